// Validates prometheus-operator objects against their CRD schemas with the models of
// @kubernetes-models/prometheus-operator (installed by xtask under the cache directory).
// Usage: node validate-crds.mjs NODE_MODULES < objects.json (a JSON array). Prints one line per
// object, `ok Kind/name` or `invalid Kind/name: reason`; exits 1 when any object is invalid.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [nodeModules] = process.argv.slice(2);
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const obj of objects) {
  const [group, version] = obj.apiVersion.split("/");
  const id = `${obj.kind}/${obj.metadata?.name}`;
  const file = `${nodeModules}/@kubernetes-models/prometheus-operator/${group}/${version}/${obj.kind}.js`;
  let model;
  try {
    model = (await import(pathToFileURL(file).href))[obj.kind];
  } catch (e) {
    console.log(`invalid ${id}: no model for ${obj.apiVersion} ${obj.kind} (${e.message})`);
    failed++;
    continue;
  }
  try {
    new model(obj).validate();
    console.log(`ok ${id}`);
  } catch (e) {
    console.log(`invalid ${id}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);

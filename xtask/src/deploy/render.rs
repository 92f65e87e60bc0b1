//! Renders deploy/kubernetes the way `kubectl apply -k` does, for the fields qoslet's
//! kustomizations use: `resources` (YAML files and other kustomization directories) and
//! `configMapGenerator` (`files`, `literals`, `options.labels` / `annotations`) with
//! `generatorOptions.disableNameSuffixHash`.
//!
//! Written here because no kustomize is packaged for this machine: Debian has only its Go
//! sources, PyPI's `kustomize` is an unrelated reimplementation, and the project's registries
//! carry no binary. Any other field is an error rather than a silent difference from kustomize
//! (`deny_unknown_fields`); a unit test compares the output with `kubectl kustomize` where a
//! kubectl is installed.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use serde_json::{Map, Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    generator_options: GeneratorOptions,
    #[serde(default)]
    config_map_generator: Vec<ConfigMapGenerator>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GeneratorOptions {
    #[serde(default)]
    disable_name_suffix_hash: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigMapGenerator {
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    literals: Vec<String>,
    #[serde(default)]
    options: GeneratedOptions,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GeneratedOptions {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Every object of the kustomization in `dir`, resources first, then generated ones (the order
/// kustomize emits them in before its own kind-based sort, which `kubectl apply` does not need).
pub fn render(dir: &Path) -> Result<Vec<Value>> {
    let file = dir.join("kustomization.yaml");
    let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let k: Kustomization =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    if k.api_version != "kustomize.config.k8s.io/v1beta1" || k.kind != "Kustomization" {
        bail!(
            "{}: not a kustomize.config.k8s.io/v1beta1 Kustomization",
            file.display()
        );
    }
    let mut out = Vec::new();
    for r in &k.resources {
        let path = dir.join(r);
        if path.is_dir() {
            out.extend(render(&path)?);
        } else {
            out.extend(documents(&path)?);
        }
    }
    for g in &k.config_map_generator {
        if !k.generator_options.disable_name_suffix_hash {
            // kustomize appends a hash of the data to the name and rewrites every reference.
            bail!(
                "{}: configMapGenerator {} needs generatorOptions.disableNameSuffixHash: true (name hashes are not rendered here)",
                file.display(),
                g.name
            );
        }
        out.push(config_map(dir, g)?);
    }
    Ok(out)
}

/// The objects of a (multi-document) YAML file; empty documents are skipped.
pub fn documents(path: &Path) -> Result<Vec<Value>> {
    use serde::Deserialize as _;
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).with_context(|| format!("parsing {}", path.display()))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn config_map(dir: &Path, g: &ConfigMapGenerator) -> Result<Value> {
    let mut data = Map::new();
    for f in &g.files {
        let (key, rel) = match f.split_once('=') {
            Some((k, p)) => (k.to_owned(), PathBuf::from(p)),
            None => {
                let p = PathBuf::from(f);
                let key = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .with_context(|| format!("configMapGenerator {}: file {f}", g.name))?
                    .to_owned();
                (key, p)
            }
        };
        let path = dir.join(&rel);
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        data.insert(key, Value::String(text));
    }
    for l in &g.literals {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("configMapGenerator {}: literal {l} has no =", g.name))?;
        data.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(g.name));
    if let Some(ns) = &g.namespace {
        metadata.insert("namespace".into(), json!(ns));
    }
    if !g.options.labels.is_empty() {
        metadata.insert("labels".into(), json!(g.options.labels));
    }
    if !g.options.annotations.is_empty() {
        metadata.insert("annotations".into(), json!(g.options.annotations));
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": data,
    }))
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::cargo::workspace_root;

    /// `Kind namespace/name`, for messages and for matching objects between two renderings.
    fn id(obj: &Value) -> String {
        format!(
            "{} {} {}/{}",
            obj["apiVersion"].as_str().unwrap_or("?"),
            obj["kind"].as_str().unwrap_or("?"),
            obj["metadata"]["namespace"].as_str().unwrap_or(""),
            obj["metadata"]["name"].as_str().unwrap_or("?")
        )
    }

    fn deploy() -> PathBuf {
        workspace_root().join("deploy/kubernetes")
    }

    #[test]
    fn renders_every_resource_and_the_dashboard_config_map() {
        let objects = render(&deploy()).unwrap();
        let ids: Vec<String> = objects.iter().map(id).collect();
        for want in [
            "v1 Namespace /qoslet-system",
            "apps/v1 DaemonSet qoslet-system/qoslet",
            "monitoring.coreos.com/v1 PrometheusRule qoslet-system/qoslet",
            "v1 ConfigMap qoslet-system/qoslet-grafana-dashboard",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} in {ids:?}");
        }
        let dashboard = objects
            .iter()
            .find(|o| o["metadata"]["name"] == "qoslet-grafana-dashboard")
            .unwrap();
        assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
        // The one copy of the JSON, byte for byte.
        assert_eq!(
            dashboard["data"]["qoslet.json"].as_str().unwrap(),
            fs::read_to_string(workspace_root().join("deploy/grafana/qoslet.json")).unwrap()
        );
    }

    #[test]
    fn a_field_it_does_not_render_is_an_error() {
        let dir = std::env::temp_dir().join(format!("xtask-render-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("kustomization.yaml"),
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: x-\n",
        )
        .unwrap();
        let err = render(&dir).unwrap_err();
        let _ = fs::remove_dir_all(&dir);
        assert!(format!("{err:#}").contains("namePrefix"), "{err:#}");
    }

    /// The same objects as kustomize itself, where a kubectl (with its built-in kustomize) is
    /// installed; the machines this project's CI runs on do not promise one.
    #[test]
    fn agrees_with_kubectl_kustomize_where_installed() {
        let Ok(out) = Command::new("kubectl")
            .arg("kustomize")
            .arg(deploy())
            .output()
        else {
            eprintln!("skipped: no kubectl on this machine");
            return;
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file =
            std::env::temp_dir().join(format!("xtask-kustomize-{}.yaml", std::process::id()));
        fs::write(&file, &out.stdout).unwrap();
        let theirs = documents(&file).unwrap();
        let _ = fs::remove_file(&file);
        let mut ours = render(&deploy()).unwrap();
        let mut theirs = theirs;
        ours.sort_by_key(id);
        theirs.sort_by_key(id);
        assert_eq!(ours.len(), theirs.len());
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a, b, "{}", id(a));
        }
    }
}

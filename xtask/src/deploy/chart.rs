//! The Helm chart deploy/helm/qoslet: `helm lint` and `helm template` for the checks, its default
//! objects compared with kustomize's (so the two install paths cannot drift), and `helm upgrade
//! --install` on a real cluster ([`install`], for the cluster test).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::tools::{self, documents, id, output};
use crate::{cargo::workspace_root, toolchain::cache_dir};

/// The release name: the chart names its objects after it (release `qoslet`: `qoslet`,
/// `qoslet-config`, ..., the kustomization's names).
pub const RELEASE: &str = "qoslet";
/// The release's namespace, the kustomization's: the chart creates none, `helm upgrade --install
/// --create-namespace` does (without the Pod Security label: [`install`]'s caller labels it).
pub const NAMESPACE: &str = "qoslet-system";
/// The namespace the chart is rendered in with ci/full-values.yaml (away from the default).
pub const FULL_VALUES_NAMESPACE: &str = "qoslet-agents";
/// The Kubernetes version the chart is rendered and linted for (`.Capabilities.KubeVersion`).
const KUBE_VERSION: &str = "1.37.0";
/// The prometheus-operator kinds the chart renders when the cluster serves them.
const OPERATOR_KINDS: &[&str] = &[
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
];
/// Labels Helm's conventions add to every object; the kustomization has only
/// app.kubernetes.io/name and app.kubernetes.io/instance (the selector's).
const HELM_LABELS: &[&str] = &[
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];
/// The pod template's hash of the ConfigMap, which rolls the pods when the configuration changes.
const CONFIG_CHECKSUM: &str = "checksum/config";

pub fn chart_dir() -> PathBuf {
    workspace_root().join("deploy/helm/qoslet")
}

/// helm with its own configuration, cache and data directories under qoslet's cache, so neither
/// the user's repositories and plugins change what it does nor it the user's.
fn helm_command(helm: &Path) -> Result<Command> {
    helm_command_in(helm, None)
}

/// [`helm_command`] in the network namespace `/run/netns/NETNS` (where a test cluster's API
/// server is reachable), or this one.
fn helm_command_in(helm: &Path, netns: Option<&str>) -> Result<Command> {
    let home = cache_dir()?.join("helm");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}")).arg("--").arg(helm);
            c
        }
        None => Command::new(helm),
    };
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    Ok(cmd)
}

pub struct Chart<'a> {
    helm: &'a Path,
    dir: PathBuf,
}

impl<'a> Chart<'a> {
    pub fn new(helm: &'a Path) -> Self {
        Self {
            helm,
            dir: chart_dir(),
        }
    }

    /// The values file with every setting away from its default.
    pub fn full_values(&self) -> PathBuf {
        self.dir.join("ci/full-values.yaml")
    }

    /// `helm lint --strict` with the defaults and with the full values (warnings fail too).
    pub fn lint(&self) -> Result<()> {
        for values in [None, Some(self.full_values())] {
            let mut cmd = helm_command(self.helm)?;
            cmd.args(["lint", "--strict", "--kube-version", KUBE_VERSION])
                .arg(&self.dir);
            if let Some(v) = &values {
                cmd.arg("--values").arg(v);
            }
            output(&mut cmd)?;
        }
        Ok(())
    }

    /// `helm template` of release [`RELEASE`] in `namespace` with `values` files and `set`
    /// pairs; `operator`: as for a cluster that serves the prometheus-operator's kinds.
    pub fn template(
        &self,
        namespace: &str,
        values: &[PathBuf],
        set: &[&str],
        operator: bool,
    ) -> Result<Vec<Value>> {
        let mut cmd = helm_command(self.helm)?;
        cmd.args(["template", RELEASE])
            .arg(&self.dir)
            .args(["--namespace", namespace])
            .args(["--kube-version", KUBE_VERSION]);
        for s in set {
            cmd.args(["--set", s]);
        }
        for v in values {
            cmd.arg("--values").arg(v);
        }
        if operator {
            for k in OPERATOR_KINDS {
                cmd.args(["--api-versions", k]);
            }
        }
        documents(&output(&mut cmd)?).context("parsing helm template's output")
    }
}

/// What to install on a cluster with [`install`].
pub struct Install<'a> {
    pub kubeconfig: &'a Path,
    /// `--set` pairs, e.g. `("image.tag", "dev")`, `("serviceMonitor.enabled", "false")`.
    pub set: &'a [(&'a str, &'a str)],
    /// Extra values files, after the chart's own defaults.
    pub values: &'a [PathBuf],
    /// `--wait` for the DaemonSet's pods to be ready, at most this long; None: return once the
    /// objects are created.
    pub wait: Option<Duration>,
    /// The network namespace (`/run/netns/NAME`) helm runs in, where the API server of
    /// `kubeconfig` is reachable; None: this one.
    pub netns: Option<&'a str>,
}

/// `helm upgrade --install qoslet deploy/helm/qoslet -n qoslet-system --create-namespace` on the
/// cluster of `i.kubeconfig`: the release record and the namespaced objects go to
/// [`NAMESPACE`]. A namespace helm creates has no Pod Security label: where the cluster enforces
/// a standard, create it labelled first (deploy/kubernetes/namespace.yaml). Builds helm first if
/// needed.
pub fn install(i: &Install) -> Result<()> {
    let helm = tools::helm()?;
    let mut cmd = helm_command_in(&helm, i.netns)?;
    cmd.args(["upgrade", "--install", RELEASE])
        .arg(chart_dir())
        .arg("--kubeconfig")
        .arg(i.kubeconfig)
        .args(["--namespace", NAMESPACE, "--create-namespace"]);
    for v in i.values {
        cmd.arg("--values").arg(v);
    }
    for (k, v) in i.set {
        cmd.arg("--set").arg(format!("{k}={v}"));
    }
    if let Some(wait) = i.wait {
        cmd.arg("--wait")
            .arg(format!("--timeout={}s", wait.as_secs().max(1)));
    }
    output(&mut cmd).context("helm upgrade --install")?;
    Ok(())
}

/// `helm uninstall qoslet -n qoslet-system`, waiting until its objects are gone (the namespace
/// stays).
pub fn uninstall(kubeconfig: &Path, netns: Option<&str>) -> Result<()> {
    let helm = tools::helm()?;
    let mut cmd = helm_command_in(&helm, netns)?;
    cmd.args(["uninstall", RELEASE, "--wait", "--namespace", NAMESPACE])
        .arg("--kubeconfig")
        .arg(kubeconfig);
    output(&mut cmd).context("helm uninstall")?;
    Ok(())
}

/// The `config.yaml` of the ConfigMap (`qoslet-config`, or `FULLNAME-config`) that has one.
pub fn config_yaml(objects: &[Value]) -> Result<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .find_map(|o| o["data"]["config.yaml"].as_str())
        .map(str::to_owned)
        .context("no ConfigMap with a config.yaml")
}

/// Every way the chart's objects differ from kustomize's, one line each (empty: none). Helm's
/// standard labels and the pod template's config checksum aside, and kustomize's Namespace (the
/// chart creates none) and the chart's `helm test` hooks (`helm install` creates none); in
/// qoslet-config's
/// config.yaml, every setting kustomize's sets must have the same value in the chart's, which
/// also spells out the agent's defaults (agent/tests/helm_values.rs pins those).
pub fn differences(kustomize: &[Value], chart: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let by_id = |objs: &[Value]| -> BTreeMap<String, Value> {
        objs.iter()
            .filter(|o| {
                o["kind"] != "Namespace" && o["metadata"]["annotations"]["helm.sh/hook"].is_null()
            })
            .map(|o| (id(o), o.clone()))
            .collect()
    };
    let mut ours = by_id(kustomize);
    let mut theirs = by_id(chart);
    for k in ours.keys().filter(|k| !theirs.contains_key(*k)) {
        out.push(format!("{k}: only in deploy/kubernetes"));
    }
    for k in theirs.keys().filter(|k| !ours.contains_key(*k)) {
        out.push(format!("{k}: only in the chart"));
    }
    for (k, a) in ours.iter_mut() {
        let Some(b) = theirs.get_mut(k) else { continue };
        strip_helm(b);
        if a["kind"] == "ConfigMap" && a["metadata"]["name"] == "qoslet-config" {
            config_differences(k, a, b, &mut out);
        }
        diff(k, a, b, &mut out);
    }
    out
}

/// Compares the two config.yaml texts setting by setting, then takes them out of the objects.
fn config_differences(k: &str, a: &mut Value, b: &mut Value, out: &mut Vec<String>) {
    let parse = |o: &mut Value| -> Option<serde_json::Map<String, Value>> {
        let text = o["data"]["config.yaml"].take();
        serde_yaml_ng::from_str::<Value>(text.as_str()?)
            .ok()?
            .as_object()
            .cloned()
    };
    let (Some(kustomize), Some(chart)) = (parse(a), parse(b)) else {
        out.push(format!(
            "{k}: data.config.yaml is not a YAML mapping in both"
        ));
        return;
    };
    for (key, want) in &kustomize {
        match chart.get(key) {
            Some(got) if got == want => {}
            got => out.push(format!(
                "{k}: config.yaml {key}: deploy/kubernetes {want}, chart {}",
                got.map_or_else(|| "unset".to_owned(), Value::to_string)
            )),
        }
    }
}

fn strip_helm(obj: &mut Value) {
    for labels in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(m) = obj.pointer_mut(labels).and_then(Value::as_object_mut) {
            for l in HELM_LABELS {
                m.remove(*l);
            }
        }
    }
    if let Some(m) = obj
        .pointer_mut("/spec/template/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        m.remove(CONFIG_CHECKSUM);
    }
}

/// The paths at which `a` and `b` differ, `path: a != b`.
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                match y.get(k) {
                    Some(vb) => diff(&format!("{path}.{k}"), va, vb, out),
                    None => out.push(format!("{path}.{k}: only in deploy/kubernetes")),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!("{path}.{k}: only in the chart"));
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                diff(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if a != b => out.push(format!("{path}: deploy/kubernetes {a}, chart {b}")),
        _ => {}
    }
}

/// Rendered for a cluster without the prometheus-operator, the chart has the same objects less
/// exactly the operator's.
pub fn check_without_operator(with: &[Value], without: &[Value]) -> Result<()> {
    let operator = |o: &&Value| {
        o["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("monitoring.coreos.com/"))
    };
    let expected: Vec<&Value> = with.iter().filter(|o| !operator(o)).collect();
    let got: Vec<&Value> = without.iter().collect();
    if got.iter().any(operator) || expected != got {
        bail!(
            "without the operator's kinds the chart renders {:?}, expected {:?}",
            got.iter().map(|o| id(o)).collect::<Vec<_>>(),
            expected.iter().map(|o| id(o)).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// The chart rendered with ci/full-values.yaml in [`FULL_VALUES_NAMESPACE`]: no Namespace; every
/// object named after fullnameOverride (the ServiceAccount serviceAccount.name), the namespaced
/// ones in the release's namespace (the Lease Role and its binding in config.leaseNamespace); the service account named wherever qoslet's identity is
/// (the DaemonSet, the bindings but the scraper's, the admission policy's condition); each
/// alert's runbook_url runbookBaseURL#<alert in lower case>.
pub fn check_full_values(objects: &[Value]) -> Result<()> {
    let text = std::fs::read_to_string(chart_dir().join("ci/full-values.yaml"))?;
    let values: Value = serde_yaml_ng::from_str(&text)?;
    let str_at = |p: &str| {
        values
            .pointer(p)
            .and_then(Value::as_str)
            .with_context(|| format!("ci/full-values.yaml has no {p}"))
    };
    let (fullname, sa, base) = (
        str_at("/fullnameOverride")?,
        str_at("/serviceAccount/name")?,
        str_at("/prometheusRule/runbookBaseURL")?,
    );
    let lease_ns = str_at("/config/leaseNamespace")?;
    let mut wrong = Vec::new();
    let username = format!("system:serviceaccount:{FULL_VALUES_NAMESPACE}:{sa}");
    for o in objects {
        let name = o["metadata"]["name"].as_str().unwrap_or("");
        let kind = o["kind"].as_str().unwrap_or("");
        let named = if kind == "ServiceAccount" {
            name == sa
        } else {
            name == fullname || name.starts_with(&format!("{fullname}-"))
        };
        if !named {
            wrong.push(format!("{}: not named after {fullname}", id(o)));
        }
        let cluster_scoped = matches!(
            kind,
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        );
        // The Lease Role and its binding go to config.leaseNamespace.
        let want_ns = if matches!(kind, "Role" | "RoleBinding") {
            lease_ns
        } else {
            FULL_VALUES_NAMESPACE
        };
        let ns = o["metadata"]["namespace"].as_str();
        if kind == "Namespace" || (!cluster_scoped && ns != Some(want_ns)) {
            wrong.push(format!("{}: not in namespace {want_ns}", id(o)));
        }
        let mut sa_names = Vec::new();
        match kind {
            "DaemonSet" => sa_names.push(&o["spec"]["template"]["spec"]["serviceAccountName"]),
            // The scraper's binding names rbac.metricsReaderSubjects, not qoslet.
            "ClusterRoleBinding" if name.ends_with("-metrics-reader") => {}
            "ClusterRoleBinding" | "RoleBinding" => sa_names.push(&o["subjects"][0]["name"]),
            "ValidatingAdmissionPolicy" => {
                let cond = o["spec"]["matchConditions"][0]["expression"]
                    .as_str()
                    .unwrap_or("");
                if !cond.contains(&format!("\"{username}\"")) {
                    wrong.push(format!("{}: its condition names no {username}", id(o)));
                }
            }
            "PrometheusRule" => {
                for r in o["spec"]["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                {
                    let Some(alert) = r["alert"].as_str() else {
                        continue;
                    };
                    let want = format!("{base}#{}", alert.to_lowercase());
                    if r["annotations"]["runbook_url"] != want.as_str() {
                        wrong.push(format!("{alert}: runbook_url is not {want}"));
                    }
                }
            }
            _ => {}
        }
        for n in sa_names {
            if n != sa {
                wrong.push(format!("{}: service account {n}, not {sa}", id(o)));
            }
        }
    }
    if !wrong.is_empty() {
        bail!(
            "the chart with ci/full-values.yaml:\n  {}",
            wrong.join("\n  ")
        );
    }
    Ok(())
}

/// With serviceAccount.create, rbac.create and tests.enabled false the chart renders the defaults'
/// objects less the ServiceAccount, the RBAC objects and the test pod, and its pods run as the
/// namespace's `default` service account.
pub fn check_without_rbac(defaults: &[Value], bare: &[Value]) -> Result<()> {
    const LEFT_OUT: &[&str] = &[
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let expected: Vec<String> = defaults
        .iter()
        .filter(|o| {
            !LEFT_OUT.contains(&o["kind"].as_str().unwrap_or(""))
                && o["metadata"]["annotations"]["helm.sh/hook"].is_null()
        })
        .map(id)
        .collect();
    let got: Vec<String> = bare.iter().map(id).collect();
    if got != expected {
        bail!(
            "without the service account, RBAC and tests the chart renders {got:?}, expected {expected:?}"
        );
    }
    let ds = bare
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .context("no DaemonSet")?;
    let sa = &ds["spec"]["template"]["spec"]["serviceAccountName"];
    if sa != "default" {
        bail!("with serviceAccount.create=false and no name the pods run as {sa}, not default");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use serde_json::json;

    use super::*;

    fn configmap(config: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "qoslet-config", "namespace": "qoslet-system", "labels": labels},
               "data": {"config.yaml": config}})
    }

    #[test]
    fn helms_labels_and_the_agents_spelled_out_defaults_are_no_difference() {
        let k = [configmap(
            "mode: enforce\nleaseNamespace: qoslet-system\n",
            json!({"app.kubernetes.io/name": "qoslet"}),
        )];
        let c = [configmap(
            "leaseNamespace: qoslet-system\nmode: enforce\nstatsInterval: 10s\n",
            json!({"app.kubernetes.io/name": "qoslet", "helm.sh/chart": "qoslet-0.1.0",
                   "app.kubernetes.io/managed-by": "Helm"}),
        )];
        assert_eq!(differences(&k, &c), Vec::<String>::new());
    }

    #[test]
    fn a_changed_setting_label_or_object_is_a_difference() {
        let k = [
            configmap(
                "mode: enforce\n",
                json!({"app.kubernetes.io/name": "qoslet"}),
            ),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "qoslet"}}),
        ];
        let c = [configmap(
            "mode: observe\n",
            json!({"app.kubernetes.io/name": "qoslet", "team": "x"}),
        )];
        let d = differences(&k, &c);
        assert_eq!(
            d,
            vec![
                "v1 Service /qoslet: only in deploy/kubernetes",
                "v1 ConfigMap qoslet-system/qoslet-config: config.yaml mode: deploy/kubernetes \"enforce\", chart \"observe\"",
                "v1 ConfigMap qoslet-system/qoslet-config.metadata.labels.team: only in the chart",
            ],
            "{d:#?}"
        );
    }

    #[test]
    fn kustomizes_namespace_and_the_charts_test_hook_are_no_difference() {
        let k = [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "qoslet-system"}}),
        ];
        let c = [json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "qoslet-test-healthz", "namespace": "qoslet-system",
                                     "annotations": {"helm.sh/hook": "test"}}})];
        assert_eq!(differences(&k, &c), Vec::<String>::new());
    }

    #[test]
    fn the_pod_templates_config_checksum_is_no_difference_but_another_annotation_is() {
        let ds = |annotations: Value| {
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "qoslet"},
                   "spec": {"template": {"metadata": {"annotations": annotations}}}})
        };
        let k = [ds(json!({"a": "1"}))];
        assert!(differences(&k, &[ds(json!({"a": "1", "checksum/config": "f00"}))]).is_empty());
        assert_eq!(
            differences(&k, &[ds(json!({"a": "2"}))]),
            vec![
                r#"apps/v1 DaemonSet /qoslet.spec.template.metadata.annotations.a: deploy/kubernetes "1", chart "2""#
            ]
        );
    }

    /// values.yaml's settings, each a dotted path to a value that is not a non-empty mapping
    /// (`resources` is one value), with their defaults.
    fn value_leaves(v: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
        match v.as_object() {
            Some(m) if !m.is_empty() && prefix != "resources." => {
                for (k, child) in m {
                    value_leaves(child, &format!("{prefix}{k}."), out);
                }
            }
            _ => {
                out.insert(prefix.trim_end_matches('.').to_owned(), v.clone());
            }
        }
    }

    /// The chart README's values table has one row per setting of values.yaml, in its order,
    /// with its default (the cell's YAML).
    #[test]
    fn the_readmes_values_table_is_values_yaml() {
        let values: Value =
            serde_yaml_ng::from_str(&fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
                .unwrap();
        let mut want = BTreeMap::new();
        value_leaves(&values, "", &mut want);
        let readme = fs::read_to_string(chart_dir().join("README.md")).unwrap();
        let mut got = BTreeMap::new();
        for line in readme.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split(" | ").collect();
            let key = cells[0].trim_start_matches("| ").trim_matches('`');
            let default = cells.get(1).map(|c| c.trim_matches('`')).unwrap_or("");
            let parsed: Value = serde_yaml_ng::from_str(default)
                .unwrap_or_else(|e| panic!("README.md {key}: default {default:?}: {e}"));
            assert!(
                got.insert(key.to_owned(), parsed).is_none(),
                "README.md lists {key} twice"
            );
        }
        for (key, v) in &want {
            assert_eq!(
                got.get(key),
                Some(v),
                "README.md's values table: {key} (values.yaml: {v})"
            );
        }
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            extra.is_empty(),
            "README.md lists settings values.yaml lacks: {extra:?}"
        );
    }

    /// The chart cannot read files outside its directory, so it carries the dashboard and the
    /// rules' spec; these are the one copies, and the chart's must stay equal to them.
    #[test]
    fn the_charts_dashboard_and_rules_are_deploys() {
        let root = workspace_root();
        assert_eq!(
            fs::read(chart_dir().join("files/qoslet.json")).unwrap(),
            fs::read(root.join("deploy/grafana/qoslet.json")).unwrap(),
            "copy deploy/grafana/qoslet.json to deploy/helm/qoslet/files/"
        );
        let rule = documents(
            &fs::read_to_string(root.join("deploy/kubernetes/prometheusrule.yaml")).unwrap(),
        )
        .unwrap();
        let spec: Value = serde_yaml_ng::from_str(
            &fs::read_to_string(chart_dir().join("files/qoslet-rules.yaml")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            rule[0]["spec"], spec,
            "deploy/helm/qoslet/files/qoslet-rules.yaml must be the spec of deploy/kubernetes/prometheusrule.yaml"
        );
    }
}

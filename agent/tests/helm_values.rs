//! The Helm chart's values (deploy/helm/qoslet) cannot drift from the QosletConfiguration:
//! `config` in values.yaml spells out every setting, its values.schema.json describes every
//! setting, its defaults are the agent's (less the two that deploy/kubernetes/configmap.yaml sets
//! for a DaemonSet pod), and ci/full-values.yaml moves every setting away from its default.
//! `cargo xtask test` renders the chart with helm and runs `qoslet validate` on its config.yaml.

use std::{collections::BTreeSet, fs, path::PathBuf};

use qoslet::config::{EndpointAuth, QosletConfiguration};
use serde_json::{Map, Value};

/// The namespace `cargo xtask validate-deploy` renders ci/full-values.yaml in
/// (xtask/src/deploy/chart.rs); the defaults go to qoslet-system, the kustomization's.
const FULL_VALUES_NAMESPACE: &str = "qoslet-agents";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml(path: &str) -> Value {
    let text = fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The chart's `config` as its ConfigMap template writes it (templates/configmap.yaml) for a
/// release in `namespace`: a null leaseNamespace becomes the release's namespace, other nulls
/// are left out.
fn rendered_config(values: &Value, namespace: &str) -> QosletConfiguration {
    let mut config = values["config"]
        .as_object()
        .expect("config is a mapping")
        .clone();
    if config.get("leaseNamespace").is_none_or(Value::is_null) {
        config.insert("leaseNamespace".into(), namespace.into());
    }
    drop_nulls(&mut config);
    for section in ["capacity", "cpuPressure"] {
        if let Some(m) = config.get_mut(section).and_then(Value::as_object_mut) {
            drop_nulls(m);
        }
    }
    config.insert("apiVersion".into(), "qoslet.dev/v1alpha1".into());
    config.insert("kind".into(), "QosletConfiguration".into());
    let text = serde_yaml_ng::to_string(&config).unwrap();
    let file = PathBuf::from("values.yaml#config");
    let qc = QosletConfiguration::parse(&file, &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    qc.check(&file).unwrap_or_else(|e| panic!("{e}\n{text}"));
    qc
}

fn drop_nulls(m: &mut Map<String, Value>) {
    m.retain(|_, v| !v.is_null());
}

/// Dotted paths of every setting: object keys, recursing into the settings that are structs
/// (not `ebpf.sensors`, a map whose keys are sensor names).
fn settings(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let Some(m) = v.as_object() else { return };
    for (k, child) in m {
        let path = format!("{prefix}{k}");
        if path != "ebpf.sensors" {
            settings(child, &format!("{path}."), out);
        }
        out.insert(path);
    }
}

fn leaves(v: &Value, prefix: &str, out: &mut Vec<(String, Value)>) {
    match v.as_object() {
        Some(m) if prefix != "ebpf.sensors." => {
            for (k, child) in m {
                leaves(child, &format!("{prefix}{k}."), out);
            }
        }
        _ => out.push((prefix.trim_end_matches('.').to_owned(), v.clone())),
    }
}

/// Every setting of the agent, read from a configuration that sets each one (an Option left
/// unset may not serialize).
fn agent_settings(full: &QosletConfiguration) -> BTreeSet<String> {
    let mut v = serde_json::to_value(full).unwrap();
    let m = v.as_object_mut().unwrap();
    m.remove("apiVersion");
    m.remove("kind");
    let mut out = BTreeSet::new();
    settings(&v, "", &mut out);
    out
}

/// The two sets are equal; else which side lacks what.
fn assert_same(spelled: &BTreeSet<String>, want: &BTreeSet<String>, what: &str) {
    let missing: Vec<_> = want.difference(spelled).collect();
    let extra: Vec<_> = spelled.difference(want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: missing {missing:?}, unknown {extra:?}"
    );
}

#[test]
fn values_spell_out_every_setting_with_the_agents_defaults() {
    let values = yaml("deploy/helm/qoslet/values.yaml");
    let full = rendered_config(
        &yaml("deploy/helm/qoslet/ci/full-values.yaml"),
        FULL_VALUES_NAMESPACE,
    );
    let mut spelled = BTreeSet::new();
    settings(&values["config"], "", &mut spelled);
    assert_same(
        &spelled,
        &agent_settings(&full),
        "values.yaml's config against agent/src/config/qoslet.rs's QosletConfiguration",
    );

    // The defaults are deploy/kubernetes/configmap.yaml's: the agent's own, with its two
    // DaemonSet settings and cluster mode's endpointAuth spelled out.
    let configmap = yaml("deploy/kubernetes/configmap.yaml");
    let kustomize = QosletConfiguration::parse(
        &PathBuf::from("deploy/kubernetes/configmap.yaml"),
        configmap["data"]["config.yaml"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(rendered_config(&values, "qoslet-system"), kustomize);
    assert_eq!(
        kustomize,
        QosletConfiguration {
            mode: kustomize.mode,
            metrics_address: Some("[::]:9479".into()),
            endpoint_auth: Some(EndpointAuth::TokenReview),
            lease_namespace: "qoslet-system".into(),
            ..QosletConfiguration::default()
        }
    );
}

#[test]
fn full_values_move_every_setting_away_from_its_default() {
    let full = rendered_config(
        &yaml("deploy/helm/qoslet/ci/full-values.yaml"),
        FULL_VALUES_NAMESPACE,
    );
    let mut defaults = serde_json::to_value(QosletConfiguration::default()).unwrap();
    // Unset serializes as absent; every other setting is compared with its default.
    defaults["kubernetesVersion"] = Value::Null;
    let mut got = Vec::new();
    leaves(&serde_json::to_value(&full).unwrap(), "", &mut got);
    let same: Vec<&str> = got
        .iter()
        .filter(|(path, _)| path != "apiVersion" && path != "kind")
        .filter(|(path, v)| defaults.pointer(&format!("/{}", path.replace('.', "/"))) == Some(v))
        .map(|(path, _)| path.as_str())
        .collect();
    assert!(
        same.is_empty(),
        "ci/full-values.yaml leaves these at their defaults: {same:?}"
    );
}

#[test]
fn the_schema_describes_every_setting() {
    let schema: Value = serde_json::from_str(
        &fs::read_to_string(repo().join("deploy/helm/qoslet/values.schema.json")).unwrap(),
    )
    .unwrap();
    fn properties(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
        let Some(m) = schema["properties"].as_object() else {
            return;
        };
        for (k, child) in m {
            let path = format!("{prefix}{k}");
            properties(child, &format!("{path}."), out);
            out.insert(path);
        }
    }
    let mut described = BTreeSet::new();
    properties(&schema["properties"]["config"], "", &mut described);
    let mut spelled = BTreeSet::new();
    settings(
        &yaml("deploy/helm/qoslet/values.yaml")["config"],
        "",
        &mut spelled,
    );
    assert_eq!(
        described, spelled,
        "values.schema.json's config against values.yaml's"
    );
}

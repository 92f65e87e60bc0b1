//! deploy/ checked by the programs that consume it: `kustomize build deploy/kubernetes` and the
//! Helm chart deploy/helm/qoslet (`helm lint`, `helm template` with its defaults and with
//! ci/full-values.yaml) against the Kubernetes 1.37 schemas (`kubernetes-validate`, PyPI) and the
//! prometheus-operator CRD schemas (`@kubernetes-models/prometheus-operator`, npm); the chart's
//! default objects against kustomize's, object by object; each rendered config.yaml through
//! `qoslet validate`; the example manifests against the same Kubernetes schemas; the alert rules
//! with `promtool check rules` and `promtool test rules`. Each tool is installed on first use
//! under the cache directory (or by apt), pinned.

mod chart;
mod tools;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

pub use chart::{Install, install, uninstall};
pub use tools::{documents, helm, kustomize, kustomize_build};

use crate::{
    apt,
    cargo::{target_dir, workspace_root},
    toolchain::cache_dir,
};

const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";
const KUBERNETES_VERSION: &str = "1.37.0";
const PROMETHEUS_OPERATOR_MODELS: &str = "@kubernetes-models/prometheus-operator@6.0.0";
/// Debian's prometheus carries promtool.
pub const PROMETHEUS_PACKAGES: &[&str] = &["prometheus"];
/// Kinds of deploy/examples that are no Kubernetes API object; `qoslet validate` checks them
/// (agent/tests/validate_cli.rs).
const NOT_API_KINDS: &[&str] = &["KubeletConfiguration", "QosletConfiguration"];

/// Where the renderers and validators live once installed.
pub struct Tools {
    kubernetes_validate: PathBuf,
    node_modules: PathBuf,
    kustomize: PathBuf,
    helm: PathBuf,
}

/// Installs what is missing: kustomize and helm (Go builds), a venv with kubernetes-validate, the
/// npm models, Debian's prometheus (promtool). A second run only checks paths, stamps and dpkg.
pub fn ensure_tools() -> Result<Tools> {
    let cache = cache_dir()?;
    let venv = cache.join("venv");
    let kubernetes_validate = venv.join("bin/kubernetes-validate");
    if !kubernetes_validate.exists() {
        println!(
            "deploy: installing {KUBERNETES_VALIDATE} into {}",
            venv.display()
        );
        apt::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        apt::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "-q", "--disable-pip-version-check"])
                .arg(KUBERNETES_VALIDATE),
        )?;
    }
    let npm = cache.join("npm");
    let node_modules = npm.join("node_modules");
    if !node_modules
        .join("@kubernetes-models/prometheus-operator/package.json")
        .exists()
    {
        println!(
            "deploy: installing {PROMETHEUS_OPERATOR_MODELS} into {}",
            npm.display()
        );
        fs::create_dir_all(&npm)?;
        apt::run(
            Command::new("npm")
                .args([
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--save-exact",
                    "--prefix",
                ])
                .arg(&npm)
                .arg(PROMETHEUS_OPERATOR_MODELS),
        )?;
    }
    apt::ensure("deploy", PROMETHEUS_PACKAGES)?;
    Ok(Tools {
        kubernetes_validate,
        node_modules,
        kustomize: kustomize()?,
        helm: helm()?,
    })
}

/// Renders deploy/kubernetes with kustomize and the chart with helm, validates every object, the
/// chart's configurations (with `qoslet`, the agent binary) and the examples, checks and
/// unit-tests the alert rules. Prints one line per check; fails on the first broken one.
pub fn validate(tools: &Tools, qoslet: &Path) -> Result<()> {
    let root = workspace_root();
    let out = target_dir().join("deploy");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;

    let objects = kustomize_build(&tools.kustomize, &root.join("deploy/kubernetes"))?;
    check_objects(
        tools,
        "kustomize build deploy/kubernetes",
        &objects,
        &out.join("kustomize"),
    )?;

    let chart = chart::Chart::new(&tools.helm);
    chart.lint()?;
    println!("deploy: helm lint --strict passes with the chart's defaults and ci/full-values.yaml");
    let defaults = chart.template(chart::NAMESPACE, &[], &[], true)?;
    check_objects(
        tools,
        "helm template (defaults)",
        &defaults,
        &out.join("chart-defaults"),
    )?;
    let differences = chart::differences(&objects, &defaults);
    if !differences.is_empty() {
        bail!(
            "the chart's default objects differ from deploy/kubernetes's:\n  {}",
            differences.join("\n  ")
        );
    }
    println!(
        "deploy: the chart's {} default objects equal deploy/kubernetes's (Helm's labels, kustomize's Namespace and the helm test pod aside)",
        defaults.len()
    );
    let without_operator = chart.template(chart::NAMESPACE, &[], &[], false)?;
    chart::check_without_operator(&defaults, &without_operator)?;
    println!(
        "deploy: without the prometheus-operator's kinds the chart leaves out its ServiceMonitor and PrometheusRule and nothing else"
    );
    let full = chart.template(
        chart::FULL_VALUES_NAMESPACE,
        &[chart.full_values()],
        &[],
        false,
    )?;
    check_objects(
        tools,
        "helm template -f ci/full-values.yaml",
        &full,
        &out.join("chart-full"),
    )?;
    chart::check_full_values(&full)?;
    println!(
        "deploy: with ci/full-values.yaml every object is named after fullnameOverride, in the release's namespace, and every runbook_url starts with runbookBaseURL"
    );
    let bare = chart.template(
        chart::NAMESPACE,
        &[],
        &[
            "serviceAccount.create=false",
            "rbac.create=false",
            "tests.enabled=false",
        ],
        true,
    )?;
    chart::check_without_rbac(&defaults, &bare)?;
    println!(
        "deploy: serviceAccount.create=false, rbac.create=false and tests.enabled=false leave out the ServiceAccount, the RBAC objects and the test pod, and nothing else"
    );
    for (name, objs) in [("defaults", &defaults), ("full-values", &full)] {
        let file = out.join(format!("chart-{name}-config.yaml"));
        fs::write(&file, chart::config_yaml(objs)?)?;
        qoslet_validate(qoslet, &file)?;
    }
    println!(
        "deploy: qoslet validate accepts the chart's config.yaml with its defaults and ci/full-values.yaml"
    );

    let mut examples = Vec::new();
    yaml_files(&root.join("deploy/examples"), &mut examples)?;
    let mut checked = Vec::new();
    for f in examples {
        let text = fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let docs = documents(&text).with_context(|| format!("parsing {}", f.display()))?;
        let api = |d: &Value| !NOT_API_KINDS.contains(&d["kind"].as_str().unwrap_or(""));
        if docs.iter().all(api) {
            checked.push(f);
        } else if docs.iter().any(api) {
            bail!("{}: mixes API objects with {NOT_API_KINDS:?}", f.display());
        }
    }
    kubernetes_validate(tools, &checked)?;
    println!(
        "deploy: {} example manifests valid against the Kubernetes {KUBERNETES_VERSION} schemas",
        checked.len()
    );

    let rules = write_rules(&objects, &out)?;
    promtool(&["check", "rules"], &rules)?;
    let tests = out.join("qoslet-rules.test.yaml");
    fs::copy(
        root.join("deploy/prometheus/qoslet-rules.test.yaml"),
        &tests,
    )?;
    promtool(&["test", "rules"], &tests)?;
    println!("deploy: alert rules pass promtool check rules and their unit tests");
    Ok(())
}

/// Every object of one rendering against the Kubernetes schemas or, for the prometheus-operator
/// kinds, their CRD schemas; one file per object under `dir`, so a failure names it.
fn check_objects(tools: &Tools, what: &str, objects: &[Value], dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    let (crds, core): (Vec<&Value>, Vec<&Value>) = objects.iter().partition(|o| {
        o["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("monitoring.coreos.com/"))
    });
    let mut files = Vec::new();
    for (i, obj) in core.iter().enumerate() {
        let f = dir.join(format!(
            "{i:02}-{}-{}.json",
            obj["kind"].as_str().unwrap_or("x"),
            obj["metadata"]["name"].as_str().unwrap_or("x")
        ));
        fs::write(&f, serde_json::to_vec_pretty(obj)?)?;
        files.push(f);
    }
    kubernetes_validate(tools, &files).with_context(|| what.to_owned())?;
    validate_crds(tools, &crds).with_context(|| what.to_owned())?;
    let rules = crds
        .iter()
        .filter(|o| o["kind"] == "PrometheusRule")
        .count();
    if rules > 0 {
        let owned: Vec<Value> = crds.iter().map(|o| (*o).clone()).collect();
        promtool(&["check", "rules"], &write_rules(&owned, dir)?)
            .with_context(|| what.to_owned())?;
    }
    println!(
        "deploy: {what}: {} objects valid against the Kubernetes {KUBERNETES_VERSION} schemas, {} against the prometheus-operator CRD schemas",
        files.len(),
        crds.len()
    );
    Ok(())
}

/// `qoslet validate FILE`: exit 0, nothing on stderr (no problem, no warning), and the verdict
/// `valid: ...` on stdout.
fn qoslet_validate(qoslet: &Path, file: &Path) -> Result<()> {
    let out = Command::new(qoslet)
        .arg("validate")
        .arg(file)
        .env("RUST_LOG", "off")
        .output()
        .with_context(|| format!("running {}", qoslet.display()))?;
    if !out.status.success() || !out.stderr.is_empty() || !out.stdout.starts_with(b"valid: ") {
        bail!(
            "qoslet validate {} ({}): {}{}",
            file.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The PrometheusRule's `spec` as a plain Prometheus rule file, `<out>/qoslet-rules.yaml` (what
/// the operator hands to Prometheus).
pub fn write_rules(objects: &[Value], out: &Path) -> Result<PathBuf> {
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .context("no PrometheusRule among the objects")?;
    let path = out.join("qoslet-rules.yaml");
    fs::write(&path, serde_json::to_vec_pretty(&rule["spec"])?)?;
    Ok(path)
}

fn kubernetes_validate(tools: &Tools, files: &[PathBuf]) -> Result<()> {
    let out = Command::new(&tools.kubernetes_validate)
        .args([
            "--strict",
            "--quiet",
            "--kubernetes-version",
            KUBERNETES_VERSION,
        ])
        .args(files)
        .stdin(Stdio::null())
        .output()
        .context("running kubernetes-validate")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A kind without a schema is only a warning to kubernetes-validate; here it is a failure.
    if !out.status.success()
        || text
            .lines()
            .any(|l| l.starts_with("WARN") || l.starts_with("ERROR"))
    {
        bail!("kubernetes-validate: {}", text.trim());
    }
    Ok(())
}

fn validate_crds(tools: &Tools, objects: &[&Value]) -> Result<()> {
    if objects.is_empty() {
        return Ok(());
    }
    let script = workspace_root().join("xtask/src/deploy/validate-crds.mjs");
    let mut child = Command::new("node")
        .arg(script)
        .arg(&tools.node_modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running node")?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().context("node stdin")?;
        stdin.write_all(&serde_json::to_vec(objects)?)?;
    }
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.lines().count() != objects.len() {
        bail!("prometheus-operator schemas: {}", text.trim());
    }
    Ok(())
}

fn promtool(args: &[&str], file: &Path) -> Result<()> {
    let out = Command::new("promtool")
        .args(args)
        .arg(file)
        .output()
        .context("running promtool")?;
    if !out.status.success() {
        bail!(
            "promtool {} {}: {}{}",
            args.join(" "),
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The alerts of deploy/kubernetes/prometheusrule.yaml: (name, runbook_url).
    fn alerts() -> Vec<(String, String)> {
        let text =
            fs::read_to_string(workspace_root().join("deploy/kubernetes/prometheusrule.yaml"))
                .unwrap();
        let rule = &documents(&text).unwrap()[0];
        rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .filter_map(|r| {
                let alert = r["alert"].as_str()?;
                let url = r["annotations"]["runbook_url"].as_str().unwrap_or("");
                Some((alert.to_owned(), url.to_owned()))
            })
            .collect()
    }

    /// Every alert links its own section of docs/runbooks.md (a `## Name` heading, whose anchor
    /// is the name in lower case) and has a promtool unit test.
    #[test]
    fn every_alert_has_its_runbook_section_and_a_unit_test() {
        let root = workspace_root();
        let runbooks = fs::read_to_string(root.join("docs/runbooks.md")).unwrap();
        let tests =
            fs::read_to_string(root.join("deploy/prometheus/qoslet-rules.test.yaml")).unwrap();
        let alerts = alerts();
        assert!(alerts.len() >= 10, "{alerts:?}");
        for (alert, url) in alerts {
            assert_eq!(
                url,
                format!("docs/runbooks.md#{}", alert.to_lowercase()),
                "{alert}'s runbook_url"
            );
            assert!(
                runbooks.lines().any(|l| l == format!("## {alert}")),
                "docs/runbooks.md has no section {alert}"
            );
            assert!(
                tests
                    .lines()
                    .any(|l| l.trim() == format!("alertname: {alert}")),
                "deploy/prometheus/qoslet-rules.test.yaml does not test {alert}"
            );
        }
    }
}

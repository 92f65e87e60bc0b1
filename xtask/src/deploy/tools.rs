//! kustomize and helm, built from the Go module proxy at pinned versions by
//! [`gotools::ensure`] (no binary of either is packaged for these machines): the real programs
//! operators install qoslet with, so what `cargo xtask test` checks is what they render.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::gotools::{self, GoBuild};

/// kustomize v5.8.2: the newest v5.8 the installed Go builds (v5.8.3 needs Go 1.27).
pub const KUSTOMIZE: GoBuild<'static> = GoBuild {
    name: "kustomize",
    module: "sigs.k8s.io/kustomize/kustomize/v5",
    version: "v5.8.2",
    packages: &["sigs.k8s.io/kustomize/kustomize/v5"],
    replaces: &[],
    tags: &[],
    cgo: false,
    link_vars: &[],
};

/// helm v3.22.0: the newest v3 release the module proxy serves. Its Makefile stamps in its
/// version and the Kubernetes version of its client libraries (the default of `helm template`'s
/// and `helm lint`'s `--kube-version`, else 1.20).
pub const HELM: GoBuild<'static> = GoBuild {
    name: "helm",
    module: "helm.sh/helm/v3",
    version: "v3.22.0",
    packages: &["helm.sh/helm/v3/cmd/helm"],
    replaces: &[],
    tags: &[],
    cgo: false,
    link_vars: &[
        ("helm.sh/helm/v3/internal/version.version", "v3.22.0"),
        ("helm.sh/helm/v3/internal/version.gitTreeState", "clean"),
        ("helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor", "1"),
        ("helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor", "37"),
        ("helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor", "1"),
        ("helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor", "37"),
    ],
};

/// The kustomize binary, built once.
pub fn kustomize() -> Result<PathBuf> {
    checked(gotools::ensure(&KUSTOMIZE)?.join("kustomize"))
}

/// The helm binary, built once.
pub fn helm() -> Result<PathBuf> {
    checked(gotools::ensure(&HELM)?.join("helm"))
}

/// A cached build that no longer runs (a half-written file, another machine's) is an error
/// that says so, not a confusing failure later.
fn checked(bin: PathBuf) -> Result<PathBuf> {
    if !gotools::runs(&bin, &["version"]) {
        bail!(
            "{} does not run `version`; remove its directory to rebuild it",
            bin.display()
        );
    }
    Ok(bin)
}

/// `kustomize build DIR`: every object of the kustomization, as `kubectl apply -k` sends them.
pub fn kustomize_build(kustomize: &Path, dir: &Path) -> Result<Vec<Value>> {
    let text = output(Command::new(kustomize).arg("build").arg(dir))?;
    documents(&text).with_context(|| format!("kustomize build {}", dir.display()))
}

/// A command's standard output; its standard error in the error when it fails.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed no UTF-8"))
}

/// The objects of a (multi-document) YAML text; empty documents are skipped.
pub fn documents(text: &str) -> Result<Vec<Value>> {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = Value::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// `Kind namespace/name`, for messages and for matching objects between two renderings.
pub fn id(obj: &Value) -> String {
    format!(
        "{} {} {}/{}",
        obj["apiVersion"].as_str().unwrap_or("?"),
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_skip_empty_ones() {
        let docs = documents("---\na: 1\n---\n---\nb: [2]\n").unwrap();
        assert_eq!(
            docs,
            vec![serde_json::json!({"a": 1}), serde_json::json!({"b": [2]})]
        );
    }
}

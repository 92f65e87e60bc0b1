//! The cluster's programs: Kubernetes, etcd, containerd, the CNI plugins and the CNCF
//! distribution registry built from the Go module proxy at pinned versions (`gotools`), runc,
//! skopeo and the rest from Debian.

use std::path::PathBuf;

use anyhow::Result;

use crate::{
    apt,
    gotools::{self, GoBuild},
};

/// The Kubernetes release; its staging modules (`k8s.io/api`, ...) are at `v0.<minor>.<patch>`.
pub const KUBERNETES: &str = "v1.37.2";
/// Staging modules of k8s.io/kubernetes v1.37.2 (its go.mod's `replace` block, which a
/// dependent module does not inherit).
const STAGING: &[&str] = &[
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "sample-cli-plugin",
    "sample-controller",
    "streaming",
];
/// etcd's server: Kubernetes v1.37.2 requires go.etcd.io/etcd/server/v3 v3.7.0, so it is built
/// in the same module graph (one compilation of the shared packages); its main package is the
/// module root, which `go build` names `server`.
const ETCD_PACKAGE: &str = "go.etcd.io/etcd/server/v3";
pub const CONTAINERD: &str = "v2.4.2";
pub const CNI_PLUGINS: &str = "v1.10.0";
/// The CNCF distribution registry (the `registry:3` image's program), from which the node pulls
/// qoslet's image. Its go.mod asks for Go 1.26.
pub const DISTRIBUTION: &str = "v3.1.2";
const DISTRIBUTION_MODULE: &str = "github.com/distribution/distribution/v3";
/// Debian's: runc runs the containers, openssl makes the certificates, iproute2 and
/// util-linux (nsenter, unshare) make and enter the namespaces, busybox-static is the test
/// pods' userland, gcc and libc6-dev build the static pause program, skopeo pushes qoslet's
/// image to the cluster's registry.
pub const PACKAGES: &[&str] = &[
    "runc",
    "openssl",
    "iproute2",
    "util-linux",
    "busybox-static",
    "gcc",
    "libc6-dev",
    "skopeo",
];

pub struct Bins {
    pub kubernetes: PathBuf,
    pub containerd: PathBuf,
    pub cni: PathBuf,
    /// The directory of the distribution registry's `registry`.
    pub distribution: PathBuf,
}

impl Bins {
    pub fn kube(&self, name: &str) -> PathBuf {
        self.kubernetes.join(name)
    }

    pub fn etcd(&self) -> PathBuf {
        self.kubernetes.join(gotools::binary_name(ETCD_PACKAGE))
    }

    pub fn kubectl(&self) -> PathBuf {
        self.kube("kubectl")
    }

    pub fn registry(&self) -> PathBuf {
        self.distribution.join("registry")
    }
}

fn staging_replaces() -> Vec<(String, String)> {
    let minor = KUBERNETES.trim_start_matches("v1.");
    STAGING
        .iter()
        .map(|m| (format!("k8s.io/{m}"), format!("k8s.io/{m}@v0.{minor}")))
        .collect()
}

/// `("1", "37")` of `v1.37.2`.
fn kubernetes_major_minor() -> (&'static str, &'static str) {
    let mut parts = KUBERNETES.trim_start_matches('v').split('.');
    (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    )
}

/// Builds (once) and returns the programs' directories.
pub fn ensure() -> Result<Bins> {
    apt::ensure("cluster", PACKAGES)?;
    let replaces = staging_replaces();
    let (major, minor) = kubernetes_major_minor();
    // What hack/lib/version.sh stamps in: without it every component says v0.0.0-master, and
    // helm (and anything else that checks the server's version) refuses the cluster.
    let mut version_vars = Vec::new();
    for package in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (var, value) in [
            ("gitVersion", KUBERNETES),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        ] {
            version_vars.push((format!("{package}.{var}"), value));
        }
    }
    let version_vars: Vec<(&str, &str)> = version_vars
        .iter()
        .map(|(var, value)| (var.as_str(), *value))
        .collect();
    let kubernetes = gotools::ensure(&GoBuild {
        name: "kubernetes",
        module: "k8s.io/kubernetes",
        version: KUBERNETES,
        packages: &[
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubelet",
            "k8s.io/kubernetes/cmd/kubectl",
            ETCD_PACKAGE,
        ],
        replaces: &replaces,
        tags: &[],
        cgo: false,
        link_vars: &version_vars,
    })?;
    let containerd = gotools::ensure(&GoBuild {
        name: "containerd",
        module: "github.com/containerd/containerd/v2",
        version: CONTAINERD,
        packages: &[
            "github.com/containerd/containerd/v2/cmd/containerd",
            "github.com/containerd/containerd/v2/cmd/ctr",
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        ],
        replaces: &[],
        // Snapshotters the cluster does not use (it uses `native`) and that need cgo or
        // kernel features.
        tags: &["no_btrfs", "no_devmapper", "no_zfs"],
        cgo: false,
        link_vars: &[(
            "github.com/containerd/containerd/v2/version.Version",
            CONTAINERD,
        )],
    })?;
    let cni = gotools::ensure(&GoBuild {
        name: "cni-plugins",
        module: "github.com/containernetworking/plugins",
        version: CNI_PLUGINS,
        packages: &[
            "github.com/containernetworking/plugins/plugins/main/bridge",
            "github.com/containernetworking/plugins/plugins/main/loopback",
            "github.com/containernetworking/plugins/plugins/ipam/host-local",
            "github.com/containernetworking/plugins/plugins/meta/portmap",
        ],
        replaces: &[],
        tags: &[],
        cgo: false,
        link_vars: &[],
    })?;
    let distribution = gotools::ensure(&GoBuild {
        name: "distribution",
        module: DISTRIBUTION_MODULE,
        version: DISTRIBUTION,
        packages: &["github.com/distribution/distribution/v3/cmd/registry"],
        replaces: &[],
        tags: &[],
        cgo: false,
        // What its Makefile stamps in (`registry --version`); a plain build says v3.1.2+unknown.
        link_vars: &[(
            "github.com/distribution/distribution/v3/version.version",
            DISTRIBUTION,
        )],
    })?;
    let bins = Bins {
        kubernetes,
        containerd,
        cni,
        distribution,
    };
    for (program, args) in [
        (bins.kubectl(), &["version", "--client"][..]),
        (bins.containerd.join("containerd"), &["--version"][..]),
        (bins.registry(), &["--version"][..]),
    ] {
        if !gotools::runs(&program, args) {
            anyhow::bail!("{} does not run", program.display());
        }
    }
    Ok(bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_are_pinned_to_the_matching_v0() {
        let r = staging_replaces();
        assert!(r.contains(&("k8s.io/api".into(), "k8s.io/api@v0.37.2".into())));
        assert_eq!(r.len(), STAGING.len());
    }
}

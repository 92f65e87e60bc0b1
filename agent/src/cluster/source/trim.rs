//! What the watches keep of each object: only what qoslet reads. The reflector holds every
//! object the API server sends, as sent, for as long as it exists; a pod may carry up to 1.5 MB
//! (a 256 KiB annotation block, environment values, managed fields), and 40 pods with a 1.2 MB
//! environment value took the agent from 19 to 226 MB. Trimmed as each event arrives, before the
//! store takes it, memory follows the number of objects, not what they carry.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DynamicObject;

use crate::cluster::writes::EVICTED_AT;

/// The pod annotations qoslet reads: the kubelet's marks of a static or mirror pod
/// (`policy::pod`), and qoslet's own eviction time (`cluster::action`).
const POD_ANNOTATIONS: [&str; 3] = [
    "kubernetes.io/config.mirror",
    "kubernetes.io/config.source",
    EVICTED_AT,
];

/// Clears what a container runs, its environment, probes and mounts: a macro because containers
/// and ephemeral containers are two types with these same fields.
macro_rules! trim_container {
    ($c:ident) => {
        $c.env = None;
        $c.env_from = None;
        $c.command = None;
        $c.args = None;
        $c.lifecycle = None;
        $c.liveness_probe = None;
        $c.readiness_probe = None;
        $c.startup_probe = None;
        $c.volume_mounts = None;
    };
}

/// Drops what qoslet never reads from an object as it arrives from a watch.
pub(crate) trait Trim {
    fn trim(&mut self);
}

impl Trim for Pod {
    fn trim(&mut self) {
        self.metadata.managed_fields = None;
        if let Some(a) = &mut self.metadata.annotations {
            let kept: BTreeMap<String, String> = std::mem::take(a)
                .into_iter()
                .filter(|(k, _)| POD_ANNOTATIONS.contains(&k.as_str()))
                .collect();
            *a = kept;
        }
        if let Some(spec) = &mut self.spec {
            // Resources, names, images and restart policies stay: the plan and the door read
            // them. What a container runs and its environment are the kubelet's business.
            let containers = spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten());
            for c in containers {
                trim_container!(c);
            }
            for c in spec.ephemeral_containers.iter_mut().flatten() {
                trim_container!(c);
            }
            spec.volumes = None;
        }
    }
}

impl Trim for Node {
    fn trim(&mut self) {
        self.metadata.managed_fields = None;
        self.metadata.annotations = None;
        if let Some(status) = &mut self.status {
            // A node with many images lists each with all its names.
            status.images = None;
        }
    }
}

impl Trim for DynamicObject {
    fn trim(&mut self) {
        self.metadata.managed_fields = None;
        self.metadata.annotations = None;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A pod as an attacker would shape it: managed fields, a large annotation beside the three
    /// qoslet reads, an environment value of a megabyte, a command, probes and volumes. Trimmed,
    /// it keeps what the plan and the door read and is a few kilobytes.
    #[test]
    fn a_trimmed_pod_keeps_what_qoslet_reads_and_nothing_large() {
        let big = "x".repeat(1 << 20);
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u", "generation": 3,
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
                "annotations": {
                    "big": big,
                    "kubernetes.io/config.source": "file",
                    "kubernetes.io/config.mirror": "abc",
                    EVICTED_AT: "2026-12-04T00:00:00Z",
                },
            },
            "spec": {
                "nodeName": "n", "priority": 5,
                "volumes": [{"name": "v", "emptyDir": {}}],
                "initContainers": [{"name": "i", "image": "busybox", "restartPolicy": "Always", "env": [{"name": "E", "value": big}]}],
                "containers": [{
                    "name": "c", "image": "busybox",
                    "command": ["sh", "-c", big],
                    "env": [{"name": "E", "value": big}],
                    "livenessProbe": {"exec": {"command": ["true"]}},
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                    "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                }],
            },
            "status": {"phase": "Running", "qosClass": "Burstable"},
        }))
        .unwrap();
        pod.trim();
        let size = serde_json::to_vec(&pod).unwrap().len();
        assert!(size < 2048, "{size} bytes: {pod:?}");
        let a = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            a.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "kubernetes.io/config.mirror",
                "kubernetes.io/config.source",
                EVICTED_AT
            ]
        );
        assert_eq!(pod.metadata.generation, Some(3));
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert!(c.resources.as_ref().unwrap().limits.is_some());
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0]
                .restart_policy
                .as_deref(),
            Some("Always")
        );
        assert_eq!(spec.priority, Some(5));
        assert_eq!(
            pod.status.as_ref().unwrap().qos_class.as_deref(),
            Some("Burstable")
        );
    }
}

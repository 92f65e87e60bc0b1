//! What the runtime runs: a pod reduced to the fields a process runtime needs, read from a
//! k8s-openapi `Pod`. There are no images, so each container's `command` and `args` run on the
//! host; every field the runtime cannot honour is an error naming it rather than a silent skip.

use std::{path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1 as core;
use thiserror::Error;

use crate::{
    cgroup::CgroupBeneath,
    policy::pod::{ContainerKind, PodKey, RestartPolicy, derived_uid},
    source::build::Unrunnable,
};

/// `terminationGracePeriodSeconds` when unset (PodSpec defaulting).
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// PATH for containers whose `env` does not set one (the value container runtimes default to).
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The cgroup directories a container's processes join: one per hierarchy (on a hybrid host
/// the v1 controller directories plus the unified-tree directory; on pure v2 one directory).
/// Empty means the container has no cgroup of its own, and the runtime does not start it.
/// Named beneath the node root (the path comes from the pod's UID), where every file of them is
/// opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerCgroups {
    pub dirs: Vec<CgroupBeneath>,
}

/// One container of a pod, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub kind: ContainerKind,
    /// `command` followed by `args`; never empty.
    pub argv: Vec<String>,
    /// `env` in order, after `PATH` defaulting; later entries win, as in Kubernetes.
    pub env: Vec<(String, String)>,
    /// `workingDir`; `/` when unset.
    pub working_dir: PathBuf,
    pub cgroups: ContainerCgroups,
}

/// A pod as the runtime runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRuntimeSpec {
    pub key: PodKey,
    /// Init containers (regular and sidecars) in their order, then app containers.
    pub containers: Vec<ContainerSpec>,
    pub restart_policy: RestartPolicy,
    pub termination_grace: Duration,
}

/// A pod field the runtime cannot run.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("Pod/{namespace}/{name}: {field}: {message}")]
pub struct SpecError {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// JSON path inside the object, e.g. `spec.containers[0].env[1].valueFrom`.
    pub(crate) field: String,
    pub(crate) message: String,
}

/// The runtime's check at the source's door (`source::build::RunCheck`): a pod it cannot read
/// into a [`PodRuntimeSpec`] is a problem line there, not a failure when it is to start.
pub(crate) fn run_check(pod: &core::Pod) -> Result<(), Unrunnable> {
    PodRuntimeSpec::from_pod(pod)
        .map(drop)
        .map_err(|e| Unrunnable {
            field: e.field,
            message: e.message,
        })
}

impl PodRuntimeSpec {
    /// Reads a pod. Container cgroups are left empty: the caller (the cgroup reconciler) sets
    /// them with [`PodRuntimeSpec::set_cgroups`].
    pub fn from_pod(pod: &core::Pod) -> Result<Self, SpecError> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let name = meta.name.clone().unwrap_or_default();
        let err = |field: String, message: &str| SpecError {
            namespace: namespace.clone(),
            name: name.clone(),
            field,
            message: message.to_owned(),
        };
        let uid = meta
            .uid
            .clone()
            .unwrap_or_else(|| derived_uid(&namespace, &name));
        let spec = pod
            .spec
            .as_ref()
            .ok_or_else(|| err("spec".into(), "required"))?;
        let restart_policy = match spec.restart_policy.as_deref() {
            None | Some("Always") => RestartPolicy::Always,
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            Some(_) => {
                return Err(err(
                    "spec.restartPolicy".into(),
                    "must be Always, OnFailure or Never",
                ));
            }
        };
        let termination_grace = match spec.termination_grace_period_seconds {
            None => DEFAULT_GRACE,
            Some(s) if s >= 0 => Duration::from_secs(s.unsigned_abs()),
            Some(_) => {
                return Err(err(
                    "spec.terminationGracePeriodSeconds".into(),
                    "must not be negative",
                ));
            }
        };
        let mut containers = Vec::new();
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            let kind = match c.restart_policy.as_deref() {
                Some("Always") => ContainerKind::Sidecar,
                None => ContainerKind::Init,
                Some(_) => {
                    return Err(err(
                        format!("spec.initContainers[{i}].restartPolicy"),
                        "only Always (a sidecar) is allowed",
                    ));
                }
            };
            let path = format!("spec.initContainers[{i}]");
            containers.push(container(c, kind, &path).map_err(|(f, m)| err(f, &m))?);
        }
        for (i, c) in spec.containers.iter().enumerate() {
            let path = format!("spec.containers[{i}]");
            containers.push(container(c, ContainerKind::App, &path).map_err(|(f, m)| err(f, &m))?);
        }
        if !containers.iter().any(|c| c.kind == ContainerKind::App) {
            return Err(err("spec.containers".into(), "at least one is required"));
        }
        Ok(Self {
            key: PodKey {
                namespace,
                name,
                uid,
            },
            containers,
            restart_policy,
            termination_grace,
        })
    }

    /// Sets the cgroup directories of the container `name`; false when there is no such
    /// container.
    pub fn set_cgroups(&mut self, name: &str, cgroups: ContainerCgroups) -> bool {
        match self.containers.iter_mut().find(|c| c.name == name) {
            Some(c) => {
                c.cgroups = cgroups;
                true
            }
            None => false,
        }
    }
}

fn container(
    c: &core::Container,
    kind: ContainerKind,
    path: &str,
) -> Result<ContainerSpec, (String, String)> {
    let fail = |field: &str, message: &str| Err((format!("{path}.{field}"), message.to_owned()));
    if c.name.is_empty() {
        return fail("name", "required");
    }
    let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
    if argv.is_empty() {
        return fail(
            "command",
            "required: qoslet runs commands on the host and has no image entrypoint",
        );
    }
    argv.extend(c.args.iter().flatten().cloned());
    if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        return fail("envFrom", "unsupported by the standalone runtime");
    }
    let mut env = vec![("PATH".to_owned(), DEFAULT_PATH.to_owned())];
    for (i, e) in c.env.iter().flatten().enumerate() {
        if e.value_from.is_some() {
            return fail(
                &format!("env[{i}].valueFrom"),
                "unsupported by the standalone runtime (use value)",
            );
        }
        env.push((e.name.clone(), e.value.clone().unwrap_or_default()));
    }
    let working_dir = match c.working_dir.as_deref() {
        None | Some("") => PathBuf::from("/"),
        Some(d) if d.starts_with('/') => PathBuf::from(d),
        Some(_) => return fail("workingDir", "must be an absolute path"),
    };
    Ok(ContainerSpec {
        name: c.name.clone(),
        kind,
        argv,
        env,
        working_dir,
        cgroups: ContainerCgroups::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> core::Pod {
        serde_yaml_ng::from_str(yaml).expect("test pod")
    }

    #[test]
    fn reads_containers_in_order_with_env_and_defaults() {
        let p = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  restartPolicy: OnFailure
  initContainers:
  - {name: setup, command: [/bin/true]}
  - {name: proxy, restartPolicy: Always, command: [sleep], args: ["100"]}
  containers:
  - name: app
    command: [/bin/sh, -c]
    args: ["echo $X"]
    workingDir: /tmp
    env: [{name: X, value: "1"}, {name: PATH, value: /bin}]
"#);
        let s = PodRuntimeSpec::from_pod(&p).unwrap();
        assert_eq!(s.key.namespace, "default");
        assert_eq!(s.key.uid, derived_uid("default", "web"));
        assert_eq!(s.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(s.termination_grace, DEFAULT_GRACE);
        let kinds: Vec<_> = s.containers.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                ContainerKind::Init,
                ContainerKind::Sidecar,
                ContainerKind::App
            ]
        );
        assert_eq!(s.containers[1].argv, ["sleep", "100"]);
        let app = &s.containers[2];
        assert_eq!(app.argv, ["/bin/sh", "-c", "echo $X"]);
        assert_eq!(app.working_dir, PathBuf::from("/tmp"));
        assert_eq!(app.env.last().unwrap(), &("PATH".into(), "/bin".into()));
        assert_eq!(s.containers[0].working_dir, PathBuf::from("/"));
    }

    #[test]
    fn value_from_is_an_error_naming_the_field() {
        let p = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns}
spec:
  containers:
  - name: c
    command: [x]
    env:
    - {name: A, value: b}
    - name: B
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
"#);
        let e = PodRuntimeSpec::from_pod(&p).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].env[1].valueFrom");
        assert!(
            e.to_string()
                .starts_with("Pod/ns/a: spec.containers[0].env[1].valueFrom: ")
        );
    }

    #[test]
    fn a_container_without_command_is_an_error() {
        let p = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  terminationGracePeriodSeconds: 3\n  containers: [{name: c, image: busybox}]\n",
        );
        let e = PodRuntimeSpec::from_pod(&p).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].command");
    }

    #[test]
    fn set_cgroups_finds_the_container() {
        let p = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: u1}\nspec:\n  terminationGracePeriodSeconds: 3\n  containers: [{name: c, command: [x]}]\n",
        );
        let mut s = PodRuntimeSpec::from_pod(&p).unwrap();
        assert_eq!(s.key.uid, "u1");
        assert_eq!(s.termination_grace, Duration::from_secs(3));
        let cg = ContainerCgroups {
            dirs: vec![CgroupBeneath::own(&std::env::temp_dir(), crate::cgroup::Tree::V2).unwrap()],
        };
        assert!(s.set_cgroups("c", cg.clone()));
        assert!(!s.set_cgroups("d", cg.clone()));
        assert_eq!(s.containers[0].cgroups, cg);
    }
}

//! The resources the fake serves, and request paths parsed into (resource, namespace, name,
//! subresource), following the API server's URL layout:
//! `/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]` and the same under `/apis/GROUP/VERSION`.

/// One served resource type.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether writes to the object ignore `status` and `/status` writes touch only `status`
    /// (the resource has a status subresource).
    pub status_subresource: bool,
    /// Field selector labels the real server accepts besides `metadata.name` and
    /// `metadata.namespace` (each type's `GetAttrs` / field label conversion).
    pub fields: &'static [&'static str],
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const NODE_FIELDS: &[&str] = &["spec.unschedulable"];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];
const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "reason",
    "reportingController",
    "type",
];

/// Every resource type the fake serves. Indexes into this table identify a type.
pub static RESOURCES: &[ResourceType] = &[
    ResourceType {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        fields: POD_FIELDS,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        fields: NODE_FIELDS,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        fields: EVENT_FIELDS,
    },
    ResourceType {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        fields: EVENTS_V1_FIELDS,
    },
    ResourceType {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        fields: &[],
    },
    ResourceType {
        group: "scheduling.k8s.io",
        version: "v1beta1",
        plural: "workloads",
        singular: "workload",
        kind: "Workload",
        namespaced: true,
        status_subresource: true,
        fields: &[],
    },
    ResourceType {
        group: "scheduling.k8s.io",
        version: "v1beta1",
        plural: "podgroups",
        singular: "podgroup",
        kind: "PodGroup",
        namespaced: true,
        status_subresource: true,
        fields: &[],
    },
    ResourceType {
        group: "scheduling.k8s.io",
        version: "v1alpha3",
        plural: "compositepodgroups",
        singular: "compositepodgroup",
        kind: "CompositePodGroup",
        namespaced: true,
        status_subresource: true,
        fields: &[],
    },
];

/// Index of a type in [`RESOURCES`].
pub type ResourceId = usize;

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `leases.coordination.k8s.io`, as error messages name a resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name" || field == "metadata.namespace" || self.fields.contains(&field)
    }
}

/// The type with this apiVersion and kind.
pub fn by_kind(api_version: &str, kind: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.kind == kind && r.api_version() == api_version)
}

fn by_plural(group: &str, version: &str, plural: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// What a request path names.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/api/v1` or `/apis/GROUP/VERSION`
    Resources {
        group: String,
        version: String,
    },
    Object(Target),
    Unknown,
}

/// A request on a resource: a collection when `name` is `None`.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    pub resource: ResourceId,
    /// `None` for cluster-scoped types and for cluster-wide lists of namespaced ones.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    pub fn res(&self) -> &'static ResourceType {
        &RESOURCES[self.resource]
    }
}

pub fn route(path: &str) -> Route {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Route::Unknown,
    };
    let (namespace, rest) = match rest {
        [] => {
            return Route::Resources {
                group: group.to_string(),
                version: version.to_string(),
            };
        }
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let Some((plural, rest)) = rest.split_first() else {
        return Route::Unknown;
    };
    let Some(resource) = by_plural(group, version, plural) else {
        return Route::Unknown;
    };
    let namespaced = RESOURCES[resource].namespaced;
    let (name, subresource) = match rest {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
        _ => return Route::Unknown,
    };
    // A namespaced object is only reachable through its namespace; a cluster-scoped one never is.
    if (namespaced && name.is_some() && namespace.is_none()) || (!namespaced && namespace.is_some())
    {
        return Route::Unknown;
    }
    Route::Object(Target {
        resource,
        namespace,
        name,
        subresource,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_targets() {
        let Route::Object(t) = route("/api/v1/namespaces/ns/pods/p/eviction") else {
            panic!()
        };
        assert_eq!(
            (t.res().kind, t.namespace.as_deref(), t.name.as_deref()),
            ("Pod", Some("ns"), Some("p"))
        );
        assert_eq!(t.subresource.as_deref(), Some("eviction"));
        let Route::Object(t) = route("/api/v1/pods") else {
            panic!()
        };
        assert_eq!((t.namespace, t.name), (None, None));
        let Route::Object(t) =
            route("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1")
        else {
            panic!()
        };
        assert_eq!(t.res().kind, "Lease");
        let Route::Object(t) = route("/api/v1/nodes/n1/status") else {
            panic!()
        };
        assert_eq!(
            (t.res().kind, t.subresource.as_deref()),
            ("Node", Some("status"))
        );
        assert_eq!(route("/api/v1/pods/p"), Route::Unknown);
        assert_eq!(route("/api/v1/namespaces/ns/nodes"), Route::Unknown);
        assert_eq!(route("/apis/apps/v1/deployments"), Route::Unknown);
        assert_eq!(
            route("/apis/events.k8s.io/v1"),
            Route::Resources {
                group: "events.k8s.io".into(),
                version: "v1".into()
            }
        );
    }
}

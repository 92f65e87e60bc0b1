//! What the shipped RBAC (`deploy/kubernetes/rbac.yaml`) allows, checked against the requests
//! the fake received: each request becomes the API server's authorization attributes (verb, API
//! group, resource/subresource, namespace), as its request-info resolver derives them, and must
//! match a rule of a ClusterRole, or of a Role in the request's namespace. The fake itself does
//! not authorize, so without this a request the real API server would refuse with 403 passes.

use serde_json::Value;

use super::RequestRecord;

/// The authorization attributes of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub group: String,
    /// `pods`, or `pods/eviction` for a subresource.
    pub resource: String,
    pub namespace: Option<String>,
}

/// The attributes of a resource request; `None` for a non-resource path (`/version`, `/api`).
pub fn attributes(r: &RequestRecord) -> Option<Attributes> {
    let segs: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return None,
    };
    let watch = r
        .query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (r.method.as_str(), name) {
        ("GET", _) if watch => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => return None,
    };
    Some(Attributes {
        verb,
        group,
        resource: sub.map_or_else(|| resource.to_owned(), |s| format!("{resource}/{s}")),
        namespace,
    })
}

/// The requests in `log` that no rule of the (multi-document) RBAC manifest `rbac_yaml` allows,
/// as "METHOD PATH (verb group resource)".
pub fn denied(log: &[RequestRecord], rbac_yaml: &str) -> Result<Vec<String>, String> {
    let mut grants: Vec<(Option<String>, Value)> = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(rbac_yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
        let scope = match v["kind"].as_str() {
            Some("ClusterRole") => None,
            Some("Role") => Some(
                v["metadata"]["namespace"]
                    .as_str()
                    .ok_or("a Role without a namespace")?
                    .to_owned(),
            ),
            _ => continue,
        };
        for rule in v["rules"].as_array().into_iter().flatten() {
            grants.push((scope.clone(), rule.clone()));
        }
    }
    let listed = |rule: &Value, key: &str, want: &str| {
        rule[key]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x == want || x == "*"))
    };
    Ok(log
        .iter()
        .filter_map(|r| Some((r, attributes(r)?)))
        .filter(|(_, a)| {
            !grants.iter().any(|(scope, rule)| {
                scope
                    .as_ref()
                    .is_none_or(|ns| a.namespace.as_ref() == Some(ns))
                    && listed(rule, "apiGroups", &a.group)
                    && listed(rule, "resources", &a.resource)
                    && listed(rule, "verbs", a.verb)
            })
        })
        .map(|(r, a)| {
            format!(
                "{} {} ({} {:?} {})",
                r.method, r.path, a.verb, a.group, a.resource
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, query: &str) -> RequestRecord {
        RequestRecord {
            method: method.into(),
            path: path.into(),
            query: query.into(),
            content_type: None,
            body: None,
            code: 200,
        }
    }

    #[test]
    fn requests_map_to_the_api_servers_attributes() {
        let a = attributes(&req("POST", "/api/v1/namespaces/ns/pods/hog/eviction", "")).unwrap();
        assert_eq!(
            (a.verb, a.group.as_str(), a.resource.as_str()),
            ("create", "", "pods/eviction")
        );
        let a = attributes(&req("GET", "/api/v1/pods", "fieldSelector=x&watch=true")).unwrap();
        assert_eq!(
            (a.verb, a.resource.as_str(), a.namespace),
            ("watch", "pods", None)
        );
        let a = attributes(&req(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/qoslet-system/leases/qoslet-n",
            "",
        ))
        .unwrap();
        assert_eq!(
            (a.verb, a.group.as_str(), a.namespace.as_deref()),
            ("update", "coordination.k8s.io", Some("qoslet-system"))
        );
    }

    #[test]
    fn a_role_grants_only_in_its_namespace() {
        let rbac = "kind: Role\nmetadata: {namespace: a}\nrules:\n- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [update]\n---\nkind: ClusterRole\nrules:\n- apiGroups: ['']\n  resources: [pods]\n  verbs: [get]\n";
        let log = [
            req(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                "",
            ),
            req(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/b/leases/l",
                "",
            ),
            req("GET", "/api/v1/namespaces/x/pods/p", ""),
            req("PATCH", "/api/v1/namespaces/x/pods/p/status", ""),
        ];
        let denied = denied(&log, rbac).unwrap();
        assert_eq!(denied.len(), 2, "{denied:?}");
        assert!(denied[0].contains("namespaces/b/leases"));
        assert!(denied[1].contains("pods/status"));
    }
}

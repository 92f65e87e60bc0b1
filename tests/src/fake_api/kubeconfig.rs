//! A kubeconfig file that points kube (and `qoslet run --kube --kubeconfig FILE`) at the fake.

/// The kubeconfig text for a server at `url`, with `namespace` as the context's default.
/// The user has no credentials: the fake does not authenticate.
pub fn kubeconfig(url: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: qoslet-fake
  cluster:
    server: {url}
contexts:
- name: qoslet-fake
  context:
    cluster: qoslet-fake
    user: qoslet-fake
    namespace: {namespace}
current-context: qoslet-fake
users:
- name: qoslet-fake
  user: {{}}
"
    )
}

//! A kubeconfig file that points kube (and `qoslet run --kube --kubeconfig FILE`) at the fake.

/// A self-signed CA certificate (made once with `openssl req -x509`, key discarded) that the
/// kubeconfig names, as every in-cluster configuration names one. The fake serves plain HTTP, so
/// it is never used to verify anything; without any CA, kube's rustls client falls back to the
/// system's trust store and refuses to start where there is none (the test VM's initramfs).
const CA_PEM: &[u8] = include_bytes!("ca.pem");

/// The kubeconfig text for a server at `url`, with `namespace` as the context's default.
/// The user has no credentials: the fake does not authenticate.
pub fn kubeconfig(url: &str, namespace: &str) -> String {
    // ByteString serialises as a quoted base64 string, the form of `certificate-authority-data`.
    let ca =
        serde_json::to_string(&k8s_openapi::ByteString(CA_PEM.to_vec())).expect("bytes serialise");
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: qoslet-fake
  cluster:
    server: {url}
    certificate-authority-data: {ca}
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

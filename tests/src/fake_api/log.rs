//! The request log tests assert against: one record per request, in arrival order.

use serde_json::Value;

/// One request as the fake received and answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw query string ("" when none).
    pub query: String,
    pub content_type: Option<String>,
    /// The body parsed as JSON (YAML for apply patches); `None` when empty or unparsable.
    pub body: Option<Value>,
    /// The HTTP status answered (200 for a watch, whatever its events).
    pub code: u16,
}

impl RequestRecord {
    /// The value of query parameter `name`, percent-decoded.
    pub fn param(&self, name: &str) -> Option<String> {
        url_decode_pairs(&self.query)
            .into_iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch").as_deref(), Some("true" | "1"))
    }
}

/// `a=b&c=d` into pairs, as `application/x-www-form-urlencoded` decodes.
pub fn url_decode_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

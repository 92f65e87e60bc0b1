//! Field and label selectors (`fieldSelector`, `labelSelector` query parameters) with the real
//! server's grammar: field selectors are `,`-joined `field=value`, `field==value`,
//! `field!=value` terms on the fields a type supports (an unknown field is a 400); label
//! selectors add the set-based forms `key in (a,b)`, `key notin (a,b)`, `key` and `!key`.

use serde_json::Value;

use super::{resources::ResourceType, status::ApiError};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed `fieldSelector` and `labelSelector`; the default selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    fields: Vec<Requirement>,
    labels: Vec<Requirement>,
}

impl Selector {
    pub fn parse(
        res: &ResourceType,
        fields: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Self, ApiError> {
        let fields = match fields {
            Some(s) => parse_fields(res, s)?,
            None => Vec::new(),
        };
        let labels = match labels {
            Some(s) => parse_labels(s)?,
            None => Vec::new(),
        };
        Ok(Self { fields, labels })
    }

    pub fn matches(&self, object: &Value) -> bool {
        let fields_match = self.fields.iter().all(|r| {
            let value = field_value(object, &r.key);
            match &r.op {
                Op::Eq(v) => value == *v,
                Op::NotEq(v) => value != *v,
                _ => false,
            }
        });
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        fields_match
            && self.labels.iter().all(|r| match &r.op {
                Op::Eq(v) => label(&r.key) == Some(v.as_str()),
                Op::NotEq(v) => label(&r.key) != Some(v.as_str()),
                Op::In(vs) => label(&r.key).is_some_and(|l| vs.iter().any(|v| v == l)),
                Op::NotIn(vs) => label(&r.key).is_none_or(|l| vs.iter().all(|v| v != l)),
                Op::Exists => label(&r.key).is_some(),
                Op::NotExists => label(&r.key).is_none(),
            })
    }
}

/// The field's value as the selector compares it: strings as they are, booleans and numbers
/// printed, a missing field as "".
fn field_value(object: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    match object.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn parse_fields(res: &ResourceType, s: &str) -> Result<Vec<Requirement>, ApiError> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (key, op) = if let Some((k, v)) = term.split_once("!=") {
            (k, Op::NotEq(v.to_string()))
        } else if let Some((k, v)) = term.split_once("==") {
            (k, Op::Eq(v.to_string()))
        } else if let Some((k, v)) = term.split_once('=') {
            (k, Op::Eq(v.to_string()))
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid field selector: invalid selector: '{s}'; can't understand '{term}'"
            )));
        };
        let key = key.trim();
        if !res.supports_field(key) {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {key}"
            )));
        }
        out.push(Requirement {
            key: key.to_string(),
            op,
        });
    }
    Ok(out)
}

/// Splits on commas outside parentheses.
fn terms(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0usize, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn parse_labels(s: &str) -> Result<Vec<Requirement>, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "unable to parse requirement: invalid label selector: '{s}'"
        ))
    };
    let set = |rest: &str| -> Result<Vec<String>, ApiError> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(bad)?;
        Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
    };
    let mut out = Vec::new();
    for term in terms(s) {
        let (key, op) = if let Some(k) = term.strip_prefix('!') {
            (k, Op::NotExists)
        } else if let Some((k, v)) = term.split_once("!=") {
            (k, Op::NotEq(v.trim().to_string()))
        } else if let Some((k, v)) = term.split_once("==") {
            (k, Op::Eq(v.trim().to_string()))
        } else if let Some((k, v)) = term.split_once('=') {
            (k, Op::Eq(v.trim().to_string()))
        } else if let Some((k, rest)) = term.split_once(" notin ") {
            (k, Op::NotIn(set(rest)?))
        } else if let Some((k, rest)) = term.split_once(" in ") {
            (k, Op::In(set(rest)?))
        } else {
            (term, Op::Exists)
        };
        let key = key.trim();
        if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '(' || c == ')') {
            return Err(bad());
        }
        out.push(Requirement {
            key: key.to_string(),
            op,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_api::resources::RESOURCES;

    fn pod() -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"app": "web", "tier": "x"}},
               "spec": {"nodeName": "n1", "hostNetwork": false}})
    }

    #[test]
    fn selectors_follow_the_server_grammar() {
        let pods = &RESOURCES[0];
        let sel =
            |f: Option<&str>, l: Option<&str>| Selector::parse(pods, f, l).unwrap().matches(&pod());
        assert!(sel(Some("spec.nodeName=n1,metadata.namespace==ns"), None));
        assert!(!sel(Some("spec.nodeName=n2"), None));
        assert!(sel(Some("spec.nodeName!=n2"), None));
        assert!(sel(Some("spec.hostNetwork=false"), None));
        assert!(!sel(Some("status.phase=Running"), None));
        assert!(sel(Some("status.phase="), None));
        assert!(sel(None, Some("app=web,tier in (x, y),!gone,tier")));
        assert!(!sel(None, Some("app notin (web)")));
        assert!(!sel(None, Some("app!=web")));
        assert_eq!(
            Selector::parse(pods, Some("spec.foo=1"), None)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            Selector::parse(&RESOURCES[1], Some("spec.nodeName=n1"), None)
                .unwrap_err()
                .code,
            400
        );
    }
}

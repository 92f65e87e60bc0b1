//! Seed files: JSON or YAML, holding one object, a `List` (`items`), a JSON array, or several
//! YAML documents, in any mix.

use std::path::Path;

use serde::Deserialize as _;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("cannot read seed file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse seed file {path}")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
}

/// The objects in a seed file, in file order.
pub fn load(path: &Path) -> Result<Vec<Value>, SeedError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SeedError::Read {
        path: shown.clone(),
        source,
    })?;
    parse(&text).map_err(|source| SeedError::Parse {
        path: shown,
        source,
    })
}

/// The objects in seed text (JSON is YAML, so one parser reads both).
pub fn parse(text: &str) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    let mut out = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(document)?;
        flatten(value, &mut out);
    }
    Ok(out)
}

fn flatten(value: Value, out: &mut Vec<Value>) {
    match value {
        Value::Null => {}
        Value::Array(items) => items.into_iter().for_each(|v| flatten(v, out)),
        Value::Object(mut map)
            if map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List")) =>
        {
            if let Some(Value::Array(items)) = map.remove("items") {
                items.into_iter().for_each(|v| flatten(v, out));
            }
        }
        other => out.push(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_read_lists_arrays_and_documents() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: n1}}\n---\n\
                    [{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"p\"}}]\n---\n";
        let objects = parse(text).unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["Node", "Pod"]);
    }
}

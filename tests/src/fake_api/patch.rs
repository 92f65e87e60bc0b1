//! PATCH bodies applied to a JSON object.
//!
//! - `application/merge-patch+json`: RFC 7386 (objects merge, `null` deletes, everything else
//!   replaces, lists included).
//! - `application/strategic-merge-patch+json`: the same, except that lists whose Go field
//!   carries `patchStrategy:"merge"` merge element by element on their `patchMergeKey`. The fake
//!   knows the merge keys of the fields a node agent patches (the table below: conditions by
//!   `type`, containers and volumes by `name`, ...); any other list replaces. The directives
//!   `$patch: delete` (in a list element, removes it) and `$patch: replace` (in an object,
//!   replaces it) are honoured; the other `$` keys (`$setElementOrder/...`, `$retainKeys`,
//!   `$deleteFromPrimitiveList/...`) are dropped, not obeyed.
//! - `application/apply-patch+yaml` (server-side apply) is applied as a strategic merge: no
//!   managed fields, no field ownership, no removal of fields a manager stopped applying.
//!
//! `application/json-patch+json` (RFC 6902) is not implemented (415).

use serde_json::{Map, Value};

/// List fields that merge by key, by field name: `patchMergeKey` of the k8s.io/api types.
const MERGE_KEYS: &[(&str, &str)] = &[
    ("conditions", "type"),
    ("containers", "name"),
    ("initContainers", "name"),
    ("ephemeralContainers", "name"),
    ("volumes", "name"),
    ("volumeMounts", "mountPath"),
    ("env", "name"),
    ("ownerReferences", "uid"),
    ("addresses", "type"),
    ("taints", "key"),
    ("imagePullSecrets", "name"),
];

/// The patch flavours the fake understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Applies `patch` to `target` in place.
pub fn apply(kind: PatchType, target: &mut Value, patch: &Value) {
    match kind {
        PatchType::Merge => merge(target, patch),
        PatchType::Strategic | PatchType::Apply => strategic(target, patch),
    }
}

/// RFC 7386.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") || !target.is_object() {
        *target = strip_directives(&Value::Object(patch.clone()));
        return;
    }
    let target = target.as_object_mut().expect("checked above");
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        match (value, merge_key(key)) {
            (Value::Null, _) => {
                target.remove(key);
            }
            (Value::Array(items), Some(merge_key)) => {
                let slot = target
                    .entry(key.clone())
                    .or_insert(Value::Array(Vec::new()));
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                merge_list(
                    slot.as_array_mut().expect("made an array above"),
                    items,
                    merge_key,
                );
            }
            (Value::Array(_), None) => {
                target.insert(key.clone(), strip_directives(value));
            }
            (Value::Object(_), _) => {
                strategic(target.entry(key.clone()).or_insert(Value::Null), value);
            }
            _ => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

fn merge_key(field: &str) -> Option<&'static str> {
    MERGE_KEYS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, k)| *k)
}

/// Merges list elements by `key`: a patch element with the key of an existing one is merged into
/// it (or removes it, with `$patch: delete`); a new key is appended.
fn merge_list(target: &mut Vec<Value>, patch: &[Value], key: &str) {
    for item in patch {
        let Some(id) = item.get(key) else {
            target.push(strip_directives(item));
            continue;
        };
        let position = target.iter().position(|t| t.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                target.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic(&mut target[i], item),
            (None, false) => target.push(strip_directives(item)),
        }
    }
}

fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge(&mut v, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(v, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn strategic_patch_merges_conditions_by_type() {
        let mut v = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "MemoryPressure", "status": "False", "reason": "Ok"},
        ], "images": [{"names": ["a"]}]}});
        let patch = json!({"status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "MemoryPressure"}],
            "conditions": [{"type": "MemoryPressure", "status": "True", "reason": null}, {"type": "PIDPressure", "status": "False"}],
            "images": [{"names": ["b"]}],
        }});
        strategic(&mut v, &patch);
        assert_eq!(
            v,
            json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "MemoryPressure", "status": "True"},
            {"type": "PIDPressure", "status": "False"},
        ], "images": [{"names": ["b"]}]}})
        );
        strategic(
            &mut v,
            &json!({"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}),
        );
        assert_eq!(v["status"]["conditions"].as_array().unwrap().len(), 2);
    }
}

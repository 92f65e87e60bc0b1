//! Unknown fields: the keys of a document its type does not read, each with its path
//! (`spec.containers[0].resoures`) and, where a field the type reads is close, that name
//! ("did you mean `resources`?").
//!
//! The type itself says what it reads: serde hands the names of a struct's fields to
//! `deserialize_struct`, and a key the struct does not read is skipped through
//! `deserialize_ignored_any` (the k8s-openapi types and serde's derive both do so). So the
//! document is decoded once more through [`Walk`], a deserializer over the loaded
//! `serde_yaml_ng::Value` that knows the path of every node, remembers each struct's field names
//! and notes every key skipped: no list of field names is kept by hand, and what is known is
//! exactly what the decoding reads. `serde_ignored` finds the skipped keys' paths too, but not
//! the names the struct reads, which the suggestion needs; scalars and enums are decoded by
//! serde_yaml_ng itself, so the walk accepts what the real decoding accepts. Edit distances are
//! `strsim`'s (already built for clap).
//!
//! Hostile input is bounded: at most `limit` unknown fields are kept per document (the rest are
//! counted), a suggestion is looked for only for keys of at most [`MAX_SUGGEST_LEN`] bytes, and
//! [`shown`] shortens what is printed.

use std::cell::RefCell;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer as _, Visitor};
use serde_yaml_ng::Value;

/// Keys longer than this get no suggestion (the distance is quadratic in the length).
pub(crate) const MAX_SUGGEST_LEN: usize = 64;

/// The longest path built (see [`Walk::extended`]).
const MAX_PATH_BYTES: usize = 1024;

/// The most characters of a path or key printed (see [`shown`]).
pub(crate) const MAX_SHOWN: usize = 120;

/// A key that the document's type does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnknownField {
    /// The path of the key, as problems name fields: `spec.containers[0].resoures`.
    pub(crate) path: String,
    /// A field of the same struct whose name is close.
    pub(crate) suggestion: Option<&'static str>,
}

impl UnknownField {
    /// `unknown field (did you mean `resources`?)`: the message of a problem at [`Self::path`].
    pub(crate) fn message(&self) -> String {
        match self.suggestion {
            Some(s) => format!("unknown field (did you mean `{s}`?)"),
            None => "unknown field".into(),
        }
    }
}

/// The unknown fields of `value` decoded as `T`, the first `limit` of them, and how many more.
/// A value that does not decode yields those found before the error (the decoding itself
/// reports the error).
pub(crate) fn unknown_fields<T: DeserializeOwned>(
    value: &Value,
    limit: usize,
) -> (Vec<UnknownField>, usize) {
    let found = RefCell::new(Found {
        fields: Vec::new(),
        more: 0,
        limit,
    });
    let walk = Walk {
        value,
        path: String::new(),
        found: &found,
        parent: None,
    };
    let _ = T::deserialize(walk);
    let f = found.into_inner();
    (f.fields, f.more)
}

/// The closest of `known` to `key` when it is close: an edit (Damerau-Levenshtein, case counted)
/// distance of at most a third of the longer name, 1 for names under 6 characters.
pub(crate) fn did_you_mean(key: &str, known: &[&'static str]) -> Option<&'static str> {
    if key.len() > MAX_SUGGEST_LEN {
        return None;
    }
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .filter(|(d, k)| {
            let allowed = (key.len().max(k.len()) / 3).max(1);
            *d > 0 && *d <= allowed
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// `text` as printed: control characters escaped, at most [`MAX_SHOWN`] characters, then `…`.
pub(crate) fn shown(text: &str) -> String {
    let escaped: String = text.chars().flat_map(char::escape_debug).collect();
    if escaped.chars().count() <= MAX_SHOWN {
        escaped
    } else {
        let mut s: String = escaped.chars().take(MAX_SHOWN).collect();
        s.push('…');
        s
    }
}

struct Found {
    fields: Vec<UnknownField>,
    more: usize,
    limit: usize,
}

/// Where a node is: the value of a key of a struct (whose fields are known) or of a map.
#[derive(Clone, Copy)]
struct Parent<'a> {
    key: &'a str,
    fields: Option<&'static [&'static str]>,
}

/// A deserializer over one node of a loaded document that knows its path.
struct Walk<'a> {
    value: &'a Value,
    path: String,
    found: &'a RefCell<Found>,
    parent: Option<Parent<'a>>,
}

impl<'a> Walk<'a> {
    fn child(&self, value: &'a Value, path: String, parent: Option<Parent<'a>>) -> Walk<'a> {
        Walk {
            value,
            path,
            found: self.found,
            parent,
        }
    }

    /// A child's path; past [`MAX_PATH_BYTES`] the path stops growing (it is shortened when
    /// printed anyway), so that hostile nesting of long keys costs no more than its size.
    fn extended(&self, child: impl FnOnce(&str) -> String) -> String {
        if self.path.len() >= MAX_PATH_BYTES {
            self.path.clone()
        } else {
            child(&self.path)
        }
    }

    fn map<V: Visitor<'a>>(
        self,
        fields: Option<&'static [&'static str]>,
        visitor: V,
    ) -> Result<V::Value, serde_yaml_ng::Error> {
        match self.value {
            Value::Mapping(m) => visitor.visit_map(MapWalk {
                walk: &self,
                iter: m.iter(),
                pending: None,
                fields,
            }),
            v => v.clone().deserialize_map(visitor),
        }
    }

    fn seq<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, serde_yaml_ng::Error> {
        match self.value {
            Value::Sequence(s) => visitor.visit_seq(SeqWalk {
                walk: &self,
                iter: s.iter().enumerate(),
            }),
            v => v.clone().deserialize_seq(visitor),
        }
    }
}

/// Scalars, enums and the like: serde_yaml_ng's own decoding of the node.
macro_rules! delegate {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
            self.value.clone().$method($($arg,)* visitor)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Walk<'de> {
    type Error = serde_yaml_ng::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Mapping(_) => self.map(None, visitor),
            Value::Sequence(_) => self.seq(visitor),
            v => v.clone().deserialize_any(visitor),
        }
    }

    /// A plain scalar where a string is wanted reads as its text, as serde_yaml_ng reads a file
    /// (`kubernetesVersion: 1.36`), so the walk goes on where the decoding of the file does.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Number(n) => visitor.visit_string(n.to_string()),
            Value::Bool(b) => visitor.visit_string(b.to_string()),
            v => v.clone().deserialize_str(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Mapping(_) => self.map(Some(fields), visitor),
            v => v.clone().deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.map(None, visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.seq(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.seq(visitor)
    }

    /// A key the struct does not read (or any skipped value: only a struct's key is noted).
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if let Some(Parent {
            fields: Some(fields),
            key,
        }) = self.parent
        {
            let mut f = self.found.borrow_mut();
            if f.fields.len() < f.limit {
                let suggestion = did_you_mean(key, fields);
                f.fields.push(UnknownField {
                    path: self.path,
                    suggestion,
                });
            } else {
                f.more = f.more.saturating_add(1);
            }
        }
        visitor.visit_unit()
    }

    delegate! {
        deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(),
        deserialize_u32(), deserialize_u64(), deserialize_u128(), deserialize_f32(),
        deserialize_f64(), deserialize_char(),
        deserialize_bytes(), deserialize_byte_buf(), deserialize_unit(),
        deserialize_identifier(),
        deserialize_unit_struct(name: &'static str),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
    }
}

/// A mapping's keys (serde_yaml_ng's decoding) and values (walked, each with its path).
struct MapWalk<'w, 'a> {
    walk: &'w Walk<'a>,
    iter: serde_yaml_ng::mapping::Iter<'a>,
    pending: Option<(&'a Value, &'a Value)>,
    fields: Option<&'static [&'static str]>,
}

impl<'de> de::MapAccess<'de> for MapWalk<'_, 'de> {
    type Error = serde_yaml_ng::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((k, v)) = self.iter.next() else {
            return Ok(None);
        };
        self.pending = Some((k, v));
        seed.deserialize(k.clone()).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        let Some((k, v)) = self.pending.take() else {
            return Err(de::Error::custom("a value without its key"));
        };
        let key = k.as_str().unwrap_or("?");
        let path = self.walk.extended(|p| {
            if p.is_empty() {
                key.to_owned()
            } else {
                format!("{p}.{key}")
            }
        });
        let parent = Parent {
            key,
            fields: self.fields,
        };
        seed.deserialize(self.walk.child(v, path, Some(parent)))
    }
}

/// A sequence's items, walked, each with its path (`containers[0]`).
struct SeqWalk<'w, 'a> {
    walk: &'w Walk<'a>,
    iter: std::iter::Enumerate<std::slice::Iter<'a, Value>>,
}

impl<'de> de::SeqAccess<'de> for SeqWalk<'_, 'de> {
    type Error = serde_yaml_ng::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Self::Error> {
        let Some((i, v)) = self.iter.next() else {
            return Ok(None);
        };
        let path = self.walk.extended(|p| format!("{p}[{i}]"));
        seed.deserialize(self.walk.child(v, path, None)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(text: &str) -> Value {
        serde_yaml_ng::from_str(text).expect("yaml")
    }

    #[test]
    fn a_pods_unknown_fields_have_their_paths_and_suggestions() {
        let v = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, lables: {x: y}}\nspec:\n  containers:\n  - name: c\n    image: x\n    resoures: {limits: {cpu: 1}}\n    zzzzzzzz: 1\n  - name: d\n    resources: {limits: {cpu: 1}, requets: {}}\n  nodeSelector: {anything: goes}\nstatuss: {}\n",
        );
        let (fields, more) = unknown_fields::<Pod>(&v, 10);
        let got: Vec<(String, Option<&str>)> =
            fields.into_iter().map(|f| (f.path, f.suggestion)).collect();
        assert_eq!(
            got,
            [
                ("metadata.lables".to_owned(), Some("labels")),
                ("spec.containers[0].resoures".to_owned(), Some("resources")),
                ("spec.containers[0].zzzzzzzz".to_owned(), None),
                (
                    "spec.containers[1].resources.requets".to_owned(),
                    Some("requests")
                ),
                ("statuss".to_owned(), Some("status")),
            ]
        );
        assert_eq!(more, 0);
        let (fields, more) = unknown_fields::<Pod>(&v, 2);
        assert_eq!((fields.len(), more), (2, 3));
    }

    #[test]
    fn a_valid_pod_has_none_and_maps_take_any_key() {
        let v = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {lables: y}, annotations: {x: \"1\"}}\nspec:\n  containers: [{name: c, image: x, resources: {limits: {cpu: \"1\", memory: 1Gi}}, env: [{name: A, value: b}]}]\n  nodeSelector: {anything: goes}\n  overhead: {cpu: 10m}\n",
        );
        assert_eq!(unknown_fields::<Pod>(&v, 10), (Vec::new(), 0));
    }

    #[test]
    fn suggestions_are_for_close_names_only() {
        let known = &["resources", "name", "image", "metricsAddress"][..];
        assert_eq!(did_you_mean("resoures", known), Some("resources"));
        assert_eq!(did_you_mean("resoruces", known), Some("resources"));
        assert_eq!(did_you_mean("metricsAdress", known), Some("metricsAddress"));
        assert_eq!(did_you_mean("nmae", known), Some("name"));
        assert_eq!(did_you_mean("colour", known), None);
        assert_eq!(did_you_mean("name", known), None, "a known name is no typo");
        assert_eq!(did_you_mean(&"r".repeat(10_000), known), None);
    }

    #[test]
    fn shown_text_is_bounded_and_escaped() {
        assert_eq!(shown("a\nb"), "a\\nb");
        let long = shown(&"x".repeat(10_000));
        assert_eq!(long.chars().count(), MAX_SHOWN + 1);
        assert!(long.ends_with('…'));
    }
}

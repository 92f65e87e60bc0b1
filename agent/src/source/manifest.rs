//! Reading Kubernetes-style YAML manifests from files and directories.
//!
//! Each document becomes a [`RawObject`] that remembers where it came from, so every later error
//! can name the file, the object and the field. Typed decoding is the job of the module that owns
//! the kind (policy for Pods and KubeletConfiguration, workload for the scheduling kinds).
//!
//! Hostile YAML is bounded: alias expansion by serde_yaml_ng's repetition limit (a "billion
//! laughs" document is refused in about 0.1 s), nesting by [`super::nesting`] before serde_yaml_ng
//! loads the document (its own recursion limit, 128, applies only after libyaml has scanned the
//! whole document, in time quadratic in the depth), file sizes by [`super::file`]. The tests at
//! the end of this file pin the first two.

use std::{
    collections::BTreeMap,
    fmt, fs,
    path::{Path, PathBuf},
};

use serde::Deserialize as _;
use thiserror::Error;

use super::{fields::shown, file::read_bounded, nesting::check_nesting, yaml::key_lines};
use crate::workload::{self, DecodeError, Decoder, Kind, Object, Origin, Problem, Typed};

/// A path as problems name fields (`spec.containers[0].resources`; empty for the document).
pub(crate) fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut s = String::new();
    for seg in path {
        match seg {
            Segment::Seq { index } => s.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(key);
            }
            Segment::Unknown => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push('?');
            }
        }
    }
    s
}

/// A manifest could not be read at all (exit status 2 in the CLI).
#[derive(Debug, Error)]
#[error("{path}: cannot read")]
pub(crate) struct UnreadableError {
    pub(crate) path: PathBuf,
    #[source]
    pub(crate) source: std::io::Error,
}

/// A manifest was read but a document in it is not a Kubernetes object (exit status 1).
#[derive(Debug, Error)]
#[error("{file}: document {index}: {message}")]
pub struct MalformedError {
    pub(crate) file: PathBuf,
    /// 0-based position of the document in its file.
    pub(crate) index: usize,
    /// The field that does not decode (`spec.containers[0].resources`), empty for the document.
    pub(crate) field: String,
    pub(crate) message: String,
}

/// The outcome of loading a set of paths: objects and the documents that were malformed.
#[derive(Debug, Default)]
pub struct Loaded {
    pub objects: Vec<RawObject>,
    /// Objects that are typed already (the API's pods and workload objects): admitted as they
    /// are, without a detour through a document (`source::admit::admit_typed`).
    pub(crate) typed: Vec<(Origin, Typed)>,
    pub malformed: Vec<MalformedError>,
    /// The text of each file read by [`load_paths`], so that a problem can be given its line
    /// ([`Loaded::locate`]).
    pub(crate) texts: BTreeMap<PathBuf, String>,
}

impl Loaded {
    /// Gives each problem in a file of [`Self::texts`] its line: that of its field, else of
    /// the field's nearest ancestor in the document, else of the document. One pass per file.
    pub(crate) fn locate(texts: &BTreeMap<PathBuf, String>, problems: &mut [&mut Problem]) {
        let mut by_file: BTreeMap<&Path, Vec<usize>> = BTreeMap::new();
        for (i, p) in problems.iter().enumerate() {
            by_file.entry(p.origin.file.as_path()).or_default().push(i);
        }
        let mut lines = Vec::new();
        for (file, at) in by_file {
            let Some(text) = texts.get(file) else {
                continue;
            };
            let wanted: Vec<(usize, &str)> = at
                .iter()
                .map(|i| (problems[*i].origin.index, problems[*i].field.as_str()))
                .collect();
            let found = key_lines(text, &wanted);
            for i in at {
                let p = &problems[i];
                lines.push((i, found.get(&(p.origin.index, p.field.clone())).copied()));
            }
        }
        for (i, line) in lines {
            problems[i].line = line;
        }
    }
}

/// One document of a manifest file.
#[derive(Debug, Clone)]
pub struct RawObject {
    pub(crate) file: PathBuf,
    pub(crate) index: usize,
    pub(crate) api_version: String,
    pub(crate) kind: String,
    /// Empty for cluster-scoped kinds and kinds without metadata (KubeletConfiguration).
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) value: serde_yaml_ng::Value,
}

impl RawObject {
    /// `Kind/namespace/name` as error lines print it (`Kind/name` without a namespace).
    pub(crate) fn display_id(&self) -> ObjectId<'_> {
        ObjectId(self)
    }

    /// Decodes the document into `T`, naming the file, the object and the field on failure
    /// (serde's own errors do not say which field).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, MalformedError> {
        serde_path_to_error::deserialize(self.value.clone()).map_err(|e| {
            let field = field_path(e.path());
            let at = if field.is_empty() {
                String::new()
            } else {
                format!("{}: ", shown(&field))
            };
            MalformedError {
                file: self.file.clone(),
                index: self.index,
                message: format!("{}: {at}{}", self.display_id(), e.inner()),
                field,
            }
        })
    }

    /// Where the document was read from.
    pub(crate) fn origin(&self) -> Origin {
        Origin {
            file: self.file.clone(),
            index: self.index,
        }
    }

    /// The document's kind, when it is one of the hierarchy's in the API version qoslet reads.
    pub(crate) fn hierarchy_kind(&self) -> Result<Kind, DecodeError> {
        workload::kind_of(&self.api_version, &self.kind)
    }

    /// The document decoded as the typed object of its kind (k8s-openapi's), for the hierarchy.
    pub(crate) fn typed(&self) -> Result<Typed, DecodeError> {
        let kind = self.hierarchy_kind()?;
        Typed::decode(kind, self).map_err(|e| self.schema_error(kind, e))
    }

    /// The document as the hierarchy's [`Object`].
    pub fn hierarchy_object(&self) -> Result<Object, DecodeError> {
        Ok(workload::object(self.typed()?, self.origin()))
    }

    /// A document of `kind` that does not decode, its message without the object's name (the
    /// problem line names it).
    pub(crate) fn schema_error(&self, kind: Kind, e: MalformedError) -> DecodeError {
        let id = format!("{}: ", self.display_id());
        DecodeError::Schema {
            kind,
            message: e.message.strip_prefix(&id).unwrap_or(&e.message).to_owned(),
            field: e.field,
        }
    }
}

impl Decoder for RawObject {
    type Error = MalformedError;

    fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, MalformedError> {
        RawObject::decode(self)
    }
}

pub(crate) struct ObjectId<'a>(&'a RawObject);

impl fmt::Display for ObjectId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        match (o.namespace.is_empty(), o.name.is_empty()) {
            (_, true) => write!(f, "{}", o.kind),
            (true, false) => write!(f, "{}/{}", o.kind, o.name),
            (false, false) => write!(f, "{}/{}/{}", o.kind, o.namespace, o.name),
        }
    }
}

/// Loads every YAML/JSON document under `paths`. Directories are read non-recursively, in file
/// name order, taking `*.yaml`, `*.yml` and `*.json`; hidden files are skipped. Each file must be
/// a regular file of at most `max_bytes` (see [`super::file`]).
pub(crate) fn load_paths(paths: &[PathBuf], max_bytes: u64) -> Result<Loaded, UnreadableError> {
    let mut loaded = Loaded::default();
    for path in paths {
        for file in expand(path)? {
            let text = read_bounded(&file, max_bytes).map_err(|source| UnreadableError {
                path: file.clone(),
                source,
            })?;
            parse_documents(&file, &text, &mut loaded);
            loaded.texts.insert(file, text);
        }
    }
    Ok(loaded)
}

/// The manifest files a path stands for.
pub(crate) fn expand(path: &Path) -> Result<Vec<PathBuf>, UnreadableError> {
    let unreadable = |source| UnreadableError {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(unreadable)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in fs::read_dir(path).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let p = entry.path();
        if is_manifest_file(&p) && entry.file_type().map_err(unreadable)?.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// Whether a directory entry is a manifest qoslet reads.
pub(crate) fn is_manifest_file(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = path.extension().and_then(|e| e.to_str());
    !hidden && matches!(ext, Some("yaml" | "yml" | "json"))
}

/// Splits `text` into documents and appends them to `loaded`. Empty documents are skipped.
pub fn parse_documents(file: &Path, text: &str, loaded: &mut Loaded) {
    if let Err(e) = check_nesting(text) {
        loaded.malformed.push(MalformedError {
            file: file.to_path_buf(),
            index: 0,
            field: String::new(),
            message: format!("invalid YAML: {e}"),
        });
        return;
    }
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let malformed = |message: String| MalformedError {
            file: file.to_path_buf(),
            index,
            field: String::new(),
            message,
        };
        let value = match serde_yaml_ng::Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                loaded
                    .malformed
                    .push(malformed(format!("invalid YAML: {e}")));
                // A syntax error ends the stream; later documents cannot be located reliably.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        match raw_object(file, index, value) {
            Ok(o) => loaded.objects.push(o),
            Err(message) => loaded.malformed.push(malformed(message)),
        }
    }
}

fn raw_object(file: &Path, index: usize, value: serde_yaml_ng::Value) -> Result<RawObject, String> {
    let str_field = |v: &serde_yaml_ng::Value, key: &str| -> Option<String> {
        v.get(key).and_then(|s| s.as_str()).map(str::to_owned)
    };
    if !value.is_mapping() {
        return Err("not a Kubernetes object (expected a mapping)".into());
    }
    let kind = str_field(&value, "kind").ok_or("kind: missing")?;
    let api_version = str_field(&value, "apiVersion").ok_or("apiVersion: missing")?;
    let meta = value.get("metadata");
    let name = meta.and_then(|m| str_field(m, "name")).unwrap_or_default();
    let namespace = meta
        .and_then(|m| str_field(m, "namespace"))
        .unwrap_or_default();
    Ok(RawObject {
        file: file.to_path_buf(),
        index,
        api_version,
        kind,
        namespace,
        name,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_multi_document_files_and_names_objects() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: ns}\n---\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n";
        let mut loaded = Loaded::default();
        parse_documents(Path::new("x.yaml"), text, &mut loaded);
        assert!(loaded.malformed.is_empty());
        let ids: Vec<String> = loaded
            .objects
            .iter()
            .map(|o| o.display_id().to_string())
            .collect();
        assert_eq!(ids, ["Pod/ns/a", "Pod/b"]);
    }

    #[test]
    fn reports_documents_without_kind() {
        let mut loaded = Loaded::default();
        parse_documents(
            Path::new("x.yaml"),
            "apiVersion: v1\nmetadata: {}\n",
            &mut loaded,
        );
        assert_eq!(loaded.malformed.len(), 1);
        assert_eq!(
            loaded.malformed[0].to_string(),
            "x.yaml: document 0: kind: missing"
        );
    }
}

#[cfg(test)]
mod alias_tests {
    use super::*;

    /// A "billion laughs" document: nine levels of nine aliases, 9^9 strings once expanded.
    fn laughs() -> String {
        let mut s =
            String::from("apiVersion: v1\nkind: Pod\nmetadata: {name: lol}\nl0: &l0 [lol]\n");
        for i in 1..=9 {
            let prev = format!("*l{}", i - 1);
            s.push_str(&format!("l{i}: &l{i} [{}]\n", vec![prev; 9].join(", ")));
        }
        s
    }

    #[test]
    fn alias_expansion_is_bounded() {
        let mut loaded = Loaded::default();
        parse_documents(Path::new("lol.yaml"), &laughs(), &mut loaded);
        assert!(loaded.objects.is_empty());
        assert_eq!(loaded.malformed.len(), 1);
        assert!(
            loaded.malformed[0]
                .message
                .contains("repetition limit exceeded"),
            "{}",
            loaded.malformed[0]
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!(
            "kind: Pod\napiVersion: v1\nx: {}{}\n",
            "[".repeat(200),
            "]".repeat(200)
        );
        let mut loaded = Loaded::default();
        parse_documents(Path::new("deep.yaml"), &deep, &mut loaded);
        assert_eq!(loaded.malformed.len(), 1);
        assert!(
            loaded.malformed[0]
                .message
                .contains("recursion limit exceeded"),
            "{}",
            loaded.malformed[0]
        );
    }
}

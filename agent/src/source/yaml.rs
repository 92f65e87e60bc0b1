//! libyaml's events with their lines, safely, for what serde_yaml_ng does not tell: how deep a
//! document nests before it is loaded ([`super::nesting`]) and on which line of its file a field
//! is ([`key_lines`]), so that a problem can name its line. The parser is the one serde_yaml_ng
//! wraps (unsafe-libyaml; serde_yaml_ng's safe wrapper is private), so both read the same
//! documents. Syntax errors are left to serde_yaml_ng, which reports them with their position:
//! the events just stop there.

use std::{
    collections::{BTreeMap, BTreeSet},
    marker::PhantomData,
    mem::MaybeUninit,
};

use unsafe_libyaml as unsafe_sys;

/// What an event is, as far as the callers need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    DocumentStart,
    MappingStart,
    MappingEnd,
    SequenceStart,
    SequenceEnd,
    /// A scalar and its text (the key of a mapping, or a value).
    Scalar(String),
    Alias,
    Other,
}

/// The events of a YAML text, each with the 1-based line it starts on. Ends at the end of the
/// stream or at the first syntax error.
pub(crate) struct Events<'a> {
    /// The parser stays in this box, at one address, from initialisation to deletion.
    parser: Box<MaybeUninit<unsafe_sys::yaml_parser_t>>,
    done: bool,
    /// The parser reads the text through a pointer: it must outlive the parser.
    text: PhantomData<&'a str>,
}

impl<'a> Events<'a> {
    /// `None` when the parser cannot be initialised (out of memory: serde_yaml_ng would panic
    /// on the same call; let it report).
    pub(crate) fn new(text: &'a str) -> Option<Self> {
        let mut parser = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
        let p = parser.as_mut_ptr();
        // SAFETY: `p` points to writable memory for a yaml_parser_t; initialisation fills it.
        if unsafe { unsafe_sys::yaml_parser_initialize(p) }.fail {
            return None;
        }
        // SAFETY: the parser is initialised; `text` outlives it (`Events` borrows it for 'a and
        // deletes the parser on drop) and is only read through the pointer and length given.
        unsafe {
            unsafe_sys::yaml_parser_set_encoding(p, unsafe_sys::YAML_UTF8_ENCODING);
            unsafe_sys::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        }
        Some(Self {
            parser,
            done: false,
            text: PhantomData,
        })
    }
}

impl Iterator for Events<'_> {
    /// The event and its 1-based line.
    type Item = (Event, u64);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let p = self.parser.as_mut_ptr();
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        // SAFETY: the parser is initialised (`new`) and `event` is writable; on success the
        // event is initialised, read once (its type, mark and, for a scalar, its text, copied
        // out of the `value`/`length` libyaml allocated for it) and deleted.
        let item = unsafe {
            if unsafe_sys::yaml_parser_parse(p, event.as_mut_ptr()).fail {
                self.done = true;
                return None;
            }
            let e = event.as_mut_ptr();
            let line = (*e).start_mark.line.saturating_add(1);
            let kind = match (*e).type_ {
                unsafe_sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
                unsafe_sys::YAML_MAPPING_START_EVENT => Event::MappingStart,
                unsafe_sys::YAML_MAPPING_END_EVENT => Event::MappingEnd,
                unsafe_sys::YAML_SEQUENCE_START_EVENT => Event::SequenceStart,
                unsafe_sys::YAML_SEQUENCE_END_EVENT => Event::SequenceEnd,
                unsafe_sys::YAML_ALIAS_EVENT => Event::Alias,
                unsafe_sys::YAML_SCALAR_EVENT => {
                    let s = (*e).data.scalar;
                    let len = usize::try_from(s.length).unwrap_or(0);
                    let bytes = if s.value.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(s.value, len)
                    };
                    Event::Scalar(String::from_utf8_lossy(bytes).into_owned())
                }
                unsafe_sys::YAML_STREAM_END_EVENT => {
                    self.done = true;
                    Event::Other
                }
                _ => Event::Other,
            };
            unsafe_sys::yaml_event_delete(e);
            (kind, line)
        };
        Some(item)
    }
}

impl Drop for Events<'_> {
    fn drop(&mut self) {
        // SAFETY: initialised in `new` (an `Events` exists only then) and not used afterwards.
        unsafe { unsafe_sys::yaml_parser_delete(self.parser.as_mut_ptr()) };
    }
}

/// Where a node is in its document: `spec.containers[0].resources`, as problems name fields.
fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// Every path `path` is under, itself first: `a.b[0].c`, `a.b[0]`, `a.b`, `a`, ``.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let cuts = path
        .char_indices()
        .filter(|(_, c)| matches!(c, '.' | '['))
        .map(|(i, _)| i)
        .rev();
    std::iter::once(path)
        .chain(cuts.map(move |i| &path[..i]))
        .chain((!path.is_empty()).then_some(""))
}

/// A collection being walked: its own path, and for a mapping the path of the value to come
/// (`None` while a key is awaited, or under a key that is no scalar).
enum Frame {
    Mapping {
        path: Option<String>,
        value: Option<Option<String>>,
    },
    Sequence {
        path: Option<String>,
        next: usize,
    },
}

/// The 1-based line of each `(document, path)` wanted: the line of the key at `path`
/// (`spec.containers[0].resources`; a sequence item's own line), else of its nearest ancestor
/// in the document, else of the document's root. Absent when the document is not in `text`
/// (past a syntax error). One pass over `text`.
pub(crate) fn key_lines(text: &str, wanted: &[(usize, &str)]) -> BTreeMap<(usize, String), u64> {
    let mut found = BTreeMap::new();
    if wanted.is_empty() {
        return found;
    }
    let look: BTreeSet<(usize, &str)> = wanted
        .iter()
        .flat_map(|(d, p)| ancestors(p).map(move |a| (*d, a)))
        .collect();
    let last_doc = wanted.iter().map(|(d, _)| *d).max().unwrap_or(0);
    let Some(events) = Events::new(text) else {
        return found;
    };
    let mut seen: BTreeMap<(usize, String), u64> = BTreeMap::new();
    let mut doc: Option<usize> = None;
    let mut stack: Vec<Frame> = Vec::new();
    for (event, line) in events {
        if event == Event::DocumentStart {
            let next = doc.map_or(0, |d| d + 1);
            if next > last_doc {
                break;
            }
            doc = Some(next);
            stack.clear();
            continue;
        }
        let Some(d) = doc else { continue };
        // The path of the node this event starts, if it starts one.
        let node_path = |stack: &mut Vec<Frame>| -> Option<Option<String>> {
            match stack.last_mut() {
                None => Some(Some(String::new())),
                Some(Frame::Sequence { path, next }) => {
                    let p = path.as_ref().map(|p| format!("{p}[{next}]"));
                    *next = next.saturating_add(1);
                    Some(p)
                }
                Some(Frame::Mapping { value, .. }) => value.take(),
            }
        };
        let record = |path: &Option<String>, seen: &mut BTreeMap<(usize, String), u64>| {
            if let Some(p) = path
                && look.contains(&(d, p.as_str()))
            {
                seen.entry((d, p.clone())).or_insert(line);
            }
        };
        match event {
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
            }
            Event::MappingStart | Event::SequenceStart | Event::Scalar(_) | Event::Alias => {
                // A key: a mapping on top awaiting one.
                if let Some(Frame::Mapping { path, value }) = stack.last_mut()
                    && value.is_none()
                {
                    // Only paths towards a wanted one are built: nothing else can be wanted
                    // below them, and hostile keys stay unjoined.
                    let key_path = match (&event, path.as_deref()) {
                        (Event::Scalar(k), Some(parent)) => Some(child(parent, k)),
                        _ => None,
                    }
                    .filter(|p| look.contains(&(d, p.as_str())));
                    record(&key_path, &mut seen);
                    *value = Some(key_path);
                    match event {
                        Event::MappingStart => stack.push(Frame::Mapping {
                            path: None,
                            value: None,
                        }),
                        Event::SequenceStart => stack.push(Frame::Sequence {
                            path: None,
                            next: 0,
                        }),
                        _ => {}
                    }
                    continue;
                }
                // A value: a mapping's (its key has the line), a sequence item's or the root's.
                let own_line = !matches!(stack.last(), Some(Frame::Mapping { .. }));
                let path = node_path(&mut stack)
                    .flatten()
                    .filter(|p| look.contains(&(d, p.as_str())));
                if own_line {
                    record(&path, &mut seen);
                }
                match event {
                    Event::MappingStart => stack.push(Frame::Mapping { path, value: None }),
                    Event::SequenceStart => stack.push(Frame::Sequence { path, next: 0 }),
                    _ => {}
                }
            }
            Event::DocumentStart | Event::Other => {}
        }
    }
    for (d, p) in wanted {
        if let Some(line) = ancestors(p).find_map(|a| seen.get(&(*d, a.to_owned()))) {
            found.insert((*d, (*p).to_owned()), *line);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_items_and_documents_have_their_lines() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: c\n    resoures: {}\n  - {name: d, image: x}\n---\n\n# comment\nkind: QosletConfiguration\nmetricsAdress: x\ncapacity:\n  memory.available: 1\n";
        let wanted = [
            (0, "spec.containers[0].resoures"),
            (0, "spec.containers[1].image"),
            (0, "spec.containers[1]"),
            (0, "metadata.name"),
            (0, "spec.containers[0].ports[0].containerPort"),
            (0, ""),
            (1, "metricsAdress"),
            (1, "capacity.memory.available"),
            (1, "nope"),
            (2, "kind"),
        ];
        let lines = key_lines(text, &wanted);
        let at = |d: usize, p: &str| lines.get(&(d, p.to_owned())).copied();
        assert_eq!(at(0, "spec.containers[0].resoures"), Some(7));
        assert_eq!(at(0, "spec.containers[1].image"), Some(8));
        assert_eq!(at(0, "spec.containers[1]"), Some(8));
        assert_eq!(at(0, "metadata.name"), Some(3));
        // Not in the document: its nearest ancestor's line.
        assert_eq!(at(0, "spec.containers[0].ports[0].containerPort"), Some(6));
        assert_eq!(at(0, ""), Some(1));
        assert_eq!(at(1, "metricsAdress"), Some(13));
        // A key with a dot in it is found whole.
        assert_eq!(at(1, "capacity.memory.available"), Some(15));
        // The document's root: its first key.
        assert_eq!(at(1, "nope"), Some(12));
        assert_eq!(at(2, "kind"), None, "no third document");
    }

    #[test]
    fn complex_keys_and_aliases_do_not_shift_paths() {
        let text = "a: &x {b: 1}\n? [k]\n: {c: 2}\nd: *x\ne:\n  f: 3\n";
        let lines = key_lines(text, &[(0, "e.f"), (0, "d")]);
        assert_eq!(lines.get(&(0, "e.f".to_owned())), Some(&6));
        assert_eq!(lines.get(&(0, "d".to_owned())), Some(&4));
    }
}

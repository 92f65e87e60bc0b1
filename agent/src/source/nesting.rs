//! A bound on YAML nesting that holds before the document is loaded.
//!
//! serde_yaml_ng refuses documents nested deeper than 128 levels, but only after libyaml has
//! produced every event of the document, and libyaml's scanner spends time proportional to the
//! flow depth on every token (it walks its stack of possible simple keys, one per flow level):
//! `[[[[...]]]]` 20,000 levels deep took 8 s in a debug build, and the 4 MiB file cap allows two
//! million. This pass runs the same parser (unsafe-libyaml, which serde_yaml_ng wraps; its safe
//! wrapper is private) event by event and stops at the first event past [`MAX_DEPTH`], so the
//! scanner never goes deep: linear in the document. Syntax errors are left to serde_yaml_ng,
//! which reports them with their position.

use std::mem::MaybeUninit;

use thiserror::Error;
use unsafe_libyaml as unsafe_sys;

/// Deeper than serde_yaml_ng accepts (128), so this pass refuses nothing it would load.
pub const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("nested deeper than {MAX_DEPTH} levels (line {line})")]
pub struct TooDeep {
    /// 1-based line of the first collection past the limit.
    pub line: u64,
}

/// Checks that no collection in `text` (every document of it) is nested deeper than
/// [`MAX_DEPTH`].
pub fn check_nesting(text: &str) -> Result<(), TooDeep> {
    // The parser stays in this box, at one address, from initialisation to deletion.
    let mut parser = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
    let parser = parser.as_mut_ptr();
    // SAFETY: `parser` points to writable memory for a yaml_parser_t; initialisation fills it.
    if unsafe { unsafe_sys::yaml_parser_initialize(parser) }.fail {
        // Out of memory: serde_yaml_ng would panic on the same call; let it report.
        return Ok(());
    }
    // SAFETY: the parser is initialised; `text` outlives it (deleted before returning) and is
    // only read through the pointer and length given.
    unsafe {
        unsafe_sys::yaml_parser_set_encoding(parser, unsafe_sys::YAML_UTF8_ENCODING);
        unsafe_sys::yaml_parser_set_input_string(parser, text.as_ptr(), text.len() as u64);
    }
    let mut depth = 0usize;
    let mut result = Ok(());
    loop {
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        // SAFETY: the parser is initialised and `event` is writable; on success the event is
        // initialised, read once for its type and mark, and deleted.
        let (kind, line) = unsafe {
            if unsafe_sys::yaml_parser_parse(parser, event.as_mut_ptr()).fail {
                break;
            }
            let e = event.as_mut_ptr();
            let r = ((*e).type_, (*e).start_mark.line);
            unsafe_sys::yaml_event_delete(e);
            r
        };
        match kind {
            unsafe_sys::YAML_SEQUENCE_START_EVENT | unsafe_sys::YAML_MAPPING_START_EVENT => {
                depth += 1;
                if depth > MAX_DEPTH {
                    result = Err(TooDeep { line: line + 1 });
                    break;
                }
            }
            unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                depth = depth.saturating_sub(1);
            }
            unsafe_sys::YAML_STREAM_END_EVENT => break,
            _ => {}
        }
    }
    // SAFETY: initialised above and not used afterwards.
    unsafe { unsafe_sys::yaml_parser_delete(parser) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_documents_pass() {
        assert_eq!(check_nesting("a: [1, {b: [2]}]\n---\nc: d\n"), Ok(()));
        assert_eq!(
            check_nesting("a: [unclosed\n"),
            Ok(()),
            "syntax is serde_yaml_ng's job"
        );
        let at_limit = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(check_nesting(&at_limit), Ok(()));
    }

    #[test]
    fn deep_flow_nesting_is_refused_without_scanning_it() {
        let n = 2_000_000;
        let deep = format!("x:\n {}{}\n", "[".repeat(n), "]".repeat(n));
        assert_eq!(check_nesting(&deep), Err(TooDeep { line: 2 }));
        let block = (0..300)
            .map(|i| format!("{}- \n", " ".repeat(i)))
            .collect::<String>();
        assert!(check_nesting(&block).is_err());
    }
}

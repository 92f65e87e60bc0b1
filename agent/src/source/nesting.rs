//! A bound on YAML nesting that holds before the document is loaded.
//!
//! serde_yaml_ng refuses documents nested deeper than 128 levels, but only after libyaml has
//! produced every event of the document, and libyaml's scanner spends time proportional to the
//! flow depth on every token (it walks its stack of possible simple keys, one per flow level):
//! `[[[[...]]]]` 20,000 levels deep took 8 s in a debug build, and the 4 MiB file cap allows two
//! million. This pass runs the same parser ([`super::yaml::Events`]) event by event and stops at
//! the first event past [`MAX_DEPTH`], so the scanner never goes deep: linear in the document.
//! Syntax errors are left to serde_yaml_ng, which reports them with their position.

use thiserror::Error;

use super::yaml::{Event, Events};

/// Deeper than serde_yaml_ng accepts (128), so this pass refuses nothing it would load.
pub(crate) const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("nested deeper than {MAX_DEPTH} levels (line {line})")]
pub(crate) struct TooDeep {
    /// 1-based line of the first collection past the limit.
    pub(crate) line: u64,
}

/// Checks that no collection in `text` (every document of it) is nested deeper than
/// [`MAX_DEPTH`].
pub(crate) fn check_nesting(text: &str) -> Result<(), TooDeep> {
    let Some(events) = Events::new(text) else {
        return Ok(());
    };
    let mut depth = 0usize;
    for (event, line) in events {
        match event {
            Event::SequenceStart | Event::MappingStart => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(TooDeep { line });
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
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

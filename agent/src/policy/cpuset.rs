//! Linux cpuset lists (`0-1,4`), as in `cpuset.cpus` and `reservedSystemCPUs`.

use std::{collections::BTreeSet, fmt, str::FromStr};

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cpuset {text:?}: {reason}")]
pub struct CpuSetError {
    pub(crate) text: String,
    pub(crate) reason: &'static str,
}

/// A set of CPU ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// CPUs `0..n`.
    pub fn first(n: u32) -> Self {
        Self((0..n).collect())
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    pub(crate) fn difference(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.difference(&other.0).copied().collect())
    }

    /// The CPU ids, lowest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;

    fn from_str(text: &str) -> Result<Self, CpuSetError> {
        let err = |reason| CpuSetError {
            text: text.into(),
            reason,
        };
        let mut set = BTreeSet::new();
        for part in text.trim().split(',').map(str::trim) {
            if part.is_empty() {
                if text.trim().is_empty() {
                    break;
                }
                return Err(err("empty element"));
            }
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let lo: u32 = lo.trim().parse().map_err(|_| err("not a CPU number"))?;
            let hi: u32 = hi.trim().parse().map_err(|_| err("not a CPU number"))?;
            if lo > hi {
                return Err(err("range ends before it starts"));
            }
            if hi - lo > 65_535 {
                return Err(err("range too large"));
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's list form: ascending ranges joined by commas.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(lo) = iter.next() {
            let mut hi = lo;
            while iter.peek() == Some(&(hi + 1)) {
                hi += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_lists() {
        let set: CpuSet = "0-1,4".parse().unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.to_string(), "0-1,4");
        assert_eq!(CpuSet::first(8).difference(&set).to_string(), "2-3,5-7");
        assert_eq!("3,1,2".parse::<CpuSet>().unwrap().to_string(), "1-3");
        assert!("".parse::<CpuSet>().unwrap().is_empty());
        for bad in ["a", "3-1", "1,,2", "1-"] {
            assert!(bad.parse::<CpuSet>().is_err(), "{bad}");
        }
    }
}

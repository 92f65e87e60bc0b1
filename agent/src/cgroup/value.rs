//! Interface file values: how a desired setting is written, how the kernel's current text is
//! compared with it (page rounding, `max` / `-1`), and in which direction a change goes, which
//! decides the write order. Pure.

use crate::policy::cpuset::CpuSet;

/// v1 `memory.limit_in_bytes` reads back this (PAGE_COUNTER_MAX pages) or more when unlimited.
const V1_UNLIMITED_FLOOR: i64 = 1 << 62;

/// A value qoslet wants in one interface file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// cpu.shares, cpu.weight, cpu.cfs_period_us: relative values, any order works.
    Plain(i64),
    /// A limit; `None` is unlimited, written as `unlimited` (`max` or `-1`). `paged` values are
    /// stored by the kernel in pages and read back rounded down.
    Limit {
        value: Option<i64>,
        unlimited: &'static str,
        paged: bool,
    },
    /// cgroup v2 cpu.max: `<quota|max> <period>`.
    CpuMax { quota: Option<i64>, period: u64 },
    /// cpuset.cpus / cpuset.mems lists.
    List(CpuSet),
}

/// Whether a change loosens (parents first) or tightens (children first) the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Direction {
    /// Raising a limit, widening a set, or a relative value: top-down.
    Widen,
    /// Lowering a limit or narrowing a set: bottom-up, after every widening.
    Narrow,
}

impl Value {
    /// The text written to the file.
    pub(crate) fn render(&self) -> String {
        match self {
            Value::Plain(v) => v.to_string(),
            Value::Limit {
                value: None,
                unlimited,
                ..
            } => (*unlimited).to_string(),
            Value::Limit { value: Some(v), .. } => v.to_string(),
            Value::CpuMax { quota, period } => match quota {
                Some(q) => format!("{q} {period}"),
                None => format!("max {period}"),
            },
            Value::List(set) => set.to_string(),
        }
    }

    /// Whether `current` (the file's text) already holds this value.
    pub(crate) fn matches(&self, current: &str, page: i64) -> bool {
        let current = current.trim();
        match self {
            Value::Plain(v) => current.parse::<i64>().is_ok_and(|c| c == *v),
            Value::Limit { value, paged, .. } => {
                let want = value.map(|v| if *paged { v / page * page } else { v });
                parse_limit(current).is_some_and(|c| c == want)
            }
            Value::CpuMax { quota, period } => parse_cpu_max(current) == Some((*quota, *period)),
            Value::List(set) => parse_list(current).is_some_and(|c| c == *set),
        }
    }

    /// The writes that bring `current` to this value, with their directions: one write, or for
    /// a set that is neither wider nor narrower, the union first and the target after it.
    pub(crate) fn steps(&self, current: Option<&str>, page: i64) -> Vec<(Value, Direction)> {
        if current.is_some_and(|c| self.matches(c, page)) {
            return Vec::new();
        }
        let Some(current) = current.map(str::trim) else {
            return vec![(self.clone(), Direction::Widen)];
        };
        let lower = |now: Option<Option<i64>>, want: Option<i64>| match (now, want) {
            (Some(Some(n)), Some(w)) => w < n,
            (Some(None), Some(_)) => true,
            _ => false,
        };
        let dir = match self {
            Value::Plain(_) => Direction::Widen,
            Value::Limit { value, .. } => {
                if lower(parse_limit(current), *value) {
                    Direction::Narrow
                } else {
                    Direction::Widen
                }
            }
            Value::CpuMax { quota, .. } => {
                if lower(parse_cpu_max(current).map(|(q, _)| q), *quota) {
                    Direction::Narrow
                } else {
                    Direction::Widen
                }
            }
            Value::List(want) => {
                let now = parse_list(current).unwrap_or_default();
                if now.is_subset(want) {
                    Direction::Widen
                } else if want.is_subset(&now) {
                    Direction::Narrow
                } else {
                    let union = union(&now, want);
                    return vec![
                        (Value::List(union), Direction::Widen),
                        (self.clone(), Direction::Narrow),
                    ];
                }
            }
        };
        vec![(self.clone(), dir)]
    }
}

/// `max`, `-1` and v1's huge unlimited value are `None`.
pub(crate) fn parse_limit(text: &str) -> Option<Option<i64>> {
    let text = text.trim();
    if text == "max" {
        return Some(None);
    }
    let v: i64 = text.parse().ok()?;
    Some((0..V1_UNLIMITED_FLOOR).contains(&v).then_some(v))
}

fn parse_cpu_max(text: &str) -> Option<(Option<i64>, u64)> {
    let mut it = text.split_whitespace();
    let quota = match it.next()? {
        "max" => None,
        q => Some(q.parse().ok()?),
    };
    Some((quota, it.next()?.parse().ok()?))
}

/// The `key value` lines of a flat-keyed kernel file (`memory.stat`, `memory.events`,
/// `cpu.stat`, `/proc/stat`); lines whose value is not a `T` are skipped.
pub(crate) fn flat_keyed<T: std::str::FromStr>(text: &str) -> impl Iterator<Item = (&str, T)> {
    text.lines().filter_map(|line| {
        let mut it = line.split_whitespace();
        Some((it.next()?, it.next()?.parse().ok()?))
    })
}

/// An empty file is the empty set.
pub(crate) fn parse_list(text: &str) -> Option<CpuSet> {
    let text = text.trim();
    if text.is_empty() {
        return Some(CpuSet::default());
    }
    text.parse().ok()
}

fn union(a: &CpuSet, b: &CpuSet) -> CpuSet {
    let text: Vec<String> = [a, b]
        .iter()
        .filter(|s| !s.is_empty())
        .map(ToString::to_string)
        .collect();
    parse_list(&text.join(",")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: i64 = 4096;

    fn limit(v: Option<i64>) -> Value {
        Value::Limit {
            value: v,
            unlimited: "max",
            paged: true,
        }
    }

    #[test]
    fn limits_compare_after_page_rounding_and_unlimited_forms() {
        assert!(limit(Some(1_000_000_000)).matches("999997440\n", PAGE));
        assert!(!limit(Some(1_000_000_000)).matches("1000001536", PAGE));
        assert!(limit(None).matches("9223372036854771712", PAGE));
        assert!(limit(None).matches("max", PAGE));
        assert!(!limit(None).matches("4096", PAGE));
    }

    #[test]
    fn directions_follow_the_change() {
        assert_eq!(
            limit(Some(100)).steps(Some("max"), 1),
            vec![(limit(Some(100)), Direction::Narrow)]
        );
        assert_eq!(
            limit(None).steps(Some("100"), 1),
            vec![(limit(None), Direction::Widen)]
        );
        let q = Value::CpuMax {
            quota: Some(50000),
            period: 100000,
        };
        assert_eq!(
            q.steps(Some("max 100000"), PAGE),
            vec![(q.clone(), Direction::Narrow)]
        );
        assert!(q.steps(Some("50000 100000\n"), PAGE).is_empty());
    }

    #[test]
    fn a_disjoint_cpuset_goes_through_the_union() {
        let want = Value::List("1".parse().unwrap());
        assert_eq!(
            want.steps(Some("0\n"), PAGE),
            vec![
                (Value::List("0-1".parse().unwrap()), Direction::Widen),
                (want.clone(), Direction::Narrow)
            ]
        );
        assert_eq!(
            want.steps(Some(""), PAGE),
            vec![(want.clone(), Direction::Widen)]
        );
        assert_eq!(
            want.steps(Some("0-1"), PAGE),
            vec![(want.clone(), Direction::Narrow)]
        );
    }
}

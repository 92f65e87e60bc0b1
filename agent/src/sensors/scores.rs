//! Expected `oom_score_adj` values (the agent fills them) and the reset of a tampered score.

use std::{collections::HashMap, fs, io};

/// What an expected score applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScoreKey {
    /// One process (or thread) id.
    Pid(u32),
    /// Every task of a cgroup v2 id.
    Cgroup(u64),
}

/// The scores qoslet set; a pid entry wins over its cgroup's.
#[derive(Debug, Default, Clone)]
pub(crate) struct ExpectedScores {
    pids: HashMap<u32, i32>,
    cgroups: HashMap<u64, i32>,
}

impl ExpectedScores {
    pub(crate) fn set(&mut self, key: ScoreKey, score: i32) {
        match key {
            ScoreKey::Pid(p) => self.pids.insert(p, score),
            ScoreKey::Cgroup(c) => self.cgroups.insert(c, score),
        };
    }

    pub(crate) fn remove(&mut self, key: ScoreKey) {
        match key {
            ScoreKey::Pid(p) => self.pids.remove(&p),
            ScoreKey::Cgroup(c) => self.cgroups.remove(&c),
        };
    }

    pub(crate) fn expected(&self, pid: u32, cgroup_id: u64) -> Option<i32> {
        self.pids
            .get(&pid)
            .or_else(|| self.cgroups.get(&cgroup_id))
            .copied()
    }

    /// Pids with an expected score (checked by polling when no kernel hook reports writes).
    pub(crate) fn pids(&self) -> impl Iterator<Item = (u32, i32)> + '_ {
        self.pids.iter().map(|(p, s)| (*p, *s))
    }
}

/// The score of `pid` now.
pub(crate) fn read_score(pid: u32) -> io::Result<i32> {
    let text = fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))?;
    text.trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `score` back (the process may lower it again; each write is reported).
pub(crate) fn reset_score(pid: u32, score: i32) -> io::Result<()> {
    fs::write(format!("/proc/{pid}/oom_score_adj"), score.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_entry_wins_over_its_cgroup() {
        let mut s = ExpectedScores::default();
        s.set(ScoreKey::Cgroup(7), 900);
        s.set(ScoreKey::Pid(42), -997);
        assert_eq!(s.expected(42, 7), Some(-997));
        assert_eq!(s.expected(43, 7), Some(900));
        assert_eq!(s.expected(43, 8), None);
        s.remove(ScoreKey::Cgroup(7));
        assert_eq!(s.expected(43, 7), None);
    }
}

//! What each live container holds alone: its cgroup directories and its log directory. A
//! container whose cgroup or log another live container already holds is not started (two
//! containers of one name would otherwise share a cgroup, or one would run without one, and
//! both would write one log file). Validation at the door should refuse such pods first; this is
//! the runtime's own guard, whatever reaches it.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{Arc, Mutex},
};

/// One thing a container holds alone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Claim {
    Cgroup(PathBuf),
    /// `<log dir>/<pod dir>/<container>`.
    Log(PathBuf),
}

/// The claims of every live container of a runtime.
#[derive(Debug, Clone, Default)]
pub(crate) struct Claims(Arc<Mutex<BTreeSet<Claim>>>);

/// Held claims, released on drop.
#[derive(Debug)]
pub(crate) struct Held {
    claims: Claims,
    held: Vec<Claim>,
}

impl Claims {
    /// Takes all of `wanted` or none: on a conflict, the claim another container holds.
    pub(crate) fn take(&self, wanted: Vec<Claim>) -> Result<Held, Claim> {
        let mut set = crate::support::lock(&self.0);
        let mut seen = BTreeSet::new();
        for c in &wanted {
            // A container naming one cgroup twice conflicts with itself.
            if set.contains(c) || !seen.insert(c) {
                return Err(c.clone());
            }
        }
        set.extend(wanted.iter().cloned());
        Ok(Held {
            claims: self.clone(),
            held: wanted,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut set = crate::support::lock(&self.claims.0);
        for c in &self.held {
            set.remove(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_held_by_one_container_until_released() {
        let claims = Claims::default();
        let a = Claim::Cgroup("/sys/fs/cgroup/pod/c".into());
        let log = Claim::Log("/logs/ns_p_u/c".into());
        let first = claims.take(vec![a.clone(), log.clone()]).unwrap();
        assert_eq!(claims.take(vec![log.clone()]).unwrap_err(), log);
        assert_eq!(
            claims
                .take(vec![Claim::Cgroup("/x".into()), a.clone()])
                .unwrap_err(),
            a
        );
        // Nothing of a refused request is held.
        claims.take(vec![Claim::Cgroup("/x".into())]).unwrap();
        drop(first);
        claims.take(vec![a.clone(), log]).unwrap();
        assert!(
            claims
                .take(vec![Claim::Log("/y".into()), Claim::Log("/y".into())])
                .is_err()
        );
    }
}

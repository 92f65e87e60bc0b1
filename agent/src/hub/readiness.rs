//! `/readyz`: one latch per subsystem (linkerd's readiness pattern). The agent is ready when
//! every registered subsystem is; the body lists each with its detail (e.g. which sensors run).

use std::{collections::BTreeMap, fmt::Write as _, sync::Mutex};

#[derive(Debug, Default)]
pub(crate) struct Readiness {
    subsystems: Mutex<BTreeMap<String, (bool, String)>>,
}

impl Readiness {
    /// Registers a subsystem as not ready yet.
    pub(crate) fn register(&self, name: &str) {
        self.lock()
            .entry(name.to_owned())
            .or_insert((false, "starting".into()));
    }

    pub(crate) fn set(&self, name: &str, ready: bool, detail: impl Into<String>) {
        self.lock().insert(name.to_owned(), (ready, detail.into()));
    }

    /// Whether everything is ready, and one line per subsystem.
    pub(crate) fn report(&self) -> (bool, String) {
        let map = self.lock();
        let mut body = String::new();
        let mut all = !map.is_empty();
        for (name, (ready, detail)) in map.iter() {
            all &= *ready;
            let state = if *ready { "ready" } else { "not ready" };
            let _ = writeln!(body, "{name}: {state}: {detail}");
        }
        (all, body)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (bool, String)>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.subsystems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_subsystem_is() {
        let r = Readiness::default();
        assert!(!r.report().0, "nothing registered is not ready");
        r.register("sensors");
        r.register("reconciler");
        r.set("sensors", true, "ebpf: oom (tp_btf/mark_victim)");
        let (ready, body) = r.report();
        assert!(!ready);
        assert_eq!(
            body,
            "reconciler: not ready: starting\nsensors: ready: ebpf: oom (tp_btf/mark_victim)\n"
        );
        r.set("reconciler", true, "first pass done");
        assert!(r.report().0);
    }
}

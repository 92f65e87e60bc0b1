//! Workload / PodGroup / CompositePodGroup: model, validation, gating, gang units. No I/O.

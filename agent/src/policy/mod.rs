//! The kubelet's node resource model as pure functions. No I/O.

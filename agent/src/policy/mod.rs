//! The kubelet's node resource model as pure functions. No I/O: no filesystem, no environment,
//! no clock. Every formula cites the upstream kubernetes/kubernetes file it comes from.

pub mod quantity;

//! Kernel sensors: eBPF programs and their fallbacks.

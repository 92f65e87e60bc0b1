//! Node Allocatable (pkg/kubelet/cm/node_container_manager_linux.go,
//! pkg/kubelet/apis/config/validation/validation.go, cmd/kubelet/app/server.go).

use serde::Serialize;
use thiserror::Error;

use super::{
    cpuset::CpuSet,
    quantity::{Format, Quantity},
    settings::{Enforcement, NodeSettings, Reservation, ReservedCpusConflict},
};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocatableError {
    /// The upstream startup error, word for word.
    #[error("invalid Node Allocatable configuration. {}", .problems.join(" "))]
    ReservationAboveCapacity { problems: Vec<String> },
    #[error(
        "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)"
    )]
    ReservedCpusWithCgroup,
    #[error("reservedSystemCPUs {reserved} is not a subset of the node's CPUs {node}")]
    ReservedCpusOutsideNode { reserved: String, node: String },
}

/// cpu, memory and pids of the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ResourceTotals {
    pub(crate) cpu_millis: i64,
    pub(crate) memory_bytes: i64,
    pub(crate) pids: i64,
}

/// Node Allocatable and what follows from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeAllocatable {
    pub(crate) capacity: ResourceTotals,
    /// What the scheduler sees: capacity - reserved - hard eviction, at least 0.
    pub(crate) allocatable: ResourceTotals,
    /// capacity - reserved (no eviction threshold), at least 0: kubepods' limits when `pods` is
    /// enforced, and the base of QOSReserved.
    pub(crate) absolute: ResourceTotals,
    /// Reservations after `reservedSystemCPUs` rewrote the cpu entries.
    pub(crate) system_reserved: Reservation,
    pub(crate) kube_reserved: Reservation,
    /// Enforcement after the reserved-CPU conflict was resolved.
    pub(crate) enforcement: Enforcement,
    /// CPUs for pods and for the system daemons, when `reservedSystemCPUs` is set.
    pub(crate) pods_cpuset: Option<CpuSet>,
    pub(crate) reserved_cpuset: Option<CpuSet>,
    pub(crate) warnings: Vec<String>,
}

/// Computes allocatable, validating reservations against capacity.
pub(crate) fn node_allocatable(s: &NodeSettings) -> Result<NodeAllocatable, AllocatableError> {
    let mut system = s.system_reserved;
    let mut kube = s.kube_reserved;
    let mut enforcement = s.enforcement;
    let mut warnings = Vec::new();
    let (mut pods_cpuset, mut reserved_cpuset) = (None, None);
    if let Some(reserved) = s.reserved_system_cpus.as_ref().filter(|c| !c.is_empty()) {
        if !s.system_reserved_cgroup.is_empty() || !s.kube_reserved_cgroup.is_empty() {
            match s.reserved_cpus_conflict {
                ReservedCpusConflict::Reject => {
                    return Err(AllocatableError::ReservedCpusWithCgroup);
                }
                ReservedCpusConflict::Openshift => {
                    if enforcement.system_reserved_compressible
                        || enforcement.kube_reserved_compressible
                    {
                        warnings.push(
                            "reservedSystemCPUs is set: dropping system-reserved-compressible and kube-reserved-compressible enforcement (reservedCpusConflict: openshift)".into(),
                        );
                    }
                    enforcement.system_reserved_compressible = false;
                    enforcement.kube_reserved_compressible = false;
                }
            }
        }
        if !reserved.is_subset(&s.capacity.cpus) {
            return Err(AllocatableError::ReservedCpusOutsideNode {
                reserved: reserved.to_string(),
                node: s.capacity.cpus.to_string(),
            });
        }
        // server.go: the reserved cpuset overrides the cpu of both reservations.
        kube.cpu = None;
        system.cpu = Some(Quantity::from_int(reserved.len() as i64, Format::DecimalSI));
        pods_cpuset = Some(s.capacity.cpus.difference(reserved));
        reserved_cpuset = Some(reserved.clone());
    }

    let cap = &s.capacity;
    let capacity_q = [
        ("cpu", Quantity::from_milli(cap.cpu_millis)),
        (
            "memory",
            Quantity::from_int(cap.memory_bytes, Format::BinarySI),
        ),
        ("pids", Quantity::from_int(cap.pids, Format::DecimalSI)),
    ];
    let eviction_memory = s
        .hard_eviction
        .iter()
        .filter(|t| t.signal == "memory.available")
        .map(|t| match t.value {
            super::eviction::ThresholdValue::Quantity(q) => q,
            v => Quantity::from_int(v.amount(cap.memory_bytes), Format::BinarySI),
        })
        .next_back();
    let mut problems = Vec::new();
    let mut allocatable = [0i64; 3];
    let mut absolute = [0i64; 3];
    for (i, (name, capacity)) in capacity_q.iter().enumerate() {
        let pick = |r: &Reservation| match *name {
            "cpu" => r.cpu,
            "memory" => r.memory,
            _ => r.pids,
        };
        let eviction = if *name == "memory" {
            eviction_memory
        } else {
            None
        };
        let sum = |parts: &[Option<Quantity>]| {
            parts
                .iter()
                .flatten()
                .fold(Quantity::from_int(0, Format::DecimalSI), |acc, q| {
                    acc.checked_add(q).unwrap_or(acc)
                })
        };
        let reserved = sum(&[pick(&system), pick(&kube)]);
        let total = sum(&[pick(&system), pick(&kube), eviction]);
        if capacity.checked_sub(&total).is_none_or(|d| d.signum() < 0) {
            problems.push(format!(
                "Resource {name:?} has a reservation of {total} but capacity of {capacity}. Expected capacity >= reservation."
            ));
        }
        let remaining = |r: &Quantity| {
            let d = capacity
                .checked_sub(r)
                .unwrap_or(Quantity::from_int(0, Format::DecimalSI));
            let v = if *name == "cpu" {
                d.milli_value()
            } else {
                d.value()
            };
            v.max(0)
        };
        allocatable[i] = remaining(&total);
        absolute[i] = remaining(&reserved);
    }
    if !problems.is_empty() {
        return Err(AllocatableError::ReservationAboveCapacity { problems });
    }
    let totals = |a: [i64; 3]| ResourceTotals {
        cpu_millis: a[0],
        memory_bytes: a[1],
        pids: a[2],
    };
    Ok(NodeAllocatable {
        capacity: ResourceTotals {
            cpu_millis: cap.cpu_millis,
            memory_bytes: cap.memory_bytes,
            pids: cap.pids,
        },
        allocatable: totals(allocatable),
        absolute: totals(absolute),
        system_reserved: system,
        kube_reserved: kube,
        enforcement,
        pods_cpuset,
        reserved_cpuset,
        warnings,
    })
}

#[cfg(test)]
mod tests;

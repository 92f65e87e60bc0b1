//! The scheduling objects qoslet reasons about, normalised from the k8s-openapi types.
//!
//! k8s-openapi 0.29 (`v1_37`) has every kind we need: Workload and PodGroup in
//! `scheduling.k8s.io/v1beta1`, CompositePodGroup in `v1alpha3` (KEP-6012, alpha in 1.37) and
//! `PodSpec.schedulingGroup`. We decode into those types, then keep only what the hierarchy rules
//! read, in a form where "unset" and "invalid" are explicit so validation can name them.

use std::{fmt, path::PathBuf};

use k8s_openapi::api::{
    core::v1::Pod as K8sPod,
    scheduling::{v1alpha3, v1beta1},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// API versions of the kinds this module owns.
pub(crate) const WORKLOAD_API: &str = "scheduling.k8s.io/v1beta1";
pub(crate) const POD_GROUP_API: &str = "scheduling.k8s.io/v1beta1";
pub(crate) const COMPOSITE_API: &str = "scheduling.k8s.io/v1alpha3";

/// `spec.preemptionPolicy` when unset (KEP-5710; PodSpec defaulting).
pub(crate) const DEFAULT_PREEMPTION: &str = "PreemptLowerPriority";
/// `spec.schedulerName` when unset.
pub(crate) const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The kinds of the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Workload,
    CompositePodGroup,
    PodGroup,
    Pod,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Workload => "Workload",
            Kind::CompositePodGroup => "CompositePodGroup",
            Kind::PodGroup => "PodGroup",
            Kind::Pod => "Pod",
        }
    }

    /// The kind of a manifest document, if this module owns it.
    pub(crate) fn from_kind_str(kind: &str) -> Option<Kind> {
        match kind {
            "Workload" => Some(Kind::Workload),
            "CompositePodGroup" => Some(Kind::CompositePodGroup),
            "PodGroup" => Some(Kind::PodGroup),
            "Pod" => Some(Kind::Pod),
            _ => None,
        }
    }

    /// The apiVersion qoslet reads this kind in.
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Kind::Workload => WORKLOAD_API,
            Kind::CompositePodGroup => COMPOSITE_API,
            Kind::PodGroup => POD_GROUP_API,
            Kind::Pod => "v1",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object within one namespace: names are unique per namespace and kind (seed 002).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjRef {
    pub(crate) kind: Kind,
    pub(crate) name: String,
}

impl ObjRef {
    pub(crate) fn new(kind: Kind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// Where an object was read from, so every problem can name the file.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Origin {
    pub(crate) file: PathBuf,
    pub(crate) index: usize,
}

/// An entry of `metadata.ownerReferences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnerRef {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// What every object carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: Option<String>,
    pub(crate) owners: Vec<OwnerRef>,
    pub(crate) origin: Origin,
}

/// `schedulingPolicy`: exactly one of `basic` and `gang` (KEP-4671).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    Basic,
    /// `minCount` for a PodGroup, `minGroupCount` for a CompositePodGroup.
    Gang {
        min: i32,
    },
    /// Both or neither set: reported by `scheduling-policy-exclusive`, treated as basic elsewhere.
    Ambiguous,
}

impl Policy {
    pub(crate) fn gang_min(self) -> Option<i32> {
        match self {
            Policy::Gang { min } => Some(min),
            _ => None,
        }
    }
}

/// `disruptionMode`: `single` (the default) or `all` (KEP-5710).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disruption {
    Single,
    All,
    /// Both set, or the field set with neither: reported by `disruption-mode-exclusive`, treated
    /// as single elsewhere.
    Ambiguous,
}

impl Disruption {
    pub(crate) fn is_all(self) -> bool {
        self == Disruption::All
    }
}

/// The scheduling fields shared by groups and templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scheduling {
    pub(crate) policy: Policy,
    pub(crate) disruption: Disruption,
    pub(crate) priority: Option<i32>,
    pub(crate) priority_class_name: Option<String>,
    pub(crate) preemption_policy: Option<String>,
}

/// `spec.workloadRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkloadRef {
    pub(crate) workload_name: String,
    pub(crate) template_name: String,
}

/// A PodGroupTemplate or CompositePodGroupTemplate of a Workload, with its nested templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    pub(crate) name: String,
    /// PodGroup for a PodGroupTemplate, CompositePodGroup for a CompositePodGroupTemplate.
    pub(crate) kind: Kind,
    pub(crate) scheduling: Scheduling,
    pub(crate) children: Vec<Template>,
}

/// A Workload: the static template tree (KEP-4671).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub(crate) meta: Meta,
    /// `spec.controllerRef` as `Kind/name`.
    pub(crate) controller_ref: Option<String>,
    /// `compositePodGroupTemplates` then `podGroupTemplates`; exactly one list may be non-empty.
    pub(crate) templates: Vec<Template>,
}

/// A PodGroup (leaf, holds pods) or a CompositePodGroup (inner node, holds groups; KEP-6012).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub(crate) meta: Meta,
    /// `Kind::PodGroup` or `Kind::CompositePodGroup`.
    pub(crate) kind: Kind,
    /// `spec.parentCompositePodGroupName`; `None` for a root.
    pub(crate) parent: Option<String>,
    pub(crate) workload_ref: Option<WorkloadRef>,
    pub(crate) scheduling: Scheduling,
}

impl Group {
    pub(crate) fn obj_ref(&self) -> ObjRef {
        ObjRef::new(self.kind, &self.meta.name)
    }
}

/// The parts of a Pod the hierarchy rules read; resources belong to the policy module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub(crate) meta: Meta,
    /// `spec.schedulingGroup.podGroupName`.
    pub(crate) pod_group: Option<String>,
    pub(crate) scheduler_name: Option<String>,
    pub(crate) priority: Option<i32>,
    pub(crate) priority_class_name: Option<String>,
    pub(crate) preemption_policy: Option<String>,
    pub(crate) phase: Option<String>,
}

impl Pod {
    /// Succeeded and Failed pods are done: they count for nothing and hold nothing up.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// One decoded object of the hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Workload(Workload),
    Group(Group),
    Pod(Pod),
}

impl Object {
    pub(crate) fn meta(&self) -> &Meta {
        match self {
            Object::Workload(w) => &w.meta,
            Object::Group(g) => &g.meta,
            Object::Pod(p) => &p.meta,
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        match self {
            Object::Workload(_) => Kind::Workload,
            Object::Group(g) => g.kind,
            Object::Pod(_) => Kind::Pod,
        }
    }

    pub(crate) fn obj_ref(&self) -> ObjRef {
        ObjRef::new(self.kind(), &self.meta().name)
    }
}

/// Why a document could not become an [`Object`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a kind of the workload hierarchy")]
    NotOurs,
    #[error("apiVersion {found} is not served for {kind}; expected {expected}")]
    ApiVersion {
        kind: Kind,
        found: String,
        expected: &'static str,
    },
    #[error("does not match the {kind} schema: {message}")]
    Schema {
        kind: Kind,
        /// The field that does not decode; the message names it too.
        field: String,
        message: String,
    },
}

/// An object of the hierarchy as k8s-openapi decodes it: what the door hands this module,
/// whichever mode read it (a manifest document, an API object).
#[derive(Debug, Clone)]
pub(crate) enum Typed {
    Workload(v1beta1::Workload),
    PodGroup(v1beta1::PodGroup),
    CompositePodGroup(v1alpha3::CompositePodGroup),
    Pod(Box<K8sPod>),
}

/// Decodes one value into any type of the hierarchy: each mode's decoder, a manifest document's
/// (which names the field that does not decode) or the watch's JSON. A trait, because the kind
/// picks the type at run time and a closure cannot be generic over it.
pub(crate) trait Decoder {
    type Error;
    fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, Self::Error>;
}

impl Typed {
    /// `decoder`'s value as the typed object of `kind`.
    pub(crate) fn decode<D: Decoder>(kind: Kind, decoder: &D) -> Result<Typed, D::Error> {
        Ok(match kind {
            Kind::Workload => Typed::Workload(decoder.decode()?),
            Kind::PodGroup => Typed::PodGroup(decoder.decode()?),
            Kind::CompositePodGroup => Typed::CompositePodGroup(decoder.decode()?),
            Kind::Pod => Typed::Pod(Box::new(decoder.decode()?)),
        })
    }
}

/// The hierarchy's view of a typed object read at `origin`.
pub(crate) fn object(typed: Typed, origin: Origin) -> Object {
    match typed {
        Typed::Workload(w) => Object::Workload(workload(w, origin)),
        Typed::PodGroup(g) => Object::Group(pod_group(g, origin)),
        Typed::CompositePodGroup(g) => Object::Group(composite(g, origin)),
        Typed::Pod(p) => pod_object(&p, origin),
    }
}

/// The kind of an object of `api_version` and `kind`, when it is one qoslet reads in the API
/// version it reads.
pub(crate) fn kind_of(api_version: &str, kind: &str) -> Result<Kind, DecodeError> {
    let of = Kind::from_kind_str(kind).ok_or(DecodeError::NotOurs)?;
    if api_version != of.api_version() {
        return Err(DecodeError::ApiVersion {
            kind: of,
            found: api_version.to_owned(),
            expected: of.api_version(),
        });
    }
    Ok(of)
}

/// A typed Pod's workload-hierarchy view.
pub(crate) fn pod_object(p: &K8sPod, origin: Origin) -> Object {
    Object::Pod(pod(p, origin))
}

fn meta(m: ObjectMeta, origin: Origin) -> Meta {
    Meta {
        name: m.name.unwrap_or_default(),
        namespace: m.namespace.unwrap_or_default(),
        uid: m.uid,
        owners: m
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|o| OwnerRef {
                kind: o.kind,
                name: o.name,
                uid: o.uid,
            })
            .collect(),
        origin,
    }
}

fn policy(basic: bool, gang_min: Option<i32>) -> Policy {
    match (basic, gang_min) {
        (true, None) => Policy::Basic,
        (false, Some(min)) => Policy::Gang { min },
        _ => Policy::Ambiguous,
    }
}

/// `disruptionMode` unset is single; set, it names exactly one mode (a union).
fn disruption(set: bool, all: bool, single: bool) -> Disruption {
    match (set, all, single) {
        (_, true, false) => Disruption::All,
        (false, ..) | (true, false, true) => Disruption::Single,
        _ => Disruption::Ambiguous,
    }
}

fn pg_template(t: v1beta1::PodGroupTemplate) -> Template {
    let set = t.disruption_mode.is_some();
    let d = t.disruption_mode.unwrap_or_default();
    Template {
        name: t.name,
        kind: Kind::PodGroup,
        scheduling: Scheduling {
            policy: policy(
                t.scheduling_policy.basic.is_some(),
                t.scheduling_policy.gang.map(|g| g.min_count),
            ),
            disruption: disruption(set, d.all.is_some(), d.single.is_some()),
            priority: t.priority,
            priority_class_name: t.priority_class_name,
            preemption_policy: t.preemption_policy,
        },
        children: Vec::new(),
    }
}

fn cpg_template(t: v1beta1::CompositePodGroupTemplate) -> Template {
    let set = t.disruption_mode.is_some();
    let d = t.disruption_mode.unwrap_or_default();
    let mut children: Vec<Template> = t
        .composite_pod_group_templates
        .unwrap_or_default()
        .into_iter()
        .map(cpg_template)
        .collect();
    children.extend(
        t.pod_group_templates
            .unwrap_or_default()
            .into_iter()
            .map(pg_template),
    );
    Template {
        name: t.name,
        kind: Kind::CompositePodGroup,
        scheduling: Scheduling {
            policy: policy(
                t.scheduling_policy.basic.is_some(),
                t.scheduling_policy.gang.map(|g| g.min_group_count),
            ),
            disruption: disruption(set, d.all.is_some(), d.single.is_some()),
            priority: t.priority,
            priority_class_name: t.priority_class_name,
            preemption_policy: t.preemption_policy,
        },
        children,
    }
}

fn workload(w: v1beta1::Workload, origin: Origin) -> Workload {
    let spec = w.spec;
    let mut templates: Vec<Template> = spec
        .composite_pod_group_templates
        .unwrap_or_default()
        .into_iter()
        .map(cpg_template)
        .collect();
    templates.extend(
        spec.pod_group_templates
            .unwrap_or_default()
            .into_iter()
            .map(pg_template),
    );
    Workload {
        meta: meta(w.metadata, origin),
        controller_ref: spec
            .controller_ref
            .map(|c| format!("{}/{}", c.kind, c.name)),
        templates,
    }
}

fn pod_group(g: v1beta1::PodGroup, origin: Origin) -> Group {
    let s = g.spec;
    let set = s.disruption_mode.is_some();
    let d = s.disruption_mode.unwrap_or_default();
    Group {
        meta: meta(g.metadata, origin),
        kind: Kind::PodGroup,
        parent: s.parent_composite_pod_group_name,
        workload_ref: s.workload_ref.map(|r| WorkloadRef {
            workload_name: r.workload_name,
            template_name: r.template_name,
        }),
        scheduling: Scheduling {
            policy: policy(
                s.scheduling_policy.basic.is_some(),
                s.scheduling_policy.gang.map(|g| g.min_count),
            ),
            disruption: disruption(set, d.all.is_some(), d.single.is_some()),
            priority: s.priority,
            priority_class_name: s.priority_class_name,
            preemption_policy: s.preemption_policy,
        },
    }
}

fn composite(g: v1alpha3::CompositePodGroup, origin: Origin) -> Group {
    let s = g.spec;
    let set = s.disruption_mode.is_some();
    let d = s.disruption_mode.unwrap_or_default();
    // workloadRef is required on a CompositePodGroup; k8s-openapi defaults a missing required
    // field to empty strings, which `workload-ref-required` reports.
    let r = s.workload_ref;
    let workload_ref =
        (!r.workload_name.is_empty() || !r.template_name.is_empty()).then_some(WorkloadRef {
            workload_name: r.workload_name,
            template_name: r.template_name,
        });
    Group {
        meta: meta(g.metadata, origin),
        kind: Kind::CompositePodGroup,
        parent: s.parent_composite_pod_group_name,
        workload_ref,
        scheduling: Scheduling {
            policy: policy(
                s.scheduling_policy.basic.is_some(),
                s.scheduling_policy.gang.map(|g| g.min_group_count),
            ),
            disruption: disruption(set, d.all.is_some(), d.single.is_some()),
            priority: s.priority,
            priority_class_name: s.priority_class_name,
            preemption_policy: s.preemption_policy,
        },
    }
}

fn pod(p: &K8sPod, origin: Origin) -> Pod {
    let spec = p.spec.as_ref();
    Pod {
        meta: meta(p.metadata.clone(), origin),
        pod_group: spec
            .and_then(|s| s.scheduling_group.as_ref())
            .and_then(|g| g.pod_group_name.clone()),
        scheduler_name: spec.and_then(|s| s.scheduler_name.clone()),
        priority: spec.and_then(|s| s.priority),
        priority_class_name: spec.and_then(|s| s.priority_class_name.clone()),
        preemption_policy: spec.and_then(|s| s.preemption_policy.clone()),
        phase: p.status.as_ref().and_then(|s| s.phase.clone()),
    }
}

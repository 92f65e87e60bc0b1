//! Admission: the checks every object passes at the door, before the plan, the cgroups, the
//! runtime or the logs see it. `qoslet validate`, `qoslet plan` and the manifest watch of
//! `qoslet run` all call [`admit`] and [`unique_uids`], so what `validate` passes the others
//! accept. An object that fails is reported (one problem line per broken rule) and nothing of it
//! runs.
//!
//! Rules (names in `workload/problem.rs`), as the API server validates the objects
//! (pkg/apis/core/validation/validation.go, apimachinery pkg/util/validation):
//! - `name-dns-subdomain`: `metadata.name` is a DNS-1123 subdomain (<= 253), every kind.
//! - `namespace-dns-label`: `metadata.namespace`, when set, is a DNS-1123 label (<= 63).
//! - `container-name-dns-label`: every init, app and ephemeral container name is a DNS label.
//! - `container-name-unique`: container names are unique across initContainers, containers and
//!   ephemeralContainers.
//! - `uid-format`: `metadata.uid`, when set, is an 8-4-4-4-12 hexadecimal UUID: the pod cgroup is
//!   named after it (`cgroup/name.rs`), and nothing else may reach a cgroup path.
//! - `uid-unique`: one pod per UID on the node (the pod cgroup is `pod<uid>`); see
//!   [`unique_uids`] for which pod keeps it.
//! - `quantity-non-negative`: every request and limit is >= 0 (`ValidateResourceQuantityValue`).
//! - `quantity-range`: cpu fits 64-bit millicores, every other resource 64-bit units. The API
//!   server's quantities are arbitrary-precision; the kubelet computes cgroup values in int64
//!   and such a value cannot be written to any cgroup file.
//! - `request-within-limit`: a request is at most its limit (`validateResourceRequirements`).
//! - `containers-required`: a Pod has at least one container (`validateContainers`).
//! - `schema`: the object decodes, and its quantities parse.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;

use super::{
    manifest::RawObject,
    podset::{ManifestPod, spec_hash},
};
use crate::{
    cgroup::name::validate_uid,
    policy::{pod::PodSpecView, quantity::Quantity},
    workload::{
        self, DecodeError, Kind, Object, Origin, Typed,
        problem::{Problem, Rule},
        validate::{is_dns_label, is_dns_subdomain},
    },
};

/// An object that passed admission.
#[derive(Debug, Clone)]
pub(crate) struct Admitted {
    pub(crate) object: Object,
    /// For Pods: the API object and the views derived from it.
    pub(crate) pod: Option<AdmittedPod>,
}

/// A Pod that passed admission, with what is derived from it, computed once here and carried
/// (`source::ManifestPod`) to the plan and the executor.
#[derive(Debug, Clone)]
pub(crate) struct AdmittedPod {
    pub(crate) pod: core::Pod,
    /// The policy's view.
    pub(crate) view: PodSpecView,
    /// [`spec_hash`] of the pod.
    pub(crate) spec_hash: u64,
}

impl AdmittedPod {
    /// A pod admitted before, as the last build kept it (`source::ManifestPod`).
    pub(crate) fn kept(kept: &ManifestPod) -> Admitted {
        Admitted {
            object: kept.object.clone(),
            pod: Some(AdmittedPod {
                pod: kept.pod.clone(),
                view: kept.view.clone(),
                spec_hash: kept.spec_hash,
            }),
        }
    }
}

/// Decodes `raw` and checks every per-object rule of the module doc. All broken rules are
/// reported, not only the first. A Pod is decoded once, to the typed Pod, and admitted as the
/// API's pods are ([`admit_pod`]).
pub(crate) fn admit(raw: &RawObject) -> Result<Admitted, Vec<Problem>> {
    let raw_problem = |rule, message: String| {
        vec![Problem::new(
            &raw.origin(),
            raw.display_id().to_string(),
            rule,
            message,
        )]
    };
    let decode_problem = |e| match e {
        DecodeError::NotOurs => raw_problem(
            Rule::KindKnown,
            format!(
                "{} {} is not a kind qoslet reads",
                raw.api_version, raw.kind
            ),
        ),
        e @ DecodeError::ApiVersion { .. } => raw_problem(Rule::ApiVersion, e.to_string()),
        DecodeError::Schema { field, message, .. } => {
            let mut p = raw_problem(Rule::Schema, message);
            p[0].field = field;
            p
        }
    };
    admit_typed(raw.typed().map_err(decode_problem)?, raw.origin())
}

/// Admission of an object typed already (a decoded document, or the API's).
pub(crate) fn admit_typed(typed: Typed, origin: Origin) -> Result<Admitted, Vec<Problem>> {
    let object = match typed {
        Typed::Pod(pod) => return admit_pod(*pod, origin),
        typed => workload::object(typed, origin),
    };
    let mut problems = Vec::new();
    meta_rules(&object, &mut |rule, field, message| {
        problems.push(Problem::on(&object, rule, message).at(field));
    });
    if problems.is_empty() {
        Ok(Admitted { object, pod: None })
    } else {
        Err(problems)
    }
}

/// The most unknown fields noted per document (the rest are counted).
pub(crate) const MAX_UNKNOWN_FIELDS: usize = 20;

/// The keys of a Pod, Workload, PodGroup or CompositePodGroup document that its type does not
/// read, each an `unknown-field` problem at its path (with "did you mean" where a field is
/// close), and how many more there are past [`MAX_UNKNOWN_FIELDS`]. They are warnings, not
/// refusals: the API server drops unknown fields with a warning (`fieldValidation=Warn`, its
/// default), and so does the decoding here. Other kinds have none here.
pub(crate) fn unknown_fields(raw: &RawObject) -> (Vec<Problem>, usize) {
    use super::fields::unknown_fields as of;
    use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
    let (fields, more) = match raw.hierarchy_kind() {
        Ok(Kind::Pod) => of::<core::Pod>(&raw.value, MAX_UNKNOWN_FIELDS),
        Ok(Kind::Workload) => of::<v1beta1::Workload>(&raw.value, MAX_UNKNOWN_FIELDS),
        Ok(Kind::PodGroup) => of::<v1beta1::PodGroup>(&raw.value, MAX_UNKNOWN_FIELDS),
        Ok(Kind::CompositePodGroup) => {
            of::<v1alpha3::CompositePodGroup>(&raw.value, MAX_UNKNOWN_FIELDS)
        }
        Err(_) => return (Vec::new(), 0),
    };
    let problems = fields
        .into_iter()
        .map(|f| {
            let mut p = Problem::new(
                &raw.origin(),
                raw.display_id().to_string(),
                Rule::UnknownField,
                format!("{}: {}", super::fields::shown(&f.path), f.message()),
            );
            p.field = f.path;
            p
        })
        .collect();
    (problems, more)
}

/// The unknown fields of a set of documents ([`unknown_fields`]), as `validate`, `plan` and the
/// standalone watch report them.
#[derive(Debug, Default)]
pub(crate) struct UnknownFields {
    /// One `unknown-field` problem each (a warning), at most [`MAX_UNKNOWN_FIELDS`] a document.
    pub(crate) found: Vec<Problem>,
    /// Per file, how many more there are past that bound.
    pub(crate) more: BTreeMap<std::path::PathBuf, usize>,
}

impl UnknownFields {
    pub(crate) fn of<'a>(objects: impl IntoIterator<Item = &'a RawObject>) -> Self {
        let mut u = Self::default();
        for raw in objects {
            let (found, more) = unknown_fields(raw);
            u.found.extend(found);
            if more > 0 {
                let n = u.more.entry(raw.file.clone()).or_default();
                *n = n.saturating_add(more);
            }
        }
        u
    }

    /// `file: and N more unknown fields`, for a file with more than were noted.
    pub(crate) fn more_line(file: &std::path::Path, n: usize) -> String {
        format!("{}: and {n} more unknown fields", file.display())
    }
}

/// Admission of a typed Pod (the API's, or a manifest's once decoded): every rule of the module
/// doc, and the policy's view computed once.
pub(crate) fn admit_pod(pod: core::Pod, origin: Origin) -> Result<Admitted, Vec<Problem>> {
    let object = workload::pod_object(&pod, origin);
    let mut problems = Vec::new();
    let mut push = |rule, field: String, message: String| {
        problems.push(Problem::on(&object, rule, message).at(field));
    };
    meta_rules(&object, &mut push);
    pod_rules(&pod, &mut push);
    match PodSpecView::from_pod(&pod) {
        Ok(view) if problems.is_empty() => Ok(Admitted {
            object,
            pod: Some(AdmittedPod {
                spec_hash: spec_hash(&pod),
                pod,
                view,
            }),
        }),
        Ok(_) => Err(problems),
        Err(e) => {
            // pod_rules already reported an unparseable quantity; this is a backstop.
            if problems.is_empty() {
                problems.push(Problem::on(&object, Rule::Schema, e.to_string()));
            }
            Err(problems)
        }
    }
}

/// `metadata.name` and `metadata.namespace`, every kind. `push` takes the rule, the field and
/// the message.
fn meta_rules(object: &Object, push: &mut impl FnMut(Rule, String, String)) {
    let meta = object.meta();
    if !is_dns_subdomain(&meta.name) {
        push(
            Rule::NameDnsSubdomain,
            "metadata.name".into(),
            format!("{:?} is not a DNS subdomain", meta.name),
        );
    }
    if !meta.namespace.is_empty() && !is_dns_label(&meta.namespace) {
        push(
            Rule::NamespaceDnsLabel,
            "metadata.namespace".into(),
            format!("{:?} is not a DNS label", meta.namespace),
        );
    }
}

/// The rules of a Pod's own fields.
fn pod_rules(pod: &core::Pod, push: &mut impl FnMut(Rule, String, String)) {
    if let Some(uid) = &pod.metadata.uid
        && validate_uid(uid).is_err()
    {
        push(
            Rule::UidFormat,
            "metadata.uid".into(),
            format!(
                "{uid:?} is not a UUID (8-4-4-4-12 hexadecimal digits), which the pod cgroup's name needs"
            ),
        );
    }
    let Some(spec) = pod.spec.as_ref().filter(|s| !s.containers.is_empty()) else {
        push(
            Rule::ContainersRequired,
            "spec.containers".into(),
            "a pod needs at least one container".into(),
        );
        return;
    };
    let init = spec.init_containers.iter().flatten();
    let names = init
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), &c.name, Some(c)))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), &c.name, Some(c))),
        )
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, c)| (format!("spec.ephemeralContainers[{i}]"), &c.name, None)),
        );
    let mut seen: BTreeMap<&str, String> = BTreeMap::new();
    for (field, name, container) in names {
        if !is_dns_label(name) {
            push(
                Rule::ContainerNameDnsLabel,
                format!("{field}.name"),
                format!("{name:?} is not a DNS label"),
            );
        }
        if let Some(first) = seen.get(name.as_str()) {
            push(
                Rule::ContainerNameUnique,
                format!("{field}.name"),
                format!("{name:?} is already the name of {first}"),
            );
        } else {
            seen.insert(name, field.clone());
        }
        if let Some(r) = container.and_then(|c| c.resources.as_ref()) {
            resource_rules(r, &format!("{field}.resources"), push);
        }
    }
    if let Some(r) = &spec.resources {
        resource_rules(r, "spec.resources", push);
    }
}

/// `validateResourceRequirements` for cpu, memory and every other resource named.
fn resource_rules(
    r: &core::ResourceRequirements,
    field: &str,
    push: &mut impl FnMut(Rule, String, String),
) {
    let mut parsed = [BTreeMap::new(), BTreeMap::new()];
    for (i, (kind, list)) in [("limits", &r.limits), ("requests", &r.requests)]
        .into_iter()
        .enumerate()
    {
        for (name, q) in list.iter().flatten() {
            match q.0.parse::<Quantity>() {
                Ok(v) => {
                    parsed[i].insert(name.as_str(), v);
                }
                Err(e) => push(
                    Rule::Schema,
                    format!("{field}.{kind}.{name}"),
                    e.to_string(),
                ),
            }
        }
    }
    let [limits, requests] = parsed;
    for (kind, list) in [("limits", &limits), ("requests", &requests)] {
        for (name, q) in list {
            let path = format!("{field}.{kind}.{name}");
            if q.signum() < 0 {
                push(
                    Rule::QuantityNonNegative,
                    path,
                    format!("{:?}: must be greater than or equal to 0", q.canonical()),
                );
            } else if let Some(max) = out_of_range(name, q) {
                push(
                    Rule::QuantityRange,
                    path,
                    format!("{:?}: must be less than or equal to {max}", q.canonical()),
                );
            }
        }
    }
    for (name, req) in &requests {
        if let Some(lim) = limits.get(name)
            && req > lim
        {
            push(
                Rule::RequestWithinLimit,
                format!("{field}.requests.{name}"),
                format!(
                    "{:?}: must be less than or equal to {name} limit of {}",
                    req.canonical(),
                    lim.canonical()
                ),
            );
        }
    }
}

/// The largest value qoslet computes with, when `q` is above it: cpu in millicores, the rest in
/// units, each an i64.
fn out_of_range(resource: &str, q: &Quantity) -> Option<String> {
    let max = if resource == "cpu" {
        Quantity::from_milli(i64::MAX)
    } else {
        Quantity::from_int(i64::MAX, q.format())
    };
    (*q > max).then(|| {
        if resource == "cpu" {
            format!("{}m", i64::MAX)
        } else {
            i64::MAX.to_string()
        }
    })
}

/// Keeps one pod per UID in `admitted` and returns a `uid-unique` problem for each pod refused.
/// The pod that keeps a UID is, deterministically: the one `holders` names (the pod already
/// running with it, by namespace and name), else the first in `admitted`'s order (file name
/// order, then document order). Pods with the same namespace and name are left alone: the
/// `name-unique` rule reports those.
pub(crate) fn unique_uids(
    admitted: &mut Vec<Admitted>,
    holders: &BTreeMap<String, (String, String)>,
) -> Vec<Problem> {
    let ident = |a: &Admitted| {
        a.pod.as_ref().map(|p| {
            (
                p.view.uid.clone(),
                (p.view.namespace.clone(), p.view.name.clone()),
            )
        })
    };
    // Who keeps each contested UID: the holder when it is still present, else the first.
    let mut keeper: BTreeMap<String, (String, String)> = BTreeMap::new();
    let present: BTreeSet<(String, (String, String))> = admitted.iter().filter_map(ident).collect();
    for (uid, who) in admitted.iter().filter_map(ident) {
        let held = holders
            .get(&uid)
            .filter(|h| present.contains(&(uid.clone(), (*h).clone())));
        keeper
            .entry(uid)
            .or_insert_with(|| held.cloned().unwrap_or(who));
    }
    let mut problems = Vec::new();
    admitted.retain(|a| {
        let Some((uid, who)) = ident(a) else {
            return true;
        };
        let Some(k) = keeper.get(&uid) else {
            return true;
        };
        if *k == who {
            return true;
        }
        problems.push(
            Problem::on(
                &a.object,
                Rule::UidUnique,
                format!(
                    "{uid:?} is already Pod/{}/{}'s: a UID names one pod cgroup",
                    k.0, k.1
                ),
            )
            .at("metadata.uid"),
        );
        false
    });
    problems
}

#[cfg(test)]
mod tests;

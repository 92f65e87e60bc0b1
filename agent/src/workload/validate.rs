//! Validation of a namespace's hierarchies (seed 002 "제한 사항과 검증 규칙", KEP-4671, KEP-5710,
//! KEP-6012). Every problem names a stable rule; tests, users and the CLI rely on the names.
//!
//! Rules checked by [`validate`] (a failing hierarchy is unschedulable as a whole):
//! - `name-dns-subdomain`: object names are DNS subdomains (seed 002).
//! - `name-dns-label`: template names are DNS labels (Workload API).
//! - `name-unique`: names are unique per namespace and kind (seed 002).
//! - `template-name-unique`: template names are unique within a Workload (workloadRef keys on them).
//! - `template-exclusive`: a Workload sets exactly one of podGroupTemplates /
//!   compositePodGroupTemplates (KEP-6012).
//! - `composite-template-children`: a CompositePodGroupTemplate has at least one child template.
//! - `template-count`: at most 8 child templates per level, both lists together (seed 002).
//! - `depth-limit`: template trees and group trees are at most 4 levels deep (seed 002).
//! - `scheduling-policy-exclusive`: exactly one of `basic` / `gang`.
//! - `disruption-mode-exclusive`: at most one of `single` / `all`.
//! - `preemption-policy-value`: `PreemptLowerPriority` or `Never`.
//! - `min-count-positive`: PodGroup gang `minCount` >= 1.
//! - `min-group-count-positive`: CompositePodGroup gang `minGroupCount` >= 1.
//! - `disruption-all-with-basic`: a PodGroup with `disruptionMode: all` must be gang (KEP-5710).
//! - `disruption-all-inherited`: under an `all` parent every child is `all` (KEP-5710).
//! - `no-cycles`: the parent chain does not loop.
//! - `workload-ref-required`: a CompositePodGroup has a workloadRef (KEP-6012).
//! - `single-workload`: all groups of a hierarchy come from one Workload.
//! - `workload-template-exists`: a group's workloadRef names a template of its kind.
//! - `template-parent-match`: a group's template is a child of its parent's template (a root's is
//!   top-level).
//! - `scheduler-name-consistent`: one `schedulerName` for all pods of a hierarchy (seed 002).
//! - `priority-consistent`: one `priority` for all groups and pods, equal to the root's (seed 002).
//! - `preemption-policy-consistent`: one `preemptionPolicy` for all pods; with the
//!   PodGroupPreemptionPolicy gate the root's equals theirs (seed 002).
//!
//! [`dangling`] reports `reference-exists` (a parent, PodGroup or Workload that is not in the set):
//! the scheduler holds such objects rather than rejecting them, so gating uses it differently.
//! Update rules live in `update.rs` (`immutable-min-group-count`, `immutable-scheduling-policy`,
//! `immutable-parent`, `immutable-disruption-mode`, `immutable-scheduling-group`); `kind-known`,
//! `api-version` and `schema` are the CLI's.

use std::collections::BTreeMap;

use super::problem::{Problem, Rule};
use super::{
    forest::{Forest, Top},
    types::{
        DEFAULT_PREEMPTION, DEFAULT_SCHEDULER, Disruption, Group, Kind, ObjRef, Object, Policy,
        Scheduling, Template, Workload,
    },
};

/// Maximum depth of the template and group trees (seed 002).
pub const MAX_DEPTH: usize = 4;
/// Maximum number of child templates at any level of a Workload (seed 002).
pub const MAX_TEMPLATES: usize = 8;

/// Settings validation depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidationOptions {
    /// The PodGroupPreemptionPolicy feature gate: the root's preemptionPolicy must equal the pods'.
    pub pod_group_preemption_policy: bool,
}

/// Whether `s` is a DNS-1123 subdomain (lowercase alphanumerics, `-`, `.`, <= 253).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| is_label_chars(l, 253))
}

/// Whether `s` is a DNS-1123 label (lowercase alphanumerics and `-`, <= 63).
pub fn is_dns_label(s: &str) -> bool {
    is_label_chars(s, 63)
}

fn is_label_chars(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= max
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Checks every rule of the module doc on one namespace; sorted, deterministic.
pub fn validate(f: &Forest, opts: &ValidationOptions) -> Vec<Problem> {
    let mut out = Vec::new();
    for d in &f.duplicates {
        out.push(Problem::on(
            d,
            Rule::NameUnique,
            format!(
                "another {} is named {:?} in this namespace",
                d.kind(),
                d.meta().name
            ),
        ));
    }
    let objects: Vec<Object> = f.refs().iter().filter_map(|r| f.get(r)).collect();
    for o in &objects {
        if !is_dns_subdomain(&o.meta().name) {
            out.push(Problem::on(
                o,
                Rule::NameDnsSubdomain,
                format!("{:?} is not a DNS subdomain", o.meta().name),
            ));
        }
        if let Object::Pod(p) = o
            && let Some(pp) = &p.preemption_policy
        {
            check_preemption_value(o, pp, &mut out);
        }
    }
    for w in f.workloads.values() {
        check_workload(w, &mut out);
    }
    for g in f.groups.values() {
        check_group(f, g, &mut out);
    }
    for members in f.hierarchies().values() {
        check_hierarchy(f, members, opts, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// Objects that name a parent, PodGroup or Workload absent from the set (`reference-exists`).
pub fn dangling(f: &Forest) -> Vec<Problem> {
    let mut out = Vec::new();
    for g in f.groups.values() {
        let o = Object::Group(g.clone());
        if let Some(p) = f.parent_ref(&g.obj_ref())
            && !f.groups.contains_key(&p)
        {
            out.push(Problem::on(
                &o,
                Rule::ReferenceExists,
                format!("parent {p} does not exist"),
            ));
        }
        if let Some(r) = &g.workload_ref
            && !f.workloads.contains_key(&r.workload_name)
        {
            out.push(Problem::on(
                &o,
                Rule::ReferenceExists,
                format!("Workload/{} does not exist", r.workload_name),
            ));
        }
    }
    for p in f.pods.values() {
        if let Some(pg) = &p.pod_group
            && !f.groups.contains_key(&ObjRef::new(Kind::PodGroup, pg))
        {
            out.push(Problem::on(
                &Object::Pod(p.clone()),
                Rule::ReferenceExists,
                format!("PodGroup/{pg} does not exist"),
            ));
        }
    }
    out.sort();
    out
}

fn is_preemption_policy(value: &str) -> bool {
    value == "PreemptLowerPriority" || value == "Never"
}

fn check_preemption_value(o: &Object, value: &str, out: &mut Vec<Problem>) {
    if !is_preemption_policy(value) {
        out.push(Problem::on(
            o,
            Rule::PreemptionPolicyValue,
            format!("preemptionPolicy {value:?} is neither PreemptLowerPriority nor Never"),
        ));
    }
}

/// The rules a group or a template obeys on its own fields.
fn check_scheduling(o: &Object, what: &str, kind: Kind, s: &Scheduling, out: &mut Vec<Problem>) {
    let mut push = |rule, msg: String| out.push(Problem::on(o, rule, format!("{what}{msg}")));
    match s.policy {
        Policy::Ambiguous => push(
            Rule::SchedulingPolicyExclusive,
            "schedulingPolicy must set exactly one of basic and gang".into(),
        ),
        Policy::Gang { min } if min < 1 && kind == Kind::PodGroup => push(
            Rule::MinCountPositive,
            format!("gang minCount is {min}, must be at least 1"),
        ),
        Policy::Gang { min } if min < 1 => push(
            Rule::MinGroupCountPositive,
            format!("gang minGroupCount is {min}, must be at least 1"),
        ),
        _ => {}
    }
    if s.disruption == Disruption::Ambiguous {
        push(
            Rule::DisruptionModeExclusive,
            "disruptionMode must set at most one of single and all".into(),
        );
    }
    // KEP-5710: `all` means "evict together", which only a gang defines.
    if kind == Kind::PodGroup && s.disruption == Disruption::All && s.policy == Policy::Basic {
        push(
            Rule::DisruptionAllWithBasic,
            "disruptionMode all needs a gang schedulingPolicy, not basic".into(),
        );
    }
    if let Some(pp) = &s.preemption_policy
        && !is_preemption_policy(pp)
    {
        push(
            Rule::PreemptionPolicyValue,
            format!("preemptionPolicy {pp:?} is neither PreemptLowerPriority nor Never"),
        );
    }
}

fn check_workload(w: &Workload, out: &mut Vec<Problem>) {
    let o = Object::Workload(w.clone());
    let pg = w.templates.iter().any(|t| t.kind == Kind::PodGroup);
    let cpg = w
        .templates
        .iter()
        .any(|t| t.kind == Kind::CompositePodGroup);
    if pg == cpg {
        out.push(Problem::on(
            &o,
            Rule::TemplateExclusive,
            "spec must set exactly one of podGroupTemplates and compositePodGroupTemplates",
        ));
    }
    if w.templates.len() > MAX_TEMPLATES {
        out.push(Problem::on(
            &o,
            Rule::TemplateCount,
            format!(
                "{} top-level templates, at most {MAX_TEMPLATES}",
                w.templates.len()
            ),
        ));
    }
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut stack: Vec<(&Template, usize, Option<&Template>)> =
        w.templates.iter().map(|t| (t, 1, None)).collect();
    while let Some((t, depth, parent)) = stack.pop() {
        *names.entry(t.name.as_str()).or_default() += 1;
        let what = format!("template {:?}: ", t.name);
        if !is_dns_label(&t.name) {
            out.push(Problem::on(
                &o,
                Rule::NameDnsLabel,
                format!("{what}name is not a DNS label"),
            ));
        }
        check_scheduling(&o, &what, t.kind, &t.scheduling, out);
        if parent.is_some_and(|p| p.scheduling.disruption.is_all())
            && !t.scheduling.disruption.is_all()
        {
            out.push(Problem::on(
                &o,
                Rule::DisruptionAllInherited,
                format!("{what}its parent template has disruptionMode all, so must it"),
            ));
        }
        if depth > MAX_DEPTH {
            out.push(Problem::on(
                &o,
                Rule::DepthLimit,
                format!("{what}at depth {depth}, at most {MAX_DEPTH}"),
            ));
        }
        if t.kind == Kind::CompositePodGroup {
            if t.children.is_empty() {
                out.push(Problem::on(
                    &o,
                    Rule::CompositeTemplateChildren,
                    format!("{what}a composite template needs at least one child template"),
                ));
            }
            if t.children.len() > MAX_TEMPLATES {
                out.push(Problem::on(
                    &o,
                    Rule::TemplateCount,
                    format!(
                        "{what}{} child templates, at most {MAX_TEMPLATES}",
                        t.children.len()
                    ),
                ));
            }
        }
        stack.extend(t.children.iter().map(|c| (c, depth + 1, Some(t))));
    }
    for (name, n) in names {
        if n > 1 {
            out.push(Problem::on(
                &o,
                Rule::TemplateNameUnique,
                format!("template name {name:?} is used {n} times"),
            ));
        }
    }
}

/// Finds a template by name in a Workload, with its parent template's name.
pub fn find_template<'a>(w: &'a Workload, name: &str) -> Option<(&'a Template, Option<&'a str>)> {
    let mut stack: Vec<(&Template, Option<&str>)> = w.templates.iter().map(|t| (t, None)).collect();
    while let Some((t, parent)) = stack.pop() {
        if t.name == name {
            return Some((t, parent));
        }
        stack.extend(t.children.iter().map(|c| (c, Some(t.name.as_str()))));
    }
    None
}

fn check_group(f: &Forest, g: &Group, out: &mut Vec<Problem>) {
    let o = Object::Group(g.clone());
    let r = g.obj_ref();
    check_scheduling(&o, "", g.kind, &g.scheduling, out);
    match f.depth(&r) {
        None => {
            // Template rules cannot hold on a loop; report the loop alone.
            out.push(Problem::on(
                &o,
                Rule::NoCycles,
                "its parentCompositePodGroupName chain loops",
            ));
            return;
        }
        Some(d) if d > MAX_DEPTH => out.push(Problem::on(
            &o,
            Rule::DepthLimit,
            format!("at depth {d}, at most {MAX_DEPTH}"),
        )),
        Some(_) => {}
    }
    let parent = f.parent(&r);
    if parent.is_some_and(|p| p.scheduling.disruption.is_all()) && !g.scheduling.disruption.is_all()
    {
        out.push(Problem::on(
            &o,
            Rule::DisruptionAllInherited,
            "its parent has disruptionMode all, so must it",
        ));
    }
    let Some(wr) = &g.workload_ref else {
        if g.kind == Kind::CompositePodGroup {
            out.push(Problem::on(
                &o,
                Rule::WorkloadRefRequired,
                "spec.workloadRef is required",
            ));
        }
        return;
    };
    let Some(w) = f.workloads.get(&wr.workload_name) else {
        return; // dangling: held, not invalid
    };
    let Some((_, t_parent)) = find_template(w, &wr.template_name).filter(|(t, _)| t.kind == g.kind)
    else {
        out.push(Problem::on(
            &o,
            Rule::WorkloadTemplateExists,
            format!(
                "Workload/{} has no {}Template {:?}",
                wr.workload_name, g.kind, wr.template_name
            ),
        ));
        return;
    };
    // The group tree mirrors the template tree (KEP-6012): a root comes from a top-level
    // template, a child from a child template of its parent's.
    let expected_parent: Option<Option<&str>> = match (&g.parent, parent) {
        (None, _) => Some(None),
        (Some(_), Some(p)) => p
            .workload_ref
            .as_ref()
            .filter(|pr| pr.workload_name == wr.workload_name)
            .map(|pr| Some(pr.template_name.as_str())),
        (Some(_), None) => None,
    };
    if let Some(exp) = expected_parent
        && exp != t_parent
    {
        let msg = match exp {
            None => format!(
                "template {:?} is not a top-level template, but the group has no parent",
                wr.template_name
            ),
            Some(p) => format!(
                "template {:?} is not a child of its parent's template {p:?}",
                wr.template_name
            ),
        };
        out.push(Problem::on(&o, Rule::TemplateParentMatch, msg));
    }
}

/// Effective priority: unset with no class resolves to 0; unset with a class is unknown here
/// (admission resolves it from the PriorityClass).
fn effective_priority(priority: Option<i32>, class: &Option<String>) -> Option<i32> {
    priority.or(if class.is_none() { Some(0) } else { None })
}

fn check_hierarchy(
    f: &Forest,
    members: &[ObjRef],
    opts: &ValidationOptions,
    out: &mut Vec<Problem>,
) {
    let objects: Vec<Object> = members.iter().filter_map(|m| f.get(m)).collect();
    let groups: Vec<&Group> = members.iter().filter_map(|m| f.groups.get(m)).collect();
    let Some(first) = members.first() else { return };
    let top = f.hierarchy_key(first);
    let root = f.groups.get(&top);
    let complete = matches!(f.top(first), Top::Group { complete: true, .. });

    // single-workload: compare with the root's Workload, else the first one named.
    let workloads: Vec<&str> = groups
        .iter()
        .filter_map(|g| g.workload_ref.as_ref().map(|r| r.workload_name.as_str()))
        .collect();
    if let Some(reference) = root
        .and_then(|r| r.workload_ref.as_ref().map(|r| r.workload_name.as_str()))
        .or(workloads.first().copied())
    {
        for g in &groups {
            if let Some(r) = &g.workload_ref
                && r.workload_name != reference
            {
                out.push(Problem::on(
                    &Object::Group((*g).clone()),
                    Rule::SingleWorkload,
                    format!(
                        "refers to Workload/{} but its hierarchy belongs to Workload/{reference}",
                        r.workload_name
                    ),
                ));
            }
        }
    }

    let pods: Vec<(&Object, &super::types::Pod)> = objects
        .iter()
        .filter_map(|o| match o {
            Object::Pod(p) => Some((o, p)),
            _ => None,
        })
        .collect();

    // scheduler-name-consistent: one scheduler sees the whole hierarchy.
    let scheduler = |p: &super::types::Pod| {
        p.scheduler_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SCHEDULER.to_owned())
    };
    if let Some(want) = majority(pods.iter().map(|(_, p)| scheduler(p))) {
        for (o, p) in &pods {
            let got = scheduler(p);
            if got != want {
                out.push(Problem::on(
                    o,
                    Rule::SchedulerNameConsistent,
                    format!("schedulerName {got:?} differs from the hierarchy's {want:?}"),
                ));
            }
        }
    }

    // priority-consistent: the root's priority, else the first known one.
    let prio = |o: &Object| match o {
        Object::Group(g) => {
            effective_priority(g.scheduling.priority, &g.scheduling.priority_class_name)
        }
        Object::Pod(p) => effective_priority(p.priority, &p.priority_class_name),
        Object::Workload(_) => None,
    };
    let reference = if complete {
        root.and_then(|r| {
            effective_priority(r.scheduling.priority, &r.scheduling.priority_class_name)
        })
    } else {
        None
    }
    .or_else(|| objects.iter().find_map(prio));
    if let Some(want) = reference {
        for o in &objects {
            if let Some(got) = prio(o)
                && got != want
            {
                out.push(Problem::on(
                    o,
                    Rule::PriorityConsistent,
                    format!("priority {got} differs from the hierarchy's {want}"),
                ));
            }
        }
    }

    // preemption-policy-consistent.
    let preemption = |p: &super::types::Pod| {
        p.preemption_policy
            .clone()
            .unwrap_or_else(|| DEFAULT_PREEMPTION.to_owned())
    };
    if let Some(want) = majority(pods.iter().map(|(_, p)| preemption(p))) {
        for (o, p) in &pods {
            let got = preemption(p);
            if got != want {
                out.push(Problem::on(
                    o,
                    Rule::PreemptionPolicyConsistent,
                    format!("preemptionPolicy {got:?} differs from the hierarchy's {want:?}"),
                ));
            }
        }
        if let (true, true, Some(r)) = (opts.pod_group_preemption_policy, complete, root) {
            let got = r
                .scheduling
                .preemption_policy
                .as_deref()
                .unwrap_or(DEFAULT_PREEMPTION);
            if got != want {
                out.push(Problem::on(
                    &Object::Group(r.clone()),
                    Rule::PreemptionPolicyConsistent,
                    format!("root preemptionPolicy {got:?} differs from the pods' {want:?} (PodGroupPreemptionPolicy)"),
                ));
            }
        }
    }
}

/// The most frequent value (the smallest among equals), so the odd one out is reported.
fn majority(values: impl Iterator<Item = String>) -> Option<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    let best = counts.values().copied().max()?;
    counts.into_iter().find(|(_, n)| *n == best).map(|(v, _)| v)
}

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
//! - `depth-limit`: template trees and group trees are at most 4 levels deep (seed 002); a
//!   parent that is named but absent counts as a level ([`Forest::depth`]).
//! - `scheduling-policy-exclusive`: exactly one of `basic` / `gang`.
//! - `disruption-mode-exclusive`: `disruptionMode`, when set, sets exactly one of `single` / `all`.
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
//! - `priority-consistent` also holds within a Workload: every template has the same
//!   `priority` and `priorityClassName` (`validateWorkloadPriority`).
//! - `reference-name`: every name a reference holds is a valid name of its target, as the API
//!   server checks it: `podGroupName`, `parentCompositePodGroupName`, `workloadName` and
//!   `priorityClassName` DNS subdomains, `templateName` a DNS label.
//! - `priority-class`: a Pod's, PodGroup's or CompositePodGroup's `priority` (and a Pod's
//!   `preemptionPolicy`), when set, is what the Priority admission plugin computes from
//!   `priorityClassName`: no class, 0 and PreemptLowerPriority (qoslet assumes no globalDefault
//!   PriorityClass); `system-cluster-critical` and `system-node-critical`, their built-in values.
//!   Another class is not in qoslet's input, so its value is not checked.
//! - `priority-range`: a group's or template's priority is at most 1000000000
//!   (HighestUserDefinablePriority), its own or the one its class gives it.
//!
//! [`dangling`] reports `reference-exists` (a parent, PodGroup or Workload that is not in the set,
//! under a valid name): the API server takes such objects and the scheduler holds them until the
//! target exists, so `qoslet validate` reports them as pending, and gating holds them.
//! Update rules live in `update.rs` (`immutable-min-group-count`, `immutable-scheduling-policy`,
//! `immutable-parent`, `immutable-disruption-mode`, `immutable-scheduling-group`,
//! `immutable-workload-ref`, `immutable-workload-spec`); `kind-known`, `api-version` and `schema`
//! are the CLI's.

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
pub(crate) const MAX_TEMPLATES: usize = 8;
/// The highest priority a group or template may hold (HighestUserDefinablePriority).
pub(crate) const MAX_USER_PRIORITY: i32 = 1_000_000_000;
/// The PriorityClasses every cluster has (`scheduling/v1.SystemPriorityClasses`), with their
/// values; their preemptionPolicy is PreemptLowerPriority.
pub(crate) const SYSTEM_PRIORITY_CLASSES: [(&str, i32); 2] = [
    ("system-cluster-critical", 2_000_000_000),
    ("system-node-critical", 2_000_001_000),
];

/// Whether a walk up from a pod reads the parent of a group `level` levels up (the pod's
/// PodGroup is 1). Past [`MAX_DEPTH`] levels the chain is too deep whatever lies above, and
/// [`Forest::depth`] counts a named parent that is absent as a level, so the walk reads at most
/// [`MAX_DEPTH`] levels and the `depth-limit` rule still sees a longer chain, or a loop that
/// closes above the limit.
pub(crate) fn reads_parent(level: usize) -> bool {
    level < MAX_DEPTH
}

/// Settings validation depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidationOptions {
    /// The PodGroupPreemptionPolicy feature gate: the root's preemptionPolicy must equal the pods'.
    pub(crate) pod_group_preemption_policy: bool,
}

/// Whether `s` is a DNS-1123 subdomain (lowercase alphanumerics, `-`, `.`, <= 253).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| is_label_chars(l, 253))
}

/// Whether `s` is a DNS-1123 label (lowercase alphanumerics and `-`, <= 63).
pub(crate) fn is_dns_label(s: &str) -> bool {
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
pub(crate) fn validate(f: &Forest, opts: &ValidationOptions) -> Vec<Problem> {
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
        for (field, name, valid) in references(o) {
            if !valid {
                out.push(
                    Problem::on(
                        o,
                        Rule::ReferenceName,
                        format!("{name:?} is not a valid name"),
                    )
                    .at(field),
                );
            }
        }
        check_priority_class(o, &mut out);
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
pub(crate) fn dangling(f: &Forest) -> Vec<Problem> {
    let mut out = Vec::new();
    for g in f.groups.values() {
        let o = Object::Group(g.clone());
        if let Some(p) = f.parent_ref(&g.obj_ref())
            && !f.groups.contains_key(&p)
            && is_dns_subdomain(&p.name)
        {
            out.push(
                Problem::on(
                    &o,
                    Rule::ReferenceExists,
                    format!("parent {p} does not exist"),
                )
                .about("spec.parentCompositePodGroupName"),
            );
        }
        if let Some(r) = &g.workload_ref
            && !f.workloads.contains_key(&r.workload_name)
            && is_dns_subdomain(&r.workload_name)
        {
            out.push(
                Problem::on(
                    &o,
                    Rule::ReferenceExists,
                    format!("Workload/{} does not exist", r.workload_name),
                )
                .about("spec.workloadRef.workloadName"),
            );
        }
    }
    for p in f.pods.values() {
        if let Some(pg) = &p.pod_group
            && !f.groups.contains_key(&ObjRef::new(Kind::PodGroup, pg))
            && is_dns_subdomain(pg)
        {
            out.push(
                Problem::on(
                    &Object::Pod(p.clone()),
                    Rule::ReferenceExists,
                    format!("PodGroup/{pg} does not exist"),
                )
                .about("spec.schedulingGroup.podGroupName"),
            );
        }
    }
    out.sort();
    out
}

/// The names `o`'s references hold: (field, name, whether it is a valid name of the target).
fn references(o: &Object) -> Vec<(&'static str, &str, bool)> {
    let mut out = Vec::new();
    fn subdomain<'a>(
        out: &mut Vec<(&'static str, &'a str, bool)>,
        field: &'static str,
        name: &'a Option<String>,
    ) {
        if let Some(n) = name.as_deref().filter(|n| !n.is_empty()) {
            out.push((field, n, is_dns_subdomain(n)));
        }
    }
    match o {
        Object::Pod(p) => {
            subdomain(&mut out, "spec.schedulingGroup.podGroupName", &p.pod_group);
            subdomain(&mut out, "spec.priorityClassName", &p.priority_class_name);
        }
        Object::Group(g) => {
            subdomain(&mut out, "spec.parentCompositePodGroupName", &g.parent);
            subdomain(
                &mut out,
                "spec.priorityClassName",
                &g.scheduling.priority_class_name,
            );
            if let Some(r) = &g.workload_ref {
                out.push((
                    "spec.workloadRef.workloadName",
                    r.workload_name.as_str(),
                    is_dns_subdomain(&r.workload_name),
                ));
                out.push((
                    "spec.workloadRef.templateName",
                    r.template_name.as_str(),
                    is_dns_label(&r.template_name),
                ));
            }
        }
        Object::Workload(_) => {}
    }
    out
}

/// The value and preemptionPolicy the Priority admission plugin gives an object of `class`:
/// `None` for a class qoslet does not know (one only the cluster holds).
fn class_priority(class: &Option<String>) -> Option<(i32, &'static str)> {
    match class.as_deref().filter(|c| !c.is_empty()) {
        None => Some((0, DEFAULT_PREEMPTION)),
        Some(c) => SYSTEM_PRIORITY_CLASSES
            .iter()
            .find(|(name, _)| *name == c)
            .map(|(_, v)| (*v, DEFAULT_PREEMPTION)),
    }
}

/// `priority-class` and, for groups, `priority-range` (module doc).
fn check_priority_class(o: &Object, out: &mut Vec<Problem>) {
    let (priority, class, preemption) = match o {
        Object::Pod(p) => (p.priority, &p.priority_class_name, &p.preemption_policy),
        Object::Group(g) => (
            g.scheduling.priority,
            &g.scheduling.priority_class_name,
            &None,
        ),
        Object::Workload(_) => return,
    };
    let computed = class_priority(class);
    let from = match class.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => format!("PriorityClass {c}"),
        None => "no priorityClassName".to_owned(),
    };
    if let (Some(p), Some((v, _))) = (priority, computed)
        && p != v
    {
        out.push(Problem::on(
            o,
            Rule::PriorityClass,
            format!(
                "priority {p} is not {v}, the value the Priority admission computes from {from}"
            ),
        ));
    }
    // An unknown value is `preemption-policy-value`'s.
    if let (Some(pp), Some((_, want))) = (preemption, computed)
        && pp != want
        && is_preemption_policy(pp)
    {
        out.push(Problem::on(
            o,
            Rule::PriorityClass,
            format!("preemptionPolicy {pp:?} is not {want:?}, the one the Priority admission computes from {from}"),
        ));
    }
    if matches!(o, Object::Group(_))
        && let Some(p) = priority.or(computed.map(|(v, _)| v))
    {
        check_priority_range(o, "", p, out);
    }
}

fn check_priority_range(o: &Object, what: &str, p: i32, out: &mut Vec<Problem>) {
    if p > MAX_USER_PRIORITY {
        out.push(Problem::on(
            o,
            Rule::PriorityRange,
            format!(
                "{what}priority {p} is above {MAX_USER_PRIORITY}, the highest a group may have"
            ),
        ));
    }
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
            "disruptionMode, when set, must set exactly one of single and all".into(),
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
        if let Some(p) = t.scheduling.priority {
            check_priority_range(&o, &what, p, out);
        }
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
    // One priority and class for the whole template tree (`validateWorkloadPriority`).
    let mut all: Vec<&Template> = Vec::new();
    let mut stack: Vec<&Template> = w.templates.iter().collect();
    while let Some(t) = stack.pop() {
        all.push(t);
        stack.extend(t.children.iter());
    }
    let key = |t: &Template| {
        (
            t.scheduling.priority,
            t.scheduling.priority_class_name.clone().unwrap_or_default(),
        )
    };
    if let Some(first) = all.first()
        && all.iter().any(|t| key(t) != key(first))
    {
        out.push(Problem::on(
            &o,
            Rule::PriorityConsistent,
            "the templates' priority and priorityClassName differ: all must be the same",
        ));
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
pub(crate) fn find_template<'a>(
    w: &'a Workload,
    name: &str,
) -> Option<(&'a Template, Option<&'a str>)> {
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
        Some(d) if d > MAX_DEPTH => {
            // With a parent absent the depth counted is the least the chain can have.
            let open = matches!(
                f.top(&r),
                Top::Group {
                    complete: false,
                    ..
                }
            );
            let more = if open { " or more" } else { "" };
            out.push(Problem::on(
                &o,
                Rule::DepthLimit,
                format!("at depth {d}{more}, at most {MAX_DEPTH}"),
            ));
        }
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
        } else if g.parent.is_some() {
            out.push(Problem::on(
                &o,
                Rule::WorkloadRefRequired,
                "spec.workloadRef must be set when parentCompositePodGroupName is set",
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

/// Effective priority: what is set, else what the Priority admission computes from the class
/// (unknown for a class qoslet does not know).
fn effective_priority(priority: Option<i32>, class: &Option<String>) -> Option<i32> {
    priority.or(class_priority(class).map(|(v, _)| v))
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

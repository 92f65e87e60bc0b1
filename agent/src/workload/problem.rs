//! Rule names and problems: the vocabulary of `qoslet validate` output. The names are a stable
//! interface (tests and users match on them); the rules themselves are listed in `validate.rs`,
//! and the admission rules every object passes before anything runs in `source/admit.rs`.

use std::fmt;

use super::types::{ObjRef, Object, Origin};

/// A stable rule name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Rule {
    NameDnsSubdomain,
    NameDnsLabel,
    NameUnique,
    TemplateNameUnique,
    TemplateExclusive,
    CompositeTemplateChildren,
    TemplateCount,
    DepthLimit,
    SchedulingPolicyExclusive,
    DisruptionModeExclusive,
    PreemptionPolicyValue,
    MinCountPositive,
    MinGroupCountPositive,
    DisruptionAllWithBasic,
    DisruptionAllInherited,
    NoCycles,
    WorkloadRefRequired,
    SingleWorkload,
    WorkloadTemplateExists,
    TemplateParentMatch,
    SchedulerNameConsistent,
    PriorityConsistent,
    PreemptionPolicyConsistent,
    ReferenceExists,
    ReferenceName,
    PriorityClass,
    PriorityRange,
    ImmutableMinGroupCount,
    ImmutableSchedulingPolicy,
    ImmutableParent,
    ImmutableDisruptionMode,
    ImmutableSchedulingGroup,
    ImmutableWorkloadRef,
    ImmutableWorkloadSpec,
    KindKnown,
    ApiVersion,
    Schema,
    NamespaceDnsLabel,
    ContainerNameDnsLabel,
    ContainerNameUnique,
    UidFormat,
    UidUnique,
    QuantityNonNegative,
    QuantityRange,
    RequestWithinLimit,
    ContainersRequired,
    UnknownField,
}

impl Rule {
    /// Every rule, in declaration order.
    #[cfg(test)]
    pub(crate) const ALL: [Rule; 47] = [
        Rule::NameDnsSubdomain,
        Rule::NameDnsLabel,
        Rule::NameUnique,
        Rule::TemplateNameUnique,
        Rule::TemplateExclusive,
        Rule::CompositeTemplateChildren,
        Rule::TemplateCount,
        Rule::DepthLimit,
        Rule::SchedulingPolicyExclusive,
        Rule::DisruptionModeExclusive,
        Rule::PreemptionPolicyValue,
        Rule::MinCountPositive,
        Rule::MinGroupCountPositive,
        Rule::DisruptionAllWithBasic,
        Rule::DisruptionAllInherited,
        Rule::NoCycles,
        Rule::WorkloadRefRequired,
        Rule::SingleWorkload,
        Rule::WorkloadTemplateExists,
        Rule::TemplateParentMatch,
        Rule::SchedulerNameConsistent,
        Rule::PriorityConsistent,
        Rule::PreemptionPolicyConsistent,
        Rule::ReferenceExists,
        Rule::ReferenceName,
        Rule::PriorityClass,
        Rule::PriorityRange,
        Rule::ImmutableMinGroupCount,
        Rule::ImmutableSchedulingPolicy,
        Rule::ImmutableParent,
        Rule::ImmutableDisruptionMode,
        Rule::ImmutableSchedulingGroup,
        Rule::ImmutableWorkloadRef,
        Rule::ImmutableWorkloadSpec,
        Rule::KindKnown,
        Rule::ApiVersion,
        Rule::Schema,
        Rule::NamespaceDnsLabel,
        Rule::ContainerNameDnsLabel,
        Rule::ContainerNameUnique,
        Rule::UidFormat,
        Rule::UidUnique,
        Rule::QuantityNonNegative,
        Rule::QuantityRange,
        Rule::RequestWithinLimit,
        Rule::ContainersRequired,
        Rule::UnknownField,
    ];

    /// The rules source/admit.rs checks on each object before the forest sees it (with
    /// `name-dns-subdomain`, which the forest checks too).
    #[cfg(test)]
    pub(crate) const ADMISSION: [Rule; 9] = [
        Rule::NamespaceDnsLabel,
        Rule::ContainerNameDnsLabel,
        Rule::ContainerNameUnique,
        Rule::UidFormat,
        Rule::UidUnique,
        Rule::QuantityNonNegative,
        Rule::QuantityRange,
        Rule::RequestWithinLimit,
        Rule::ContainersRequired,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Rule::NameDnsSubdomain => "name-dns-subdomain",
            Rule::NameDnsLabel => "name-dns-label",
            Rule::NameUnique => "name-unique",
            Rule::TemplateNameUnique => "template-name-unique",
            Rule::TemplateExclusive => "template-exclusive",
            Rule::CompositeTemplateChildren => "composite-template-children",
            Rule::TemplateCount => "template-count",
            Rule::DepthLimit => "depth-limit",
            Rule::SchedulingPolicyExclusive => "scheduling-policy-exclusive",
            Rule::DisruptionModeExclusive => "disruption-mode-exclusive",
            Rule::PreemptionPolicyValue => "preemption-policy-value",
            Rule::MinCountPositive => "min-count-positive",
            Rule::MinGroupCountPositive => "min-group-count-positive",
            Rule::DisruptionAllWithBasic => "disruption-all-with-basic",
            Rule::DisruptionAllInherited => "disruption-all-inherited",
            Rule::NoCycles => "no-cycles",
            Rule::WorkloadRefRequired => "workload-ref-required",
            Rule::SingleWorkload => "single-workload",
            Rule::WorkloadTemplateExists => "workload-template-exists",
            Rule::TemplateParentMatch => "template-parent-match",
            Rule::SchedulerNameConsistent => "scheduler-name-consistent",
            Rule::PriorityConsistent => "priority-consistent",
            Rule::PreemptionPolicyConsistent => "preemption-policy-consistent",
            Rule::ReferenceExists => "reference-exists",
            Rule::ReferenceName => "reference-name",
            Rule::PriorityClass => "priority-class",
            Rule::PriorityRange => "priority-range",
            Rule::ImmutableMinGroupCount => "immutable-min-group-count",
            Rule::ImmutableSchedulingPolicy => "immutable-scheduling-policy",
            Rule::ImmutableParent => "immutable-parent",
            Rule::ImmutableDisruptionMode => "immutable-disruption-mode",
            Rule::ImmutableSchedulingGroup => "immutable-scheduling-group",
            Rule::ImmutableWorkloadRef => "immutable-workload-ref",
            Rule::ImmutableWorkloadSpec => "immutable-workload-spec",
            Rule::KindKnown => "kind-known",
            Rule::ApiVersion => "api-version",
            Rule::Schema => "schema",
            Rule::NamespaceDnsLabel => "namespace-dns-label",
            Rule::ContainerNameDnsLabel => "container-name-dns-label",
            Rule::ContainerNameUnique => "container-name-unique",
            Rule::UidFormat => "uid-format",
            Rule::UidUnique => "uid-unique",
            Rule::QuantityNonNegative => "quantity-non-negative",
            Rule::QuantityRange => "quantity-range",
            Rule::RequestWithinLimit => "request-within-limit",
            Rule::ContainersRequired => "containers-required",
            Rule::UnknownField => "unknown-field",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken rule on one object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Problem {
    pub(crate) origin: Origin,
    /// The object in its forest, when it is one of the hierarchy's kinds.
    pub(crate) object: Option<ObjRef>,
    /// `Kind/namespace/name` (`Kind/name` without a namespace).
    pub(crate) id: String,
    pub(crate) rule: Rule,
    pub(crate) message: String,
    /// The field the problem is in (`spec.containers[0].resources`), when it is one field's;
    /// the message names it too. It says where in the document the problem is.
    pub(crate) field: String,
    /// The 1-based line of [`Self::field`] (else of the object) in its file, once looked up
    /// (`source::manifest::Loaded::locate`).
    pub(crate) line: Option<u64>,
}

impl Problem {
    pub(crate) fn new(origin: &Origin, id: String, rule: Rule, message: impl Into<String>) -> Self {
        Self {
            origin: origin.clone(),
            object: None,
            id,
            rule,
            message: message.into(),
            field: String::new(),
            line: None,
        }
    }

    /// The problem of one field: the message is `field: message`.
    pub(crate) fn at(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self.message = format!("{}: {}", self.field, self.message);
        self
    }

    /// The problem is about `field`, which the message names in its own words: the field is
    /// where its line is looked up.
    pub(crate) fn about(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }

    /// A problem on an object of the forest.
    pub(crate) fn on(o: &Object, rule: Rule, message: impl Into<String>) -> Self {
        Self {
            object: Some(o.obj_ref()),
            ..Self::new(&o.meta().origin, display_id(o), rule, message)
        }
    }
}

/// `file:line: Kind/namespace/name: rule: message` (`file: ...` while the line is not looked
/// up), as docs/usage.md documents for `validate`.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.origin.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {}: {}: {}", self.id, self.rule, self.message)
    }
}

/// `Kind/namespace/name`, or `Kind/name` without a namespace.
pub(crate) fn display_id(o: &Object) -> String {
    let m = o.meta();
    if m.namespace.is_empty() {
        format!("{}/{}", o.kind(), m.name)
    } else {
        format!("{}/{}/{}", o.kind(), m.namespace, m.name)
    }
}

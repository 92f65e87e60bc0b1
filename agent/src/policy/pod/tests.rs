use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;

use super::*;
use crate::policy::{
    oom::{GUARANTEED_OOM_SCORE_ADJ, container_oom_score_adj, container_oom_score_adj_with},
    qos::{QosClass, compute_pod_qos, pod_qos},
};

fn pod(yaml: &str) -> PodSpecView {
    let pod: Pod = serde_yaml_ng::from_str(yaml).expect("valid pod YAML");
    PodSpecView::from_pod(&pod).expect("valid pod")
}

fn q(s: &str) -> Option<Quantity> {
    Some(s.parse().expect("quantity"))
}

const GIB32: i64 = 32 << 30;

#[test]
fn reads_containers_sidecars_and_defaults_requests_to_limits() {
    let p = pod(r#"
metadata: {name: web, namespace: shop}
spec:
  initContainers:
    - {name: init, resources: {requests: {cpu: 2, memory: 1Gi}}}
    - {name: proxy, restartPolicy: Always, resources: {limits: {cpu: 500m, memory: 128Mi}}}
  containers:
    - {name: app, resources: {requests: {cpu: "0.5", memory: 1Gi}}}
  ephemeralContainers:
    - {name: debug, resources: {}}
"#);
    let kinds: Vec<_> = p
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("init", ContainerKind::Init),
            ("proxy", ContainerKind::Sidecar),
            ("app", ContainerKind::App)
        ]
    );
    assert_eq!(p.containers[1].resources.requests.cpu, q("500m"));
    // Sum of app + sidecar = 1000m / 1Gi+128Mi; the init container peaks at 2000m / 1Gi.
    let r = p.requests();
    assert_eq!(r.cpu_millis(), 2000);
    assert_eq!(r.memory_bytes(), (1 << 30) + (128 << 20));
    assert_eq!(p.uid, derived_uid("shop", "web"));
    assert_eq!(p.uid, "ddd03ae4-ed32-8ce3-b9bc-f47fe84790fa");
}

#[test]
fn init_containers_after_a_sidecar_add_its_requests() {
    // Upstream PodRequests: an init container started after a sidecar runs beside it.
    let p = pod(r#"
spec:
  initContainers:
    - {name: side, restartPolicy: Always, resources: {requests: {memory: 1Gi}}}
    - {name: init, resources: {requests: {memory: 2Gi}}}
  containers:
    - {name: app, resources: {requests: {memory: 1Gi}}}
"#);
    assert_eq!(p.requests().memory_bytes(), 3 << 30);
}

#[test]
fn pod_level_resources_override_the_aggregate() {
    let p = pod(r#"
spec:
  resources: {requests: {memory: 4Gi}, limits: {cpu: 1, memory: 4Gi}}
  containers:
    - {name: a, resources: {requests: {memory: 1Gi}}}
    - {name: b}
"#);
    assert_eq!(p.requests().memory_bytes(), 4 << 30);
    assert_eq!(p.requests().cpu_millis(), 1000);
    assert_eq!(compute_pod_qos(&p), QosClass::Guaranteed);
}

#[test]
fn bad_quantities_name_their_field() {
    let pod: Pod = serde_yaml_ng::from_str(
        "spec:\n  containers:\n  - name: a\n    resources: {limits: {memory: 1Gb}}\n",
    )
    .unwrap();
    let err = PodSpecView::from_pod(&pod).unwrap_err();
    assert_eq!(err.field, "spec.containers[0].resources.limits.memory");
    assert!(err.to_string().contains("\"1Gb\""), "{err}");
}

#[test]
fn qos_classes() {
    let class = |spec: &str| pod_qos(&pod(spec));
    assert_eq!(
        class("spec: {containers: [{name: a}]}"),
        QosClass::BestEffort
    );
    assert_eq!(
        class("spec: {containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi}}}]}"),
        QosClass::Guaranteed
    );
    assert_eq!(
        class(
            "spec: {containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi}}}, {name: b}]}"
        ),
        QosClass::Burstable
    );
    // 100m and 0.1 are the same quantity.
    assert_eq!(
        class(
            "spec: {containers: [{name: a, resources: {requests: {cpu: 100m, memory: 1Gi}, limits: {cpu: '0.1', memory: 1Gi}}}]}"
        ),
        QosClass::Guaranteed
    );
    // Zero requests do not count; other resources do not count.
    assert_eq!(
        class(
            "spec: {containers: [{name: a, resources: {requests: {cpu: 0, ephemeral-storage: 1Gi}}}]}"
        ),
        QosClass::BestEffort
    );
    // A sidecar without limits makes the pod Burstable.
    assert_eq!(
        class(
            "spec: {initContainers: [{name: s, restartPolicy: Always, resources: {requests: {cpu: 1}}}], containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi}}}]}"
        ),
        QosClass::Burstable
    );
    // Pod level without cpu limit.
    assert_eq!(
        class(
            "spec: {resources: {limits: {memory: 1Gi}}, containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi}}}]}"
        ),
        QosClass::Burstable
    );
    // status.qosClass wins.
    assert_eq!(
        class("spec: {containers: [{name: a}]}\nstatus: {qosClass: Burstable}"),
        QosClass::Burstable
    );
}

fn burstable_with_request(memory: &str) -> PodSpecView {
    pod(&format!(
        "spec: {{containers: [{{name: a, resources: {{requests: {{memory: {memory}}}}}}}]}}"
    ))
}

#[test]
fn oom_score_adj_examples() {
    // Seed 001: 50% of memory requested -> 500; 0.1% -> 999 (1000 - 1 = 999, never 1000).
    let half = burstable_with_request("16Gi");
    assert_eq!(
        container_oom_score_adj(&half, &half.containers[0], GIB32),
        500
    );
    let tiny = burstable_with_request("33554432"); // 32Mi = 0.1% of 32Gi (rounded down).
    assert_eq!(
        container_oom_score_adj(&tiny, &tiny.containers[0], GIB32),
        999
    );
    let zero = pod("spec: {containers: [{name: a, resources: {requests: {cpu: 1}}}]}");
    assert_eq!(
        container_oom_score_adj(&zero, &zero.containers[0], GIB32),
        999
    );
    // Requesting everything clamps at 3, above Guaranteed's -997.
    let all = burstable_with_request("40Gi");
    assert_eq!(container_oom_score_adj(&all, &all.containers[0], GIB32), 3);
    let g = pod("spec: {containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi}}}]}");
    assert_eq!(container_oom_score_adj(&g, &g.containers[0], GIB32), -997);
    let be = pod("spec: {containers: [{name: a}]}");
    assert_eq!(container_oom_score_adj(&be, &be.containers[0], GIB32), 1000);
    let critical = pod("spec: {priorityClassName: system-node-critical, containers: [{name: a}]}");
    assert_eq!(
        container_oom_score_adj(&critical, &critical.containers[0], GIB32),
        GUARANTEED_OOM_SCORE_ADJ
    );
}

#[test]
fn sidecars_are_capped_at_the_smallest_app_score_and_pod_level_shares_spread() {
    let p = pod(r#"
spec:
  initContainers:
    - {name: side, restartPolicy: Always, resources: {requests: {memory: 32Mi}}}
  containers:
    - {name: big, resources: {requests: {memory: 16Gi}}}
    - {name: small, resources: {requests: {memory: 8Gi}}}
"#);
    let score = |i: usize| container_oom_score_adj(&p, &p.containers[i], GIB32);
    assert_eq!((score(0), score(1), score(2)), (750, 500, 750));
    // Pod-level: (16Gi - 8Gi) / 2 containers = 4Gi more each.
    let p = pod(r#"
spec:
  resources: {requests: {memory: 16Gi}}
  containers:
    - {name: a, resources: {requests: {memory: 8Gi}}}
    - {name: b}
"#);
    let score = |i: usize| container_oom_score_adj(&p, &p.containers[i], GIB32);
    assert_eq!((score(0), score(1)), (625, 875));
}

/// A container for the property tests: (cpu request, cpu limit, mem request, mem limit) in
/// small units, 0 meaning absent.
type Spec = (u8, u8, u8, u8);

fn build(containers: &[Spec], sidecar_first: bool) -> PodSpecView {
    let mut yaml = String::from("spec:\n  containers:\n");
    let entry = |i: usize, s: &Spec, extra: &str| {
        let mut res = String::new();
        let mut list = |name: &str, cpu: u8, mem: u8| {
            let mut items = Vec::new();
            if cpu > 0 {
                items.push(format!("cpu: {}m", u32::from(cpu) * 100));
            }
            if mem > 0 {
                items.push(format!("memory: {}Mi", u32::from(mem) * 64));
            }
            if !items.is_empty() {
                res.push_str(&format!("{name}: {{{}}}, ", items.join(", ")));
            }
        };
        list("requests", s.0, s.2);
        list("limits", s.1, s.3);
        format!("  - {{name: c{i}, {extra}resources: {{{res}}}}}\n")
    };
    for (i, s) in containers
        .iter()
        .enumerate()
        .skip(usize::from(sidecar_first))
    {
        yaml.push_str(&entry(i, s, ""));
    }
    if sidecar_first && !containers.is_empty() {
        yaml.push_str("  initContainers:\n");
        yaml.push_str(&entry(0, &containers[0], "restartPolicy: Always, "));
    }
    pod(&yaml)
}

/// The rules of REFERENCE section 2, read independently of qos.rs.
fn expected_class(containers: &[Spec]) -> QosClass {
    let any = containers.iter().any(|&(a, b, c, d)| a + b + c + d > 0);
    if !any {
        return QosClass::BestEffort;
    }
    // Request defaults to limit; Guaranteed: every container has both limits and request == limit.
    let guaranteed = containers.iter().all(|&(cr, cl, mr, ml)| {
        let cr = if cr == 0 { cl } else { cr };
        let mr = if mr == 0 { ml } else { mr };
        cl > 0 && ml > 0 && cr == cl && mr == ml
    });
    if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec((0u8..4, 0u8..4, 0u8..4, 0u8..4), 1..4)
}

proptest! {
    #[test]
    fn qos_matches_an_independent_reading(containers in specs(), sidecar in any::<bool>()) {
        let p = build(&containers, sidecar && containers.len() > 1);
        // Sums equal per resource whenever each container is equal, and a container with a limit
        // below its request is rejected by the API; the independent rule compares per container.
        let valid = containers.iter().all(|&(cr, cl, mr, ml)| (cl == 0 || cr <= cl) && (ml == 0 || mr <= ml));
        prop_assume!(valid);
        prop_assert_eq!(compute_pod_qos(&p), expected_class(&containers));
    }

    #[test]
    fn oom_score_adj_is_bounded_and_ordered(containers in specs(), capacity_gib in 1i64..512) {
        let capacity = capacity_gib << 30;
        let p = build(&containers, false);
        let class = pod_qos(&p);
        for c in &p.containers {
            let adj = container_oom_score_adj(&p, c, capacity);
            prop_assert!((-997..=1000).contains(&adj));
            match class {
                QosClass::Guaranteed => prop_assert_eq!(adj, -997),
                QosClass::Burstable => prop_assert!((3..=999).contains(&adj)),
                QosClass::BestEffort => prop_assert_eq!(adj, 1000),
            }
        }
    }
}

/// pkg/kubelet/qos/policy_test.go `TestGetContainerOOMScoreAdjustTieBreak`, every row without a
/// DRA claim: (name, capacity, pod YAML, container index, gate off, gate on). The gate is alpha
/// and off by default, so "gate off" is also every earlier version's score.
#[test]
fn oom_score_adj_tie_break_reproduces_the_kubelet_rows() {
    const GI: i64 = 1 << 30;
    const TI: i64 = 1 << 40;
    let one = |req: &str, lim: Option<&str>| {
        let limits = lim.map_or(String::new(), |l| format!(", limits: {{memory: {l}}}"));
        format!(
            "spec: {{containers: [{{name: c, resources: {{requests: {{memory: {req}}}{limits}}}}}]}}"
        )
    };
    let sidecar = "spec: {initContainers: [{name: sidecar, restartPolicy: Always, resources: {requests: {memory: 50Mi}}}], containers: [{name: small-bounded, resources: {requests: {memory: 50Mi}, limits: {memory: 50Mi}}}, {name: large-unbounded, resources: {requests: {memory: 16Gi}}}]}".to_string();
    let pod_level = |limit: &str| {
        format!(
            "spec: {{resources: {{requests: {{memory: 2Gi}}, limits: {{memory: {limit}}}}}, containers: [{{name: c, resources: {{requests: {{cpu: 100m}}}}}}]}}"
        )
    };
    let rows: Vec<(&str, i64, String, usize, i32, i32)> = vec![
        (
            "16Gi node, 500Mi unlimited",
            16 * GI,
            one("500Mi", None),
            0,
            970,
            970,
        ),
        (
            "16Gi node, 500Mi request equals limit",
            16 * GI,
            one("500Mi", Some("500Mi")),
            0,
            970,
            969,
        ),
        (
            "1Ti node, 50Mi unlimited is below the floor",
            TI,
            one("50Mi", None),
            0,
            999,
            999,
        ),
        (
            "1Ti node, 500Mi unlimited",
            TI,
            one("500Mi", None),
            0,
            999,
            998,
        ),
        (
            "1Ti node, 4Gi unlimited hits the nudge cap",
            TI,
            one("4Gi", None),
            0,
            997,
            993,
        ),
        (
            "1Ti node, 16Gi unlimited",
            TI,
            one("16Gi", None),
            0,
            985,
            981,
        ),
        (
            "1Ti node, 500Mi request equals limit",
            TI,
            one("500Mi", Some("500Mi")),
            0,
            999,
            993,
        ),
        (
            "4Ti node, 500Mi unlimited",
            4 * TI,
            one("500Mi", None),
            0,
            999,
            998,
        ),
        (
            "4Ti node, 64Gi unlimited",
            4 * TI,
            one("64Gi", None),
            0,
            985,
            979,
        ),
        (
            "1Ti node, sidecar capped at the highest regular container",
            TI,
            sidecar,
            0,
            999,
            995,
        ),
        (
            "1Ti node, pod-level limit above the container's share",
            TI,
            pod_level("4Gi"),
            0,
            999,
            995,
        ),
        (
            "1Ti node, pod-level limit equal to the container's share",
            TI,
            pod_level("2Gi"),
            0,
            999,
            990,
        ),
    ];
    for (name, capacity, yaml, i, off, on) in rows {
        let p = pod(&yaml);
        let c = &p.containers[i];
        assert_eq!(
            container_oom_score_adj(&p, c, capacity),
            off,
            "{name}, gate off"
        );
        assert_eq!(
            container_oom_score_adj_with(&p, c, capacity, false),
            off,
            "{name}"
        );
        assert_eq!(
            container_oom_score_adj_with(&p, c, capacity, true),
            on,
            "{name}, gate on"
        );
    }
}

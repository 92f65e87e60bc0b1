use std::time::Duration;

use super::*;
use crate::policy::{eviction::ThresholdValue, quantity::Quantity};

const MI: i64 = 1 << 20;

fn th(signal: &str, mib: i64, grace: u64, min_reclaim_mib: Option<i64>) -> Threshold {
    let q = |m: i64| ThresholdValue::Quantity(format!("{m}Mi").parse::<Quantity>().unwrap());
    Threshold {
        signal: signal.into(),
        value: q(mib),
        grace_period_secs: grace,
        min_reclaim: min_reclaim_mib.map(q),
    }
}

fn obs(signal: &str, available_mib: i64) -> Observations {
    [(
        signal.to_owned(),
        Observed {
            available: available_mib * MI,
            capacity: 512 * MI,
        },
    )]
    .into()
}

#[test]
fn a_threshold_is_met_strictly_below_its_amount() {
    let t = [th("memory.available", 100, 0, None)];
    assert!(thresholds_met(&t, &obs("memory.available", 100), false).is_empty());
    assert_eq!(
        thresholds_met(&t, &obs("memory.available", 99), false).len(),
        1
    );
    assert!(thresholds_met(&t, &obs("pid.available", 1), false).is_empty());
}

#[test]
fn percentages_are_of_capacity() {
    let t = Threshold {
        value: ThresholdValue::Percentage(0.25),
        ..th("memory.available", 1, 0, None)
    };
    assert_eq!(
        thresholds_met(
            std::slice::from_ref(&t),
            &obs("memory.available", 127),
            false
        )
        .len(),
        1
    );
    assert!(thresholds_met(&[t], &obs("memory.available", 128), false).is_empty());
}

#[test]
fn hard_thresholds_are_actionable_at_once_soft_ones_after_their_grace() {
    let t0 = Instant::now();
    let ts = [
        th("memory.available", 100, 0, None),
        th("memory.available", 200, 30, None),
    ];
    let mut s = ThresholdState::default();
    let e = s.observe(&ts, &obs("memory.available", 150), t0);
    assert_eq!(e.met.len(), 1);
    assert!(
        e.actionable.is_empty(),
        "soft threshold still in its grace period"
    );
    let e = s.observe(
        &ts,
        &obs("memory.available", 150),
        t0 + Duration::from_secs(29),
    );
    assert!(e.actionable.is_empty());
    let e = s.observe(
        &ts,
        &obs("memory.available", 150),
        t0 + Duration::from_secs(30),
    );
    assert_eq!(e.actionable, vec![ts[1].clone()]);
    let e = s.observe(
        &ts,
        &obs("memory.available", 50),
        t0 + Duration::from_secs(31),
    );
    assert_eq!(e.actionable.len(), 2);
    assert_eq!(to_reclaim(&e.actionable).unwrap().0, &ts[0], "hard first");
}

#[test]
fn a_soft_threshold_that_clears_restarts_its_grace_period() {
    let t0 = Instant::now();
    let ts = [th("memory.available", 200, 10, None)];
    let mut s = ThresholdState::default();
    s.observe(&ts, &obs("memory.available", 150), t0);
    s.observe(
        &ts,
        &obs("memory.available", 250),
        t0 + Duration::from_secs(5),
    );
    let e = s.observe(
        &ts,
        &obs("memory.available", 150),
        t0 + Duration::from_secs(11),
    );
    assert!(e.actionable.is_empty());
    assert_eq!(s.first_observed(&ts[0]), Some(t0 + Duration::from_secs(11)));
}

#[test]
fn minimum_reclaim_keeps_an_acted_on_threshold_met() {
    let t0 = Instant::now();
    let ts = [th("memory.available", 100, 0, Some(50))];
    let mut s = ThresholdState::default();
    assert_eq!(
        s.observe(&ts, &obs("memory.available", 90), t0)
            .actionable
            .len(),
        1
    );
    // Above the threshold but below threshold + min reclaim: still met.
    let e = s.observe(&ts, &obs("memory.available", 120), t0);
    assert_eq!(e.actionable.len(), 1);
    assert_eq!(
        shortfall(&ts[0], &obs("memory.available", 120)["memory.available"]),
        30 * MI
    );
    // Past both: resolved, and minimum reclaim no longer applies.
    assert!(
        s.observe(&ts, &obs("memory.available", 151), t0)
            .actionable
            .is_empty()
    );
    assert!(
        s.observe(&ts, &obs("memory.available", 120), t0)
            .actionable
            .is_empty()
    );
}

#[test]
fn memory_is_reclaimed_before_pids() {
    let ts = [
        th("pid.available", 10, 0, None),
        th("allocatableMemory.available", 10, 0, None),
    ];
    assert_eq!(to_reclaim(&ts).unwrap().1, Resource::Memory);
    assert_eq!(to_reclaim(&ts[..1]).unwrap().1, Resource::Pids);
    assert!(to_reclaim(&[th("nodefs.available", 1, 0, None)]).is_none());
}

//! The autoscaler as data in, decisions out: each test feeds signals
//! and asks at given times, and checks the exact decision.

use proptest::prelude::*;

use super::*;
use crate::model::{LatencyProfile, PoolPreference, Runtime, TenantId};

/// 500 milli-GPU, 20 ms on a whole GPU (so 40 ms on its slice), a 200 ms
/// deadline: capacity 5 requests, target 3.5 at 70 %.
fn spec(min: u32, max: u32) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: "f".into(),
        runtime: Runtime::Pytorch,
        memory_mib: 4096,
        compute_milli: 500,
        tier: Tier::Burstable,
        deadline_ms: 200,
        pool: PoolPreference::Any,
        min_instances: min,
        max_instances: max,
        idle_timeout_s: 30,
        latency: LatencyProfile {
            full_gpu_us: 20_000,
            saturation_milli: 1000,
        },
    }
}

fn sig(at_s: u64, concurrency: u32) -> Signal {
    Signal {
        at_ms: at_s * 1000,
        concurrency,
        arrivals: u64::from(concurrency),
        rejected_per_s_milli: 0,
    }
}

/// Feeds one signal a second over `seconds` (inclusive) at `concurrency`.
fn feed(a: &mut Autoscaler, p: &Params, seconds: std::ops::RangeInclusive<u64>, concurrency: u32) {
    for t in seconds {
        a.observe(p, sig(t, concurrency));
    }
}

#[test]
fn the_target_comes_from_slice_service_time_and_deadline() {
    let p = Params::default();
    assert_eq!(target_concurrency_milli(&spec(0, 10), &p), 3500);
    // A whole GPU halves the service time: capacity 10, target 7.
    let mut whole = spec(0, 10);
    whole.compute_milli = 1000;
    assert_eq!(target_concurrency_milli(&whole, &p), 7000);
    // Multi-GPU slices count as one whole GPU's speed.
    whole.compute_milli = 4000;
    assert_eq!(target_concurrency_milli(&whole, &p), 7000);
    // A deadline shorter than one service: still one request.
    let mut tight = spec(0, 10);
    tight.deadline_ms = 10;
    assert_eq!(target_concurrency_milli(&tight, &p), 1000);
    // Extremes saturate instead of overflowing.
    tight.deadline_ms = u64::MAX;
    assert!(target_concurrency_milli(&tight, &p) >= 1000);
}

#[test]
fn the_stable_window_sets_the_instances() {
    let p = Params::default();
    let s = spec(0, 10);
    let mut a = Autoscaler::new(0);
    feed(&mut a, &p, 1..=60, 10);
    let d = a.decide(&p, &s, 60_000, 2, 100);
    assert_eq!(
        d,
        Decision {
            desired: 3,
            current: 2,
            rule: Rule::Stable,
            panic: false,
            stable_concurrency_milli: 10_000,
            panic_concurrency_milli: 10_000,
            target_milli: 3500,
        }
    );
}

#[test]
fn a_burst_panics_holds_through_the_stable_window_then_scales_in_slowly() {
    let p = Params::default();
    let s = spec(0, 10);
    let mut a = Autoscaler::new(0);
    feed(&mut a, &p, 1..=60, 3);
    assert_eq!(a.decide(&p, &s, 60_000, 1, 100).desired, 1);
    feed(&mut a, &p, 61..=65, 35);
    let d = a.decide(&p, &s, 65_000, 1, 100);
    // Panic window (59 s, 65 s]: (3 + 5 × 35) / 6 = 29.666 → 9 instances.
    assert_eq!((d.desired, d.rule, d.panic), (9, Rule::Panic, true));
    assert_eq!(d.panic_concurrency_milli, 29_666);
    assert_eq!(d.stable_concurrency_milli, 5_666);

    // The load falls back; panic mode keeps the 9 one stable window past
    // the last time it held: it ends at 65 s + 60 s.
    for t in 66..=124 {
        a.observe(&p, sig(t, 3));
        let last = a.decide(&p, &s, t * 1000, 9, 100);
        assert_eq!((last.desired, last.rule), (9, Rule::Panic), "at {t} s");
    }
    // Out of panic: the stable window needs 1, but the recommendations of
    // the last idle_timeout_s (30 s) were 9, so nothing is released yet.
    for t in 125..=154 {
        a.observe(&p, sig(t, 3));
        let last = a.decide(&p, &s, t * 1000, 9, 100);
        assert_eq!(
            (last.desired, last.rule),
            (9, Rule::ScaleInDelay),
            "at {t} s"
        );
        assert!(!last.panic);
    }
    // 30 s after the last 9: scale in, at most halving per decision.
    a.observe(&p, sig(155, 3));
    let mut last = a.decide(&p, &s, 155_000, 9, 100);
    assert_eq!((last.desired, last.rule), (5, Rule::ScaleDownRate));
    a.observe(&p, sig(156, 3));
    last = a.decide(&p, &s, 156_000, 5, 100);
    assert_eq!((last.desired, last.rule), (3, Rule::ScaleDownRate));
    a.observe(&p, sig(157, 3));
    last = a.decide(&p, &s, 157_000, 2, 100);
    assert_eq!((last.desired, last.rule), (1, Rule::Stable));
}

#[test]
fn an_idle_function_scales_to_zero_after_its_idle_timeout_and_back_on_a_request() {
    let p = Params::default();
    let s = spec(0, 10);
    let mut a = Autoscaler::new(0);
    feed(&mut a, &p, 1..=10, 1);
    feed(&mut a, &p, 11..=39, 0);
    // Last activity at 10 s; idle_timeout_s = 30.
    let d = a.decide(&p, &s, 39_000, 1, 100);
    assert_eq!((d.desired, d.rule), (1, Rule::Stable));
    a.observe(&p, sig(40, 0));
    let d = a.decide(&p, &s, 40_000, 1, 100);
    assert_eq!((d.desired, d.rule), (0, Rule::ToZero));
    // Released: it stays at zero, though the stable window's mean still
    // holds the load of 1..=10 s (10/41 at once, which alone would ask
    // for one instance).
    a.observe(&p, sig(41, 0));
    let d = a.decide(&p, &s, 41_000, 0, 100);
    assert_eq!(
        (d.desired, d.rule, d.stable_concurrency_milli),
        (0, Rule::ToZero, 243)
    );

    // A request held for it (concurrency 1 at the replica): back to one.
    a.observe(&p, sig(50, 1));
    let d = a.decide(&p, &s, 50_000, 0, 100);
    assert_eq!((d.desired, d.rule), (1, Rule::FromZero));
    // A burst from zero asks for what the load needs at once.
    let mut b = Autoscaler::new(0);
    b.observe(&p, sig(100, 20));
    let d = b.decide(&p, &s, 100_000, 0, 100);
    assert_eq!((d.desired, d.rule), (6, Rule::FromZero));
}

#[test]
fn an_instance_just_woken_from_zero_is_not_released_before_its_first_report() {
    let p = Params::default();
    let s = spec(0, 10);
    let mut a = Autoscaler::new(0);
    feed(&mut a, &p, 1..=10, 1);
    feed(&mut a, &p, 11..=40, 0);
    let d = a.decide(&p, &s, 40_000, 1, 100);
    assert_eq!((d.desired, d.rule), (0, Rule::ToZero));
    // Released; at 100 s a request held at a replica wakes it (one
    // instance placed then). No agent has reported it since: the windows
    // hold only the old idle signals.
    a.placed(100_000);
    for at in [101_000, 110_000, 129_999] {
        let d = a.decide(&p, &s, at, 1, 100);
        assert_ne!(d.rule, Rule::ToZero, "at {at}");
        assert_eq!(d.desired, 1, "at {at}");
    }
    // Its reports say idle: to zero idle_timeout_s after the placement.
    feed(&mut a, &p, 101..=130, 0);
    let d = a.decide(&p, &s, 130_000, 1, 100);
    assert_eq!((d.desired, d.rule), (0, Rule::ToZero));
    // An older placement (a report of one placed earlier) changes nothing.
    a.placed(50_000);
    let d = a.decide(&p, &s, 130_000, 1, 100);
    assert_eq!((d.desired, d.rule), (0, Rule::ToZero));
}

/// A new leader's autoscaler, on its first tick, with its function's
/// instance placed long ago and no report yet (the agents linked to the old
/// leader reconnect): nothing goes to zero until `idle_timeout_s` after the
/// takeover. Before, the old placement time stood in for the last activity
/// and the first tick released the last instance of a busy function.
#[test]
fn a_new_leader_sends_nothing_to_zero_on_its_first_ticks() {
    let p = Params::default();
    let s = spec(0, 10);
    let takeover = 1_000_000;
    let mut a = Autoscaler::resume(takeover, 1);
    a.placed(10_000);
    for at in [takeover, takeover + 29_999] {
        let d = a.decide(&p, &s, at, 1, 100);
        assert_ne!(d.rule, Rule::ToZero, "at {at}");
        assert_eq!(d.desired, 1, "at {at}");
    }
    // Idle reports all along: to zero idle_timeout_s after the takeover.
    feed(&mut a, &p, 1_001..=1_030, 0);
    let d = a.decide(&p, &s, takeover + 30_000, 1, 100);
    assert_eq!((d.desired, d.rule), (0, Rule::ToZero));
}

#[test]
fn min_instances_keeps_an_idle_function_up_and_no_signal_keeps_what_there_is() {
    let p = Params::default();
    let mut a = Autoscaler::new(0);
    // Never a signal: after the idle timeout a min 0 function goes to zero...
    assert_eq!(
        a.decide(&p, &spec(0, 10), 30_000, 1, 100).rule,
        Rule::ToZero
    );
    // ... a min 1 one stays, and before the timeout nothing changes.
    let d = a.decide(&p, &spec(1, 10), 30_000, 1, 100);
    assert_eq!((d.desired, d.rule), (1, Rule::NoSignal));
    let d = Autoscaler::new(0).decide(&p, &spec(0, 10), 29_999, 3, 100);
    assert_eq!((d.desired, d.rule), (3, Rule::NoSignal));
    let mut idle = Autoscaler::new(0);
    feed(&mut idle, &p, 1..=60, 0);
    let d = idle.decide(&p, &spec(2, 10), 60_000, 2, 100);
    assert_eq!((d.desired, d.rule), (2, Rule::Min));
}

#[test]
fn max_instances_and_the_quota_cut_the_decision() {
    let p = Params::default();
    let mut a = Autoscaler::new(0);
    feed(&mut a, &p, 1..=60, 10); // needs 3
    let d = a.decide(&p, &spec(0, 2), 60_000, 2, 100);
    assert_eq!((d.desired, d.rule), (2, Rule::Max));
    let d = a.decide(&p, &spec(0, 10), 60_000, 2, 0);
    assert_eq!((d.desired, d.rule), (2, Rule::Quota));
    // The quota never forces a scale-in.
    let d = a.decide(&p, &spec(0, 10), 60_000, 3, 0);
    assert_eq!((d.desired, d.rule), (3, Rule::Stable));
}

#[test]
fn a_late_signal_is_ignored_and_old_ones_leave_the_window() {
    let p = Params::default();
    let s = spec(1, 10);
    let mut a = Autoscaler::new(0);
    a.observe(&p, sig(100, 10));
    a.observe(&p, sig(90, 1000));
    let d = a.decide(&p, &s, 100_000, 3, 100);
    assert_eq!(d.stable_concurrency_milli, 10_000);
    // 60 s later the signal at 100 s is out of the stable window.
    let d = a.decide(&p, &s, 160_000, 3, 100);
    assert_eq!((d.desired, d.rule), (3, Rule::NoSignal));
}

fn cand(id: u32, tier: Tier, used: u32, protected: bool) -> ScaleInCandidate<u32> {
    ScaleInCandidate {
        id,
        tier,
        gpu_used_ppm: used,
        last_on_node_with_waiting: protected,
    }
}

#[test]
fn scale_in_releases_the_weakest_tier_on_the_emptiest_gpu_never_a_needed_last_copy() {
    let cands = vec![
        cand(1, Tier::Guaranteed, 100_000, false),
        cand(2, Tier::Oversubscribed, 900_000, false),
        cand(3, Tier::Oversubscribed, 200_000, false),
        cand(4, Tier::Oversubscribed, 100_000, true),
        cand(5, Tier::Oversubscribed, 200_000, false),
    ];
    assert_eq!(pick_scale_in(&cands).map(|c| c.id), Some(3));
    assert_eq!(pick_scale_in(&cands[..2]).map(|c| c.id), Some(2));
    assert_eq!(pick_scale_in(&cands[..1]).map(|c| c.id), Some(1));
    assert_eq!(pick_scale_in(&cands[3..4]).map(|c| c.id), None);
    let burst = [
        cand(7, Tier::Exclusive, 0, false),
        cand(8, Tier::Burstable, 999_999, false),
    ];
    assert_eq!(pick_scale_in(&burst).map(|c| c.id), Some(8));
}

proptest! {
    /// Whatever agents and tenants send, a decision never panics and stays
    /// within [min_instances, max_instances] (the quota only cuts growth).
    #[test]
    fn decisions_stay_within_bounds_on_any_input(
        steps in prop::collection::vec((0u64..=u64::MAX, any::<u32>(), any::<u64>(), 0u32..=64, any::<u32>()), 1..40),
        min in 0u32..4,
        extra in 0u32..8,
        deadline in prop_oneof![Just(0u64), Just(u64::MAX), 1u64..100_000],
        idle in prop_oneof![Just(0u64), Just(u64::MAX), 1u64..10_000],
    ) {
        let p = Params::default();
        let mut s = spec(min, min + extra);
        s.deadline_ms = deadline;
        s.idle_timeout_s = idle;
        let mut a = Autoscaler::new(0);
        let mut now = 0u64;
        for (dt, conc, arrivals, current, room) in steps {
            now = now.saturating_add(dt % 100_000);
            if dt == u64::MAX { now = u64::MAX; }
            a.observe(&p, Signal { at_ms: now, concurrency: conc, arrivals, rejected_per_s_milli: arrivals.saturating_mul(500) });
            let d = a.decide(&p, &s, now, current, room);
            prop_assert!(d.desired <= s.max_instances);
            // Only the quota may keep it below min_instances.
            prop_assert!(d.desired >= s.min_instances.min(current.saturating_add(room)));
            if d.desired > current { prop_assert!(d.desired <= current.saturating_add(room)); }
        }
    }
}

#[test]
fn early_rejects_count_as_the_load_they_would_have_put_on_an_instance() {
    let p = Params::default();
    let s = spec(0, 10);
    // 3 at once at every sample, and 200 a second turned away: each would
    // have taken 40 ms, so they add 200/s × 40 ms = 8 at once.
    let mut a = Autoscaler::new(0);
    for t in 1..=60 {
        a.observe(
            &p,
            Signal {
                at_ms: t * 1000,
                concurrency: 3,
                arrivals: 203,
                rejected_per_s_milli: 200_000,
            },
        );
    }
    let d = a.decide(&p, &s, 60_000, 2, 100);
    assert_eq!(
        (
            d.desired,
            d.rule,
            d.stable_concurrency_milli,
            d.panic_concurrency_milli
        ),
        (4, Rule::Stable, 11_000, 11_000)
    );

    // The same signals without rejects ask for one instance.
    let mut b = Autoscaler::new(0);
    feed(&mut b, &p, 1..=60, 3);
    assert_eq!(b.decide(&p, &s, 60_000, 2, 100).desired, 1);

    // A deadline shorter than one service: rejects ask for nothing (no
    // instance could meet it), only the concurrency counts (target 1).
    let mut tight = spec(0, 10);
    tight.deadline_ms = 10;
    let d = a.decide(&p, &tight, 60_000, 3, 100);
    assert_eq!((d.desired, d.stable_concurrency_milli), (3, 3_000));
}

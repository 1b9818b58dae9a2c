use super::*;
use crate::model::{PoolKind, TenantId, Tier};
use crate::state::HOUR_MS;

const H: u64 = HOUR_MS * 1_000; // one hour in µs
const T0: u64 = 480_000 * H; // a whole hour, Unix µs

fn key(f: &str) -> UsageKey {
    UsageKey {
        tenant: TenantId("acme".into()),
        function: f.into(),
        tier: Tier::Burstable,
        gpu_model: "A100-80G".into(),
        pool_kind: PoolKind::Edge,
    }
}

fn draft(f: &str, compute: u64, memory: u64, invocations: u64, end_ms: u64) -> UsageDraft {
    UsageDraft {
        key: key(f),
        compute_milli_gpu_ms: compute,
        memory_mib_ms: memory,
        invocations,
        end_ms,
    }
}

#[test]
fn invocations_accrue_compute_and_counts_until_taken() {
    let mut m = UsageMeter::new();
    // 250 milli-GPU busy for 40 ms, twice; 500 milli for 3 ms on another function.
    m.invocation(&key("a"), 250, T0 + 1_000, T0 + 41_000);
    m.invocation(&key("a"), 250, T0 + 50_000, T0 + 90_000);
    m.invocation(&key("b"), 500, T0 + 10_000, T0 + 13_000);
    assert_eq!(
        m.take_busy(),
        vec![
            draft("a", 20_000, 0, 2, T0 / 1_000 + 90),
            draft("b", 1_500, 0, 1, T0 / 1_000 + 13),
        ]
    );
    assert_eq!(m.take_busy(), vec![], "taken once");
    assert_eq!(m.take_all(T0 + 100_000), vec![], "nothing resident");
}

#[test]
fn a_streamed_run_is_one_invocation_billed_in_two_parts() {
    let mut m = UsageMeter::new();
    // Start to first byte (10 ms) as the invocation, taken (journaled)...
    m.invocation(&key("a"), 250, T0, T0 + 10_000);
    assert_eq!(
        m.take_busy(),
        vec![draft("a", 2_500, 0, 1, T0 / 1_000 + 10)]
    );
    // ...then the stream's 30 ms as compute only: no second invocation.
    m.accrue_busy(&key("a"), 250, T0 + 10_000, T0 + 40_000);
    assert_eq!(
        m.take_busy(),
        vec![draft("a", 7_500, 0, 0, T0 / 1_000 + 40)]
    );
}

#[test]
fn residency_is_billed_while_on_the_gpu_only() {
    let mut m = UsageMeter::new();
    let id = ResidencyId(7);
    m.resident_start(id, key("a"), 2_000, T0);
    // Take at +1.5 s: 2000 MiB × 1500 ms.
    assert_eq!(
        m.take_all(T0 + 1_500_000),
        vec![draft("a", 0, 3_000_000, 0, T0 / 1_000 + 1_500)]
    );
    // Swapped out at +2 s, back in at +5 s, taken at +6 s: 0.5 s + 1 s resident.
    m.resident_stop(id, T0 + 2_000_000);
    assert_eq!(m.take_busy(), vec![], "memory is not busy usage");
    m.resident_start(id, key("a"), 2_000, T0 + 5_000_000);
    assert_eq!(
        m.take_all(T0 + 6_000_000),
        vec![draft("a", 0, 3_000_000, 0, T0 / 1_000 + 6_000)]
    );
    m.resident_stop(id, T0 + 6_000_000);
    assert_eq!(m.resident_count(), 0);
    assert_eq!(m.take_all(T0 + 9_000_000), vec![]);
}

#[test]
fn intervals_are_split_at_hour_boundaries() {
    let mut m = UsageMeter::new();
    // Resident from 10 s before the hour to 20 s after: 1 MiB.
    m.resident_start(ResidencyId(1), key("a"), 1, T0 + H - 10_000_000);
    // Busy 1000 milli from 4 ms before the hour to 6 ms after.
    m.invocation(&key("a"), 1_000, T0 + H - 4_000, T0 + H + 6_000);
    let hour_end = (T0 + H) / 1_000;
    assert_eq!(
        m.take_all(T0 + H + 20_000_000),
        vec![
            draft("a", 4_000, 10_000, 0, hour_end - 1),
            draft("a", 6_000, 20_000, 1, hour_end + 20_000),
        ]
    );
    // An interval ending exactly on the boundary belongs to the hour before.
    let mut m = UsageMeter::new();
    m.invocation(&key("b"), 2, T0 + H - 1_000, T0 + H);
    assert_eq!(m.take_busy(), vec![draft("b", 2, 0, 1, hour_end - 1)]);
    // Over three hours: 1 + whole + 1 pieces.
    let mut m = UsageMeter::new();
    m.resident_start(ResidencyId(1), key("c"), 3, T0 + H - 1_000);
    let d = m.take_all(T0 + 2 * H + 1_000);
    assert_eq!(
        d,
        vec![
            draft("c", 0, 3, 0, hour_end - 1),
            draft("c", 0, 3 * HOUR_MS, 0, hour_end + HOUR_MS - 1),
            draft("c", 0, 3, 0, hour_end + HOUR_MS + 1),
        ]
    );
    for x in &d {
        assert!(x.end_ms / HOUR_MS >= T0 / H, "in a billing hour");
    }
}

#[test]
fn sub_millisecond_remainders_are_carried_not_lost() {
    let mut m = UsageMeter::new();
    // 3 milli-GPU for 700 µs = 2.1 milli-GPU-ms, three times = 6.3.
    let mut total = 0;
    for i in 0..3 {
        let start = T0 + i * 10_000;
        m.invocation(&key("a"), 3, start, start + 700);
        total += m
            .take_busy()
            .iter()
            .map(|d| d.compute_milli_gpu_ms)
            .sum::<u64>();
    }
    // 2.1 → 2 (carry .1), 2.2 → 2 (carry .2), 2.3 → 2 (carry .3)
    assert_eq!(total, 6);
    for i in 0..7 {
        let start = T0 + 100_000 + i * 10_000;
        m.invocation(&key("a"), 3, start, start + 700);
        total += m
            .take_busy()
            .iter()
            .map(|d| d.compute_milli_gpu_ms)
            .sum::<u64>();
    }
    // 10 × 2.1 = 21 exactly.
    assert_eq!(total, 21);
}

#[test]
fn moving_weights_closes_one_interval_and_opens_another() {
    let mut m = UsageMeter::new();
    m.resident_start(ResidencyId(1), key("a"), 100, T0);
    m.resident_stop(ResidencyId(1), T0 + 1_000_000);
    m.resident_start(ResidencyId(2), key("a"), 100, T0 + 1_000_000);
    // Restarting a resident id closes its open interval first.
    m.resident_start(ResidencyId(2), key("a"), 100, T0 + 2_000_000);
    m.resident_stop(ResidencyId(2), T0 + 3_000_000);
    m.resident_stop(ResidencyId(99), T0 + 3_000_000);
    assert_eq!(
        m.take_all(T0 + 4_000_000),
        vec![draft("a", 0, 300_000, 0, T0 / 1_000 + 3_000)]
    );
}

#[test]
fn drafts_become_records_with_seq_zero() {
    let r = draft("a", 1, 2, 3, 4).into_record();
    assert_eq!(
        (
            r.seq,
            r.function.as_str(),
            r.compute_milli_gpu_ms,
            r.memory_mib_ms,
            r.invocations,
            r.end_ms
        ),
        (0, "a", 1, 2, 3, 4)
    );
    assert_eq!(r.tier, Tier::Burstable);
    assert_eq!(r.pool_kind, PoolKind::Edge);
}

#[test]
fn a_failed_write_gives_back_delivered_service_not_completed_invocations() {
    let mut m = UsageMeter::new();
    let id = ResidencyId(3);
    m.resident_start(id, key("a"), 1_000, T0);
    // A completed invocation (its reply waits for the write) and the rest
    // of a streamed run (its bytes went out already), 0.5 ms units each side.
    m.invocation(&key("a"), 100, T0, T0 + 10_500);
    m.accrue_busy(&key("a"), 200, T0, T0 + 20_250);
    let taken = m.take_all(T0 + 2_000_000);
    assert_eq!(
        taken,
        vec![draft("a", 1_050 + 4_050, 2_000_000, 1, T0 / 1_000 + 2_000)]
    );
    // The write failed: the memory and the stream's rest accrue again, the
    // invocation does not (its reply is answered with an error).
    let delivered = m.delivered();
    assert!(!delivered.is_empty());
    m.restore(delivered);
    assert!(m.delivered().is_empty(), "handed out once");
    // The next write holds them, with the carry as before the failed take:
    // 4_050 exactly (not 4_050 plus the failed take's 0.5 remainder).
    m.invocation(&key("a"), 100, T0 + 2_000_000, T0 + 2_001_000);
    assert_eq!(
        m.take_all(T0 + 3_000_000),
        vec![draft("a", 4_050 + 100, 3_000_000, 1, T0 / 1_000 + 3_000)]
    );
    // That write failed too: given back again, invocation left out again.
    let again = m.delivered();
    m.restore(again);
    assert_eq!(
        m.take_busy(),
        vec![draft("a", 4_050, 0, 0, T0 / 1_000 + 20)]
    );
    // A successful write's delivered part is simply dropped by the caller.
    let _ = m.delivered();
    m.resident_stop(id, T0 + 3_000_000);
    assert_eq!(
        m.take_all(T0 + 4_000_000),
        vec![draft("a", 0, 3_000_000, 0, T0 / 1_000 + 3_000)]
    );
}

#[test]
fn a_restore_after_a_later_take_leaves_that_takes_carry_within_a_unit() {
    let mut m = UsageMeter::new();
    m.accrue_busy(&key("a"), 1, T0, T0 + 1_500); // 1.5 units: 1, carry 0.5
    assert_eq!(m.take_busy(), vec![draft("a", 1, 0, 0, T0 / 1_000 + 1)]);
    let first = m.delivered();
    // A second take (e.g. the final flush) drafts the key meanwhile.
    m.accrue_busy(&key("a"), 1, T0 + 2_000, T0 + 2_700); // 0.7 + 0.5 carried
    assert_eq!(m.take_busy(), vec![draft("a", 1, 0, 0, T0 / 1_000 + 2)]);
    // The first write failed: its 1.5 units accrue again; the carry the
    // second take left (0.2) stays. The failed take's 0.5 remainder went
    // into the second take and is in the 1.5 again: 3 units bill 2.5 of
    // service, half a unit over (off by less than one unit per key, over
    // or under, depending on the carries).
    m.restore(first);
    assert_eq!(m.take_busy(), vec![draft("a", 1, 0, 0, T0 / 1_000 + 1)]);
    m.accrue_busy(&key("a"), 1, T0 + 3_000, T0 + 3_300); // 0.3 + 0.2 + 0.5
    assert_eq!(m.take_busy(), vec![draft("a", 1, 0, 0, T0 / 1_000 + 3)]);
}

#[test]
fn a_failed_take_of_invocations_alone_leaves_no_remainder_behind() {
    let mut m = UsageMeter::new();
    m.invocation(&key("a"), 1, T0, T0 + 1_500); // 1.5 units: 1, carry 0.5
    assert_eq!(m.take_busy(), vec![draft("a", 1, 0, 1, T0 / 1_000 + 1)]);
    // Its write failed: nothing to give back but the carry as before.
    let delivered = m.delivered();
    assert!(delivered.is_empty());
    m.restore(delivered);
    // 0.6 units: not a whole one (with the failed take's 0.5 it would be).
    m.invocation(&key("a"), 1, T0 + 2_000, T0 + 2_600);
    assert_eq!(m.take_busy(), vec![draft("a", 0, 0, 1, T0 / 1_000 + 2)]);
}

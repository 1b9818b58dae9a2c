//! The node's usage meter (see the module docs of [`super`]).

use super::{UsageDraft, UsageKey};
use crate::state::HOUR_MS;
use std::collections::BTreeMap;

/// Microseconds in one billing hour.
const HOUR_US: u64 = HOUR_MS * 1_000;
/// µs units in one ms unit.
const US_PER_MS: u128 = 1_000;

/// Names one resident copy of weights (e.g. function and GPU); chosen by
/// the caller, unique among the copies resident at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResidencyId(pub u64);

#[derive(Debug, Clone)]
struct Residency {
    key: UsageKey,
    memory_mib: u64,
    /// Accrued up to here (Unix µs).
    since_us: u64,
}

/// What accrued for one key in one hour, in µs units.
#[derive(Debug, Clone, Copy, Default)]
struct Accrued {
    compute_milli_us: u128,
    memory_mib_us: u128,
    invocations: u64,
    /// Latest end of anything accrued here (Unix µs).
    end_us: u64,
}

/// Sub-ms remainders of one key, carried to its next draft.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Carry {
    compute: u128,
    memory: u128,
}

/// Meters residency and completed invocations per [`UsageKey`] (pure).
#[derive(Debug, Default)]
pub struct UsageMeter {
    resident: BTreeMap<ResidencyId, Residency>,
    busy: BTreeMap<(UsageKey, u64), Accrued>,
    memory: BTreeMap<(UsageKey, u64), Accrued>,
    carry: BTreeMap<UsageKey, Carry>,
    /// The part of `busy` that [`UsageMeter::accrue_busy`] added (the rest
    /// of streamed runs): delivered service, kept by a failed write.
    streamed: BTreeMap<(UsageKey, u64), Accrued>,
    /// What the last take handed out of delivered service.
    last_delivered: Delivered,
}

/// The part of a take that was service already delivered, whatever becomes
/// of the write it went to: resident memory, and the rest of streamed runs
/// after their first byte ([`UsageMeter::accrue_busy`]), with the sub-ms
/// carries the take moved. A failed write gives it back
/// ([`UsageMeter::restore`]); completed invocations are not in it (a failed
/// write answers them with an error: nothing happened, nothing is billed).
#[derive(Debug, Default)]
pub struct Delivered {
    /// The rest of streamed runs (compute only).
    streamed: BTreeMap<(UsageKey, u64), Accrued>,
    /// Resident memory (memory only).
    memory: BTreeMap<(UsageKey, u64), Accrued>,
    /// Per key drafted: its carry before and after the take.
    carries: BTreeMap<UsageKey, (Carry, Carry)>,
}

impl Delivered {
    /// Whether it holds no usage to give back.
    pub fn is_empty(&self) -> bool {
        self.streamed.is_empty() && self.memory.is_empty()
    }
}

/// Calls `f(hour, from, to)` for each piece of `[from_us, to_us)` within one hour.
fn split_hours(from_us: u64, to_us: u64, mut f: impl FnMut(u64, u64, u64)) {
    let mut t = from_us;
    while t < to_us {
        let hour = t / HOUR_US;
        let end = to_us.min(hour.saturating_add(1).saturating_mul(HOUR_US));
        f(hour, t, end);
        t = end;
    }
}

/// The hour a piece ending at `end_us` (exclusive) belongs to.
fn hour_of_end(end_us: u64) -> u64 {
    end_us.saturating_sub(1) / HOUR_US
}

impl UsageMeter {
    /// An empty meter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Weights of `key` (`memory_mib` of GPU memory) became resident at `now_us`.
    /// Starting an id that is already resident closes its interval first.
    pub fn resident_start(&mut self, id: ResidencyId, key: UsageKey, memory_mib: u64, now_us: u64) {
        self.resident_stop(id, now_us);
        self.resident.insert(
            id,
            Residency {
                key,
                memory_mib,
                since_us: now_us,
            },
        );
    }

    /// The weights of `id` left the GPU at `now_us` (swapped out, unloaded,
    /// moved away, released). Unknown ids are ignored.
    pub fn resident_stop(&mut self, id: ResidencyId, now_us: u64) {
        if let Some(r) = self.resident.remove(&id) {
            self.accrue_memory(&r.key, r.memory_mib, r.since_us, now_us);
        }
    }

    /// How many copies of weights are resident now.
    pub fn resident_count(&self) -> usize {
        self.resident.len()
    }

    /// An invocation of `key` completed: the slice's `compute_milli` was
    /// busy from `start_us` to `end_us`.
    pub fn invocation(&mut self, key: &UsageKey, compute_milli: u64, start_us: u64, end_us: u64) {
        Self::accrue_compute(&mut self.busy, key, compute_milli, start_us, end_us);
        let a = self
            .busy
            .entry((key.clone(), hour_of_end(end_us.max(1))))
            .or_default();
        a.invocations = a.invocations.saturating_add(1);
        a.end_us = a.end_us.max(end_us);
    }

    /// The slice's `compute_milli` was busy from `start_us` to `end_us` for
    /// an invocation already counted (the rest of a streamed reply's run,
    /// after its first part was billed as [`UsageMeter::invocation`]).
    /// Being delivered already, it survives a failed write ([`Delivered`]).
    pub fn accrue_busy(&mut self, key: &UsageKey, compute_milli: u64, start_us: u64, end_us: u64) {
        Self::accrue_compute(&mut self.busy, key, compute_milli, start_us, end_us);
        Self::accrue_compute(&mut self.streamed, key, compute_milli, start_us, end_us);
    }

    fn accrue_compute(
        into: &mut BTreeMap<(UsageKey, u64), Accrued>,
        key: &UsageKey,
        compute_milli: u64,
        start_us: u64,
        end_us: u64,
    ) {
        let start_us = start_us.min(end_us);
        split_hours(start_us, end_us, |hour, from, to| {
            let a = into.entry((key.clone(), hour)).or_default();
            a.compute_milli_us = a.compute_milli_us.saturating_add(
                u128::from(compute_milli).saturating_mul(u128::from(to.saturating_sub(from))),
            );
            a.end_us = a.end_us.max(to);
        });
    }

    fn accrue_memory(&mut self, key: &UsageKey, memory_mib: u64, from_us: u64, to_us: u64) {
        split_hours(from_us, to_us, |hour, from, to| {
            let a = self.memory.entry((key.clone(), hour)).or_default();
            a.memory_mib_us = a.memory_mib_us.saturating_add(
                u128::from(memory_mib).saturating_mul(u128::from(to.saturating_sub(from))),
            );
            a.end_us = a.end_us.max(to);
        });
    }

    /// Drafts of the compute and invocations accrued since the last take
    /// (memory stays for [`UsageMeter::take_all`]).
    pub fn take_busy(&mut self) -> Vec<UsageDraft> {
        let busy = std::mem::take(&mut self.busy);
        let streamed = std::mem::take(&mut self.streamed);
        self.drafts(busy, streamed, BTreeMap::new())
    }

    /// Drafts of everything accrued, with resident intervals closed (and
    /// reopened) at `now_us`.
    pub fn take_all(&mut self, now_us: u64) -> Vec<UsageDraft> {
        let open: Vec<(UsageKey, u64, u64)> = self
            .resident
            .values_mut()
            .map(|r| {
                let since = r.since_us;
                r.since_us = now_us.max(since);
                (r.key.clone(), r.memory_mib, since)
            })
            .collect();
        for (key, mib, since) in open {
            self.accrue_memory(&key, mib, since, now_us);
        }
        let mut all = std::mem::take(&mut self.busy);
        let streamed = std::mem::take(&mut self.streamed);
        let memory = std::mem::take(&mut self.memory);
        for (k, m) in &memory {
            Self::merge(&mut all, k.clone(), *m);
        }
        self.drafts(all, streamed, memory)
    }

    /// What the last take ([`UsageMeter::take_busy`], [`UsageMeter::take_all`])
    /// handed out of service already delivered: give it to
    /// [`UsageMeter::restore`] if the write it went to failed.
    pub fn delivered(&mut self) -> Delivered {
        std::mem::take(&mut self.last_delivered)
    }

    /// A write of a take failed: its delivered part accrues again, to go
    /// with the next take (and again if that write fails too), and each
    /// key's sub-ms carry is what it was before the take. The take's
    /// completed invocations stay out. If a later take drafted the key
    /// meanwhile (and left it another carry), that carry stays: the failed
    /// take's carry went on into it, so the key is then off by less than
    /// one ms unit, over or under (the agent's only such take is its final
    /// flush, after which a give-back is not written anyway).
    pub fn restore(&mut self, delivered: Delivered) {
        for (at, a) in delivered.streamed {
            Self::merge(&mut self.busy, at.clone(), a);
            Self::merge(&mut self.streamed, at, a);
        }
        for (at, a) in delivered.memory {
            Self::merge(&mut self.memory, at, a);
        }
        for (key, (before, after)) in delivered.carries {
            let carry = self.carry.entry(key).or_default();
            if *carry == after {
                *carry = before;
            }
        }
    }

    /// Adds `a`'s compute, memory and invocations at `at`.
    fn merge(into: &mut BTreeMap<(UsageKey, u64), Accrued>, at: (UsageKey, u64), a: Accrued) {
        let to = into.entry(at).or_default();
        to.compute_milli_us = to.compute_milli_us.saturating_add(a.compute_milli_us);
        to.memory_mib_us = to.memory_mib_us.saturating_add(a.memory_mib_us);
        to.invocations = to.invocations.saturating_add(a.invocations);
        to.end_us = to.end_us.max(a.end_us);
    }

    fn drafts(
        &mut self,
        accrued: BTreeMap<(UsageKey, u64), Accrued>,
        streamed: BTreeMap<(UsageKey, u64), Accrued>,
        memory: BTreeMap<(UsageKey, u64), Accrued>,
    ) -> Vec<UsageDraft> {
        let mut out = Vec::new();
        let mut carries = BTreeMap::new();
        for ((key, hour), a) in accrued {
            let carry = self.carry.entry(key.clone()).or_default();
            let moved = carries.entry(key.clone()).or_insert((*carry, *carry));
            let compute = a.compute_milli_us.saturating_add(carry.compute);
            let memory = a.memory_mib_us.saturating_add(carry.memory);
            carry.compute = compute % US_PER_MS;
            carry.memory = memory % US_PER_MS;
            moved.1 = *carry;
            let draft = UsageDraft {
                key,
                compute_milli_gpu_ms: u64::try_from(compute / US_PER_MS).unwrap_or(u64::MAX),
                memory_mib_ms: u64::try_from(memory / US_PER_MS).unwrap_or(u64::MAX),
                invocations: a.invocations,
                end_ms: (a.end_us / 1_000).min(
                    hour.saturating_add(1)
                        .saturating_mul(HOUR_MS)
                        .saturating_sub(1),
                ),
            };
            if draft.compute_milli_gpu_ms > 0 || draft.memory_mib_ms > 0 || draft.invocations > 0 {
                out.push(draft);
            }
        }
        self.last_delivered = Delivered {
            streamed,
            memory,
            carries,
        };
        out
    }
}

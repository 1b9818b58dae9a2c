//! The group commit of metered usage: the [`NodeAgent`] gathers usage into
//! the open group, one writer thread journals groups back to back.
//!
//! ```text
//!   NodeAgent (actix thread)                         writer thread ("usage-journal")
//!   Done / stream head / stream end                  ┌─▶ wait until something is due
//!     ─▶ hold(meter op, keyed outcome) ─▶ tag g ─┐   │   take group g: drafts (take_busy, or
//!   interval tick, instance released             │   │     take_all when memory is due),
//!     ─▶ memory_due() ───────────────────────────┤   │     keyed outcomes; open g + 1
//!                                                ▼   │   journal.append_keyed (insert + flush)
//!                          Mutex<Gathering> + Condvar│   Written{g, result} ─▶ NodeAgent
//!                                                    └── (next group at once, if one is due)
//!   Written{g, Ok}  ─▶ replies and stream starts tagged ≤ g released
//!   Written{g, Err} ─▶ replies tagged ≤ g become `usage_not_recorded`
//! ```
//!
//! A plain reply (no idempotency key, not streamed: nothing of the agent's
//! state waits on it) is held here instead of in the actor
//! ([`GroupCommit::hold_reply`]), and the writer thread sends it itself
//! once its group's write returned, before it tells the actor: one thread
//! hand-over less on the common path (the actor only counts it).
//!
//! Between writes the writer sleeps on a condition variable, but on a
//! quiet agent (fewer than 1.5 requests per write on average, the last
//! wait for a group within [`POLL`], more than one CPU) it first polls for
//! up to [`POLL`]: there the next group is one round trip away, and waking
//! a sleeping thread, often a halted virtual CPU, was a large part of that
//! round trip (`invoke-bench --metering`, docs/edge.md). A busy agent does
//! not poll (its next group is mostly due already; a core spent polling is
//! taken from its requests), and a poll that runs out stops polling until
//! a short wait is seen again, so a slow stream of requests spins at most
//! once.
//!
//! A reply is tagged with the group that was open when its usage went into
//! the meter, under the same lock the writer takes a group under, so the
//! write of group `g` holds the usage of every reply tagged `g`. One group
//! is written at a time; while it is, completions gather in the next one,
//! which the writer takes as soon as its write returns, without a round
//! trip through the actor between two writes (its release of the replies
//! runs meanwhile). The actor's thread never waits on the disk.
//!
//! [`NodeAgent`]: super::NodeAgent

use super::NodeAgent;
use crate::journal::{KeyedOutcome, UsageJournal};
use actix::WeakAddr;
use gshare_core::clock::SharedClock;
use gshare_core::metering::{Delivered, UsageMeter};
use gshare_core::protocol::{InvokeError, InvokeOutcome};
use gshare_core::state::UsageRecord;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long the writer polls for the next group before it sleeps.
const POLL: Duration = Duration::from_micros(200);

/// A journal write ended (the writer thread → NodeAgent).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub(super) struct Written {
    /// The group written: the replies tagged with it (and any below) wait
    /// for this answer.
    pub(super) group: u64,
    /// Records journaled, or why the write failed.
    pub(super) result: Result<u64, String>,
    /// The plain replies the writer sent.
    pub(super) sent: Sent,
    /// The group is durable but the journal takes no more appends (its
    /// tree lacks an entry of its log): the agent must restart.
    pub(super) fatal: Option<String>,
}

/// What the writer did with a write's plain replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    /// Their usage was durable: their outcomes went out (even if applying
    /// it to the journal's tree then failed: the next open applies it).
    Released(u64),
    /// The write failed: they were answered `usage_not_recorded`.
    Failed(u64),
}

/// A plain reply waiting for its group's write (see the module's text).
#[derive(Debug)]
struct HeldPlain {
    group: u64,
    tx: oneshot::Sender<InvokeOutcome>,
    outcome: InvokeOutcome,
}

/// One group taken for a write.
#[derive(Debug)]
pub(super) struct Group {
    /// Its number (the tag of the replies it releases).
    pub(super) number: u64,
    /// The usage records (numbered by the journal).
    pub(super) records: Vec<UsageRecord>,
    /// The outcomes of keyed invocations it bills, in the order they
    /// were held (a stream's start before its end), stamped `now_ms`.
    pub(super) keyed: Vec<KeyedOutcome>,
    /// Unix ms when it was taken: the write's time (keys expire by it).
    pub(super) now_ms: u64,
    /// The holds (replies, stream heads and ends) whose usage it writes.
    pub(super) held: u64,
    /// What of its usage was service already delivered (resident memory,
    /// the rest of streamed runs): a failed write gives it back to the
    /// meter ([`GroupCommit::restore`]) for the next one.
    pub(super) delivered: Delivered,
}

/// What waits for the next write.
#[derive(Debug)]
struct Gathering {
    meter: UsageMeter,
    /// Outcomes of keyed invocations whose usage is in the meter, in the
    /// order they were held: a stream's start (held when it opened) comes
    /// before its end (held when the run ended, in a later group: the end
    /// waits until the start's write returned), so its key keeps its end.
    keyed: Vec<KeyedOutcome>,
    /// A reply, a stream or memory waits for the next write.
    due: bool,
    /// Resident memory goes with the next write.
    memory_due: bool,
    /// The number of the open group (the next write takes it).
    open: u64,
    /// The writer waits for something to be due.
    idle: bool,
    /// The agent is gone: the writer ends.
    closed: bool,
    /// Plain replies, in the order held.
    plain: Vec<HeldPlain>,
    /// Holds since the open group began (what [`Group::held`] counts).
    held: u64,
}

/// The usage gathered for the journal, shared by the agent and its writer.
#[derive(Debug)]
pub(super) struct GroupCommit {
    gathering: Mutex<Gathering>,
    wake: Condvar,
    /// Something is due (a hint read without the lock: the writer polls
    /// it for [`POLL`] before it sleeps on `wake`).
    due_hint: AtomicBool,
    /// Polls that ended because something became due (tests).
    #[cfg(test)]
    poll_hits: std::sync::atomic::AtomicU64,
    clock: SharedClock,
    /// The agent's clock zero and the Unix µs at it (the meter's time).
    epoch: Instant,
    unix_base_us: u64,
}

impl GroupCommit {
    /// An empty commit whose meter reads time as the agent does: Unix µs
    /// = `unix_base_us` + µs since `epoch` on `clock`.
    pub(super) fn new(clock: SharedClock, epoch: Instant, unix_base_us: u64) -> Self {
        Self {
            gathering: Mutex::new(Gathering {
                meter: UsageMeter::new(),
                keyed: Vec::new(),
                due: false,
                memory_due: false,
                open: 1,
                idle: false,
                closed: false,
                plain: Vec::new(),
                held: 0,
            }),
            wake: Condvar::new(),
            due_hint: AtomicBool::new(false),
            #[cfg(test)]
            poll_hits: std::sync::atomic::AtomicU64::new(0),
            clock,
            epoch,
            unix_base_us,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Gathering> {
        self.gathering.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_us(&self) -> u64 {
        let since = self.clock.now().saturating_duration_since(self.epoch);
        self.unix_base_us
            .saturating_add(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }

    /// Changes the meter without anything waiting for a write (residency
    /// starts and stops).
    pub(super) fn meter(&self, change: impl FnOnce(&mut UsageMeter)) {
        change(&mut self.lock().meter);
    }

    /// Puts usage into the meter (and `keyed`, the outcome a keyed
    /// invocation's usage bills) for the next write, and returns the group
    /// whose write journals it: what waits for that usage waits for
    /// `Written` of that group.
    pub(super) fn hold(
        &self,
        change: impl FnOnce(&mut UsageMeter),
        keyed: Option<KeyedOutcome>,
    ) -> u64 {
        let mut g = self.lock();
        change(&mut g.meter);
        g.keyed.extend(keyed);
        g.held = g.held.saturating_add(1);
        g.due = true;
        self.due_hint.store(true, Ordering::Release);
        if g.idle {
            self.wake.notify_one();
        }
        g.open
    }

    /// [`GroupCommit::hold`] for a plain reply: `outcome` goes to `tx`
    /// from the thread that ends its group's write ([`GroupCommit::send`]).
    pub(super) fn hold_reply(
        &self,
        change: impl FnOnce(&mut UsageMeter),
        tx: oneshot::Sender<InvokeOutcome>,
        outcome: InvokeOutcome,
    ) -> u64 {
        let mut g = self.lock();
        change(&mut g.meter);
        let group = g.open;
        g.plain.push(HeldPlain { group, tx, outcome });
        g.held = g.held.saturating_add(1);
        g.due = true;
        self.due_hint.store(true, Ordering::Release);
        if g.idle {
            self.wake.notify_one();
        }
        group
    }

    /// Sends the plain replies of the groups `covered` accepts, once their
    /// write ended with `result`: their outcomes on `Ok`, `usage_not_recorded`
    /// on `Err`. Returns how many.
    pub(super) fn send(&self, covered: impl Fn(u64) -> bool, result: &Result<u64, String>) -> u64 {
        let mut due = Vec::new();
        {
            let mut g = self.lock();
            let mut i = 0;
            while i < g.plain.len() {
                if covered(g.plain[i].group) {
                    due.push(g.plain.remove(i));
                } else {
                    i += 1;
                }
            }
        }
        let sent = due.len() as u64;
        for r in due {
            let outcome = match result {
                Ok(_) => r.outcome,
                Err(e) => {
                    InvokeOutcome::Failed(InvokeError::UsageNotRecorded { detail: e.clone() })
                }
            };
            let _ = r.tx.send(outcome);
        }
        sent
    }

    /// Resident memory goes with the next write.
    pub(super) fn memory_due(&self) {
        let mut g = self.lock();
        g.memory_due = true;
        g.due = true;
        self.due_hint.store(true, Ordering::Release);
        if g.idle {
            self.wake.notify_one();
        }
    }

    /// Takes everything metered up to now as one group (the final flush):
    /// its number tags what it releases.
    pub(super) fn take_all(&self) -> Group {
        let now = self.now_us();
        let now_ms = self.clock.unix_ms();
        let mut g = self.lock();
        let records = g.meter.take_all(now);
        Self::take(&mut g, records, now_ms)
    }

    /// Takes the open group: its drafts, and its keyed outcomes, each
    /// stamped `now_ms` (the write's time, by which its key expires).
    fn take(
        g: &mut Gathering,
        drafts: Vec<gshare_core::metering::UsageDraft>,
        now_ms: u64,
    ) -> Group {
        let number = g.open;
        g.open += 1;
        g.due = false;
        g.memory_due = false;
        let mut keyed = std::mem::take(&mut g.keyed);
        for o in &mut keyed {
            o.at_ms = now_ms;
        }
        Group {
            number,
            records: drafts.into_iter().map(|d| d.into_record()).collect(),
            keyed,
            now_ms,
            held: std::mem::take(&mut g.held),
            delivered: g.meter.delivered(),
        }
    }

    /// A group's write failed and kept nothing: the service it held that
    /// was delivered anyway (resident memory, the rest of streamed runs)
    /// accrues again and goes with the next write; its completed
    /// invocations do not (their replies are answered `usage_not_recorded`),
    /// nor their sub-ms remainders. Not due by itself: it waits for the
    /// next hold or memory tick.
    pub(super) fn restore(&self, delivered: Delivered) {
        self.lock().meter.restore(delivered);
    }

    /// The writer's next group: waits until something is due; `None` once
    /// the agent is gone. With `poll`, it first polls for up to [`POLL`]
    /// before it sleeps.
    fn next(&self, poll: bool) -> Option<Group> {
        let mut g = self.lock();
        let mut spun = !poll;
        loop {
            if g.closed {
                return None;
            }
            if g.due {
                g.idle = false;
                self.due_hint.store(false, Ordering::Relaxed);
                let drafts = if g.memory_due {
                    g.meter.take_all(self.now_us())
                } else {
                    g.meter.take_busy()
                };
                let now_ms = self.clock.unix_ms();
                return Some(Self::take(&mut g, drafts, now_ms));
            }
            if !spun {
                // Poll a while before sleeping: with one request in flight
                // the next group is due one round trip after this write,
                // and waking a sleeping thread (often a halted virtual
                // CPU) is a large part of that round trip.
                spun = true;
                drop(g);
                let until = Instant::now() + POLL;
                while !self.due_hint.load(Ordering::Acquire) && Instant::now() < until {
                    std::hint::spin_loop();
                }
                #[cfg(test)]
                if self.due_hint.load(Ordering::Acquire) {
                    self.poll_hits.fetch_add(1, Ordering::Relaxed);
                }
                g = self.lock();
                continue;
            }
            g.idle = true;
            g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The agent is gone: the writer ends after its write in flight (if any).
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.due_hint.store(true, Ordering::Release);
        self.wake.notify_all();
    }

    /// Starts the writer thread: it journals group after group into
    /// `journal` and answers each with [`Written`] to `agent`, until
    /// [`GroupCommit::close`] or the agent is gone.
    pub(super) fn spawn_writer(
        self: &Arc<Self>,
        journal: Arc<UsageJournal>,
        agent: WeakAddr<NodeAgent>,
    ) -> std::io::Result<()> {
        let groups = self.clone();
        std::thread::Builder::new()
            .name("usage-journal".into())
            .spawn(move || {
                // Whether the writer polls before it sleeps (the rule in
                // the module's text).
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let mut poll = false;
                // The holds per write (replies, stream heads and ends),
                // averaged over the last writes (weight 1/8).
                let mut per_write = 0.0_f64;
                loop {
                    let waiting = Instant::now();
                    let Some(group) = groups.next(poll) else {
                        break;
                    };
                    let soon = waiting.elapsed() <= POLL;
                    let (records, keyed, now_ms) = (group.records, group.keyed, group.now_ms);
                    let delivered = group.delivered;
                    let number = group.number;
                    let held = group.held;
                    // Plain replies go out from this thread as soon as the
                    // group is durable (before the journal's tree has it);
                    // then the actor (the others, and the counts).
                    let mut sent = None;
                    let mut durable = None;
                    // A panic in the journal fails this group's replies
                    // (closed) instead of leaving them waiting forever.
                    let append = std::panic::AssertUnwindSafe(|| {
                        journal.append_keyed_then(records, keyed, now_ms, |n| {
                            durable = Some(n);
                            sent = Some(groups.send(|tag| tag <= number, &Ok(n)));
                        })
                    });
                    let appended = std::panic::catch_unwind(append);
                    // A failed append that kept nothing gives its delivered
                    // service back; one whose records may still reach the
                    // region (sled's flush failed) must not bill it twice.
                    // A panic may have come after the records went in.
                    let kept = match &appended {
                        Ok(Err(e)) => e.may_have_kept(),
                        Ok(Ok(_)) => false,
                        Err(_) => true,
                    };
                    let (result, fatal) = match (appended, durable) {
                        (Ok(Ok(seqs)), _) => (Ok(seqs.end - seqs.start), None),
                        // Durable, but the journal cannot go on (its tree
                        // lacks the entry): the group is released, and the
                        // agent stops so that a restart replays it.
                        (Ok(Err(e)), Some(n)) => (Ok(n), Some(e.to_string())),
                        (Err(_), Some(n)) => (
                            Ok(n),
                            Some("journal writer: the append panicked after its write".to_string()),
                        ),
                        // The journal refuses appends until a restart
                        // replays its log: stop too.
                        (Ok(Err(e @ crate::journal::JournalError::Unapplied(_))), None) => {
                            (Err(withheld_because(&e)), Some(e.to_string()))
                        }
                        (Ok(Err(e)), None) => (Err(withheld_because(&e)), None),
                        (Err(_), None) => (
                            Err(format!(
                                "journal writer: the append panicked; {MAY_BE_BILLED}"
                            )),
                            None,
                        ),
                    };
                    let sent = match (sent, durable) {
                        (Some(n), _) => Sent::Released(n),
                        // Durable, but the callback did not finish.
                        (None, Some(n)) => Sent::Released(groups.send(|tag| tag <= number, &Ok(n))),
                        (None, None) => {
                            if !kept {
                                groups.restore(delivered);
                            }
                            Sent::Failed(groups.send(|tag| tag <= number, &result))
                        }
                    };
                    per_write = per_write * 0.875 + held as f64 * 0.125;
                    poll = cores > 1 && soon && per_write < 1.5;
                    let Some(agent) = agent.upgrade() else {
                        return;
                    };
                    let stop = fatal.is_some();
                    agent.do_send(Written {
                        group: number,
                        result,
                        sent,
                        fatal,
                    });
                    if stop {
                        return;
                    }
                }
            })
            .map(|_| ())
    }
}

/// What a withheld result's answer adds when its usage records may have
/// been kept though the write failed ([`JournalError::may_have_kept`], a
/// panic in the append): the call may be billed, so a retry without an
/// idempotency key, the call's own, may bill it twice (the answer still
/// says `retryable`).
const MAY_BE_BILLED: &str = "its usage may have been recorded anyway and billed: \
     retry with the call's idempotency key if it had one (without, a retry may bill it twice)";

/// The detail of the `usage_not_recorded` answer to the results a failed
/// append withholds.
pub(super) fn withheld_because(e: &crate::journal::JournalError) -> String {
    if e.may_have_kept() {
        format!("{e}; {MAY_BE_BILLED}")
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::clock::ManualClock;
    use gshare_core::metering::{ResidencyId, UsageKey};
    use gshare_core::model::{PoolKind, TenantId, Tier};
    use std::time::Duration;

    const BASE_US: u64 = 1_700_000_000_000_000;

    fn key() -> UsageKey {
        UsageKey {
            tenant: TenantId("acme".into()),
            function: "chat".into(),
            tier: Tier::Guaranteed,
            gpu_model: "A100-80G".into(),
            pool_kind: PoolKind::Center,
        }
    }

    fn commit() -> (Arc<ManualClock>, GroupCommit) {
        let (manual, clock) = ManualClock::shared(BASE_US / 1_000);
        let epoch = clock.now();
        (manual, GroupCommit::new(clock, epoch, BASE_US))
    }

    fn done(at_us: u64) -> impl FnOnce(&mut UsageMeter) {
        move |m: &mut UsageMeter| m.invocation(&key(), 100, at_us - 1_000, at_us)
    }

    fn invocations(g: &Group) -> u64 {
        g.records.iter().map(|r| r.invocations).sum()
    }

    fn reply(body: &[u8]) -> InvokeOutcome {
        InvokeOutcome::Done {
            body: body.to_vec(),
            queued_us: 0,
            service_us: 1,
        }
    }

    /// A failed group of completed invocations alone gives nothing back,
    /// and its sub-ms remainders go too: the next group bills only its own.
    #[test]
    fn a_failed_group_of_invocations_leaves_no_remainder_behind() {
        let (_, c) = commit();
        // 1 milli for 1.5 ms: 1 unit drafted, 0.5 carried.
        let part = |from: u64, to: u64| move |m: &mut UsageMeter| m.invocation(&key(), 1, from, to);
        c.hold(part(BASE_US, BASE_US + 1_500), None);
        let g = c.next(false).expect("due");
        assert_eq!(g.records[0].compute_milli_gpu_ms, 1);
        assert!(g.delivered.is_empty());
        // Its write failed.
        c.restore(g.delivered);
        // 0.6 units: no whole unit (with the failed group's 0.5, one).
        c.hold(part(BASE_US + 2_000, BASE_US + 2_600), None);
        let g = c.next(false).expect("due");
        assert_eq!(
            (g.records[0].compute_milli_gpu_ms, g.records[0].invocations),
            (0, 1)
        );
    }

    #[test]
    fn plain_replies_wait_for_their_groups_write_and_fail_closed_with_it() {
        let (_, c) = commit();
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        assert_eq!(c.hold_reply(done(BASE_US + 2_000), tx1, reply(b"a")), 1);
        let g1 = c.next(false).expect("due");
        assert_eq!((g1.number, invocations(&g1)), (1, 1));
        // Held while group 1 is written: it goes with group 2.
        assert_eq!(c.hold_reply(done(BASE_US + 3_000), tx2, reply(b"b")), 2);
        // Nothing is sent before its group's write ended.
        assert!(rx1.try_recv().is_err());
        assert_eq!(c.send(|tag| tag <= 1, &Ok(1)), 1);
        assert_eq!(rx1.try_recv().unwrap(), reply(b"a"));
        assert!(rx2.try_recv().is_err(), "group 2 is not written yet");
        let g2 = c.next(false).expect("due");
        assert_eq!((g2.number, invocations(&g2)), (2, 1));
        // A failed write answers its replies usage_not_recorded.
        assert_eq!(c.send(|tag| tag <= 2, &Err("disk full".into())), 1);
        assert!(matches!(
            rx2.try_recv().unwrap(),
            InvokeOutcome::Failed(InvokeError::UsageNotRecorded { detail }) if detail == "disk full"
        ));
        assert_eq!(c.send(|_| true, &Ok(0)), 0);
    }

    #[test]
    fn a_group_holds_the_usage_of_every_reply_tagged_with_it() {
        let (_, c) = commit();
        let k = KeyedOutcome::new(TenantId("acme".into()), "k1".into(), 1, b"ok");
        assert_eq!(c.hold(done(BASE_US + 2_000), Some(k.clone())), 1);
        assert_eq!(c.hold(done(BASE_US + 3_000), None), 1);
        let g = c.next(false).expect("due");
        assert_eq!(g.number, 1);
        assert_eq!(invocations(&g), 2);
        // Stamped with the write's time.
        let k = KeyedOutcome {
            at_ms: BASE_US / 1_000,
            ..k
        };
        assert_eq!(g.keyed, vec![k]);
        // Usage held after the writer took group 1 goes with group 2.
        assert_eq!(c.hold(done(BASE_US + 4_000), None), 2);
        let g = c.next(false).expect("due");
        assert_eq!((g.number, invocations(&g)), (2, 1));
        assert!(g.keyed.is_empty());
    }

    #[test]
    fn keyed_outcomes_keep_their_order_and_take_the_write_time() {
        let (clock, c) = commit();
        let tenant = TenantId("acme".into());
        let head = gshare_core::protocol::ReplyHead {
            status: 200,
            headers: Vec::new(),
        };
        // A keyed stream's start (held when it opened, stamped 0), then its
        // end in the same group: the end comes last, so the key keeps it.
        let start = KeyedOutcome::http(tenant.clone(), "s".into(), 0, head.clone(), &[], 0, false);
        let end = KeyedOutcome::http(tenant, "s".into(), 0, head, b"data: x", 7, true);
        c.hold(done(BASE_US + 2_000), Some(start));
        c.hold(done(BASE_US + 3_000), Some(end));
        clock.advance(Duration::from_millis(7));
        let g = c.next(false).expect("due");
        let now_ms = BASE_US / 1_000 + 7;
        assert_eq!(g.now_ms, now_ms);
        assert_eq!(
            g.keyed
                .iter()
                .map(|o| (o.complete, o.at_ms))
                .collect::<Vec<_>>(),
            vec![(false, now_ms), (true, now_ms)]
        );
    }

    #[test]
    fn memory_goes_with_the_next_group_and_the_final_flush_takes_everything() {
        let (clock, c) = commit();
        c.meter(|m| m.resident_start(ResidencyId(1), key(), 1_024, BASE_US));
        clock.advance(Duration::from_millis(10));
        // A residency alone is not due.
        c.hold(done(BASE_US + 5_000), None);
        let g = c.next(false).expect("due");
        assert!(g.records.iter().all(|r| r.memory_mib_ms == 0));
        c.memory_due();
        let g = c.next(false).expect("due");
        assert_eq!(g.number, 2);
        assert_eq!(
            g.records.iter().map(|r| r.memory_mib_ms).sum::<u64>(),
            10 * 1_024
        );
        // The final flush: the usage held so far, the residency up to now,
        // as a group of its own (the writer's next group is the one after).
        assert_eq!(c.hold(done(BASE_US + 12_000), None), 3);
        clock.advance(Duration::from_millis(5));
        let f = c.take_all();
        assert_eq!(f.number, 3);
        assert_eq!(invocations(&f), 1);
        assert_eq!(
            f.records.iter().map(|r| r.memory_mib_ms).sum::<u64>(),
            5 * 1_024
        );
        assert_eq!(c.hold(done(BASE_US + 16_000), None), 4);
    }

    #[test]
    fn an_idle_writer_wakes_on_usage_and_ends_when_closed() {
        // Sleeping at once, and polling first (holds before the writer
        // waits, and holds and a close after a poll ran out).
        for poll in [false, true] {
            an_idle_writer_takes_every_hold(poll, Duration::ZERO);
            an_idle_writer_takes_every_hold(poll, POLL * 3);
        }
    }

    /// A lost wake-up fails here instead of hanging the test.
    const NO_HANG: Duration = Duration::from_secs(10);

    fn an_idle_writer_takes_every_hold(poll: bool, pause: Duration) {
        let (_, c) = commit();
        let c = Arc::new(c);
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut taken = Vec::new();
                while let Some(g) = c.next(poll) {
                    taken.push((g.number, invocations(&g), g.held));
                }
                let _ = tx.send(taken);
            });
        }
        // Whether the writer already waits or not, each hold is taken by
        // a group at or after its tag.
        let tags: Vec<u64> = (1..=3)
            .map(|i| {
                std::thread::sleep(pause);
                c.hold(done(BASE_US + i * 2_000), None)
            })
            .collect();
        // Wait until everything held was taken, then close.
        let deadline = Instant::now() + NO_HANG;
        while c.lock().due {
            assert!(Instant::now() < deadline, "poll {poll}: a hold never taken");
            std::hint::spin_loop();
        }
        std::thread::sleep(pause);
        c.close();
        let taken = rx
            .recv_timeout(NO_HANG)
            .unwrap_or_else(|_| panic!("poll {poll}: the writer did not end on close"));
        assert_eq!(taken.iter().map(|t| t.1).sum::<u64>(), 3);
        assert_eq!(
            taken.iter().map(|t| t.2).sum::<u64>(),
            3,
            "every hold counted"
        );
        for tag in tags {
            assert!(taken.iter().any(|t| t.0 == tag), "group {tag} written");
        }
    }

    #[test]
    fn a_polling_writer_takes_what_is_held_during_its_poll() {
        // A hold a quarter of the poll after the writer starts mostly lands
        // inside the poll; tried until one does (a hint never set would
        // leave every poll to run out, and this to fail).
        for _ in 0..500 {
            let (_, c) = commit();
            let c = Arc::new(c);
            let (tx, rx) = std::sync::mpsc::channel();
            {
                let c = c.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(c.next(true).map(|g| invocations(&g)));
                });
            }
            std::thread::sleep(POLL / 4);
            c.hold(done(BASE_US + 2_000), None);
            let got = rx.recv_timeout(NO_HANG).expect("the writer took the hold");
            assert_eq!(got, Some(1));
            if c.poll_hits.load(Ordering::Relaxed) > 0 {
                return;
            }
        }
        panic!("no poll ever ended on a hold");
    }

    /// A failed append that may have kept its records says the call may
    /// be billed; one that kept nothing does not.
    #[test]
    fn a_withheld_result_says_when_its_usage_may_be_billed_anyway() {
        use crate::journal::JournalError;
        let kept = JournalError::Unflushed(sled::Error::Unsupported("flush".into()));
        assert!(
            withheld_because(&kept).ends_with(MAY_BE_BILLED),
            "{}",
            withheld_because(&kept)
        );
        let lost = JournalError::Encode("a record too large".into());
        assert!(!lost.may_have_kept());
        assert!(!withheld_because(&lost).contains(MAY_BE_BILLED));
    }
}

//! Migration of an instance to another node, make-before-break.
//!
//! ```text
//!   leader: InstanceMigrate { instance: old, slices, cause }
//!      apply: same fit and quota as a placement (the quota counts both),
//!             max_instances counts one (a roll's: the new) ─▶ new instance, Migration { from: old, to: new }
//!   both serve while the new one loads; every tick the leader looks at each migration:
//!      migration_steps(view, ready, now, wait)      (pure)
//!         the new one is ready (its agent reports it) ─▶ Complete: InstanceRelease(old)
//!         a drain's or a roll's, not ready within MUST_FINISH_AFTER_MS, whose old one's node
//!           is leaving (drains, or lost) ─▶ Complete all the same
//!         a roll's, not ready within MUST_FINISH_AFTER_MS, beside a ready instance of its
//!           version on its node (which serves that version), or whose old one is on a node
//!           no agent ever registered for (it serves nothing) ─▶ Complete all the same
//!         not ready within `wait` (or twice its predicted cold start, if longer), or its node not ready ─▶ Abort: InstanceRelease(new)
//!   a release of either side ends the record (completed, or given up)
//! ```
//!
//! During the overlap both instances hold their slices on their GPUs and
//! both count against the tenant's quota (a migration needs quota room
//! for one more instance: where there is none, it is refused and nothing
//! moves); `max_instances` and the autoscaler count the function's
//! instances once ([`super::RegionState::instance_count`] leaves the new
//! side out until the old one goes; a roll's new side counts at once, its
//! old one being outgoing). The old instance keeps serving until
//! it is released; the agent finishes the requests it is running and hands
//! back the ones still queued, which the replica sends to the other copy.

use super::instance::{Instance, InstanceId};
use super::region_state::{RegionState, UnixMillis};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Why an instance moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MigrationCause {
    /// It spilled out of its preferred pool (the pool was full, or its
    /// node not ready) and room came back there.
    Return,
    /// An operator moved it (`gsharectl function move`); the leader does
    /// not move it back to its preference.
    Operator,
    /// It made room for a placement that fitted the pool only in sum
    /// (defragmentation across nodes).
    Defragment,
    /// Its node drains (`gsharectl node drain`): a drain's make-before-break is a migration, so a new
    /// leader finds it in the state and ends it instead of placing a
    /// second replacement. It completes when the new instance is ready, or
    /// after [`MUST_FINISH_AFTER_MS`] even if not while the node still
    /// drains (the drain must end; the new one loads on). After the causes
    /// above, to keep their encoding.
    Drain,
    /// A reshaping update's roll replaces an outgoing instance with one of
    /// the function's current version (on any node, its own included):
    /// like a drain's, recorded so that a new leader ends it rather than
    /// placing a second new instance. It completes when the new instance is
    /// ready; not ready after [`MUST_FINISH_AFTER_MS`], only where the old
    /// one's node is leaving (as a drain's) or no agent ever registered for
    /// it, or the new one's node serves the new version from another
    /// instance (see [`migration_steps`]);
    /// otherwise it is given up after the general wait and the old one
    /// serves on (a new version that never loads takes nothing down).
    /// Last, to keep the encoding of the others.
    Roll,
}

/// How long a drain's or a roll's migration ([`MigrationCause::must_finish`])
/// waits for its new instance to be ready before it releases the old one
/// anyway (ms).
pub const MUST_FINISH_AFTER_MS: u64 = 10_000;

impl MigrationCause {
    /// A short stable name (logs, metrics, the API).
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationCause::Return => "return",
            MigrationCause::Operator => "operator",
            MigrationCause::Defragment => "defragment",
            MigrationCause::Drain => "drain",
            MigrationCause::Roll => "roll",
        }
    }

    /// Whether the old side may go although the new one is not ready after
    /// [`MUST_FINISH_AFTER_MS`] (on the conditions of [`migration_steps`]):
    /// a drain's, or a roll's.
    pub fn must_finish(self) -> bool {
        matches!(self, MigrationCause::Drain | MigrationCause::Roll)
    }

    /// Every cause, in order.
    pub const ALL: [MigrationCause; 5] = [
        MigrationCause::Return,
        MigrationCause::Operator,
        MigrationCause::Defragment,
        MigrationCause::Drain,
        MigrationCause::Roll,
    ];
}

impl fmt::Display for MigrationCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One migration in progress: `to` was placed for `from`, which serves
/// until `to` is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// The instance that moves (released once `to` is ready).
    pub from: InstanceId,
    /// The instance placed for it.
    pub to: InstanceId,
    /// Why.
    pub cause: MigrationCause,
    /// When `to` was placed (Unix ms, the command's `now`).
    pub started_at: UnixMillis,
}

/// What the leader does next about one migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationStep {
    /// The new instance is ready: release the old one
    /// (`InstanceRelease { instance: from }`).
    Complete {
        /// The old instance.
        from: InstanceId,
        /// The new one.
        to: InstanceId,
    },
    /// The new instance did not become ready in time (or its node is not
    /// ready): release it (`InstanceRelease { instance: to }`); the old one
    /// stays.
    Abort {
        /// The old instance.
        from: InstanceId,
        /// The new one.
        to: InstanceId,
    },
}

impl MigrationStep {
    /// The instance this step releases.
    pub fn releases(&self) -> InstanceId {
        match self {
            MigrationStep::Complete { from, .. } => *from,
            MigrationStep::Abort { to, .. } => *to,
        }
    }
}

/// The next step of every migration of `view` whose outcome is decided at
/// `now`: `ready(new)` says whether the new instance's agent reports it
/// ready for requests; one not ready after `wait_ms`, or whose node takes
/// no placements (its agent went silent, or it drains), is given up. A
/// migration whose old instance's node is not ready completes as soon as
/// the new one is ready (nothing serves there anyway). A drain's or a
/// roll's migration ([`MigrationCause::must_finish`]) whose new instance
/// is not ready after [`MUST_FINISH_AFTER_MS`] completes all the same,
/// where its node takes placements, when the old one's node is leaving
/// (it drains, or is lost). A roll's also does when another instance of
/// the new one's version on its node is ready: that node's agent serves
/// the version from that copy (it loads one copy per version ahead, so
/// an idle function's second instance there may never report resident
/// itself). So does a roll's whose old instance is on a node no agent ever
/// registered for (it serves nothing: releasing it loses nothing, and
/// without agents a roll would never end). A roll's otherwise waits for its new instance like any
/// migration, and is given up after `wait_ms`: the old version being
/// replaced is no reason to release a working instance for one that is
/// not ready (a new version that never loads would take the function
/// down, one instance every MUST_FINISH_AFTER_MS).
///
/// A migration's age counts from the later of its `started_at` (the
/// clock of the leader that started it) and when this replica first saw
/// it (`seen`, by the new side, on this replica's clock; see
/// [`note_migrations_seen`]): a leader whose clock runs ahead of the one
/// that started a migration neither forces nor gives it up early. (A clock
/// running behind only delays both, as before.)
pub fn migration_steps(
    view: &RegionState,
    ready: &dyn Fn(&Instance) -> bool,
    now: UnixMillis,
    wait_ms: u64,
    seen: &BTreeMap<InstanceId, UnixMillis>,
) -> Vec<MigrationStep> {
    let mut out = Vec::new();
    for m in view.migrations() {
        let (Some(_), Some(to)) = (view.instance(m.from), view.instance(m.to)) else {
            continue; // apply ends the record with either side
        };
        let node_ok = to.slices.iter().all(|s| view.takes_placements(&s.gpu.node));
        let since = seen
            .get(&m.to)
            .map_or(m.started_at, |at| (*at).max(m.started_at));
        let age = now.saturating_sub(since);
        // The old side must go only while its node still drains (or is
        // lost): undrained, it serves on until the new one is ready.
        let leaving = || {
            view.instance(m.from).is_some_and(|from| {
                from.slices
                    .iter()
                    .any(|s| !view.takes_placements(&s.gpu.node))
            })
        };
        // The new side's node serves its version already: a ready sibling
        // of the same version shares a node with it (the agent prefetches
        // only a version's first instance on a node; the others load on
        // demand, so they may never report resident while idle, and the
        // roll would be given up and planned again forever).
        let served_beside = || {
            view.instances_of(&to.tenant, &to.function).any(|i| {
                i.id != to.id
                    && i.version == to.version
                    && i.slices
                        .iter()
                        .any(|s| to.slices.iter().any(|t| t.gpu.node == s.gpu.node))
                    && ready(i)
            })
        };
        // The old side of a roll on a node no agent ever registered for
        // serves nothing there, so it loses nothing by going. (Not "not
        // reported ready": a report can be missing for a moment, a peer
        // slow to answer, an agent reconnecting, while the instance serves.)
        let old_idle = || {
            view.instance(m.from).is_some_and(|from| {
                from.slices
                    .iter()
                    .all(|s| view.agents().all(|a| a.node != s.gpu.node))
            })
        };
        let forced = age >= MUST_FINISH_AFTER_MS
            && match m.cause {
                MigrationCause::Drain => leaving(),
                MigrationCause::Roll => leaving() || old_idle() || served_beside(),
                _ => false,
            };
        if node_ok && (forced || ready(to)) {
            out.push(MigrationStep::Complete {
                from: m.from,
                to: m.to,
            });
        } else if !node_ok || age >= give_up_after(view, to, wait_ms) {
            out.push(MigrationStep::Abort {
                from: m.from,
                to: m.to,
            });
        }
    }
    out
}

/// How long a migration waits for its new instance `to` before it is given
/// up: `wait_ms`, or twice the topology's predicted cold start of its
/// function's weights on its node where that is longer. A new instance that
/// cannot load within `wait_ms` even as predicted would be given up
/// mid-load, planned again and loaded from scratch for ever (a roll never
/// ending, a return churning storage); twice the prediction leaves room
/// for a slow disk without waiting for ever on one that never loads.
pub fn give_up_after(view: &RegionState, to: &Instance, wait_ms: u64) -> u64 {
    let predicted_us = to.slices.first().and_then(|s| {
        let weights = view
            .function(&to.tenant, &to.function)
            .ok()?
            .spec
            .memory_mib;
        view.topology()?.cold_start_us(&s.gpu.node.0, weights)
    });
    predicted_us.map_or(wait_ms, |us| wait_ms.max((us / 1000).saturating_mul(2)))
}

/// Keeps `seen` (when this replica first saw each migration of `view`,
/// by its new side, on this replica's clock) in step with `view` at `now`:
/// the migrations not seen before are seen now, the ended ones are
/// forgotten. Every replica keeps it, leader or not, so that a new leader
/// ages a migration from about when it was applied, not from the failover.
pub fn note_migrations_seen(
    view: &RegionState,
    seen: &mut BTreeMap<InstanceId, UnixMillis>,
    now: UnixMillis,
) {
    let live: std::collections::BTreeSet<InstanceId> = view.migrations().map(|m| m.to).collect();
    seen.retain(|to, _| live.contains(to));
    for to in live {
        seen.entry(to).or_insert(now);
    }
}

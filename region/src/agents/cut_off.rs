//! Whether a replica is cut off from the region's leader, so that the agents
//! linked to it should link to another replica.
//!
//! An agent stays on the replica it registered with for as long as that
//! replica answers its heartbeats. A replica on the minority side of a
//! partition, one whose peers are down, or one removed from the region
//! still answers, but the leader no longer hears the agent through it
//! (liveness then sends the node's work elsewhere), its usage is not
//! committed and its assignments go stale. Such a replica refuses
//! heartbeats (`Refused{code: "cut_off", retry: true}`), and the agent
//! registers with another replica if one takes it, moving there; if none
//! does (no replica has a leader) it stays, since its invocations still
//! come through this one.
//!
//! Cut off: no leader known (a follower that lost its leader stands for
//! election, and an uncommitted vote names none), a leader no quorum has
//! acknowledged for [`LEADER_WITHOUT_QUORUM`], or a replica its own
//! membership no longer names; and only once that lasted [`GRACE`]: an
//! ordinary election ends well within it, and agents do not move for it.
//! A timer looks at the Raft metrics every [`OBSERVE_EVERY`]; a heartbeat
//! is refused only while the metrics read at that moment still say so.
//! Only agents that registered with [`gshare_core::protocol::FEATURE_CUT_OFF`]
//! are refused: an older agent ends its session on any refusal, and
//! where no replica has a leader it could register nowhere.
//! A registration is refused at once (`retry`) by a replica that is not a
//! member, or a leader no quorum has acknowledged for a second
//! ([`RaftView::registration_futile`]): it would not hold, or would only
//! hold the agent.

use std::time::{Duration, Instant};

/// A leader whose last quorum acknowledgement is older than this counts as
/// cut off (its heartbeats go out every 100 ms; an election times out
/// after 0.5–1 s).
pub const LEADER_WITHOUT_QUORUM: Duration = Duration::from_millis(1_000);
/// How long a replica must stay cut off before it refuses heartbeats.
pub const GRACE: Duration = Duration::from_secs(3);

/// What the replica's Raft metrics say at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftView {
    /// The leader this replica knows of.
    pub leader: Option<u64>,
    /// This replica leads.
    pub leads: bool,
    /// As the leader: ms since a quorum last acknowledged it (`None`: never).
    pub since_quorum_ack_ms: Option<u64>,
    /// Its own membership names it (voter or learner).
    pub member: bool,
}

impl RaftView {
    /// As a leader, how long (ms) no quorum has acknowledged it, once that
    /// is over [`LEADER_WITHOUT_QUORUM`] (`Some(None)`: never acknowledged).
    fn quorum_lost(&self) -> Option<Option<u64>> {
        let limit = u64::try_from(LEADER_WITHOUT_QUORUM.as_millis()).unwrap_or(u64::MAX);
        match self.since_quorum_ack_ms {
            _ if !self.leads => None,
            Some(ms) if ms <= limit => None,
            ack => Some(ack),
        }
    }

    /// Why a registration here would not hold: this replica is not a
    /// member of the region (it would commit through a leader it still
    /// knows, then refuse the heartbeats), or it leads but no quorum has
    /// acknowledged it for [`LEADER_WITHOUT_QUORUM`] (the write would wait
    /// for a quorum that does not answer). A follower without a leader (an
    /// election, which its proposer rides out) and a new leader not yet
    /// acknowledged are not.
    pub fn registration_futile(&self) -> Option<String> {
        if !self.member {
            return Some("this replica is not a member of the region".into());
        }
        // A new leader not yet acknowledged (`None`) is not.
        let ms = self.quorum_lost()??;
        Some(format!(
            "this replica leads, but no quorum has acknowledged it for {ms} ms"
        ))
    }

    /// Why this view is cut off from a leader, if it is.
    pub fn cut_off(&self) -> Option<String> {
        if !self.member {
            return Some("this replica is no longer a member of the region".into());
        }
        if self.leads {
            return self.quorum_lost().map(|ack| match ack {
                Some(ms) => {
                    format!("this replica leads, but no quorum has acknowledged it for {ms} ms")
                }
                None => "this replica leads, but no quorum has acknowledged it".into(),
            });
        }
        match self.leader {
            Some(_) => None,
            None => Some("this replica knows no leader".into()),
        }
    }
}

/// A replica's cut-off state over time, as a timer observes it.
#[derive(Debug, Default)]
pub struct CutOff {
    /// Cut off since then, as far as the observations tell.
    since: Option<Instant>,
    /// The last observation.
    last: Option<Instant>,
}

impl CutOff {
    /// Looks at `view` at `now` (see [`CutOff::refusing`] for what it
    /// leads to). Observations come every [`OBSERVE_EVERY`]: after a gap
    /// longer than the grace (the process was stopped, or starved) the
    /// replica may have had a leader meanwhile, so the grace starts over.
    pub fn observe(&mut self, view: &RaftView, now: Instant) {
        let gap = self
            .last
            .replace(now)
            .is_some_and(|last| now.saturating_duration_since(last) > GRACE);
        if gap || view.cut_off().is_none() {
            self.since = None;
        }
        if view.cut_off().is_some() {
            self.since.get_or_insert(now);
        }
    }

    /// Why heartbeats are refused at `now`, by the observations so far and
    /// `view`, read just now: cut off for the grace, and still (a leader
    /// found since the last observation ends it at once). Changes nothing.
    pub fn refusing(&self, view: &RaftView, now: Instant) -> Option<String> {
        let why = view.cut_off()?;
        let lasted = now.saturating_duration_since(self.since?);
        (lasted >= GRACE).then(|| format!("{why} (for {} ms)", lasted.as_millis()))
    }
}

/// How often a replica looks at its Raft metrics for [`CutOff::observe`].
pub const OBSERVE_EVERY: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::*;

    const FOLLOWER: RaftView = RaftView {
        leader: Some(1),
        leads: false,
        since_quorum_ack_ms: None,
        member: true,
    };

    const LOST: RaftView = RaftView {
        leader: None,
        ..FOLLOWER
    };

    /// Observes `view` at `now`, then asks whether heartbeats are refused.
    fn seen(c: &mut CutOff, view: &RaftView, now: Instant) -> Option<String> {
        c.observe(view, now);
        c.refusing(view, now)
    }

    #[test]
    fn a_follower_with_a_leader_or_a_leader_with_its_quorum_is_not_cut_off() {
        assert_eq!(FOLLOWER.cut_off(), None);
        let leader = RaftView {
            leader: Some(2),
            leads: true,
            since_quorum_ack_ms: Some(150),
            ..FOLLOWER
        };
        assert_eq!(leader.cut_off(), None);
    }

    #[test]
    fn no_leader_a_leader_without_quorum_or_a_removed_replica_is_cut_off() {
        assert!(LOST.cut_off().unwrap().contains("knows no leader"));
        let alone = RaftView {
            leader: Some(2),
            leads: true,
            since_quorum_ack_ms: Some(5_000),
            ..FOLLOWER
        };
        assert!(alone.cut_off().unwrap().contains("5000 ms"));
        let never = RaftView {
            since_quorum_ack_ms: None,
            ..alone
        };
        assert!(never.cut_off().is_some());
        let removed = RaftView {
            member: false,
            ..FOLLOWER
        };
        assert!(removed.cut_off().unwrap().contains("no longer a member"));
    }

    #[test]
    fn heartbeats_are_refused_only_after_the_grace_and_a_leader_resets_it() {
        let t0 = Instant::now();
        let mut c = CutOff::default();
        // An election: no leader for a moment, then one again.
        assert_eq!(seen(&mut c, &LOST, t0), None);
        assert_eq!(seen(&mut c, &LOST, t0 + GRACE / 2), None);
        assert_eq!(seen(&mut c, &FOLLOWER, t0 + GRACE / 2), None);
        // The grace starts again from the next time no leader is known.
        assert_eq!(seen(&mut c, &LOST, t0 + GRACE), None);
        assert_eq!(seen(&mut c, &LOST, t0 + GRACE + GRACE / 2), None);
        let why = seen(&mut c, &LOST, t0 + GRACE * 2).expect("cut off for the grace");
        assert!(
            why.contains("knows no leader") && why.contains("3000 ms"),
            "{why}"
        );
        assert_eq!(seen(&mut c, &FOLLOWER, t0 + GRACE * 3), None);
    }

    #[test]
    fn only_a_leader_without_quorum_refuses_registrations_at_once() {
        let new_leader = RaftView {
            leader: Some(1),
            leads: true,
            since_quorum_ack_ms: None,
            ..FOLLOWER
        };
        let alone = RaftView {
            since_quorum_ack_ms: Some(1_500),
            ..new_leader
        };
        assert_eq!(FOLLOWER.registration_futile(), None);
        assert_eq!(LOST.registration_futile(), None);
        assert_eq!(new_leader.registration_futile(), None);
        assert!(alone.registration_futile().unwrap().contains("1500 ms"));
        let removed = RaftView {
            member: false,
            ..FOLLOWER
        };
        assert!(removed
            .registration_futile()
            .unwrap()
            .contains("not a member"));
    }

    #[test]
    fn a_refusal_needs_the_grace_and_a_view_still_cut_off() {
        let t0 = Instant::now();
        let mut c = CutOff::default();
        assert_eq!(c.refusing(&LOST, t0), None);
        c.observe(&LOST, t0);
        assert_eq!(c.refusing(&LOST, t0 + GRACE / 2), None);
        assert!(c.refusing(&LOST, t0 + GRACE).is_some());
        // A leader found since the last observation: no refusal.
        assert_eq!(c.refusing(&FOLLOWER, t0 + GRACE), None);
    }

    #[test]
    fn after_a_gap_in_the_observations_the_grace_starts_over() {
        let t0 = Instant::now();
        let mut c = CutOff::default();
        assert_eq!(seen(&mut c, &LOST, t0), None);
        assert!(seen(&mut c, &LOST, t0 + GRACE).is_some());
        // No observation for a minute (the process was stopped); the next
        // one finds no leader again: a short election, perhaps, not a
        // minute of it.
        let later = t0 + GRACE * 20;
        assert_eq!(seen(&mut c, &LOST, later), None);
        assert_eq!(seen(&mut c, &LOST, later + GRACE / 2), None);
        assert!(seen(&mut c, &LOST, later + GRACE).is_some());
    }
}

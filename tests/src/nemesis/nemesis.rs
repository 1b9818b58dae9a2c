//! The nemesis: a fault schedule drawn from the seed, and how each fault
//! is applied to and healed on a [`Cluster`].
//!
//! ```text
//!   seed ─▶ Rng ─▶ [Round { fault, hold_ms, rest_ms }; rounds]
//!   each round: resolve (whose leader now?) ─▶ apply ─▶ hold ─▶ heal ─▶ rest
//! ```
//!
//! The seed fixes the schedule (which fault, how long, which link or
//! agent), not the interleaving: "the leader" is whoever leads when the
//! round starts, and the processes' own timing differs between runs.

use std::fmt;
use std::time::Duration;

use gshare_core::rng::Rng;

use super::cluster::{Cluster, DISK_REPLICA};

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of the leader, restarted when healed.
    KillLeader,
    /// kill -9 of a follower, restarted when healed.
    KillFollower,
    /// kill -9 of every replica at once, all restarted when healed.
    KillAll,
    /// SIGSTOP of the leader, SIGCONT when healed.
    PauseLeader,
    /// SIGSTOP of a follower.
    PauseFollower,
    /// Every datagram into replica `2` or `3`'s Raft endpoint dropped.
    CutRaftLink,
    /// Loss and delay on the link into replica `2` or `3`.
    SlowRaftLink,
    /// One agent cut off from every replica.
    IsolateAgent,
    /// Loss and delay on one agent's links.
    SlowAgent,
    /// kill -9 of one agent, restarted when healed.
    KillAgent,
    /// Replica 3's data disk filled up; freed (and the replica restarted
    /// if it stopped) when healed.
    FillDisk,
}

const ALL: [Fault; 11] = [
    Fault::KillLeader,
    Fault::KillFollower,
    Fault::KillAll,
    Fault::PauseLeader,
    Fault::PauseFollower,
    Fault::CutRaftLink,
    Fault::SlowRaftLink,
    Fault::IsolateAgent,
    Fault::SlowAgent,
    Fault::KillAgent,
    Fault::FillDisk,
];

/// One round of the schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The fault.
    pub fault: Fault,
    /// How long it lasts.
    pub hold: Duration,
    /// Healthy time after it.
    pub rest: Duration,
    /// A draw for the fault's own choices (which link, which agent, how
    /// much loss).
    pub pick: u64,
}

/// The schedule of one seed: `rounds` rounds, faults drawn uniformly
/// (without [`Fault::FillDisk`] when `disk` is false), holds of 1.5–4 s
/// (a full disk 4.5–12 s), rests of 1–2 s.
pub fn schedule(seed: u64, rounds: usize, disk: bool) -> Vec<Round> {
    let mut rng = Rng::new(seed ^ 0x6e65_6d65_7369_7321);
    let kinds: Vec<Fault> = ALL
        .into_iter()
        .filter(|f| disk || *f != Fault::FillDisk)
        .collect();
    (0..rounds)
        .map(|_| {
            let fault = kinds[rng.below(kinds.len() as u64) as usize];
            let mut hold = Duration::from_millis(1_500 + rng.below(2_500));
            if fault == Fault::FillDisk {
                // Long enough for sled to need space past what it holds.
                hold *= 3;
            }
            let rest = Duration::from_millis(1_000 + rng.below(1_000));
            Round {
                fault,
                hold,
                rest,
                pick: rng.next_u64(),
            }
        })
        .collect()
}

/// A fault resolved against the cluster as it is now.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// These replicas were killed.
    Killed(Vec<u64>),
    /// This replica was paused.
    Paused(u64),
    /// The Raft link into this replica: loss probability and delay (1.0:
    /// cut).
    RaftLink(u64, f64, Duration),
    /// This agent's links: loss probability and delay (1.0: cut).
    AgentLinks(usize, f64, Duration),
    /// This agent was killed.
    AgentKilled(usize),
    /// The disk was filled with this many bytes.
    DiskFilled(u64),
    /// Nothing could be done (why).
    Skipped(String),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Killed(ids) => write!(f, "kill -9 replicas {ids:?}"),
            Action::Paused(id) => write!(f, "SIGSTOP replica {id}"),
            Action::RaftLink(id, p, _) if *p >= 1.0 => write!(f, "cut raft link into r{id}"),
            Action::RaftLink(id, p, d) => {
                write!(f, "raft link into r{id}: loss {p:.2}, delay {d:?}")
            }
            Action::AgentLinks(i, p, _) if *p >= 1.0 => write!(f, "agent {i} cut off"),
            Action::AgentLinks(i, p, d) => write!(f, "agent {i} links: loss {p:.2}, delay {d:?}"),
            Action::AgentKilled(i) => write!(f, "kill -9 agent {i}"),
            Action::DiskFilled(n) => write!(f, "r{DISK_REPLICA}'s disk filled (+{n} bytes)"),
            Action::Skipped(why) => write!(f, "skipped: {why}"),
        }
    }
}

fn loss(pick: u64) -> (f64, Duration) {
    let p = 0.1 + (pick % 30) as f64 / 100.0;
    let d = Duration::from_millis(20 + (pick >> 8) % 180);
    (p, d)
}

/// Applies `round`'s fault to `c`.
pub fn apply(round: &Round, c: &mut Cluster) -> anyhow::Result<Action> {
    let pick = round.pick;
    let running = c.region.running();
    let action = match round.fault {
        Fault::KillLeader | Fault::PauseLeader | Fault::KillFollower | Fault::PauseFollower => {
            let leader = c.leader();
            let target = match (round.fault, leader) {
                (Fault::KillLeader | Fault::PauseLeader, Some(l)) => Some(l),
                (_, l) => {
                    let others: Vec<u64> =
                        running.iter().copied().filter(|i| Some(*i) != l).collect();
                    (!others.is_empty()).then(|| others[(pick % others.len() as u64) as usize])
                }
            };
            match (target, round.fault) {
                (None, _) => Action::Skipped("no replica to act on".into()),
                (Some(id), Fault::KillLeader | Fault::KillFollower) => {
                    c.kill_replica(id)?;
                    Action::Killed(vec![id])
                }
                (Some(id), _) => {
                    c.pause(id)?;
                    Action::Paused(id)
                }
            }
        }
        Fault::KillAll => {
            for id in 1..=3 {
                c.kill_replica(id)?;
            }
            Action::Killed(vec![1, 2, 3])
        }
        Fault::CutRaftLink | Fault::SlowRaftLink => {
            let i = (pick % c.raft_links.len() as u64) as usize;
            let (id, proxy) = &c.raft_links[i];
            if round.fault == Fault::CutRaftLink {
                proxy.cut();
                Action::RaftLink(*id, 1.0, Duration::ZERO)
            } else {
                let (p, d) = loss(pick >> 4);
                proxy.set_drop_probability(p);
                proxy.set_delay(d);
                Action::RaftLink(*id, p, d)
            }
        }
        Fault::IsolateAgent | Fault::SlowAgent => {
            let i = (pick % c.agents.len() as u64) as usize;
            let (p, d) = if round.fault == Fault::IsolateAgent {
                (1.0, Duration::ZERO)
            } else {
                loss(pick >> 4)
            };
            for proxy in &c.agents[i].links {
                if p >= 1.0 {
                    proxy.cut();
                } else {
                    proxy.set_drop_probability(p);
                    proxy.set_delay(d);
                }
            }
            Action::AgentLinks(i, p, d)
        }
        Fault::KillAgent => {
            let i = (pick % c.agents.len() as u64) as usize;
            c.kill_agent(i);
            Action::AgentKilled(i)
        }
        Fault::FillDisk => match c.disk {
            Some(_) => Action::DiskFilled(c.fill_disk()?),
            None => Action::Skipped(c.disk_skipped.clone().unwrap_or_default()),
        },
    };
    Ok(action)
}

/// Undoes `action` (see [`Cluster::heal_all`] for the final heal).
pub fn heal(action: &Action, c: &mut Cluster) -> anyhow::Result<()> {
    match action {
        Action::Killed(ids) => {
            for id in ids {
                c.restart_replica(*id)?;
            }
        }
        Action::Paused(id) => c.resume(*id)?,
        Action::RaftLink(id, _, _) => {
            if let Some((_, p)) = c.raft_links.iter().find(|(i, _)| i == id) {
                p.heal();
            }
        }
        Action::AgentLinks(i, _, _) => {
            for p in &c.agents[*i].links {
                p.heal();
            }
        }
        Action::AgentKilled(i) => c.start_agent(*i)?,
        Action::DiskFilled(_) => {
            c.free_disk();
            // A replica that stopped on the full disk is started again.
            c.restart_replica(DISK_REPLICA)?;
        }
        Action::Skipped(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_schedule() {
        assert_eq!(schedule(7, 12, true), schedule(7, 12, true));
        assert_ne!(schedule(7, 12, true), schedule(8, 12, true));
        let no_disk = schedule(7, 200, false);
        assert!(no_disk.iter().all(|r| r.fault != Fault::FillDisk));
        let with_disk = schedule(7, 200, true);
        for f in ALL {
            assert!(with_disk.iter().any(|r| r.fault == f), "{f:?} never drawn");
        }
    }
}

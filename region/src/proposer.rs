//! Turns many concurrent client writes into few Raft entries.
//!
//! ```text
//!  client ─┐                         ┌─ raft.client_write(batch) ── leader here
//!  client ─┼─▶ queue ─▶ batch (≤ MAX_BATCH) ─┤
//!  client ─┘    (one task)           └─ forward over QUIC ─▶ leader's raft.client_write(batch)
//! ```
//!
//! While up to `MAX_IN_FLIGHT` batches are being committed, new commands
//! queue up and form the next batch, so batches grow with load and the
//! per-entry cost (fsync, replication round trip) is shared. Each client gets
//! the outcome of its own command.
//!
//! A batch is bounded in commands ([`MAX_BATCH`]) and in encoded bytes
//! ([`MAX_BATCH_BYTES`]; one proposal alone may be larger, up to
//! [`MAX_PROPOSAL_BYTES`]): a Raft entry must fit one peer frame
//! ([`PEER_FRAME_BYTES`], 16 MiB) with room to spare, or no follower could
//! ever take it and replication would stop at it for good (many agents'
//! full usage batches at once, ~1 MiB each, would have made one).

use std::sync::Arc;
use std::time::Duration;

use gshare_core::command::{CommandError, CommandOutcome, RegionCommand};
use gshare_raft_store::{BatchOutcome, CommandBatch, TypeConfig};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::Raft;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::peer_link::{PeerLinks, PeerTransport};
use crate::wire::{PeerReply, PeerRequest, WriteRefusal, PEER_FRAME_BYTES};
use gshare_core::clock::SharedClock;

/// Most commands in one Raft entry.
pub const MAX_BATCH: usize = 1024;
/// Proposals queued together form one entry while their commands'
/// encoded bytes stay within this.
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Largest proposal taken, in encoded bytes (half a peer frame: the entry's
/// envelope, an AppendEntries' other fields and a forward's frame fit
/// beside it).
pub const MAX_PROPOSAL_BYTES: usize = PEER_FRAME_BYTES / 2;
const _: () =
    assert!(MAX_BATCH_BYTES <= MAX_PROPOSAL_BYTES && MAX_PROPOSAL_BYTES < PEER_FRAME_BYTES);
/// Batches being committed at once. Measured with `region-bench` (256
/// clients): 2 gave ~2x the throughput of 16, because fewer, larger entries
/// cost less per command than more pipelining gains.
const MAX_IN_FLIGHT: usize = 2;
const FORWARD_TTL: Duration = Duration::from_secs(5);
const ATTEMPTS: usize = 4;

/// Why a write was not acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// The command is invalid; it was not proposed.
    #[error("invalid command: {0}")]
    Invalid(#[from] CommandError),
    /// No leader is known right now; retry shortly.
    #[error("no leader is known; retry")]
    NoLeader,
    /// The outcome is unknown (e.g. the leader failed mid-write); retry.
    #[error("write outcome unknown: {0}")]
    Unknown(String),
    /// The replica is shutting down.
    #[error("replica is shutting down")]
    Stopped,
    /// More commands in one proposal than one Raft entry takes; nothing was proposed.
    #[error("{len} commands in one proposal (at most {max})")]
    TooMany {
        /// Commands given.
        len: usize,
        /// The most one proposal takes.
        max: usize,
    },
    /// A proposal larger than one Raft entry may be; nothing was proposed.
    #[error("{bytes} bytes of commands in one proposal (at most {max})")]
    TooLarge {
        /// Its commands' encoded bytes (at least; counting stopped past `max`).
        bytes: usize,
        /// The most one proposal may encode to.
        max: usize,
    },
}

impl WriteError {
    /// Whether the client should retry the same command.
    pub fn retryable(&self) -> bool {
        !matches!(
            self,
            WriteError::Invalid(_) | WriteError::TooMany { .. } | WriteError::TooLarge { .. }
        )
    }
}

/// Commands of one caller that go into one Raft entry together.
struct Pending {
    commands: Vec<RegionCommand>,
    /// Their encoded bytes.
    bytes: usize,
    reply: oneshot::Sender<Result<Vec<CommandOutcome>, WriteError>>,
}

/// The write path of a replica (leader or follower).
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    raft: Raft<TypeConfig>,
    links: PeerLinks,
    clock: SharedClock,
}

impl std::fmt::Debug for Proposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposer").finish_non_exhaustive()
    }
}

impl Proposer {
    /// Starts the batching task on the current tokio runtime; `clock` is
    /// the time the leader stamps on the commands it proposes.
    pub fn start(raft: Raft<TypeConfig>, links: PeerLinks, clock: SharedClock) -> Self {
        let (tx, rx) = mpsc::channel(MAX_BATCH * MAX_IN_FLIGHT);
        tokio::spawn(batch_loop(raft.clone(), links.clone(), clock.clone(), rx));
        Proposer {
            tx,
            raft,
            links,
            clock,
        }
    }

    /// This replica's clock, in Unix milliseconds: what it stamps on the
    /// commands it proposes, and what its scheduler and API plan with.
    pub fn now_ms(&self) -> u64 {
        self.clock.unix_ms()
    }

    /// Waits until this replica has applied every write the leader had
    /// acknowledged when called (Raft's read index, §6.4: the leader
    /// confirms its leadership with a quorum and names its commit index; a
    /// follower asks it over QUIC). A read from local state after it sees
    /// every earlier acknowledged write. Costs a quorum round trip: use it
    /// where a stale read would give a wrong definite answer (an unknown
    /// token), not on every read.
    pub async fn read_barrier(&self) -> Result<(), WriteError> {
        let index = match self.raft.get_read_log_id().await {
            Ok((read, _)) => read.map(|l| l.index),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                let node = f.leader_node.ok_or(WriteError::NoLeader)?;
                match self
                    .links
                    .call(&node.raft_addr, &PeerRequest::ReadIndex, FORWARD_TTL)
                    .await
                {
                    Ok(PeerReply::ReadIndex(Ok(index))) => index,
                    Ok(PeerReply::ReadIndex(Err(WriteRefusal::NotLeader { .. }))) => {
                        return Err(WriteError::NoLeader)
                    }
                    Ok(PeerReply::ReadIndex(Err(WriteRefusal::Failed(e)))) => {
                        return Err(WriteError::Unknown(e))
                    }
                    Ok(other) => {
                        return Err(WriteError::Unknown(format!("unexpected reply {other:?}")))
                    }
                    Err(e) => return Err(WriteError::Unknown(e.to_string())),
                }
            }
            Err(RaftError::APIError(_)) => return Err(WriteError::NoLeader),
            Err(RaftError::Fatal(_)) => return Err(WriteError::Stopped),
        };
        self.raft
            .wait(Some(FORWARD_TTL))
            .applied_index_at_least(index, "read barrier")
            .await
            .map(|_| ())
            .map_err(|e| WriteError::Unknown(format!("this replica did not catch up: {e}")))
    }

    /// Proposes one command and waits until it is committed and applied.
    pub async fn propose(&self, command: RegionCommand) -> Result<CommandOutcome, WriteError> {
        let mut outcomes = self.propose_all(vec![command]).await?;
        match (outcomes.pop(), outcomes.is_empty()) {
            (Some(o), true) => Ok(o),
            _ => Err(WriteError::Unknown("no outcome for the command".into())),
        }
    }

    /// Proposes `commands` in one Raft entry (with whatever else is
    /// queued) and waits until they are committed and applied; one outcome
    /// per command, in order. Each command applies on its own: one refused
    /// leaves the others applied. At most [`MAX_BATCH`] commands, encoding
    /// to at most [`MAX_PROPOSAL_BYTES`].
    pub async fn propose_all(
        &self,
        commands: Vec<RegionCommand>,
    ) -> Result<Vec<CommandOutcome>, WriteError> {
        if commands.len() > MAX_BATCH {
            return Err(WriteError::TooMany {
                len: commands.len(),
                max: MAX_BATCH,
            });
        }
        let bytes = proposal_bytes(&commands)?;
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending {
                commands,
                bytes,
                reply,
            })
            .await
            .map_err(|_| WriteError::Stopped)?;
        rx.await.map_err(|_| WriteError::Stopped)?
    }
}

async fn batch_loop(
    raft: Raft<TypeConfig>,
    links: PeerLinks,
    clock: SharedClock,
    mut rx: mpsc::Receiver<Pending>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // A proposal taken from the queue that did not fit the last batch.
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (mut n, mut bytes) = (first.commands.len(), first.bytes);
        let mut batch = vec![first];
        while n < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) if fits(n, bytes, &p) => {
                    n += p.commands.len();
                    bytes = bytes.saturating_add(p.bytes);
                    batch.push(p);
                }
                Ok(p) => {
                    carried = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        let links = links.clone();
        let clock = clock.clone();
        tokio::spawn(async move {
            let mut commands = Vec::with_capacity(n);
            let mut replies = Vec::with_capacity(batch.len());
            for p in batch {
                replies.push((p.commands.len(), p.reply));
                commands.extend(p.commands);
            }
            let batch = CommandBatch(commands);
            match commit_via(&raft, &links, batch, || clock.unix_ms()).await {
                Ok(BatchOutcome(outcomes)) if outcomes.len() == n => {
                    let mut outcomes = outcomes.into_iter();
                    for (len, reply) in replies {
                        let _ = reply.send(Ok(outcomes.by_ref().take(len).collect()));
                    }
                }
                Ok(BatchOutcome(outcomes)) => {
                    let e = WriteError::Unknown(format!(
                        "{} outcomes for {n} commands",
                        outcomes.len()
                    ));
                    for (_, reply) in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for (_, reply) in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Checks `commands` and counts their encoded bytes: `Invalid` for a
/// command that is not valid, `TooLarge` past [`MAX_PROPOSAL_BYTES`].
fn proposal_bytes(commands: &[RegionCommand]) -> Result<usize, WriteError> {
    let mut bytes = 0usize;
    for c in commands {
        c.validate()?;
        let len = gshare_raft_store::encoded_len(c).unwrap_or(usize::MAX);
        bytes = bytes.saturating_add(len);
        if bytes > MAX_PROPOSAL_BYTES {
            return Err(WriteError::TooLarge {
                bytes,
                max: MAX_PROPOSAL_BYTES,
            });
        }
    }
    Ok(bytes)
}

/// Whether proposal `p` joins a batch of `n` commands and `bytes` bytes.
fn fits(n: usize, bytes: usize, p: &Pending) -> bool {
    n.saturating_add(p.commands.len()) <= MAX_BATCH
        && bytes.saturating_add(p.bytes) <= MAX_BATCH_BYTES
}

/// Whether a `ForwardToLeader` answer to `client_write` may hide a write
/// that still commits. openraft gives that answer both when this replica
/// did not lead (nothing was appended: a definite refusal) and when it
/// led, appended the entry, and a newer leader's log then replaced it
/// (`DeleteConflictLog`, which answers the entry's waiting client so).
/// A replaced entry can still commit: another voter may hold it and be
/// elected later (with five voters when the new leader's entries reach no
/// majority; even with three: this replica leads again in a later term and
/// copies the entry to a second voter, a newer leader's append, conflicting
/// at an earlier index, removes it here, and that voter is then elected).
/// So that answer is definite only if no leader took over
/// while the write was out: the vote's leader (term and node: openraft
/// allows two leaders of one term, of different nodes) read in the Raft
/// core after the answer is the one of the replica's metrics before the
/// write (which may lag, never lead: a lag only turns a definite refusal
/// into an unknown one). Replacing an entry takes the append of a leader
/// this replica had not voted for when it appended it.
pub fn refusal_may_hide_a_commit_between(
    before: &openraft::LeaderId<u64>,
    after: &openraft::LeaderId<u64>,
) -> bool {
    before != after
}

/// What a replica's metrics say before a `client_write`, for
/// [`refusal_may_hide_a_commit`]: the leader its vote names.
#[derive(Debug, Clone, Copy)]
pub struct BeforeWrite(openraft::LeaderId<u64>);

impl BeforeWrite {
    /// Read from `raft`'s metrics, just before the write is sent.
    pub fn of(raft: &Raft<TypeConfig>) -> BeforeWrite {
        BeforeWrite(*raft.metrics().borrow().vote.leader_id())
    }
}

/// After a `ForwardToLeader` answer to a write sent after `before`: whether
/// the write may still commit ([`refusal_may_hide_a_commit_between`], with
/// the vote read in the Raft core now, which has handled the answer's
/// cause). If the core cannot be asked, it may.
pub async fn refusal_may_hide_a_commit(raft: &Raft<TypeConfig>, before: BeforeWrite) -> bool {
    match raft.with_raft_state(|st| *st.vote_ref().leader_id()).await {
        Ok(now) => refusal_may_hide_a_commit_between(&before.0, &now),
        Err(_) => true,
    }
}

/// What a write refused with `ForwardToLeader` is answered when it may
/// still commit ([`refusal_may_hide_a_commit`]).
pub const TRUNCATED_MAY_COMMIT: &str =
    "a new leader took over while the write was out; it may have been appended and may still commit";

/// How long a write this replica's Raft took may wait for its commit
/// before its outcome is answered unknown ([`NOT_COMMITTED_IN_TIME`]).
/// Without a bound, a write could wait for ever, holding one of the
/// proposer's [`MAX_IN_FLIGHT`] slots: openraft answers no client whose
/// uncommitted entry a snapshot install purges (a leader cut off with
/// writes in its log, whose majority snapshots past them meanwhile), so
/// such a replica's proposer stopped for good after two of them.
pub const COMMIT_WITHIN: Duration = Duration::from_secs(10);

/// What a write is answered when it was not committed within [`COMMIT_WITHIN`].
pub const NOT_COMMITTED_IN_TIME: &str =
    "not committed within 10 s (the region may have lost its quorum); it may still commit";
const _: () = assert!(
    COMMIT_WITHIN.as_secs() == 10,
    "NOT_COMMITTED_IN_TIME names it"
);

/// `raft.client_write(batch)`, or `None` when [`COMMIT_WITHIN`] passed
/// first (the write may have been appended, and may still commit).
pub(crate) async fn client_write_within(
    raft: &Raft<TypeConfig>,
    batch: CommandBatch,
) -> Option<
    Result<
        openraft::raft::ClientWriteResponse<TypeConfig>,
        RaftError<u64, ClientWriteError<u64, gshare_raft_store::ReplicaNode>>,
    >,
> {
    tokio::time::timeout(COMMIT_WITHIN, raft.client_write(batch))
        .await
        .ok()
}

/// Commits `batch` here if this replica leads, else forwards it to the leader
/// over `links` (whose server stamps the time again before proposing); each
/// attempt stamps `now_ms()`. The proposer's write path, and the
/// simulation's (`tests/src/sim`), with its clock and network.
pub async fn commit_via<T: PeerTransport>(
    raft: &Raft<TypeConfig>,
    links: &T,
    mut batch: CommandBatch,
    now_ms: impl Fn() -> u64,
) -> Result<BatchOutcome, WriteError> {
    let mut last = WriteError::NoLeader;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
        }
        batch.stamp(now_ms());
        let before = BeforeWrite::of(raft);
        let Some(written) = client_write_within(raft, batch.clone()).await else {
            return Err(WriteError::Unknown(NOT_COMMITTED_IN_TIME.into()));
        };
        match written {
            Ok(resp) => return Ok(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                if refusal_may_hide_a_commit(raft, before).await {
                    return Err(WriteError::Unknown(TRUNCATED_MAY_COMMIT.into()));
                }
                let Some(node) = f.leader_node else {
                    last = WriteError::NoLeader;
                    continue;
                };
                match links
                    .call(
                        &node.raft_addr,
                        &PeerRequest::Write(batch.clone()),
                        FORWARD_TTL,
                    )
                    .await
                {
                    Ok(PeerReply::Write(Ok(outcome))) => return Ok(outcome),
                    Ok(PeerReply::Write(Err(WriteRefusal::NotLeader { .. }))) => {
                        last = WriteError::NoLeader
                    }
                    Ok(PeerReply::Write(Err(WriteRefusal::Failed(e)))) => {
                        return Err(WriteError::Unknown(e))
                    }
                    Ok(other) => {
                        return Err(WriteError::Unknown(format!("unexpected reply {other:?}")))
                    }
                    // The leader may have committed it before the link failed.
                    Err(e) => return Err(WriteError::Unknown(e.to_string())),
                }
            }
            Err(RaftError::APIError(e)) => return Err(WriteError::Unknown(e.to_string())),
            Err(RaftError::Fatal(e)) => return Err(WriteError::Unknown(e.to_string())),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::model::{PoolKind, TenantId, Tier};
    use gshare_core::state::{AgentId, DomainCommand, UsageRecord, MAX_USAGE_BATCH};

    /// A full usage batch of one agent (10,000 records).
    fn full_usage_batch(agent: &str) -> RegionCommand {
        let records = (1..=MAX_USAGE_BATCH as u64)
            .map(|seq| UsageRecord {
                seq,
                tenant: TenantId("tenant-with-a-longish-name".into()),
                function: "a-function-with-a-longer-name-than-most".into(),
                tier: Tier::Guaranteed,
                gpu_model: "NVIDIA-H100-80GB-HBM3".into(),
                pool_kind: PoolKind::Center,
                compute_milli_gpu_ms: u64::MAX / 3,
                memory_mib_ms: u64::MAX / 5,
                invocations: 1_000_000,
                end_ms: 1_800_000_000_000,
            })
            .collect();
        RegionCommand::domain(DomainCommand::UsageBatch {
            agent: AgentId(agent.into()),
            records,
        })
    }

    /// A queued proposal of `commands` (empty usage batches: only their
    /// count matters here) said to encode to `bytes`.
    fn pending(commands: usize, bytes: usize) -> Pending {
        let (reply, _) = oneshot::channel();
        let empty = || {
            RegionCommand::domain(DomainCommand::UsageBatch {
                agent: AgentId("a".into()),
                records: Vec::new(),
            })
        };
        Pending {
            commands: (0..commands).map(|_| empty()).collect(),
            bytes,
            reply,
        }
    }

    /// A `ForwardToLeader` answer is a definite refusal only if the vote
    /// still names the leader it named before the write: a new term, or
    /// another node in the same term (openraft's default leader ids), may
    /// have replaced an appended entry another voter still holds.
    #[test]
    fn a_refusal_is_definite_only_while_the_same_leader_is_voted_for() {
        let id = |term, node| openraft::LeaderId::new(term, node);
        assert!(!refusal_may_hide_a_commit_between(&id(7, 1), &id(7, 1)));
        assert!(refusal_may_hide_a_commit_between(&id(7, 1), &id(8, 2)));
        assert!(refusal_may_hide_a_commit_between(&id(7, 1), &id(8, 1)));
        assert!(refusal_may_hide_a_commit_between(&id(7, 1), &id(7, 5)));
    }

    #[test]
    fn full_usage_batches_of_many_agents_are_split_into_entries_a_peer_frame_takes() {
        let one = proposal_bytes(&[full_usage_batch("n1")]).expect("one batch is taken");
        println!("a full usage batch encodes to {one} bytes");
        assert!(one > MAX_BATCH_BYTES / 8, "{one}");
        // Queued together, they join one entry only up to the byte budget:
        // at most four here, never the sixteen a 16 MiB frame could not hold.
        let mut n = 0;
        let mut bytes = 0;
        let mut joined = 0;
        for _ in 0..16 {
            let p = pending(1, one);
            if joined > 0 && !fits(n, bytes, &p) {
                break;
            }
            n += p.commands.len();
            bytes += p.bytes;
            joined += 1;
        }
        assert!((1..16).contains(&joined), "{joined} joined");
        assert!(bytes <= MAX_BATCH_BYTES, "{bytes}");
        // One proposal of many full batches is refused whole.
        let many: Vec<RegionCommand> = (0..16)
            .map(|i| full_usage_batch(&format!("n{i}")))
            .collect();
        match proposal_bytes(&many) {
            Err(WriteError::TooLarge { bytes, max }) => {
                assert_eq!(max, MAX_PROPOSAL_BYTES);
                assert!(bytes > max);
            }
            other => panic!("{other:?}"),
        }
        // Refused for good: the same proposal would be refused again.
        let too_large = WriteError::TooLarge {
            bytes: MAX_PROPOSAL_BYTES + 1,
            max: MAX_PROPOSAL_BYTES,
        };
        assert!(!too_large.retryable());
    }

    #[test]
    fn the_command_count_still_bounds_a_batch() {
        assert!(fits(1, 0, &pending(MAX_BATCH - 1, 10)));
        assert!(!fits(2, 0, &pending(MAX_BATCH - 1, 10)));
        assert!(!fits(1, MAX_BATCH_BYTES - 5, &pending(1, 10)));
    }
}

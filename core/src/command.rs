//! Commands the region's replicated state machine applies.
//!
//! Every change to region state is a [`RegionCommand`] in the Raft log. The
//! enum is versioned: a log written by an older binary stays readable after
//! an upgrade, because a new variant set arrives as `V2(..)` beside `V1(..)`
//! and old entries keep decoding as `V1`.
//!
//! The encoding is plain serde (no `flatten`, `untagged` or
//! `skip_serializing_if`) so bincode 2 round-trips it byte for byte.
//!
//! ```text
//!   client ──▶ leader ──RegionCommand──▶ Raft log ──▶ every replica's apply ──▶ CommandOutcome
//! ```

use serde::{Deserialize, Serialize};

/// A versioned command in the region's Raft log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionCommand {
    /// Commands of the first format version.
    V1(CommandV1),
}

/// The first version of region commands.
///
/// `Put` and `Delete` were the generic key/value commands of the store's
/// first test; they are retired: their slots stay so that a log written by
/// an older binary still decodes, but they fail validation and the state
/// machine refuses them at apply ([`CommandOutcome::Rejected`]), the same
/// on every replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandV1 {
    /// Changes nothing; useful to confirm leadership and commit progress.
    Noop,
    /// Retired (set `key` to `value`): refused at apply.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Retired (remove `key`): refused at apply.
    Delete {
        /// The key to remove.
        key: String,
    },
    /// A change to the region's domain state ([`crate::state`]), applied
    /// with `RegionState::apply(command, now_ms)`.
    ///
    /// The leader stamps `now_ms` (Unix ms) just before it proposes the
    /// batch, so every replica applies the same time; the state machine
    /// never reads a clock (it only keeps the applied time monotonic).
    Domain {
        /// The proposal time, stamped by the leader.
        now_ms: u64,
        /// The command.
        command: crate::state::DomainCommand,
    },
}

/// What applying one command produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcome {
    /// The command changed nothing and returned nothing.
    Done,
    /// What a retired `Put`/`Delete` answered (no longer produced; the
    /// slot keeps the encoding of the later variants).
    Written {
        /// The value replaced or removed, if any.
        previous: Option<Vec<u8>>,
    },
    /// The command was refused by the state machine; state is unchanged.
    Rejected {
        /// Why it was refused.
        reason: String,
    },
    /// What a [`CommandV1::Domain`] command did, or why it was refused.
    Domain(Result<crate::state::Applied, crate::state::ApplyError>),
}

/// A command that fails validation before it is proposed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A retired key/value command (`Put`, `Delete`).
    #[error("the key/value commands are retired; write through the domain API")]
    Retired,
}

impl RegionCommand {
    /// A domain command of the current version (the leader stamps its time).
    pub fn domain(command: crate::state::DomainCommand) -> Self {
        RegionCommand::V1(CommandV1::Domain { now_ms: 0, command })
    }

    /// Sets the proposal time of a domain command (the leader, just before
    /// proposing); other commands are left alone.
    pub fn stamp(&mut self, now_ms: u64) {
        if let RegionCommand::V1(CommandV1::Domain { now_ms: t, .. }) = self {
            *t = now_ms;
        }
    }

    /// Checks a command before it is proposed.
    ///
    /// The state machine checks again on apply, so a command that slips past
    /// a client is rejected the same way on every replica.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            RegionCommand::V1(CommandV1::Noop | CommandV1::Domain { .. }) => Ok(()),
            RegionCommand::V1(CommandV1::Put { .. } | CommandV1::Delete { .. }) => {
                Err(CommandError::Retired)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retired_key_value_commands_fail_validation() {
        let put = RegionCommand::V1(CommandV1::Put {
            key: "k".into(),
            value: b"v".to_vec(),
        });
        let delete = RegionCommand::V1(CommandV1::Delete { key: "k".into() });
        assert_eq!(put.validate(), Err(CommandError::Retired));
        assert_eq!(delete.validate(), Err(CommandError::Retired));
        assert_eq!(RegionCommand::V1(CommandV1::Noop).validate(), Ok(()));
    }
}

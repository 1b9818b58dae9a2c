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

/// Largest key accepted by [`CommandV1::Put`] and [`CommandV1::Delete`], in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest value accepted by [`CommandV1::Put`], in bytes.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// A versioned command in the region's Raft log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionCommand {
    /// Commands of the first format version.
    V1(CommandV1),
}

/// The first version of region commands.
///
/// The generic key/value commands exist for operators and tests; the domain
/// commands (tenants, quotas, functions, placements, usage) join this enum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandV1 {
    /// Changes nothing; useful to confirm leadership and commit progress.
    Noop,
    /// Sets `key` to `value`.
    Put {
        /// The key, at most [`MAX_KEY_BYTES`] bytes.
        key: String,
        /// The value, at most [`MAX_VALUE_BYTES`] bytes.
        value: Vec<u8>,
    },
    /// Removes `key` (no effect if it is absent).
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
    /// A key was written or removed; `previous` is the value it held before.
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
    /// The key is empty.
    #[error("key is empty")]
    EmptyKey,
    /// The key is longer than [`MAX_KEY_BYTES`].
    #[error("key is {len} bytes, the limit is {MAX_KEY_BYTES}")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// The value is longer than [`MAX_VALUE_BYTES`].
    #[error("value is {len} bytes, the limit is {MAX_VALUE_BYTES}")]
    ValueTooLong {
        /// The value's length in bytes.
        len: usize,
    },
}

impl RegionCommand {
    /// A `Put` of the current version.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        RegionCommand::V1(CommandV1::Put {
            key: key.into(),
            value: value.into(),
        })
    }

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

    /// Checks the limits a command must meet before it is proposed.
    ///
    /// The state machine checks again on apply, so a command that slips past
    /// a client is rejected the same way on every replica.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            RegionCommand::V1(CommandV1::Noop) => Ok(()),
            RegionCommand::V1(CommandV1::Put { key, value }) => {
                check_key(key)?;
                if value.len() > MAX_VALUE_BYTES {
                    return Err(CommandError::ValueTooLong { len: value.len() });
                }
                Ok(())
            }
            RegionCommand::V1(CommandV1::Delete { key }) => check_key(key),
            RegionCommand::V1(CommandV1::Domain { .. }) => Ok(()),
        }
    }
}

fn check_key(key: &str) -> Result<(), CommandError> {
    if key.is_empty() {
        return Err(CommandError::EmptyKey);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(CommandError::KeyTooLong { len: key.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_refuses_empty_and_oversized() {
        assert_eq!(
            RegionCommand::put("", b"x".to_vec()).validate(),
            Err(CommandError::EmptyKey)
        );
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            RegionCommand::put(long, Vec::new()).validate(),
            Err(CommandError::KeyTooLong {
                len: MAX_KEY_BYTES + 1
            })
        );
        let big = vec![0u8; MAX_VALUE_BYTES + 1];
        assert_eq!(
            RegionCommand::put("k", big).validate(),
            Err(CommandError::ValueTooLong {
                len: MAX_VALUE_BYTES + 1
            })
        );
        assert_eq!(RegionCommand::put("k", b"v".to_vec()).validate(), Ok(()));
        assert_eq!(RegionCommand::V1(CommandV1::Noop).validate(), Ok(()));
    }
}

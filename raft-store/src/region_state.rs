//! The region's replicated state and how one command changes it.
//!
//! The domain state ([`gshare_core::state::RegionState`]: tenants, quotas,
//! prices, topology, functions, instances, usage), plus the key/value map
//! of the retired `Put`/`Delete` commands: nothing writes it any more, it
//! stays so that a snapshot written by an older binary still decodes. A domain command is
//! applied at the time the leader stamped on it, kept monotonic across
//! leaders (`max(stamp, last applied time)`), so every replica computes the
//! same result without reading a clock.

use gshare_core::command::{CommandOutcome, CommandV1, RegionCommand};
use gshare_core::state::RegionState as DomainState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Everything the region's commands have built, identical on every replica
/// that applied the same log prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionState {
    /// Written by older binaries only (retired `Put`/`Delete`).
    kv: BTreeMap<String, Vec<u8>>,
    domain: DomainState,
    now_ms: u64,
}

/// A [`RegionState`] as snapshots written before topologies had a
/// `[placement]` policy hold it.
#[derive(Deserialize)]
struct RegionStateV1 {
    kv: BTreeMap<String, Vec<u8>>,
    domain: gshare_core::state::RegionStateV1,
    now_ms: u64,
}

impl RegionState {
    /// Decodes a snapshot: the current form, else the form written before
    /// topologies had a `[placement]` policy (which then reads as the
    /// default). The error is the current form's.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<RegionState, bincode::error::DecodeError> {
        crate::decode::<RegionState>(bytes).or_else(|e| {
            crate::decode::<RegionStateV1>(bytes)
                .map(|old| RegionState {
                    kv: old.kv,
                    domain: old.domain.0,
                    now_ms: old.now_ms,
                })
                .map_err(|_| e)
        })
    }

    /// Applies one command. A command that fails validation changes nothing
    /// and is answered [`CommandOutcome::Rejected`] on every replica alike.
    pub fn apply(&mut self, command: RegionCommand) -> CommandOutcome {
        if let Err(e) = command.validate() {
            return CommandOutcome::Rejected {
                reason: e.to_string(),
            };
        }
        match command {
            RegionCommand::V1(CommandV1::Noop) => CommandOutcome::Done,
            // Retired: `validate` refuses them above; spelled out so a
            // change there cannot make them write again.
            RegionCommand::V1(CommandV1::Put { .. } | CommandV1::Delete { .. }) => {
                CommandOutcome::Rejected {
                    reason: gshare_core::command::CommandError::Retired.to_string(),
                }
            }
            RegionCommand::V1(CommandV1::Domain { now_ms, command }) => {
                self.now_ms = self.now_ms.max(now_ms);
                CommandOutcome::Domain(self.domain.apply(command, self.now_ms))
            }
        }
    }

    /// The domain state (tenants, functions, instances, usage …).
    pub fn domain(&self) -> &DomainState {
        &self.domain
    }

    /// The time of the last applied domain command (Unix ms, monotonic).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Key/value entries (from a snapshot of an older binary; never written now).
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    /// Whether no key/value entry is held.
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retired_key_value_commands_decode_but_are_refused_and_change_nothing() {
        // A batch as an older binary wrote it still decodes …
        let old = crate::CommandBatch(vec![
            RegionCommand::V1(CommandV1::Put {
                key: "a".into(),
                value: b"1".to_vec(),
            }),
            RegionCommand::V1(CommandV1::Delete { key: "a".into() }),
        ]);
        let back: crate::CommandBatch = crate::decode(&crate::encode(&old).unwrap()).unwrap();
        assert_eq!(back, old);
        // … and applying it is refused, the same on every replica.
        let mut s = RegionState::default();
        for c in back.0 {
            assert!(matches!(s.apply(c), CommandOutcome::Rejected { .. }));
        }
        assert!(s.is_empty());
        assert_eq!(s, RegionState::default());
    }

    #[test]
    fn domain_commands_apply_at_a_monotonic_stamped_time() {
        use gshare_core::model::TenantId;
        use gshare_core::state::{Applied, DomainCommand};
        let create = |name: &str| {
            RegionCommand::domain(DomainCommand::TenantCreate {
                tenant: TenantId(name.into()),
                display_name: None,
                quotas: Default::default(),
            })
        };
        let mut s = RegionState::default();
        let mut a = create("acme");
        a.stamp(5_000);
        assert_eq!(
            s.apply(a.clone()),
            CommandOutcome::Domain(Ok(Applied::TenantCreated {
                tenant: TenantId("acme".into())
            }))
        );
        assert_eq!(s.now_ms(), 5_000);
        // A second proposal of the same create is refused, the same on every replica.
        match s.apply(a) {
            CommandOutcome::Domain(Err(e)) => assert_eq!(e.code(), "duplicate_name"),
            other => panic!("{other:?}"),
        }
        // A leader with a slower clock cannot move time backwards.
        let mut b = create("beta");
        b.stamp(1_000);
        s.apply(b);
        assert_eq!(s.now_ms(), 5_000);
        assert_eq!(s.domain().tenants().count(), 2);
        let bytes = crate::encode(&s).unwrap();
        let back: RegionState = crate::decode(&bytes).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn commands_round_trip_through_bincode() {
        let cmds = crate::CommandBatch(vec![
            RegionCommand::V1(CommandV1::Noop),
            RegionCommand::domain(gshare_core::state::DomainCommand::TenantCreate {
                tenant: gshare_core::model::TenantId("t".into()),
                display_name: Some("T".into()),
                quotas: Default::default(),
            }),
        ]);
        let bytes = crate::encode(&cmds).unwrap();
        let back: crate::CommandBatch = crate::decode(&bytes).unwrap();
        assert_eq!(back, cmds);
        let out = crate::BatchOutcome(vec![
            CommandOutcome::Done,
            CommandOutcome::Written {
                previous: Some(vec![7]),
            },
            CommandOutcome::Rejected { reason: "r".into() },
        ]);
        let back: crate::BatchOutcome = crate::decode(&crate::encode(&out).unwrap()).unwrap();
        assert_eq!(back, out);
    }
}

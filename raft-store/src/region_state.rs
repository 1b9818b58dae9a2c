//! The region's replicated state and how one command changes it.
//!
//! Two parts: the generic key/value map (operators and tests) and the
//! domain state ([`gshare_core::state::RegionState`]: tenants, quotas,
//! prices, topology, functions, instances, usage). A domain command is
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
    kv: BTreeMap<String, Vec<u8>>,
    domain: DomainState,
    now_ms: u64,
}

impl RegionState {
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
            RegionCommand::V1(CommandV1::Put { key, value }) => CommandOutcome::Written {
                previous: self.kv.insert(key, value),
            },
            RegionCommand::V1(CommandV1::Delete { key }) => CommandOutcome::Written {
                previous: self.kv.remove(&key),
            },
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

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.kv.get(key).map(Vec::as_slice)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub fn entries_with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.kv
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Keys in order, starting at `from`, at most `limit` of them.
    pub fn keys_from(&self, from: &str, limit: usize) -> Vec<String> {
        self.kv
            .range(from.to_string()..)
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_delete_and_reject() {
        let mut s = RegionState::default();
        assert_eq!(
            s.apply(RegionCommand::put("a", b"1".to_vec())),
            CommandOutcome::Written { previous: None }
        );
        assert_eq!(
            s.apply(RegionCommand::put("a", b"2".to_vec())),
            CommandOutcome::Written {
                previous: Some(b"1".to_vec())
            }
        );
        assert!(matches!(
            s.apply(RegionCommand::put("", b"x".to_vec())),
            CommandOutcome::Rejected { .. }
        ));
        assert_eq!(s.len(), 1);
        assert_eq!(
            s.apply(RegionCommand::V1(CommandV1::Delete { key: "a".into() })),
            CommandOutcome::Written {
                previous: Some(b"2".to_vec())
            }
        );
        assert!(s.is_empty());
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
            RegionCommand::put("k", vec![0, 1, 255]),
            RegionCommand::V1(CommandV1::Noop),
            RegionCommand::V1(CommandV1::Delete { key: "k".into() }),
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

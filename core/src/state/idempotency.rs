//! Idempotency keys of tenants' writes: a command applied under a key is
//! applied once; applying it again under the same key returns the outcome
//! of the first application instead of acting again.
//!
//! ```text
//!   Keyed { tenant, key, fingerprint, command }
//!     key recorded, same fingerprint ─▶ the stored Applied (nothing changes)
//!     key recorded, other fingerprint ─▶ idempotency_key_reused (nothing changes)
//!     key not recorded (or expired)   ─▶ apply(command) ─▶ Ok: record (key, fingerprint, Applied)
//!                                                        └ Err: nothing recorded (nothing happened)
//! ```
//!
//! Only successes are recorded: a refused command changed nothing, so the
//! same request under the same key may simply be tried again. The table is
//! bounded per tenant: a record lives [`KEY_WINDOW_MS`] (by the leader's
//! stamped clock, so every replica evicts the same records) and a tenant
//! holds at most [`MAX_KEYS_PER_TENANT`] records (the oldest go first).
//! Each new record first forgets expired records of every tenant (not
//! only its own), oldest first, up to [`FORGET_PER_RECORD`] of them (so no
//! one apply stalls every replica on a backlog, and the backlog still
//! shrinks faster than records come): a tenant that stopped writing, or was
//! deleted, keeps nothing past the window once others write on, and the
//! table converges to the keyed writes of the last [`KEY_WINDOW_MS`]
//! (within the cap per tenant).
//! Plain serde types (a map and a queue), so they encode with bincode 2;
//! the order of tenants by their oldest record is derived, rebuilt when
//! the table is decoded.

use super::applied::Applied;
use crate::model::TenantId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How long a key's outcome is kept, ms (one hour).
pub const KEY_WINDOW_MS: u64 = 60 * 60 * 1000;
/// Most keys recorded per tenant; beyond it the oldest is forgotten.
pub const MAX_KEYS_PER_TENANT: usize = 4096;
/// Most expired records (of any tenant) one new record forgets.
pub const FORGET_PER_RECORD: usize = 64;
/// Longest idempotency key, bytes (printable ASCII).
pub const MAX_KEY_LEN: usize = 128;
/// Longest request fingerprint, bytes.
pub const MAX_FINGERPRINT_LEN: usize = 128;

/// Whether `key` is an acceptable idempotency key: 1 to [`MAX_KEY_LEN`]
/// printable ASCII characters (no spaces).
pub fn is_valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic())
}

/// The outcome recorded under one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// What the request was (the API's digest of method, path and body):
    /// the same key with another request is refused.
    pub fingerprint: String,
    /// When the command was applied (the leader's stamp, Unix ms).
    pub at_ms: u64,
    /// What applying it did.
    pub outcome: Applied,
}

/// One tenant's recorded keys, in the order they were recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TenantKeys {
    /// Records by key.
    pub records: BTreeMap<String, KeyRecord>,
    /// Keys, oldest first.
    pub order: VecDeque<String>,
}

/// What a key says about a command about to be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyLookup {
    /// The key is not recorded (or its record expired): apply the command.
    New,
    /// The same request was applied under this key: its outcome.
    Replay(Applied),
    /// The key was used for another request.
    Reused,
}

/// Every tenant's recorded keys (part of the replicated state).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "Recorded")]
pub struct IdempotencyTable {
    tenants: BTreeMap<TenantId, TenantKeys>,
    /// (when its oldest record was made, tenant) for every tenant that
    /// holds a record: where to look for expired records. Derived from
    /// `tenants`: not encoded, rebuilt on decoding.
    #[serde(skip_serializing)]
    fronts: BTreeSet<(u64, TenantId)>,
}

/// What an [`IdempotencyTable`] encodes (the same fields, in the same
/// order, as before its derived part existed).
#[derive(Deserialize)]
struct Recorded {
    tenants: BTreeMap<TenantId, TenantKeys>,
}

impl From<Recorded> for IdempotencyTable {
    fn from(r: Recorded) -> Self {
        IdempotencyTable {
            fronts: fronts_of(&r.tenants),
            tenants: r.tenants,
        }
    }
}

fn live(r: &KeyRecord, now: u64) -> bool {
    r.at_ms.saturating_add(KEY_WINDOW_MS) >= now
}

/// When the oldest record of `t` (the front of its queue) was made.
fn front_of(t: &TenantKeys) -> Option<u64> {
    t.order
        .front()
        .and_then(|k| t.records.get(k))
        .map(|r| r.at_ms)
}

/// The index of every tenant's oldest record: (when it was made, tenant).
fn fronts_of(tenants: &BTreeMap<TenantId, TenantKeys>) -> BTreeSet<(u64, TenantId)> {
    tenants
        .iter()
        .filter_map(|(tenant, t)| front_of(t).map(|at| (at, tenant.clone())))
        .collect()
}

/// Forgets, up to `most` records, the expired ones at the front of `t`'s
/// queue and, while it holds `keep_below` or more, its oldest ones;
/// returns how many it forgot.
fn trim(t: &mut TenantKeys, now: u64, keep_below: usize, most: usize) -> usize {
    let mut forgot = 0;
    while forgot < most {
        let Some(oldest) = t.order.front() else {
            break;
        };
        let expired = t.records.get(oldest).is_none_or(|r| !live(r, now));
        if !expired && t.order.len() < keep_below {
            break;
        }
        if let Some(k) = t.order.pop_front() {
            t.records.remove(&k);
        }
        forgot = forgot.saturating_add(1);
    }
    forgot
}

impl IdempotencyTable {
    /// What `key` of `tenant` holds at `now` for a request with `fingerprint`.
    pub fn lookup(&self, tenant: &TenantId, key: &str, fingerprint: &str, now: u64) -> KeyLookup {
        match self
            .tenants
            .get(tenant)
            .and_then(|t| t.records.get(key))
            .filter(|r| live(r, now))
        {
            None => KeyLookup::New,
            Some(r) if r.fingerprint == fingerprint => KeyLookup::Replay(r.outcome.clone()),
            Some(_) => KeyLookup::Reused,
        }
    }

    /// Records `outcome` under `key`, first forgetting every tenant's
    /// expired records and, at the cap, `tenant`'s oldest.
    pub fn record(
        &mut self,
        tenant: &TenantId,
        key: String,
        fingerprint: String,
        outcome: Applied,
        now: u64,
    ) {
        self.forget_expired(now);
        let t = self.tenants.entry(tenant.clone()).or_default();
        if let Some(at) = front_of(t) {
            self.fronts.remove(&(at, tenant.clone()));
        }
        if t.records.remove(&key).is_some() {
            t.order.retain(|k| *k != key);
        }
        trim(t, now, MAX_KEYS_PER_TENANT, usize::MAX);
        t.records.insert(
            key.clone(),
            KeyRecord {
                fingerprint,
                at_ms: now,
                outcome,
            },
        );
        t.order.push_back(key);
        if let Some(at) = front_of(t) {
            self.fronts.insert((at, tenant.clone()));
        }
    }

    /// Forgets up to [`FORGET_PER_RECORD`] expired records at the fronts
    /// of the tenants' queues, oldest first (a tenant left with none is
    /// dropped).
    fn forget_expired(&mut self, now: u64) {
        let mut budget = FORGET_PER_RECORD;
        while budget > 0 {
            let Some((at, tenant)) = self.fronts.first().cloned() else {
                break;
            };
            if at.saturating_add(KEY_WINDOW_MS) >= now {
                break;
            }
            self.fronts.pop_first();
            let Some(t) = self.tenants.get_mut(&tenant) else {
                continue;
            };
            budget = budget.saturating_sub(trim(t, now, usize::MAX, budget));
            match front_of(t) {
                Some(at) => {
                    self.fronts.insert((at, tenant));
                }
                None => {
                    self.tenants.remove(&tenant);
                }
            }
        }
    }

    /// Tenants holding a record (expired ones included until forgotten).
    pub fn tenants_held(&self) -> usize {
        self.tenants.len()
    }

    /// Keys recorded for `tenant` (expired ones included until evicted).
    pub fn len(&self, tenant: &TenantId) -> usize {
        self.tenants.get(tenant).map_or(0, |t| t.records.len())
    }

    /// Whether no key is recorded.
    pub fn is_empty(&self) -> bool {
        self.tenants.values().all(|t| t.records.is_empty())
    }

    /// Checks that each tenant's queue and map name the same keys and stay
    /// within the cap.
    pub fn check(&self) -> Result<(), String> {
        if fronts_of(&self.tenants) != self.fronts {
            return Err("idempotency keys: the tenants' oldest records are indexed wrong".into());
        }
        for (tenant, t) in &self.tenants {
            if t.order.len() != t.records.len()
                || t.order.iter().any(|k| !t.records.contains_key(k))
            {
                return Err(format!(
                    "idempotency keys of {tenant}: queue and map differ"
                ));
            }
            if t.records.len() > MAX_KEYS_PER_TENANT {
                return Err(format!(
                    "tenant {tenant} holds {} idempotency keys, cap {MAX_KEYS_PER_TENANT}",
                    t.records.len()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(i: u64) -> Applied {
        Applied::InstanceReleased {
            instance: super::super::InstanceId(i),
        }
    }

    #[test]
    fn records_replay_refuse_reuse_and_expire() {
        let t = TenantId("acme".into());
        let mut table = IdempotencyTable::default();
        assert_eq!(table.lookup(&t, "k1", "f", 0), KeyLookup::New);
        table.record(&t, "k1".into(), "f".into(), applied(1), 1_000);
        assert_eq!(
            table.lookup(&t, "k1", "f", 2_000),
            KeyLookup::Replay(applied(1))
        );
        assert_eq!(table.lookup(&t, "k1", "g", 2_000), KeyLookup::Reused);
        // Another tenant's key of the same name is its own.
        assert_eq!(
            table.lookup(&TenantId("globex".into()), "k1", "f", 2_000),
            KeyLookup::New
        );
        // Past the window the key is free again and is evicted on the next record.
        let later = 1_000 + KEY_WINDOW_MS + 1;
        assert_eq!(table.lookup(&t, "k1", "f", later), KeyLookup::New);
        table.record(&t, "k2".into(), "f".into(), applied(2), later);
        assert_eq!(table.len(&t), 1);
        table.check().unwrap();
    }

    #[test]
    fn a_tenant_holds_at_most_the_cap_and_the_oldest_go_first() {
        let t = TenantId("acme".into());
        let mut table = IdempotencyTable::default();
        for i in 0..(MAX_KEYS_PER_TENANT as u64 + 10) {
            table.record(&t, format!("k{i}"), "f".into(), applied(i), 5);
        }
        assert_eq!(table.len(&t), MAX_KEYS_PER_TENANT);
        assert_eq!(table.lookup(&t, "k0", "f", 5), KeyLookup::New);
        assert_eq!(table.lookup(&t, "k9", "f", 5), KeyLookup::New);
        assert_eq!(
            table.lookup(&t, "k10", "f", 5),
            KeyLookup::Replay(applied(10))
        );
        table.check().unwrap();
    }

    #[test]
    fn a_tenant_that_stopped_writing_keeps_nothing_past_the_window() {
        let (gone, quiet, busy) = (
            TenantId("gone".into()),
            TenantId("quiet".into()),
            TenantId("busy".into()),
        );
        let mut table = IdempotencyTable::default();
        for i in 0..100 {
            table.record(&gone, format!("g{i}"), "f".into(), applied(i), 1_000);
        }
        table.record(&quiet, "q".into(), "f".into(), applied(0), 2_000);
        table.record(&busy, "b0".into(), "f".into(), applied(0), 3_000);
        assert_eq!(table.tenants_held(), 3);
        // Within the window of every record, nothing is forgotten.
        table.record(
            &busy,
            "b1".into(),
            "f".into(),
            applied(1),
            1_000 + KEY_WINDOW_MS,
        );
        assert_eq!((table.len(&gone), table.len(&quiet)), (100, 1));
        // Another tenant's writes past `gone`'s window forget it, up to
        // `FORGET_PER_RECORD` records a write (then the tenant too), and
        // `quiet`'s once past its own.
        for _ in 0..2 {
            table.record(
                &busy,
                "b2".into(),
                "f".into(),
                applied(2),
                1_001 + KEY_WINDOW_MS,
            );
            assert_eq!(table.len(&quiet), 1);
            assert!(table.len(&gone) == 100 - FORGET_PER_RECORD || table.len(&gone) == 0);
        }
        assert_eq!((table.len(&gone), table.len(&quiet)), (0, 1));
        assert_eq!(table.tenants_held(), 2);
        table.record(
            &busy,
            "b3".into(),
            "f".into(),
            applied(3),
            3_001 + KEY_WINDOW_MS,
        );
        assert_eq!(table.tenants_held(), 1);
        assert_eq!(
            table.len(&busy),
            3,
            "b0 is forgotten, b1 to b3 are inside the window"
        );
        table.check().unwrap();
    }

    #[test]
    fn the_table_holds_only_the_windows_records_whatever_the_order_of_tenants() {
        // Many tenants, a record each now and then, times that sometimes go
        // back (a new leader's clock): after each record, every tenant's
        // oldest record is inside the window (here no record expires more
        // than `FORGET_PER_RECORD` others), and the index of oldest records
        // matches the queues.
        let mut table = IdempotencyTable::default();
        let mut rng = crate::rng::Rng::new(7);
        let mut now = 0u64;
        for i in 0..20_000u64 {
            now = (now + rng.below(600_000)).saturating_sub(rng.below(20_000));
            let t = TenantId(format!("t{}", rng.below(300)));
            table.record(&t, format!("k{i}"), "f".into(), applied(i), now);
            if i % 97 == 0 {
                table.check().unwrap();
            }
            if let Some((at, _)) = table.fronts.first() {
                assert!(
                    at.saturating_add(KEY_WINDOW_MS) >= now,
                    "an expired record is kept at {i}"
                );
            }
        }
        table.check().unwrap();
        assert!(table.tenants_held() < 300, "idle tenants are dropped");
    }

    #[test]
    fn the_encoding_is_unchanged_and_decoding_rebuilds_the_index() {
        #[derive(Serialize)]
        struct Before<'a> {
            tenants: &'a BTreeMap<TenantId, TenantKeys>,
        }
        let mut table = IdempotencyTable::default();
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let t = TenantId((*name).into());
            table.record(
                &t,
                format!("k{i}"),
                "f".into(),
                applied(i as u64),
                10 * i as u64,
            );
        }
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&table, config).unwrap();
        let before = bincode::serde::encode_to_vec(
            Before {
                tenants: &table.tenants,
            },
            config,
        )
        .unwrap();
        assert_eq!(bytes, before);
        let (back, _): (IdempotencyTable, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(back, table);
        back.check().unwrap();
        assert_eq!(back.fronts.len(), 3);
    }

    #[test]
    fn keys_are_printable_ascii_and_bounded() {
        assert!(is_valid_key("3f1c-a9_b.Z"));
        assert!(!is_valid_key(""));
        assert!(!is_valid_key("has space"));
        assert!(!is_valid_key("ünïcode"));
        assert!(!is_valid_key(&"k".repeat(MAX_KEY_LEN + 1)));
        assert!(is_valid_key(&"k".repeat(MAX_KEY_LEN)));
    }
}

//! Waking a function from zero: the per-function wakes in flight on one
//! replica. A request for a function with no instance is held at the
//! replica (see [`super::invoke`]); the first such request starts one
//! wake (an `Evaluation::ScaleOut { desired: 1 }` submitted to the
//! leader), and the requests arriving while it is in flight only wait for
//! its instance: several requests together make one placement, not one
//! each. A wake that failed (no capacity, quota, no leader) is remembered
//! for [`RETRY_AFTER`], and the requests arriving meanwhile are answered
//! with its reason at once rather than each asking the leader again. A
//! wake whose outcome is not known is no failure: the held requests look
//! again, and wake it again if it still has no instance.
//!
//! Wakes from different replicas are not deduplicated here: each replica
//! starts at most one at a time, and the leader's `ScaleOut` places
//! nothing once the function has an instance (`count >= desired`).

use gshare_core::model::TenantId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a failed wake answers the requests that arrive after it
/// before one of them tries again.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A function's key: (tenant, name).
type Key = (TenantId, String);

#[derive(Debug, Clone)]
enum Wake {
    InFlight,
    Failed { at: Instant, why: String },
}

/// What [`Wakes::begin`] says the caller should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// No wake was under way: the caller submits one and then calls
    /// [`Wakes::done`].
    Start,
    /// One is in flight already: wait for its instance.
    InFlight,
    /// The last one failed less than [`RETRY_AFTER`] ago: why.
    Failed(String),
}

/// The wakes of one replica, by function.
#[derive(Debug, Default)]
pub struct Wakes {
    by_function: Mutex<HashMap<Key, Wake>>,
}

impl Wakes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Wake>> {
        self.by_function.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request for `tenant`'s `function` finds no instance at `now`.
    pub fn begin(&self, tenant: &TenantId, function: &str, now: Instant) -> Begin {
        let mut wakes = self.lock();
        let key = (tenant.clone(), function.to_string());
        match wakes.get(&key) {
            Some(Wake::InFlight) => return Begin::InFlight,
            Some(Wake::Failed { at, why }) if now.saturating_duration_since(*at) < RETRY_AFTER => {
                return Begin::Failed(why.clone())
            }
            _ => {}
        }
        wakes.insert(key, Wake::InFlight);
        Begin::Start
    }

    /// The wake of `tenant`'s `function` ended at `now`: with the leader's
    /// answer (`Ok`: placed, or nothing needed), or why it placed nothing.
    fn done(&self, tenant: &TenantId, function: &str, result: Result<(), String>, now: Instant) {
        let mut wakes = self.lock();
        let key = (tenant.clone(), function.to_string());
        match result {
            Ok(()) => {
                wakes.remove(&key);
            }
            Err(why) => {
                wakes.insert(key, Wake::Failed { at: now, why });
            }
        }
    }

    /// The wake of `tenant`'s `function` ended at `now` with the leader's
    /// `answer`: placed (or nothing needed) ends it; a definite refusal is
    /// remembered as a failure ([`Begin::Failed`]); an outcome that is not
    /// known (the placement may have committed) is no failure, so the
    /// requests still held look again and, finding no instance, wake it
    /// once more (the leader's `ScaleOut` places nothing once it has one).
    pub fn ended(
        &self,
        tenant: &TenantId,
        function: &str,
        answer: &crate::scheduler::EvalResult,
        now: Instant,
    ) {
        let result = match answer {
            Ok(_) | Err(crate::scheduler::EvalError::Unknown(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        self.done(tenant, function, result, now);
    }

    /// Wakes in flight or remembered as failed.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_together_start_one_wake_per_function() {
        let w = Wakes::default();
        let t = TenantId("acme".into());
        let now = Instant::now();
        assert_eq!(w.begin(&t, "f", now), Begin::Start);
        for _ in 0..5 {
            assert_eq!(w.begin(&t, "f", now), Begin::InFlight);
        }
        // Another function, another tenant: their own wakes.
        assert_eq!(w.begin(&t, "g", now), Begin::Start);
        assert_eq!(w.begin(&TenantId("other".into()), "f", now), Begin::Start);
        w.done(&t, "f", Ok(()), now);
        assert_eq!(w.len(), 2);
        // Once done, a later request (the function went to zero again)
        // starts a new one.
        assert_eq!(w.begin(&t, "f", now), Begin::Start);
    }

    #[test]
    fn a_wake_whose_outcome_is_unknown_is_no_failure() {
        use crate::scheduler::{EvalDone, EvalError};
        let w = Wakes::default();
        let t = TenantId("acme".into());
        let now = Instant::now();
        assert_eq!(w.begin(&t, "f", now), Begin::Start);
        w.ended(
            &t,
            "f",
            &Err(EvalError::Unknown("forward lost".into())),
            now,
        );
        // Not "none could be placed": the next request wakes it again.
        assert_eq!(w.begin(&t, "f", now), Begin::Start);
        w.ended(&t, "f", &Err(EvalError::NoLeader), now);
        assert!(matches!(w.begin(&t, "f", now), Begin::Failed(why) if why.contains("no leader")));
        assert_eq!(w.begin(&t, "f", now + RETRY_AFTER), Begin::Start);
        let placed = EvalDone {
            applied: None,
            replans: 0,
        };
        w.ended(&t, "f", &Ok(placed), now + RETRY_AFTER);
        assert!(w.is_empty());
    }

    #[test]
    fn a_failed_wake_answers_for_a_while_then_is_tried_again() {
        let w = Wakes::default();
        let t = TenantId("acme".into());
        let now = Instant::now();
        assert_eq!(w.begin(&t, "f", now), Begin::Start);
        w.done(&t, "f", Err("no capacity".into()), now);
        assert_eq!(
            w.begin(&t, "f", now + RETRY_AFTER / 2),
            Begin::Failed("no capacity".into())
        );
        assert_eq!(w.begin(&t, "f", now + RETRY_AFTER), Begin::Start);
        assert_eq!(w.begin(&t, "f", now + RETRY_AFTER), Begin::InFlight);
        w.done(&t, "f", Ok(()), now + RETRY_AFTER);
        assert!(w.is_empty());
    }
}

//! Metering on the node: what each tenant used, as usage-record drafts.
//!
//! Pure (time comes in as Unix microseconds). The agent feeds it two kinds
//! of facts and takes drafts out to journal them:
//!
//! ```text
//!   weights loaded on GPU g  ─▶ resident_start(id, key, MiB, t)  ┐  memory: MiB × µs resident
//!   weights left GPU g       ─▶ resident_stop(id, t)             ┘  (swapped out: not billed)
//!   invocation completed     ─▶ invocation(key, milli, start, end)   compute: milli-GPU × µs busy, +1
//!
//!   take_busy()      ─▶ drafts of compute + invocations accrued since the last take
//!   take_all(now)    ─▶ the same, plus memory, resident intervals closed up to `now`
//!   delivered()      ─▶ what the last take held of service already delivered
//!   restore(d)       ─▶ its write failed: that part accrues again (invocations do not)
//! ```
//!
//! Every interval is split at billing-hour boundaries
//! ([`crate::state::HOUR_MS`]): a draft belongs to the hour its `end_ms`
//! falls in, and never spans two. Quantities accrue in µs units exactly
//! (`u128`) and are emitted in whole ms units; the sub-ms remainder of each
//! key is carried to its next draft, so nothing is lost or counted twice
//! while the meter lives.
//!
//! Arithmetic here is checked or saturating (`clippy::arithmetic_side_effects`
//! is denied in every non-test file): an accrual past `u128`, or a draft past
//! `u64`, saturates at the largest value instead of wrapping into a small bill.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

mod journal_seqs;
mod usage_draft;
mod usage_key;
mod usage_meter;

pub use journal_seqs::{JournalSeqs, Reconcile};
pub use usage_draft::UsageDraft;
pub use usage_key::UsageKey;
pub use usage_meter::{Delivered, ResidencyId, UsageMeter};

#[cfg(test)]
mod tests;

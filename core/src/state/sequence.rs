//! Exactly-once bookkeeping of one agent's usage sequence numbers.
//!
//! ```text
//!   applied:  1 2 3 4 5 . . 8 . 10        contiguous = 5, ahead = {8, 10}
//!   seq 3  → duplicate        seq 6 → new (then ahead 8 waits for 7)
//! ```
//!
//! Sequence numbers start at 1. Everything up to `contiguous` has been
//! applied; `ahead` holds the applied numbers beyond it. A number more than
//! [`MAX_SEQUENCE_AHEAD`] past `contiguous` is refused, which bounds
//! `ahead`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// How far past the contiguous prefix a sequence number may run.
pub const MAX_SEQUENCE_AHEAD: u64 = 65_536;

/// The applied sequence numbers of one agent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SequenceCursor {
    /// Every number in `1..=contiguous` has been applied.
    pub contiguous: u64,
    /// Applied numbers above `contiguous`.
    pub ahead: BTreeSet<u64>,
}

impl SequenceCursor {
    /// Whether `seq` has been applied.
    pub fn seen(&self, seq: u64) -> bool {
        seq <= self.contiguous || self.ahead.contains(&seq)
    }

    /// Whether `seq` lies in the window this cursor accepts.
    pub fn in_window(&self, seq: u64) -> bool {
        seq >= 1 && seq <= self.contiguous.saturating_add(MAX_SEQUENCE_AHEAD)
    }

    /// Marks `seq` applied and advances the contiguous prefix.
    pub fn record(&mut self, seq: u64) {
        if seq <= self.contiguous {
            return;
        }
        self.ahead.insert(seq);
        while let Some(next) = self.contiguous.checked_add(1) {
            if !self.ahead.remove(&next) {
                break;
            }
            self.contiguous = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_numbers_close_the_gap() {
        let mut c = SequenceCursor::default();
        for s in [1, 2, 5, 4] {
            c.record(s);
        }
        assert_eq!((c.contiguous, c.ahead.len()), (2, 2));
        assert!(c.seen(5) && !c.seen(3));
        c.record(3);
        assert_eq!((c.contiguous, c.ahead.len()), (5, 0));
        assert!(!c.in_window(0));
        assert!(c.in_window(5 + MAX_SEQUENCE_AHEAD));
        assert!(!c.in_window(6 + MAX_SEQUENCE_AHEAD));
    }
}

//! The usage journal's numbering protocol, without its storage (sans-IO):
//! the agent's sled journal (`edge::journal::UsageJournal`) and the
//! deterministic simulation (`tests/src/sim`) both number, send and
//! reconcile their records through [`JournalSeqs`].
//!
//! The rules:
//! - each record gets the next number, taken only once it is written;
//! - a record is sent to the region only once a flush that began after it
//!   was written has returned (it is durable): a record the region applied
//!   and a crash then lost would have its number handed out again after the
//!   restart, and the region would take the new record for a duplicate and
//!   never bill it;
//! - on opening, everything found on disk is durable, and numbering goes on
//!   after the highest number stored or found;
//! - registration answers the region's next expected number: every record
//!   below it was applied (drop it), and numbering jumps ahead to it if the
//!   journal is behind (lost or replaced), so new records are not taken for
//!   duplicates.

use std::ops::Range;

/// The numbers of one journal: the next to assign, and the end of the
/// durable ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSeqs {
    next: u64,
    durable_end: u64,
}

/// What a registration's answer asks of the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconcile {
    /// Records numbered below this were applied by the region: drop them.
    pub applied_below: u64,
    /// The next number to assign afterwards.
    pub next: u64,
    /// Whether numbering jumps ahead (the journal was behind the region).
    pub advanced: bool,
}

impl JournalSeqs {
    /// A journal opened with `stored_next` (the next number written with the
    /// last removal, 1 if none) and `after_last` (one past the highest record
    /// found on disk, 1 if none): all of those records are durable.
    pub fn opened(stored_next: u64, after_last: u64) -> JournalSeqs {
        JournalSeqs {
            next: stored_next.max(after_last).max(1),
            durable_end: after_last.max(1),
        }
    }

    /// The number the next record will get.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Every record numbered below this is durable.
    pub fn durable_end(&self) -> u64 {
        self.durable_end
    }

    /// The numbers `n` records being written would get (`None`: the
    /// numbers are exhausted). Nothing is taken until [`Self::taken`].
    pub fn numbers(&self, n: u64) -> Option<Range<u64>> {
        Some(self.next..self.next.checked_add(n)?)
    }

    /// The records numbered below `end` are written (not yet durable): their
    /// numbers are taken, even if the flush then fails (they may still reach
    /// the disk and the region, so they are never handed out again).
    pub fn taken(&mut self, end: u64) {
        self.next = self.next.max(end);
    }

    /// The records numbered `range`, the last ones taken, are gone for good
    /// (their write failed and can never be read back: the log they went to
    /// started a new epoch before anything else was written): their numbers
    /// are handed out again. Left taken, they would be a hole the region
    /// never sees filled, and its window over the agent's numbers would
    /// stop at it. Nothing changes unless `range` ends at the next number
    /// and starts at or after the durable ones.
    pub fn abandoned(&mut self, range: Range<u64>) {
        if range.end == self.next && range.start >= self.durable_end {
            self.next = range.start;
        }
    }

    /// A flush that began after every record below `end` was written returned.
    pub fn flushed(&mut self, end: u64) {
        self.durable_end = self.durable_end.max(end);
    }

    /// The numbers that may be sent after `after_seq` (durable ones only),
    /// or `None` when there are none.
    pub fn sendable_after(&self, after_seq: u64) -> Option<Range<u64>> {
        let start = after_seq.saturating_add(1);
        (start < self.durable_end).then_some(start..self.durable_end)
    }

    /// What the region's next expected number `region_next` asks: apply it
    /// with [`Self::taken`]`(r.next)` once the removal is stored.
    pub fn reconcile(&self, region_next: u64) -> Reconcile {
        Reconcile {
            applied_below: region_next.max(1),
            next: self.next.max(region_next),
            advanced: region_next > self.next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_flushed_records_are_sendable() {
        let mut s = JournalSeqs::opened(1, 1);
        assert_eq!(s.sendable_after(0), None);
        let r = s.numbers(3).unwrap();
        assert_eq!(r, 1..4);
        s.taken(r.end);
        assert_eq!(s.next(), 4);
        assert_eq!(s.sendable_after(0), None, "written, not flushed");
        s.flushed(4);
        assert_eq!(s.sendable_after(0), Some(1..4));
        assert_eq!(s.sendable_after(3), None);
        // A flush that returns late never lowers the watermark.
        s.flushed(2);
        assert_eq!(s.durable_end(), 4);
    }

    #[test]
    fn abandoned_numbers_are_handed_out_again_only_when_last_and_not_durable() {
        let mut s = JournalSeqs::opened(1, 1);
        s.taken(4);
        s.flushed(4);
        s.taken(7);
        // Not the last ones taken, or durable: kept.
        s.abandoned(4..6);
        s.abandoned(2..7);
        assert_eq!(s.next(), 7);
        s.abandoned(4..7);
        assert_eq!(s.next(), 4);
        assert_eq!(s.numbers(2), Some(4..6));
    }

    #[test]
    fn opening_resumes_after_what_is_on_disk() {
        let s = JournalSeqs::opened(7, 12);
        assert_eq!((s.next(), s.durable_end()), (12, 12));
        let s = JournalSeqs::opened(20, 12);
        assert_eq!((s.next(), s.durable_end()), (20, 12));
        assert_eq!(JournalSeqs::opened(0, 0).next(), 1);
    }

    #[test]
    fn reconcile_drops_what_was_applied_and_jumps_ahead_when_behind() {
        let s = JournalSeqs::opened(1, 5);
        assert_eq!(
            s.reconcile(3),
            Reconcile {
                applied_below: 3,
                next: 5,
                advanced: false
            }
        );
        let r = s.reconcile(9);
        assert_eq!(
            r,
            Reconcile {
                applied_below: 9,
                next: 9,
                advanced: true
            }
        );
        let mut s = s;
        s.taken(r.next);
        assert_eq!(s.next(), 9);
        assert_eq!(s.numbers(u64::MAX), None);
    }
}

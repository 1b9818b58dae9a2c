//! A runtime's measured start times (a microVM's boot-to-ready) and the
//! estimate the executor is given for the next load
//! ([`super::Event::StartMeasured`]).
//!
//! ```text
//!  driver: boot measured ─▶ record(us) ─▶ last WINDOW starts
//!  agent:  estimate_us()  ─▶ median of those │ DEFAULT before the first
//! ```
//!
//! The median, not the mean: one start slowed by a neighbour's boot on the
//! same cores (boots are CPU-bound) should not move the estimate much.
//! Pure: the caller measures and passes the durations in.

use crate::model::Micros;
use std::collections::VecDeque;

/// How many recent starts the estimate is taken over.
pub const START_WINDOW: usize = 16;

/// Recent start durations of one runtime (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartTimes {
    recent: VecDeque<Micros>,
    default_us: Micros,
    count: u64,
}

impl StartTimes {
    /// No starts yet; [`estimate_us`](Self::estimate_us) is `default_us`
    /// until the first one is recorded.
    pub fn new(default_us: Micros) -> Self {
        Self {
            recent: VecDeque::with_capacity(START_WINDOW),
            default_us,
            count: 0,
        }
    }

    /// One measured start.
    pub fn record(&mut self, us: Micros) {
        if self.recent.len() == START_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(us);
        self.count = self.count.saturating_add(1);
    }

    /// The median of the last [`START_WINDOW`] starts (the lower middle of
    /// an even count), or the default before any.
    pub fn estimate_us(&self) -> Micros {
        let mut v: Vec<Micros> = self.recent.iter().copied().collect();
        v.sort_unstable();
        match v.len() {
            0 => self.default_us,
            n => v[(n - 1) / 2],
        }
    }

    /// The most recent start, if any.
    pub fn last_us(&self) -> Option<Micros> {
        self.recent.back().copied()
    }

    /// Starts recorded since [`new`](Self::new).
    pub fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_default_then_the_median_of_the_window() {
        let mut t = StartTimes::new(3_000_000);
        assert_eq!(t.estimate_us(), 3_000_000);
        assert_eq!(t.last_us(), None);
        t.record(2_000_000);
        assert_eq!(t.estimate_us(), 2_000_000);
        t.record(9_000_000); // one slow boot
        t.record(1_800_000);
        assert_eq!(t.estimate_us(), 2_000_000);
        assert_eq!(t.last_us(), Some(1_800_000));
        // The window forgets the oldest: after 16 fast starts the slow one
        // and the first ones are gone.
        for _ in 0..START_WINDOW {
            t.record(1_700_000);
        }
        assert_eq!(t.estimate_us(), 1_700_000);
        assert_eq!(t.count(), 3 + START_WINDOW as u64);
    }
}

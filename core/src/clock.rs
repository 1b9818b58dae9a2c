//! Time behind a seam: the agent and the region read the clock only through
//! a [`Clock`] handed to them at construction, so a test or a simulator can
//! put its own time in (quinn's `Runtime::now`, openraft's deterministic
//! tests). Pure code in this crate still takes `now` as an argument; this
//! module is where the runtimes get that `now` from.
//!
//! ```text
//!   SystemClock (the OS clocks) ─┐
//!                                ├─▶ Arc<dyn Clock> ─▶ NodeAgent, region hub, … ─▶ `now` into core
//!   ManualClock (advanced by     ─┘
//!   a test or simulator)
//! ```
//!
//! Two readings: [`Clock::now`], monotonic (an [`Instant`], the type the
//! runtimes already keep ages and deadlines in), and [`Clock::unix_ms`] /
//! [`Clock::unix_us`], wall-clock time (stamps on records, heartbeats and
//! commands). [`SystemClock`] is the only reader of the OS clocks here.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of monotonic and wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Monotonic time now.
    fn now(&self) -> Instant;

    /// Wall-clock time now, µs since the Unix epoch (0 before it).
    fn unix_us(&self) -> u64;

    /// Wall-clock time now, ms since the Unix epoch (0 before it).
    fn unix_ms(&self) -> u64 {
        self.unix_us() / 1_000
    }
}

/// A clock handle shared by everything one runtime (an agent, a replica) runs.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// The system clock as a [`SharedClock`].
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to (tests, simulators): both readings
/// advance together by [`ManualClock::advance`], from an [`Instant`] taken
/// at creation and a chosen Unix time.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    unix_origin_us: u64,
    /// Time advanced since creation, µs.
    elapsed_us: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `unix_ms` ms since the Unix epoch.
    pub fn new(unix_ms: u64) -> Self {
        Self {
            origin: Instant::now(),
            unix_origin_us: unix_ms.saturating_mul(1_000),
            elapsed_us: AtomicU64::new(0),
        }
    }

    /// A clock standing at `unix_ms`, as a shared handle and its own `Arc`
    /// (to advance it).
    pub fn shared(unix_ms: u64) -> (Arc<ManualClock>, SharedClock) {
        let clock = Arc::new(Self::new(unix_ms));
        let shared: SharedClock = clock.clone();
        (clock, shared)
    }

    /// Moves both readings forward by `by` (saturating, never backwards).
    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        // fetch_update cannot fail with a closure that always returns Some.
        let _ = self
            .elapsed_us
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                Some(e.saturating_add(us))
            });
    }

    /// Time advanced since creation.
    pub fn elapsed(&self) -> Duration {
        Duration::from_micros(self.elapsed_us.load(Ordering::SeqCst))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        // u64 µs (about 584 000 years) fits in an Instant on the platforms
        // we run on; should it not, the clock stops rather than panic.
        let e = self.elapsed();
        self.origin.checked_add(e).unwrap_or(self.origin)
    }

    fn unix_us(&self) -> u64 {
        self.unix_origin_us
            .saturating_add(self.elapsed_us.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stands_still_until_advanced_then_both_readings_move_together() {
        let (manual, clock) = ManualClock::shared(1_700_000_000_000);
        let t0 = clock.now();
        assert_eq!(clock.unix_ms(), 1_700_000_000_000);
        assert_eq!(clock.now(), t0);
        manual.advance(Duration::from_micros(1_500));
        assert_eq!(clock.now() - t0, Duration::from_micros(1_500));
        assert_eq!(clock.unix_us(), 1_700_000_000_001_500);
        assert_eq!(clock.unix_ms(), 1_700_000_000_001);
        manual.advance(Duration::from_secs(60));
        assert_eq!(clock.now() - t0, Duration::from_micros(60_001_500));
        assert_eq!(manual.elapsed(), Duration::from_micros(60_001_500));
    }

    #[test]
    fn advancing_saturates_instead_of_wrapping() {
        let clock = ManualClock::new(u64::MAX);
        assert_eq!(clock.unix_us(), u64::MAX);
        clock.advance(Duration::MAX);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.unix_us(), u64::MAX);
        assert_eq!(clock.elapsed(), Duration::from_micros(u64::MAX));
        assert!(clock.now() >= clock.origin);
    }

    #[test]
    fn the_system_clock_reads_the_present() {
        let clock = SystemClock::shared();
        // 2020-01-01 in ms: any real system clock is past it.
        assert!(clock.unix_ms() > 1_577_836_800_000);
        let a = clock.now();
        assert!(clock.now() >= a);
    }
}

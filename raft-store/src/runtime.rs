//! openraft's async runtime for the region: tokio, with the per-thread
//! random source (openraft draws election timeouts from it) behind a seam.
//!
//! In production each thread's source is seeded from the OS on first use,
//! exactly like openraft's `TokioRuntime`. The deterministic simulation
//! (`tests/src/sim`) calls [`seed_thread_rng`] on the one thread that runs
//! every simulated replica, so the same seed draws the same timeouts.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static RNG: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Seeds this thread's random source: every draw openraft makes on this
/// thread from now on follows from `seed`.
pub fn seed_thread_rng(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

fn with_rng<T>(f: impl FnOnce(&mut StdRng) -> T) -> T {
    RNG.with(|r| {
        let mut slot = r.borrow_mut();
        f(slot.get_or_insert_with(StdRng::from_entropy))
    })
}

/// A handle to this thread's random source (see [`seed_thread_rng`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadRng;

impl RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        with_rng(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        with_rng(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        with_rng(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        with_rng(|r| r.try_fill_bytes(dest))
    }
}

/// tokio, as openraft's `TokioRuntime`, with [`ThreadRng`] as its random source.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GshareRuntime;

impl AsyncRuntime for GshareRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = ThreadRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn a_seeded_thread_draws_the_same_timeouts_again() {
        let draw = || -> Vec<u64> {
            (0..8)
                .map(|_| GshareRuntime::thread_rng().gen_range(500..1000))
                .collect()
        };
        seed_thread_rng(7);
        let first = draw();
        seed_thread_rng(7);
        assert_eq!(draw(), first);
        seed_thread_rng(8);
        assert_ne!(draw(), first);
    }
}

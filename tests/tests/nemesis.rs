//! The seeded nemesis (docs/chaos.md): real replica and agent processes,
//! clients recording every op, faults drawn from a seed, and a checker of
//! the history against the healed cluster.
//!
//! - `seeded_nemesis_keeps_every_invariant`: the CI seeds (or the one in
//!   `GSHARE_NEMESIS_SEED`), each 8 rounds.
//! - `soak` (ignored): seeds one after another until `GSHARE_SOAK_MIN`
//!   minutes (default 10) are spent, from `GSHARE_NEMESIS_SEED` or a
//!   clock-drawn start; `GSHARE_NEMESIS_ROUNDS` sets the rounds per seed.
//!
//!   GSHARE_SOAK_MIN=30 cargo test --release -p gshare-tests --test nemesis -- --ignored --nocapture
//!
//! No timing is asserted; waits have generous deadlines.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gshare_tests::nemesis::{run, seed_from_env, Config};

static SERIAL: Mutex<()> = Mutex::new(());

/// The seeds the normal suite runs.
const CI_SEEDS: [u64; 3] = [1, 2, 3];

fn config() -> Config {
    let mut c = Config::default();
    if let Some(r) = std::env::var("GSHARE_NEMESIS_ROUNDS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        c.rounds = r;
    }
    c.strict = std::env::var("GSHARE_NEMESIS_STRICT").is_ok_and(|v| v == "1");
    c
}

#[test]
fn seeded_nemesis_keeps_every_invariant() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seeds: Vec<u64> = seed_from_env().map_or(CI_SEEDS.to_vec(), |s| vec![s]);
    for seed in seeds {
        match run(seed, config()) {
            Ok(report) => println!("{report}"),
            Err(failure) => panic!("{failure}"),
        }
    }
}

#[test]
#[ignore = "soak: GSHARE_SOAK_MIN=<minutes> … -- --ignored"]
fn soak() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let minutes: u64 = std::env::var("GSHARE_SOAK_MIN")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(10);
    let end = Instant::now() + Duration::from_secs(minutes * 60);
    let mut seed = seed_from_env().unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let (mut seeds, mut rounds) = (0u64, 0usize);
    while Instant::now() < end {
        match run(seed, config()) {
            Ok(report) => {
                seeds += 1;
                rounds += report.faults.len();
                println!("{report}");
            }
            Err(failure) => panic!("after {seeds} passing seeds ({rounds} rounds): {failure}"),
        }
        seed += 1;
    }
    println!("soak: {seeds} seeds, {rounds} fault rounds, all passed");
}

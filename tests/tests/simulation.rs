//! The deterministic simulation of the control plane (docs/simulation.md).
//!
//! - `a_hundred_seeds_keep_every_invariant`: seeds `GSHARE_SIM_FIRST`
//!   (default 1) onward, `GSHARE_SIM_SEEDS` of them (default 100), each
//!   `GSHARE_SIM_SECS` simulated seconds of faults (default 120), on two
//!   threads, on `GSHARE_SIM_REPLICAS` replicas (default 3). The long mode
//!   is the same test with more seeds or seconds (or replicas).
//! - `a_seed_replays_bit_for_bit`: `GSHARE_SIM_SEED` (default 7) twice.
//! - `a_planted_journal_bug_is_caught`: agents that send usage before it is
//!   durable must break exactly-once billing on some seed.

use std::time::Instant;

use gshare_tests::sim::{run, Planted, SimConfig, SimReport};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

fn replay_line(r: &SimReport, secs: u64) -> String {
    format!(
        "replay: GSHARE_SIM_SEED={} GSHARE_SIM_SECS={secs} GSHARE_SIM_DIGEST={:016x} cargo test \
         --release -p gshare-tests --test simulation a_seed_replays_bit_for_bit -- --nocapture",
        r.seed, r.digest
    )
}

/// Whether a run exercised what its invariants are about.
fn did_something(r: &SimReport) -> Result<(), String> {
    let deploys = r
        .ops
        .iter()
        .filter(|o| o.kind.to_string() == "deploy" && o.outcome.is_ok())
        .count();
    let (ok, _, _) = r.outcome_counts();
    let checks = [
        (ok > 10, "fewer than 10 writes acknowledged"),
        (deploys > 0, "no deploy acknowledged"),
        (r.requests.0 > 0, "no request ran on an agent"),
        (r.billed > 0, "nothing billed"),
        (!r.faults.is_empty(), "no fault injected"),
    ];
    match checks.iter().find(|(held, _)| !held) {
        Some((_, why)) => Err(format!("seed {}: {why}", r.seed)),
        None => Ok(()),
    }
}

fn print_failure(r: &SimReport, secs: u64) {
    eprintln!("FAILED {}", r.summary());
    for v in &r.violations {
        eprintln!("{v}");
    }
    eprintln!("{}", replay_line(r, secs));
}

#[test]
fn a_hundred_seeds_keep_every_invariant() {
    let first = env_u64("GSHARE_SIM_FIRST", 1);
    let count = env_u64("GSHARE_SIM_SEEDS", 100);
    let secs = env_u64("GSHARE_SIM_SECS", 120);
    let replicas = env_u64("GSHARE_SIM_REPLICAS", 3);
    let threads = 2;
    let t0 = Instant::now();
    let reports: Vec<SimReport> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (first..first + count)
                        .filter(|seed| seed % threads == t)
                        .map(|seed| {
                            let r = run(SimConfig {
                                replicas,
                                ..SimConfig::new(seed, secs)
                            });
                            println!("{}", r.summary());
                            r
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let sim: f64 = reports.iter().map(|r| r.sim_secs).sum();
    let ops: usize = reports.iter().map(|r| r.ops.len()).sum();
    let faults: usize = reports.iter().map(|r| r.faults.len()).sum();
    println!(
        "{count} seeds in {wall:.1} s on {threads} threads: {:.1} seeds/min, {:.0}× real time, \
         {ops} client ops, {faults} faults",
        count as f64 * 60.0 / wall,
        sim / wall
    );
    let failed: Vec<&SimReport> = reports
        .iter()
        .filter(|r| !r.violations.is_empty())
        .collect();
    for r in &failed {
        print_failure(r, secs);
    }
    assert!(
        failed.is_empty(),
        "{} of {count} seeds broke an invariant: {:?}",
        failed.len(),
        failed.iter().map(|r| r.seed).collect::<Vec<_>>()
    );
    // The runs did what the invariants are about: each seed deployed, ran
    // requests and billed them; across the seeds, messages were lost and
    // duplicated and crashes threw writes away on both kinds of disk.
    for r in &reports {
        if let Err(why) = did_something(r) {
            panic!("{why}");
        }
    }
    let sum = |f: fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    assert!(sum(|r| r.net.lost) > 0, "no message was lost");
    assert!(sum(|r| r.net.duplicated) > 0, "no message was duplicated");
    assert!(
        sum(|r| r.lost_writes.0) > 0,
        "no replica crash lost a write"
    );
    assert!(sum(|r| r.lost_writes.1) > 0, "no agent crash lost a record");
    assert!(sum(|r| r.watch.0) > 0, "no node was marked not ready");
    assert!(sum(|r| r.watch.1) > 0, "no instance was moved off a node");
}

#[test]
fn a_seed_replays_bit_for_bit() {
    let seed = env_u64("GSHARE_SIM_SEED", 7);
    let secs = env_u64("GSHARE_SIM_SECS", 120);
    let a = run(SimConfig::new(seed, secs));
    let b = run(SimConfig::new(seed, secs));
    println!("{}", a.summary());
    for f in &a.faults {
        println!("  fault at {f}");
    }
    let mut why: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for o in &a.ops {
        let k = format!("{} {}", o.kind, o.outcome);
        let k: String = k
            .split(|c: char| c.is_ascii_digit())
            .next()
            .unwrap_or("")
            .into();
        *why.entry(k).or_default() += 1;
    }
    for (k, n) in why {
        println!("  {n:5} × {k}");
    }
    for v in &a.violations {
        println!("{v}");
    }
    assert_eq!(
        a.digest, b.digest,
        "seed {seed} did not replay: the digests differ"
    );
    // Across processes: the digest a failing run printed.
    if let Ok(want) = std::env::var("GSHARE_SIM_DIGEST") {
        assert_eq!(
            format!("{:016x}", a.digest),
            want,
            "seed {seed} did not replay the printed run"
        );
    }
    assert_eq!(
        a.ops, b.ops,
        "seed {seed} did not replay: the histories differ"
    );
    assert_eq!(a.faults, b.faults);
    let c = run(SimConfig::new(seed + 1, secs));
    assert_ne!(a.digest, c.digest, "two seeds gave the same run");
}

#[test]
fn a_planted_journal_bug_is_caught() {
    let secs = env_u64("GSHARE_SIM_SECS", 120);
    let mut tried = Vec::new();
    for seed in 1..=100 {
        let mut cfg = SimConfig::new(seed, secs);
        cfg.planted = Planted::UsageBeforeFsync;
        let r = run(cfg);
        tried.push(seed);
        if r.violations
            .iter()
            .any(|v| v.invariant == "exactly-once billing")
        {
            println!("planted bug caught by seed {seed}: {}", r.summary());
            for v in &r.violations {
                println!("{v}");
            }
            return;
        }
    }
    panic!("no seed of {tried:?} caught usage sent before it was durable");
}

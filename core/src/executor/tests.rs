//! Command-sequence tests of the executor: each feeds events at given
//! times and asserts the exact commands that come out.

use super::*;
use crate::model::{Mib, Micros, Tier};

mod next_timeout;
mod parking;
mod pinning;

const S: Micros = 1_000_000;
const MS: Micros = 1_000;
/// 4 000 MiB at 10 000 MiB/s + 100 ms setup.
const SWAP_IN: Micros = 500 * MS;
/// 500 ms setup + 4 000 MiB at 1 000 MiB/s.
const COLD: Micros = 4 * S + 500 * MS;
const FAR: Micros = 1_000 * S;

fn config(gpus: u32, rules: ExecutorRules) -> NodeConfig {
    NodeConfig {
        gpus,
        gpu_memory_mib: 12_000,
        host_memory_mib: 100_000,
        load: LoadCosts {
            h2d_mib_per_s: 10_000,
            swap_setup_us: 100 * MS,
            cold_setup_us: 500 * MS,
            storage_mib_per_s: 1_000,
        },
        rules,
    }
}

fn profile(tier: Tier) -> FunctionProfile {
    FunctionProfile {
        tier,
        memory_mib: 4_000,
        saturation_milli: 1000,
        batch_ppm: 0,
    }
}

fn node(gpus: u32, rules: ExecutorRules, tiers: &[Tier]) -> NodeExecutor {
    let mut n = NodeExecutor::new(config(gpus, rules));
    for (i, t) in tiers.iter().enumerate() {
        n.handle(
            0,
            Event::InstanceAdded {
                function: FunctionId(i as u32),
                profile: profile(*t),
            },
        );
    }
    assert_eq!(n.take_commands(), vec![]);
    n
}

/// A node of `config` with one `oversubscribed` function per entry of
/// `memory_mib` (function `i` holds `memory_mib[i]`).
fn gshare_node(config: NodeConfig, memory_mib: &[Mib]) -> NodeExecutor {
    let mut n = NodeExecutor::new(config);
    for (f, &memory_mib) in memory_mib.iter().enumerate() {
        n.handle(
            0,
            Event::InstanceAdded {
                function: FunctionId(f as u32),
                profile: FunctionProfile {
                    memory_mib,
                    ..profile(Tier::Oversubscribed)
                },
            },
        );
    }
    n
}

fn step(n: &mut NodeExecutor, now: Micros, e: Event) -> Vec<Command> {
    n.handle(now, e);
    n.take_commands()
}

fn arrive(r: u64, f: u32, exec: Micros, deadline: Micros) -> Event {
    Event::RequestArrived {
        request: RequestId(r),
        function: FunctionId(f),
        full_gpu_us: exec,
        deadline,
    }
}

fn finished(r: u64, gpu: u32) -> Event {
    Event::RequestFinished {
        request: RequestId(r),
        gpu,
    }
}

fn loaded(f: u32, gpu: u32) -> Event {
    Event::LoadFinished {
        function: FunctionId(f),
        gpu,
    }
}

fn run(r: u64, f: u32, gpu: u32, compute: u32, finish_at: Micros) -> Command {
    Command::Run {
        request: RequestId(r),
        function: FunctionId(f),
        gpu,
        compute_milli: compute,
        finish_at,
    }
}

fn cold(f: u32, gpu: u32, ready_at: Micros) -> Command {
    Command::ColdStart {
        function: FunctionId(f),
        gpu,
        ready_at,
    }
}

fn swap_out(f: u32, gpu: u32) -> Command {
    Command::SwapOut {
        function: FunctionId(f),
        gpu,
    }
}

fn swap_in(f: u32, gpu: u32, ready_at: Micros) -> Command {
    Command::SwapIn {
        function: FunctionId(f),
        gpu,
        ready_at,
    }
}

#[test]
fn earliest_deadline_runs_first() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, 10 * S)),
        vec![run(1, 0, 0, 1000, S)]
    );
    // Later arrival, later deadline: waits.
    assert_eq!(step(&mut n, 100 * MS, arrive(2, 0, S, 20 * S)), vec![]);
    // Later arrival, earlier deadline: overtakes request 2.
    assert_eq!(step(&mut n, 200 * MS, arrive(3, 0, S, 5 * S)), vec![]);
    assert_eq!(
        step(&mut n, S, finished(1, 0)),
        vec![run(3, 0, 0, 1000, 2 * S)]
    );
    assert_eq!(
        step(&mut n, 2 * S, finished(3, 0)),
        vec![run(2, 0, 0, 1000, 3 * S)]
    );
    assert_eq!(step(&mut n, 3 * S, finished(2, 0)), vec![]);
}

#[test]
fn rejects_on_arrival_when_no_gpu_meets_the_deadline() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, 10 * S)),
        vec![run(1, 0, 0, 1000, S)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(2, 0, S, 1_500 * MS)),
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 2 * S,
                deadline: 1_500 * MS,
            },
        }]
    );
}

#[test]
fn rejects_in_queue_when_its_gpu_was_taken_during_the_load() {
    let ovs = Tier::Oversubscribed;
    let mut n = node(1, ExecutorRules::gshare(), &[ovs, ovs]);
    // Function 1 becomes resident.
    assert_eq!(
        step(&mut n, 0, arrive(1, 1, 100 * MS, FAR)),
        vec![cold(1, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(1, 0)),
        vec![run(1, 1, 0, 1000, COLD + 100 * MS)]
    );
    assert_eq!(step(&mut n, COLD + 100 * MS, finished(1, 0)), vec![]);
    // Function 0 cold-starts for a request that just fits: ready 9.5 s, finish 9.6 s ≤ 9.7 s.
    let t = 5 * S;
    assert_eq!(
        step(&mut n, t, arrive(2, 0, 100 * MS, 9_700 * MS)),
        vec![cold(0, 0, t + COLD)]
    );
    // While it loads, a later-deadline request of the resident function may use the GPU
    // (EDF skips requests whose instance is not ready).
    assert_eq!(
        step(&mut n, 9_200 * MS, arrive(3, 1, 500 * MS, FAR)),
        vec![run(3, 1, 0, 1000, 9_700 * MS)]
    );
    // The load completes, but the GPU is busy until 9.7 s: 9.8 s > 9.7 s, rejected now.
    assert_eq!(
        step(&mut n, t + COLD, loaded(0, 0)),
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::DeadlineMissedInQueue {
                earliest_finish: 9_800 * MS,
                deadline: 9_700 * MS,
            },
        }]
    );
}

/// Function 1 loaded first with two close requests (next use predicted
/// soon); function 0 loaded later with one request (no next use predicted);
/// function 2 guaranteed. The GPU (12 000 MiB) is then full.
fn full_gpu() -> NodeExecutor {
    use Tier::*;
    let mut n = node(
        1,
        ExecutorRules::gshare(),
        &[Oversubscribed, Oversubscribed, Guaranteed, Oversubscribed],
    );
    assert_eq!(
        step(&mut n, 0, arrive(1, 1, 100 * MS, FAR)),
        vec![cold(1, 0, COLD)]
    );
    assert_eq!(step(&mut n, 0, arrive(2, 1, 100 * MS, FAR)), vec![]);
    assert_eq!(
        step(&mut n, 0, arrive(3, 0, 100 * MS, FAR)),
        vec![cold(0, 0, 2 * COLD)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(4, 2, 100 * MS, FAR)),
        vec![cold(2, 0, 3 * COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(1, 0)),
        vec![run(1, 1, 0, 1000, COLD + 100 * MS)]
    );
    assert_eq!(
        step(&mut n, COLD + 100 * MS, finished(1, 0)),
        vec![run(2, 1, 0, 1000, COLD + 200 * MS)]
    );
    assert_eq!(step(&mut n, COLD + 200 * MS, finished(2, 0)), vec![]);
    assert_eq!(
        step(&mut n, 2 * COLD, loaded(0, 0)),
        vec![run(3, 0, 0, 1000, 2 * COLD + 100 * MS)]
    );
    assert_eq!(step(&mut n, 2 * COLD + 100 * MS, finished(3, 0)), vec![]);
    assert_eq!(
        step(&mut n, 3 * COLD, loaded(2, 0)),
        vec![run(4, 2, 0, 1000, 3 * COLD + 100 * MS)]
    );
    assert_eq!(step(&mut n, 3 * COLD + 100 * MS, finished(4, 0)), vec![]);
    assert_eq!(n.gpu(0).free_mib(), 0);
    n
}

#[test]
fn swaps_out_the_idle_oversubscribed_instance_used_farthest_in_the_future() {
    let mut n = full_gpu();
    // Least recently used is function 1, but its next request is predicted
    // soon; function 0 has no predicted next use, so it goes. The guaranteed
    // function 2 is never a candidate.
    let t = 20 * S;
    assert_eq!(
        step(&mut n, t, arrive(5, 3, 100 * MS, FAR)),
        vec![
            Command::SwapOut {
                function: FunctionId(0),
                gpu: 0
            },
            cold(3, 0, t + COLD),
        ]
    );
    assert!(n.in_host(FunctionId(0)));
}

#[test]
fn swap_in_from_host_is_cheaper_than_a_cold_start_and_guaranteed_is_never_swapped() {
    let mut n = full_gpu();
    let t = 20 * S;
    step(&mut n, t, arrive(5, 3, 100 * MS, FAR));
    // Function 0's weights are in host memory: a swap-in, queued behind the
    // cold start on the H2D link.
    assert_eq!(
        step(&mut n, t + S, arrive(6, 0, 100 * MS, FAR)),
        vec![
            Command::SwapOut {
                function: FunctionId(1),
                gpu: 0
            },
            Command::SwapIn {
                function: FunctionId(0),
                gpu: 0,
                ready_at: t + COLD + SWAP_IN,
            },
        ]
    );
    // Now only the idle guaranteed instance could make room now: it is never
    // taken. The two loading oversubscribed instances will become evictable
    // once their requests have run, so request 7 waits for memory.
    assert_eq!(step(&mut n, t + S, arrive(7, 1, 100 * MS, FAR)), vec![]);
    assert_eq!(n.waiting(), 1);
    assert_eq!(
        step(&mut n, t + COLD, loaded(3, 0)),
        vec![run(5, 3, 0, 1000, t + COLD + 100 * MS)]
    );
    // Function 3 is idle again: it makes room, not the guaranteed function 2.
    assert_eq!(
        step(&mut n, t + COLD + 100 * MS, finished(5, 0)),
        vec![
            Command::SwapOut {
                function: FunctionId(3),
                gpu: 0
            },
            Command::SwapIn {
                function: FunctionId(1),
                gpu: 0,
                ready_at: t + COLD + 2 * SWAP_IN,
            },
        ]
    );
    assert_eq!(n.waiting(), 0);
    assert!(n.gpu(0).resident().any(|f| f == FunctionId(2)));
}

/// One GPU (three functions of 4 000 MiB) and host memory for two: functions
/// 0, 1 and 2 cold-started and idle at 3 × COLD + 400 ms; functions 0 and 2
/// had two requests each, function 1 one (its next use is the farthest).
/// The third cold start overflowed the host: the host copies of the loaded
/// functions 0 and 1 were dropped (down to 95 %), not function 2's, which
/// was loading from it.
fn small_host() -> NodeExecutor {
    let mut n = gshare_node(
        NodeConfig {
            host_memory_mib: 8_000,
            ..config(1, ExecutorRules::gshare())
        },
        &[4_000; 4],
    );
    for (r, f) in [(1, 0), (2, 1)] {
        let t = (r - 1) * COLD;
        assert_eq!(
            step(&mut n, t, arrive(r, f, 100 * MS, FAR)),
            vec![cold(f, 0, t + COLD)]
        );
        assert_eq!(
            step(&mut n, t + COLD, loaded(f, 0)),
            vec![run(r, f, 0, 1000, t + COLD + 100 * MS)]
        );
        assert_eq!(step(&mut n, t + COLD + 100 * MS, finished(r, 0)), vec![]);
    }
    // A second request of function 0: its next use is predicted soonest.
    let t = 2 * COLD;
    step(&mut n, t, arrive(3, 0, 100 * MS, FAR));
    step(&mut n, t + 100 * MS, finished(3, 0));
    assert_eq!(n.host_used_mib(), 8_000);
    assert_eq!(
        step(&mut n, t + 200 * MS, arrive(4, 2, 100 * MS, FAR)),
        vec![cold(2, 0, t + 200 * MS + COLD)]
    );
    assert_eq!(
        (0..3).map(|f| n.in_host(FunctionId(f))).collect::<Vec<_>>(),
        vec![false, false, true]
    );
    assert_eq!(n.host_used_mib(), 4_000);
    let t = t + 200 * MS + COLD;
    step(&mut n, t, loaded(2, 0));
    step(&mut n, t + 100 * MS, finished(4, 0));
    step(&mut n, t + 100 * MS, arrive(5, 2, 100 * MS, FAR));
    step(&mut n, t + 200 * MS, finished(5, 0));
    assert_eq!(n.gpu(0).free_mib(), 0);
    n
}

#[test]
fn host_memory_drops_copies_of_loaded_weights_first_and_an_eviction_writes_them_back() {
    let mut n = small_host();
    let t = 3 * COLD + 400 * MS;
    // Function 3 needs room: function 1 (no next use predicted) goes. The
    // host has no copy of it, so its weights are written back over the
    // link before function 3's cold start crosses it.
    assert_eq!(
        step(&mut n, t, arrive(6, 3, 100 * MS, FAR)),
        vec![swap_out(1, 0), cold(3, 0, t + SWAP_IN + COLD),]
    );
    // Host memory: functions 1 (written back) and 3 (fetched) overflowed it;
    // the loaded function 2's copy was dropped, and function 1's kept.
    assert_eq!(
        (0..4).map(|f| n.in_host(FunctionId(f))).collect::<Vec<_>>(),
        vec![false, true, false, true]
    );
    assert_eq!(n.host_used_mib(), 8_000);
    let t = t + SWAP_IN + COLD;
    step(&mut n, t, loaded(3, 0));
    step(&mut n, t + 100 * MS, finished(6, 0));
    // Function 1 comes back by a swap-in, not a cold start; function 3 (one
    // request, no next use predicted, its host copy kept) makes room
    // without a write-back.
    let t = t + 200 * MS;
    assert_eq!(
        step(&mut n, t, arrive(7, 1, 100 * MS, FAR)),
        vec![swap_out(3, 0), swap_in(1, 0, t + SWAP_IN),]
    );
}

#[test]
fn a_write_back_never_drops_the_host_copy_of_another_victim_of_the_same_load() {
    // One GPU of 8 000 MiB, host memory for 6 000: A (4 000) loses its host
    // copy when B's cold start overflows it; F (8 000) then evicts both.
    // A's write-back overflows host memory again, but B's copy, about to be
    // evicted too, is not dropped for it (which would cost B a write-back
    // the route did not predict): F's load waits for one write-back only,
    // and its request runs by the deadline the route accepted it for.
    let mut n = gshare_node(
        NodeConfig {
            gpu_memory_mib: 8_000,
            host_memory_mib: 6_000,
            ..config(1, ExecutorRules::gshare())
        },
        &[4_000, 4_000, 8_000],
    );
    step(&mut n, 0, arrive(1, 0, 100 * MS, FAR));
    step(&mut n, COLD, loaded(0, 0));
    step(&mut n, COLD + 100 * MS, finished(1, 0));
    let t = COLD + 100 * MS;
    assert_eq!(
        step(&mut n, t, arrive(2, 1, 100 * MS, FAR)),
        vec![cold(1, 0, t + COLD)]
    );
    assert!(!n.in_host(FunctionId(0)) && n.in_host(FunctionId(1)));
    step(&mut n, t + COLD, loaded(1, 0));
    step(&mut n, t + COLD + 100 * MS, finished(2, 0));
    let t = t + COLD + 100 * MS;
    step(&mut n, t, arrive(3, 1, 100 * MS, FAR));
    step(&mut n, t + 100 * MS, finished(3, 0));
    // F: 500 ms setup + 8 000 MiB at 1 000 MiB/s.
    let cold_f = 8 * S + 500 * MS;
    let t = t + 200 * MS;
    let deadline = t + SWAP_IN + cold_f + 100 * MS + SWAP_IN / 2;
    assert_eq!(
        step(&mut n, t, arrive(4, 2, 100 * MS, deadline)),
        vec![
            swap_out(0, 0),
            swap_out(1, 0),
            cold(2, 0, t + SWAP_IN + cold_f),
        ]
    );
    assert_eq!(
        step(&mut n, t + SWAP_IN + cold_f, loaded(2, 0)),
        vec![run(4, 2, 0, 1000, t + SWAP_IN + cold_f + 100 * MS)]
    );
    // Host memory is back within its capacity as far as it can be: F's
    // own 8 000 MiB are more than it holds, so A's and B's copies went.
    assert_eq!(n.host_used_mib(), 8_000);
}

#[test]
fn a_write_back_counts_in_the_predicted_finish() {
    let mut n = small_host();
    let t = 3 * COLD + 400 * MS;
    // Without the write-back the cold start would finish the request at
    // t + COLD + 100 ms; with it, not by this deadline: rejected. A copy is
    // still warmed for the next requests (function 3 has none), timed the
    // same way.
    let deadline = t + COLD + 100 * MS + SWAP_IN / 2;
    assert_eq!(
        step(&mut n, t, arrive(6, 3, 100 * MS, deadline)),
        vec![
            Command::Reject {
                request: RequestId(6),
                reason: RejectReason::DeadlineUnreachable {
                    predicted_finish: t + SWAP_IN + COLD + 100 * MS,
                    deadline,
                },
            },
            swap_out(1, 0),
            cold(3, 0, t + SWAP_IN + COLD),
        ]
    );
}

#[test]
fn a_second_copy_of_weights_the_host_dropped_is_a_swap_in_by_way_of_host_memory() {
    // Two GPUs: function 0's host copy is dropped while it stays loaded on
    // GPU 0; a copy on GPU 1 then comes from host memory after a write-back
    // (two link crossings), not from storage.
    let mut n = gshare_node(
        NodeConfig {
            host_memory_mib: 4_000,
            ..config(2, ExecutorRules::gshare())
        },
        &[4_000, 4_000],
    );
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 100 * MS, FAR)),
        vec![cold(0, 0, COLD)]
    );
    step(&mut n, COLD, loaded(0, 0));
    step(&mut n, COLD + 100 * MS, finished(1, 0));
    // Function 1's cold start overflows the host: function 0's copy goes.
    let t = COLD + 200 * MS;
    assert_eq!(
        step(&mut n, t, arrive(2, 1, 100 * MS, FAR)),
        vec![cold(1, 1, t + COLD)]
    );
    assert!(!n.in_host(FunctionId(0)));
    assert_eq!(n.host_used_mib(), 4_000);
    // Function 0 busy on GPU 0 for 10 s: its next request would wait, so
    // a second copy is loaded on GPU 1, which has room (`spread`), by way
    // of host memory.
    step(&mut n, t + COLD, loaded(1, 1));
    step(&mut n, t + COLD + 100 * MS, finished(2, 1));
    let t = t + COLD + 100 * MS;
    assert_eq!(
        step(&mut n, t, arrive(3, 0, 10 * S, FAR)),
        vec![run(3, 0, 0, 1000, t + 10 * S)]
    );
    let out = step(&mut n, t + MS, arrive(4, 0, 100 * MS, FAR));
    assert!(
        out.contains(&swap_in(0, 1, t + MS + 2 * SWAP_IN)),
        "{out:?}"
    );
    assert!(n.in_host(FunctionId(0)));
}

/// Functions 0, 1 and 2 (4 000 MiB each) cold-started one after another and
/// idle at 13.6 s: the 12 000 MiB GPU is full. Function 3 is not loaded.
fn three_loaded(tiers: &[Tier]) -> NodeExecutor {
    let mut n = node(1, ExecutorRules::gshare(), tiers);
    for f in 0..3u32 {
        let ready = (f as Micros + 1) * COLD;
        assert_eq!(
            step(&mut n, 0, arrive(f as u64 + 1, f, 100 * MS, FAR)),
            vec![cold(f, 0, ready)]
        );
    }
    for f in 0..3u32 {
        let ready = (f as Micros + 1) * COLD;
        assert_eq!(
            step(&mut n, ready, loaded(f, 0)),
            vec![run(f as u64 + 1, f, 0, 1000, ready + 100 * MS)]
        );
        assert_eq!(
            step(&mut n, ready + 100 * MS, finished(f as u64 + 1, 0)),
            vec![]
        );
    }
    assert_eq!(n.gpu(0).free_mib(), 0);
    n
}

/// [`three_loaded`] with oversubscribed functions, then at 20 s function 0
/// runs until 25 s and functions 1 and 2 queue behind it (1 s each): no
/// instance is idle, nothing can be evicted now.
fn all_busy() -> NodeExecutor {
    let mut n = three_loaded(&[Tier::Oversubscribed; 4]);
    assert_eq!(
        step(&mut n, 20 * S, arrive(10, 0, 5 * S, FAR)),
        vec![run(10, 0, 0, 1000, 25 * S)]
    );
    assert_eq!(step(&mut n, 20 * S, arrive(11, 1, S, FAR)), vec![]);
    assert_eq!(step(&mut n, 20 * S, arrive(12, 2, S, FAR)), vec![]);
    n
}

#[test]
fn waits_for_a_busy_victim_and_is_placed_when_it_finishes() {
    let mut n = all_busy();
    // Function 0 is predicted idle at 25 s: cold start 25 s + 4.5 s, run
    // 100 ms, finish 29.6 s ≤ 30 s. It waits instead of NoCapacity.
    assert_eq!(
        step(&mut n, 20 * S, arrive(13, 3, 100 * MS, 30 * S)),
        vec![]
    );
    assert_eq!(n.waiting(), 1);
    // A tick before the victim is idle changes nothing.
    assert_eq!(step(&mut n, 22 * S, Event::Timer), vec![]);
    assert_eq!(
        step(&mut n, 25 * S, finished(10, 0)),
        vec![
            run(11, 1, 0, 1000, 26 * S),
            Command::SwapOut {
                function: FunctionId(0),
                gpu: 0
            },
            cold(3, 0, 25 * S + COLD),
        ]
    );
    assert_eq!(n.waiting(), 0);
    assert_eq!(
        step(&mut n, 26 * S, finished(11, 0)),
        vec![run(12, 2, 0, 1000, 27 * S)]
    );
    assert_eq!(step(&mut n, 27 * S, finished(12, 0)), vec![]);
    assert_eq!(
        step(&mut n, 25 * S + COLD, loaded(3, 0)),
        vec![run(13, 3, 0, 1000, 25 * S + COLD + 100 * MS)]
    );
}

#[test]
fn a_waiting_request_whose_deadline_slips_is_rejected_with_the_deadline_reason() {
    let mut n = all_busy();
    // Too tight even when function 0 frees its memory at 25 s: rejected on
    // arrival for the deadline, not for capacity.
    assert_eq!(
        step(&mut n, 20 * S, arrive(13, 3, 100 * MS, 29 * S)),
        vec![Command::Reject {
            request: RequestId(13),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 29_600 * MS,
                deadline: 29 * S,
            },
        }]
    );
    assert_eq!(
        step(&mut n, 20 * S, arrive(14, 3, 100 * MS, 30 * S)),
        vec![]
    );
    // Function 0 gets another 3 s request: it will not be idle at 25 s.
    assert_eq!(step(&mut n, 24 * S, arrive(15, 0, 3 * S, FAR)), vec![]);
    // At 25 s the earliest victim (function 1) is idle at 26 s: load until
    // 30.5 s, finish 30.6 s > 30 s. Request 14 is given up now.
    assert_eq!(
        step(&mut n, 25 * S, finished(10, 0)),
        vec![
            run(11, 1, 0, 1000, 26 * S),
            Command::Reject {
                request: RequestId(14),
                reason: RejectReason::DeadlineMissedInQueue {
                    earliest_finish: 30_600 * MS,
                    deadline: 30 * S,
                },
            },
        ]
    );
    assert_eq!(n.waiting(), 0);
}

#[test]
fn no_capacity_only_when_memory_never_frees() {
    use Tier::*;
    let mut n = three_loaded(&[Guaranteed, Guaranteed, Guaranteed, Oversubscribed]);
    assert_eq!(
        step(&mut n, 20 * S, arrive(10, 0, 5 * S, FAR)),
        vec![run(10, 0, 0, 1000, 25 * S)]
    );
    let no_capacity = |r: u64| {
        vec![Command::Reject {
            request: RequestId(r),
            reason: RejectReason::NoCapacity,
        }]
    };
    // Guaranteed instances, busy or idle, are never evicted: no waiting.
    assert_eq!(
        step(&mut n, 20 * S, arrive(11, 3, 100 * MS, FAR)),
        no_capacity(11)
    );
    assert_eq!(n.waiting(), 0);
    // A function bigger than a GPU never fits.
    n.handle(
        20 * S,
        Event::InstanceAdded {
            function: FunctionId(4),
            profile: FunctionProfile {
                memory_mib: 13_000,
                ..profile(Oversubscribed)
            },
        },
    );
    assert_eq!(
        step(&mut n, 20 * S, arrive(12, 4, 100 * MS, FAR)),
        no_capacity(12)
    );
}

#[test]
fn a_removed_function_drops_its_waiting_requests() {
    let mut n = all_busy();
    assert_eq!(
        step(&mut n, 20 * S, arrive(13, 3, 100 * MS, 30 * S)),
        vec![]
    );
    assert_eq!(
        step(
            &mut n,
            21 * S,
            Event::InstanceRemoved {
                function: FunctionId(3)
            }
        ),
        vec![Command::Reject {
            request: RequestId(13),
            reason: RejectReason::UnknownFunction
        }]
    );
    assert_eq!(n.waiting(), 0);
}

fn cancelled(r: u64) -> Event {
    Event::RequestCancelled {
        request: RequestId(r),
    }
}

#[test]
fn a_cancelled_request_leaves_its_queue_and_its_work_no_longer_counts() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, 10 * S)),
        vec![run(1, 0, 0, 1000, S)]
    );
    assert_eq!(step(&mut n, 0, arrive(2, 0, S, 3 * S)), vec![]);
    assert_eq!(step(&mut n, 0, arrive(3, 0, S, 3_500 * MS)), vec![]);
    // Behind 1, 2 and 3 a 1 s request finishes at 4 s: 3.8 s is refused.
    assert_eq!(
        step(&mut n, 0, arrive(4, 0, S, 3_800 * MS)),
        vec![Command::Reject {
            request: RequestId(4),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 4 * S,
                deadline: 3_800 * MS,
            },
        }]
    );
    assert_eq!(step(&mut n, 0, cancelled(2)), vec![]);
    assert_eq!(n.gpu(0).queued(), 1);
    // A running request, an unknown one and one cancelled twice: nothing changes.
    assert_eq!(step(&mut n, 0, cancelled(1)), vec![]);
    assert_eq!(step(&mut n, 0, cancelled(99)), vec![]);
    assert_eq!(step(&mut n, 0, cancelled(2)), vec![]);
    assert_eq!(n.gpu(0).queued(), 1);
    // Without 2's second of work, the same request now fits (finish 3 s).
    assert_eq!(step(&mut n, 0, arrive(5, 0, S, 3_800 * MS)), vec![]);
    assert_eq!(
        step(&mut n, S, finished(1, 0)),
        vec![run(3, 0, 0, 1000, 2 * S)]
    );
    assert_eq!(
        step(&mut n, 2 * S, finished(3, 0)),
        vec![run(5, 0, 0, 1000, 3 * S)]
    );
    // Request 2 never runs.
    assert_eq!(step(&mut n, 3 * S, finished(5, 0)), vec![]);
    assert_eq!(step(&mut n, 3 * S, Event::Timer), vec![]);
    assert_eq!(n.gpu(0).queued(), 0);
}

#[test]
fn far_deadlines_queued_do_not_turn_away_a_near_one_that_fits_before_them() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, FAR)),
        vec![run(1, 0, 0, 1000, S)]
    );
    // Three seconds of work queued, due in a thousand seconds.
    for r in 2..=4 {
        assert_eq!(step(&mut n, 0, arrive(r, 0, S, FAR)), vec![]);
    }
    // Earliest deadline first, a near request waits only for request 1
    // (finish 2 s), not for the queue (5 s): admitted, and run next.
    assert_eq!(step(&mut n, 0, arrive(5, 0, S, 2_500 * MS)), vec![]);
    assert_eq!(
        step(&mut n, S, finished(1, 0)),
        vec![run(5, 0, 0, 1000, 2 * S)]
    );
    assert_eq!(
        step(&mut n, 2 * S, finished(5, 0)),
        vec![run(2, 0, 0, 1000, 3 * S)]
    );
}

#[test]
fn a_near_deadline_is_not_admitted_ahead_of_one_it_would_make_late() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, FAR)),
        vec![run(1, 0, 0, 1000, S)]
    );
    // Request 2 finishes at 2 s, due at 2.2 s.
    assert_eq!(step(&mut n, 0, arrive(2, 0, S, 2_200 * MS)), vec![]);
    // Request 3 (due 2.1 s) would finish at 2 s ahead of 2, but 2 would then
    // finish at 3 s, late: 3 counts as behind 2 (finish 3 s) and is refused.
    assert_eq!(
        step(&mut n, 0, arrive(3, 0, S, 2_100 * MS)),
        vec![Command::Reject {
            request: RequestId(3),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 3 * S,
                deadline: 2_100 * MS,
            },
        }]
    );
    assert_eq!(
        step(&mut n, S, finished(1, 0)),
        vec![run(2, 0, 0, 1000, 2 * S)]
    );
}

#[test]
fn a_near_deadline_is_not_admitted_ahead_where_shares_that_do_not_pack_would_make_one_late() {
    // Three functions of 600 milli each on one GPU: two never run together.
    let mut n = NodeExecutor::new(config(1, ExecutorRules::oracle()));
    for f in 0..3 {
        n.handle(
            0,
            Event::InstanceAdded {
                function: FunctionId(f),
                profile: FunctionProfile {
                    saturation_milli: 600,
                    ..profile(Tier::Oversubscribed)
                },
            },
        );
    }
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 10 * MS, FAR)),
        vec![run(1, 0, 0, 600, 10 * MS)]
    );
    // Request 2 waits for request 1's compute: it runs 10–20 ms, due at 22 ms.
    assert_eq!(step(&mut n, 0, arrive(2, 1, 10 * MS, 22 * MS)), vec![]);
    // Request 3 (5 ms, due at 16 ms) would finish at 11 ms by the shared
    // compute ahead of 2, 2 still at 16 ms by it; but run one after another
    // (as strict EDF runs two shares that do not fit together), 2 would
    // end at 25 ms: 3 counts as behind 2 and is refused.
    assert_eq!(
        step(&mut n, 0, arrive(3, 2, 5 * MS, 16 * MS)),
        vec![Command::Reject {
            request: RequestId(3),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 17 * MS,
                deadline: 16 * MS,
            },
        }]
    );
    assert_eq!(
        step(&mut n, 10 * MS, finished(1, 0)),
        vec![run(2, 1, 0, 600, 20 * MS)]
    );
}

#[test]
fn a_request_whose_copy_is_not_ready_when_the_compute_frees_is_not_admitted_ahead() {
    let ovs = Tier::Oversubscribed;
    let mut n = node(1, ExecutorRules::gshare(), &[ovs, ovs, ovs]);
    // Function 0 runs until 10.5 s; function 1's 5 s request (due 17 s)
    // waits for the compute once loaded at 9 s.
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 6 * S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(2, 1, 5 * S, 17 * S)),
        vec![cold(1, 0, 2 * COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + 6 * S)]
    );
    assert_eq!(step(&mut n, 2 * COLD, loaded(1, 0)), vec![]);
    // Function 2's 1 s request, due 15 s, needs a load until 13.5 s. Behind
    // request 2 it would end at 16.5 s. Ahead of it, it would end at 14.5 s
    // by the estimate, but the compute frees at 10.5 s, before the load
    // ends: dispatch would run request 2 then (until 15.5 s) and this one
    // would miss. It is refused now, not after its load.
    let out = step(&mut n, 2 * COLD, arrive(3, 2, S, 15 * S));
    assert_eq!(
        out.first(),
        Some(&Command::Reject {
            request: RequestId(3),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 16_500 * MS,
                deadline: 15 * S,
            },
        }),
        "{out:?}"
    );
}

#[test]
fn a_cancelled_request_waiting_for_memory_is_dropped_unanswered() {
    let mut n = all_busy();
    assert_eq!(
        step(&mut n, 20 * S, arrive(13, 3, 100 * MS, 30 * S)),
        vec![]
    );
    assert_eq!(n.waiting(), 1);
    assert_eq!(step(&mut n, 21 * S, cancelled(13)), vec![]);
    assert_eq!(n.waiting(), 0);
    // Function 3 leaves: nothing is left of request 13 to reject.
    assert_eq!(
        step(
            &mut n,
            21 * S,
            Event::InstanceRemoved {
                function: FunctionId(3)
            }
        ),
        vec![]
    );
}

#[test]
fn waits_for_the_resident_copy_while_the_deadline_holds_else_loads_another() {
    // Without `spread` (tested below), which would load the second copy as
    // soon as request 2 waits.
    let rules = ExecutorRules {
        spread: false,
        ..ExecutorRules::gshare()
    };
    let mut n = node(2, rules, &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 2 * S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + 2 * S)]
    );
    // Waiting on GPU 0 finishes at COLD+3 s, within the deadline: it waits,
    // although a swap-in on GPU 1 would finish at COLD+1.5 s.
    assert_eq!(step(&mut n, COLD, arrive(2, 0, S, COLD + 5 * S)), vec![]);
    // A tighter deadline: waiting would miss it, so a second copy is swapped
    // in on GPU 1 (the busy copy on GPU 0 is not moved).
    assert_eq!(
        step(&mut n, COLD, arrive(3, 0, S, COLD + 2 * S)),
        vec![Command::SwapIn {
            function: FunctionId(0),
            gpu: 1,
            ready_at: COLD + SWAP_IN,
        }]
    );
    assert_eq!(
        step(&mut n, COLD + SWAP_IN, loaded(0, 1)),
        vec![run(3, 0, 1, 1000, COLD + SWAP_IN + S)]
    );
    assert_eq!(
        step(&mut n, COLD + 2 * S, finished(1, 0)),
        vec![run(2, 0, 0, 1000, COLD + 3 * S)]
    );
}

/// Two GPUs; function 0 (4 000 MiB) busy on GPU 0 until COLD + 2 s.
fn busy_on_gpu_zero(extra: &[Mib]) -> NodeExecutor {
    let mut n = node(2, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    for (i, &mem) in extra.iter().enumerate() {
        let function = FunctionId(1 + i as u32);
        n.handle(
            0,
            Event::InstanceAdded {
                function,
                profile: FunctionProfile {
                    memory_mib: mem,
                    ..profile(Tier::Oversubscribed)
                },
            },
        );
        // A request no load can serve in time: rejected, nothing loaded.
        let out = step(&mut n, 0, arrive(100 + i as u64, 1 + i as u32, S, S / 2));
        assert!(
            matches!(out.as_slice(), [Command::Reject { .. }]),
            "{out:?}"
        );
    }
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 2 * S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + 2 * S)]
    );
    n
}

#[test]
fn a_request_that_waits_on_its_copy_spreads_its_function_onto_free_gpus() {
    let mut n = busy_on_gpu_zero(&[]);
    // Request 2 waits for GPU 0 (done at COLD + 3 s, in time), and a copy is
    // swapped in on the idle GPU 1 for the next requests.
    assert_eq!(
        step(&mut n, COLD, arrive(2, 0, S, COLD + 5 * S)),
        vec![Command::SwapIn {
            function: FunctionId(0),
            gpu: 1,
            ready_at: COLD + SWAP_IN,
        }]
    );
    // One load at a time: request 3 waits too and loads nothing more; it
    // goes to the new copy, which finishes it first.
    assert_eq!(step(&mut n, COLD, arrive(3, 0, S, COLD + 2 * S)), vec![]);
    assert_eq!(
        step(&mut n, COLD + SWAP_IN, loaded(0, 1)),
        vec![run(3, 0, 1, 1000, COLD + SWAP_IN + S)]
    );
    assert_eq!(
        step(&mut n, COLD + 2 * S, finished(1, 0)),
        vec![run(2, 0, 0, 1000, COLD + 3 * S)]
    );
}

#[test]
fn spreading_keeps_free_memory_for_functions_that_have_no_copy() {
    // Functions 1 and 2 (9 000 MiB each) had requests and have no copy:
    // the 20 000 MiB free would hold them but not them and another copy
    // of function 0, so request 2 waits and nothing is loaded.
    let mut n = busy_on_gpu_zero(&[9_000, 9_000]);
    assert_eq!(step(&mut n, COLD, arrive(2, 0, S, COLD + 5 * S)), vec![]);
    // With one of them (9 000 + 4 000 ≤ 20 000 MiB free), it spreads.
    let mut n = busy_on_gpu_zero(&[9_000]);
    assert_eq!(
        step(&mut n, COLD, arrive(2, 0, S, COLD + 5 * S)),
        vec![Command::SwapIn {
            function: FunctionId(0),
            gpu: 1,
            ready_at: COLD + SWAP_IN,
        }]
    );
}

#[test]
fn under_spread_a_copy_whose_function_has_another_is_evicted_first() {
    // 4 000 MiB function 0; 8 000 MiB functions 1 and 3 (never requested,
    // so the farthest predicted next use); 4 000 MiB function 2.
    let mut n = NodeExecutor::new(config(2, ExecutorRules::gshare()));
    for (f, mem) in [(0, 4_000), (1, 8_000), (2, 4_000), (3, 8_000)] {
        n.handle(
            0,
            Event::InstanceAdded {
                function: FunctionId(f),
                profile: FunctionProfile {
                    memory_mib: mem,
                    ..profile(Tier::Oversubscribed)
                },
            },
        );
    }
    // Function 1 on GPU 0 (ready 8.5 s), 0 and 3 on GPU 1 (4.5 s, 13 s).
    for f in [1, 0, 3] {
        n.handle(
            0,
            Event::Prefetch {
                function: FunctionId(f),
            },
        );
    }
    assert_eq!(
        n.take_commands(),
        vec![
            cold(1, 0, 8_500 * MS),
            cold(0, 1, COLD),
            cold(3, 1, COLD + 8_500 * MS)
        ]
    );
    let t = 13 * S;
    for (f, g) in [(1, 0), (0, 1), (3, 1)] {
        assert_eq!(step(&mut n, t, loaded(f, g)), vec![]);
    }
    assert_eq!(
        step(&mut n, t, arrive(1, 0, 2 * S, FAR)),
        vec![run(1, 0, 1, 1000, t + 2 * S)]
    );
    // Request 2 waits for GPU 1 and spreads function 0 onto GPU 0, which
    // is then full.
    assert_eq!(
        step(&mut n, t, arrive(2, 0, S, t + 5 * S)),
        vec![Command::SwapIn {
            function: FunctionId(0),
            gpu: 0,
            ready_at: t + SWAP_IN,
        }]
    );
    assert_eq!(step(&mut n, t + SWAP_IN, loaded(0, 0)), vec![]);
    assert_eq!(
        step(&mut n, t + 2 * S, finished(1, 1)),
        vec![run(2, 0, 1, 1000, t + 3 * S)]
    );
    let _ = step(&mut n, t + 3 * S, finished(2, 1));
    // Function 2 needs 4 000 MiB on a full GPU: the copy of function 0
    // goes, although its next use is the nearest, since another copy of it
    // stays; the sole copies of functions 1 and 3 stay.
    let out = step(&mut n, t + 4 * S, arrive(3, 2, S, FAR));
    assert!(
        matches!(
            out.as_slice(),
            [
                Command::SwapOut {
                    function: FunctionId(0),
                    gpu: a,
                },
                Command::ColdStart {
                    function: FunctionId(2),
                    gpu: b,
                    ..
                },
            ] if a == b
        ),
        "{out:?}"
    );
}

#[test]
fn spreading_onto_a_full_gpu_evicts_an_idle_spare_copy_never_a_sole_one() {
    // Function 0 (4 000 MiB) and 2 (4 000 MiB) on GPU 0, function 1
    // (8 000 MiB) on GPU 1.
    let mut n = NodeExecutor::new(config(2, ExecutorRules::gshare()));
    for (f, mem) in [(0, 4_000), (1, 8_000), (2, 4_000)] {
        let function = FunctionId(f);
        let profile = FunctionProfile {
            memory_mib: mem,
            ..profile(Tier::Oversubscribed)
        };
        n.handle(0, Event::InstanceAdded { function, profile });
        n.handle(0, Event::Prefetch { function });
    }
    assert_eq!(
        n.take_commands(),
        vec![cold(0, 0, COLD), cold(1, 1, 8_500 * MS), cold(2, 0, 9 * S)]
    );
    for (t, f, g) in [(COLD, 0, 0), (8_500 * MS, 1, 1), (9 * S, 2, 0)] {
        assert_eq!(step(&mut n, t, loaded(f, g)), vec![]);
    }
    // Function 2 is delayed on GPU 0 and spreads onto GPU 1's free
    // 4 000 MiB, which fills it.
    let _ = step(&mut n, 10 * S, arrive(1, 2, 2 * S, FAR));
    assert_eq!(
        step(&mut n, 11 * S, arrive(2, 2, S, FAR)),
        vec![Command::SwapIn {
            function: FunctionId(2),
            gpu: 1,
            ready_at: 11 * S + SWAP_IN,
        }]
    );
    let _ = step(&mut n, 11 * S + SWAP_IN, loaded(2, 1));
    let _ = step(&mut n, 12 * S, finished(1, 0));
    let _ = step(&mut n, 13 * S, finished(2, 0));
    // A later request of function 2 (next use predicted at 48 s) runs on
    // GPU 0; both its copies are idle after.
    assert_eq!(
        step(&mut n, 40 * S, arrive(3, 2, S, FAR)),
        vec![run(3, 2, 0, 1000, 41 * S)]
    );
    let _ = step(&mut n, 41 * S, finished(3, 0));
    // Function 0 (next use predicted at 45 s) is delayed on GPU 0: GPU 1
    // has no free memory, but function 2's idle copy there is a spare, so
    // it goes and function 0 is swapped in; function 1's sole copy stays.
    let t = 45 * S;
    assert_eq!(
        step(&mut n, t, arrive(4, 0, 2 * S, FAR)),
        vec![run(4, 0, 0, 1000, t + 2 * S)]
    );
    assert_eq!(
        step(&mut n, t, arrive(5, 0, S, FAR)),
        vec![
            Command::SwapOut {
                function: FunctionId(2),
                gpu: 1,
            },
            Command::SwapIn {
                function: FunctionId(0),
                gpu: 1,
                ready_at: t + SWAP_IN,
            }
        ]
    );
}

#[test]
fn remaps_an_idle_instance_to_another_gpu_when_memory_is_scarce() {
    let mut n = NodeExecutor::new(config(2, ExecutorRules::gshare()));
    for (f, mem) in [(0, 4_000), (1, 4_000), (2, 10_000)] {
        n.handle(
            0,
            Event::InstanceAdded {
                function: FunctionId(f),
                profile: FunctionProfile {
                    memory_mib: mem,
                    ..profile(Tier::Oversubscribed)
                },
            },
        );
    }
    // Functions 0 and 1 on GPU 0, the big function 2 on GPU 1 (10 s + 0.5 s cold start).
    let cold2 = 10 * S + 500 * MS;
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 100 * MS, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(2, 2, 100 * MS, FAR)),
        vec![cold(2, 1, cold2)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(3, 1, 100 * MS, FAR)),
        vec![cold(1, 0, 2 * COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + 100 * MS)]
    );
    assert_eq!(step(&mut n, COLD + 100 * MS, finished(1, 0)), vec![]);
    assert_eq!(
        step(&mut n, 2 * COLD, loaded(1, 0)),
        vec![run(3, 1, 0, 1000, 2 * COLD + 100 * MS)]
    );
    assert_eq!(step(&mut n, 2 * COLD + 100 * MS, finished(3, 0)), vec![]);
    assert_eq!(
        step(&mut n, cold2, loaded(2, 1)),
        vec![run(2, 2, 1, 1000, cold2 + 100 * MS)]
    );
    assert_eq!(step(&mut n, cold2 + 100 * MS, finished(2, 1)), vec![]);
    // A long request of function 1 takes GPU 0 for 10 s.
    assert_eq!(
        step(&mut n, 20 * S, arrive(4, 1, 10 * S, FAR)),
        vec![run(4, 1, 0, 1000, 30 * S)]
    );
    // Function 0, idle on the busy GPU 0, must run by 23 s: GPU 1 has room only
    // after evicting function 2, so the copy is moved rather than duplicated.
    assert_eq!(
        step(&mut n, 21 * S, arrive(5, 0, S, 23 * S)),
        vec![
            Command::SwapOut {
                function: FunctionId(2),
                gpu: 1
            },
            Command::Move {
                function: FunctionId(0),
                from: 0,
                to: 1,
                ready_at: 21 * S + SWAP_IN,
            },
        ]
    );
    assert_eq!(n.gpu(0).resident().collect::<Vec<_>>(), vec![FunctionId(1)]);
    assert_eq!(
        step(&mut n, 21 * S + SWAP_IN, loaded(0, 1)),
        vec![run(5, 0, 1, 1000, 22 * S + SWAP_IN)]
    );
}

#[test]
fn exclusive_baseline_drops_the_lru_instance_and_cold_starts() {
    let ovs = Tier::Oversubscribed;
    let mut n = node(1, ExecutorRules::exclusive(), &[ovs, ovs]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 100 * MS, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + 100 * MS)]
    );
    assert_eq!(step(&mut n, COLD + 100 * MS, finished(1, 0)), vec![]);
    let t = 10 * S;
    assert_eq!(
        step(&mut n, t, arrive(2, 1, 100 * MS, FAR)),
        vec![
            Command::Unload {
                function: FunctionId(0),
                gpu: 0
            },
            cold(1, 0, t + COLD),
        ]
    );
    // No host cache: function 0 comes back by a cold start too.
    assert!(!n.in_host(FunctionId(0)));
}

/// Two exclusive GPUs: function 0 on GPU 0 used at 20 s, function 1 on
/// GPU 1 last used at 14.6 s; both idle at 30 s.
fn two_exclusive(rules: ExecutorRules) -> NodeExecutor {
    let ovs = Tier::Oversubscribed;
    let mut n = node(2, rules, &[ovs, ovs, ovs]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 100 * MS, FAR)),
        vec![cold(0, 0, COLD)]
    );
    step(&mut n, COLD, loaded(0, 0));
    step(&mut n, COLD + 100 * MS, finished(1, 0));
    let t = 10 * S;
    assert_eq!(
        step(&mut n, t, arrive(2, 1, 100 * MS, FAR)),
        vec![cold(1, 1, t + COLD)]
    );
    step(&mut n, t + COLD, loaded(1, 1));
    step(&mut n, t + COLD + 100 * MS, finished(2, 1));
    assert_eq!(
        step(&mut n, 20 * S, arrive(3, 0, 100 * MS, FAR)),
        vec![run(3, 0, 0, 1000, 20 * S + 100 * MS)]
    );
    step(&mut n, 20 * S + 100 * MS, finished(3, 0));
    n
}

#[test]
fn exclusive_evicts_the_least_recently_used_model_across_gpus() {
    // Function 1 on GPU 1 is the least recently used: it goes, not GPU 0's
    // function 0 (the lowest-index idle GPU).
    let mut n = two_exclusive(ExecutorRules::exclusive());
    let t = 30 * S;
    assert_eq!(
        step(&mut n, t, arrive(4, 2, 100 * MS, FAR)),
        vec![
            Command::Unload {
                function: FunctionId(1),
                gpu: 1
            },
            cold(2, 1, t + COLD),
        ]
    );
}

#[test]
fn exclusive_scale_out_evicts_the_lru_model_for_a_second_copy() {
    let mut n = two_exclusive(ExecutorRules::exclusive());
    let t = 30 * S;
    // Function 0 is busy on GPU 0 for 10 s.
    assert_eq!(
        step(&mut n, t, arrive(4, 0, 10 * S, FAR)),
        vec![run(4, 0, 0, 1000, t + 10 * S)]
    );
    // A 1 s request with a 6 s deadline: neither the wait (10 s) nor a cold
    // start (4.5 s + 1 s) on GPU 1 meets it. It is rejected, and a second
    // copy of function 0 replaces the idle function 1 on GPU 1.
    assert_eq!(
        step(&mut n, t, arrive(5, 0, S, t + 5 * S)),
        vec![
            Command::Reject {
                request: RequestId(5),
                reason: RejectReason::DeadlineUnreachable {
                    predicted_finish: t + COLD + S,
                    deadline: t + 5 * S,
                },
            },
            Command::Unload {
                function: FunctionId(1),
                gpu: 1
            },
            cold(0, 1, t + COLD),
        ]
    );
}

#[test]
fn exclusive_swap_keeps_evicted_weights_in_host_memory() {
    let mut n = two_exclusive(ExecutorRules::exclusive_swap());
    let t = 30 * S;
    assert_eq!(
        step(&mut n, t, arrive(4, 2, 100 * MS, FAR)),
        vec![
            Command::SwapOut {
                function: FunctionId(1),
                gpu: 1
            },
            cold(2, 1, t + COLD),
        ]
    );
    assert!(n.in_host(FunctionId(1)));
    step(&mut n, t + COLD, loaded(2, 1));
    step(&mut n, t + COLD + 100 * MS, finished(4, 1));
    // Function 1 comes back by a swap-in, one model per GPU: function 2
    // (one request so far, so no next use predicted) makes room, not
    // function 0 (requests 20 s apart, next one predicted at 40 s).
    let t = 40 * S;
    assert_eq!(
        step(&mut n, t, arrive(5, 1, 100 * MS, FAR)),
        vec![
            Command::SwapOut {
                function: FunctionId(2),
                gpu: 1
            },
            Command::SwapIn {
                function: FunctionId(1),
                gpu: 1,
                ready_at: t + SWAP_IN,
            },
        ]
    );
}

#[test]
fn static_slices_slow_requests_by_the_latency_model() {
    // Two slots of 6 000 MiB and 500 milli each; saturation 1000 → twice as slow.
    let mut n = node(
        1,
        ExecutorRules::static_slices(2),
        &[Tier::Guaranteed, Tier::Guaranteed],
    );
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(2, 1, S, FAR)),
        vec![cold(1, 0, 2 * COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 500, COLD + 2 * S)]
    );
    assert_eq!(
        step(&mut n, 2 * COLD, loaded(1, 0)),
        vec![run(2, 1, 0, 500, 2 * COLD + 2 * S)]
    );
}

#[test]
fn timer_rejects_queued_requests_that_became_hopeless() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    step(&mut n, 0, arrive(1, 0, 5 * S, FAR));
    assert_eq!(step(&mut n, 0, arrive(2, 0, S, 6 * S)), vec![]);
    assert_eq!(step(&mut n, S, Event::Timer), vec![]);
    // A lost finish report leaves request 1 holding the GPU; at 5.5 s
    // request 2 cannot finish by 6 s any more.
    assert_eq!(
        step(&mut n, 5_500 * MS, Event::Timer),
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::DeadlineMissedInQueue {
                earliest_finish: 6_500 * MS,
                deadline: 6 * S,
            },
        }]
    );
}

#[test]
fn removed_function_rejects_its_queue_and_unloads() {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(
            &mut n,
            S,
            Event::InstanceRemoved {
                function: FunctionId(0)
            }
        ),
        vec![
            Command::Reject {
                request: RequestId(1),
                reason: RejectReason::UnknownFunction
            },
            Command::Unload {
                function: FunctionId(0),
                gpu: 0
            },
        ]
    );
    assert_eq!(n.gpu(0).free_mib(), 12_000);
    assert_eq!(n.host_used_mib(), 0);
    assert_eq!(
        step(&mut n, S, arrive(2, 0, S, FAR)),
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::UnknownFunction
        }]
    );
}

#[test]
fn prefetch_loads_onto_free_memory_only() {
    let ovs = Tier::Oversubscribed;
    let mut n = node(1, ExecutorRules::gshare(), &[ovs, ovs, ovs, ovs]);
    let pre = |f: u32| Event::Prefetch {
        function: FunctionId(f),
    };
    assert_eq!(step(&mut n, 0, pre(0)), vec![cold(0, 0, COLD)]);
    assert_eq!(step(&mut n, 0, pre(0)), vec![]);
    assert_eq!(step(&mut n, 0, pre(1)), vec![cold(1, 0, 2 * COLD)]);
    assert_eq!(step(&mut n, 0, pre(2)), vec![cold(2, 0, 3 * COLD)]);
    // The GPU is full: no eviction for a prefetch.
    assert_eq!(step(&mut n, 0, pre(3)), vec![]);
}

#[test]
fn a_rejected_request_warms_one_more_copy_in_free_memory() {
    let mut n = node(2, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 10 * S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + 10 * S)]
    );
    let too_late = |r: u64| Command::Reject {
        request: RequestId(r),
        reason: RejectReason::DeadlineUnreachable {
            predicted_finish: COLD + SWAP_IN + 100 * MS,
            deadline: COLD + 200 * MS,
        },
    };
    // Neither waiting (10 s) nor a swap-in (0.5 s) meets a 200 ms deadline:
    // rejected, and a second copy is swapped in on GPU 1 for what follows.
    assert_eq!(
        step(&mut n, COLD, arrive(2, 0, 100 * MS, COLD + 200 * MS)),
        vec![
            too_late(2),
            Command::SwapIn {
                function: FunctionId(0),
                gpu: 1,
                ready_at: COLD + SWAP_IN,
            },
        ]
    );
    // One warm-up at a time.
    assert_eq!(
        step(&mut n, COLD, arrive(3, 0, 100 * MS, COLD + 200 * MS)),
        vec![too_late(3)]
    );
}

/// An instance of `memory_mib` that finishes its running request at `busy_until`.
fn busy_instance(function: u32, memory_mib: Mib, busy_until: Micros) -> gpu::Instance {
    gpu::Instance {
        function: FunctionId(function),
        tier: Tier::Oversubscribed,
        mem_mib: memory_mib,
        reserved_compute: None,
        loaded: true,
        ready_at: 0,
        running: 1,
        queued: 0,
        queued_us: 0,
        busy_until,
        last_used: 0,
        removing: false,
        batch_ppm: 0,
        held: 0,
        unpinned: false,
        batch_share: 0,
    }
}

#[test]
fn memory_frees_when_enough_instances_are_idle_whatever_their_order() {
    let rules = ExecutorRules::gshare();
    let mut g = GpuExecutor::new(0, 12_000);
    // Held in an order unlike their idle times: 8 s, 2 s, 5 s, 3 s.
    for (f, (mib, at)) in [
        (4_000, 8 * S),
        (1_000, 2 * S),
        (3_000, 5 * S),
        (2_000, 3 * S),
    ]
    .into_iter()
    .enumerate()
    {
        g.add_instance(busy_instance(f as u32, mib, at));
    }
    let mut scratch = Vec::new();
    // 2 000 MiB free: +1 000 at 2 s, +2 000 at 3 s, +3 000 at 5 s, +4 000 at 8 s.
    let at =
        |need, g: &GpuExecutor, scratch: &mut Vec<_>| g.memory_free_at(S, need, &rules, scratch);
    assert_eq!(at(2_000, &g, &mut scratch), Some(S));
    assert_eq!(at(3_000, &g, &mut scratch), Some(2 * S));
    assert_eq!(at(5_000, &g, &mut scratch), Some(3 * S));
    assert_eq!(at(6_000, &g, &mut scratch), Some(5 * S));
    assert_eq!(at(8_000, &g, &mut scratch), Some(5 * S));
    assert_eq!(at(8_001, &g, &mut scratch), Some(8 * S));
    assert_eq!(at(12_000, &g, &mut scratch), Some(8 * S));
    assert_eq!(at(12_001, &g, &mut scratch), None);
}

/// One GPU under gshare with `functions` functions of saturation 600,
/// each prefetched and loaded by `2 × COLD` (the returned time).
fn sixty_percent_shares(functions: u32) -> (NodeExecutor, Micros) {
    let mut n = NodeExecutor::new(config(1, ExecutorRules::gshare()));
    for f in 0..functions {
        let profile = FunctionProfile {
            saturation_milli: 600,
            ..profile(Tier::Oversubscribed)
        };
        let function = FunctionId(f);
        n.handle(0, Event::InstanceAdded { function, profile });
        n.handle(0, Event::Prefetch { function });
    }
    let colds: Vec<_> = (0..functions)
        .map(|f| cold(f, 0, Micros::from(f + 1) * COLD))
        .collect();
    assert_eq!(n.take_commands(), colds);
    for f in 0..functions {
        assert_eq!(
            step(&mut n, Micros::from(f + 1) * COLD, loaded(f, 0)),
            vec![]
        );
    }
    (n, 2 * COLD)
}

#[test]
fn alone_on_an_idle_gpu_a_loose_request_takes_its_whole_share_and_its_solo_time() {
    let (mut n, t) = sixty_percent_shares(1);
    // 2 ms of work with 5 s to spare: right-sized it would run 1 s on 1 milli.
    assert_eq!(
        step(&mut n, t, arrive(1, 0, 2 * MS, t + 5 * S)),
        vec![run(1, 0, 0, 600, t + 2 * MS)]
    );
    // A second one squeezes onto the 400 milli left, as before.
    assert_eq!(
        step(&mut n, t, arrive(2, 0, 2 * MS, t + 5 * S)),
        vec![run(2, 0, 0, 400, t + 3 * MS)]
    );
}

#[test]
fn beside_another_function_a_loose_request_is_right_sized_and_leaves_room() {
    let (mut n, t) = sixty_percent_shares(2);
    // 200 ms on 600 milli within 95 % of 1 s: ⌈200 000 × 600 / 950 000⌉ = 127
    // milli, ⌈200 000 × 600 / 127⌉ µs.
    assert_eq!(
        step(&mut n, t, arrive(1, 0, 200 * MS, t + S)),
        vec![run(1, 0, 0, 127, t + 944_882)]
    );
    // The other function's tight request still finds its whole share free
    // (on 400 milli it would take 150 ms, past its deadline).
    assert_eq!(
        step(&mut n, t, arrive(2, 1, 100 * MS, t + 105 * MS)),
        vec![run(2, 1, 0, 600, t + 100 * MS)]
    );
}

#[test]
fn a_joiner_of_a_right_sized_batch_takes_its_extra_work_at_the_batchs_rate() {
    // One GPU, functions 0 and 1 of saturation 600 batching at 5 % per
    // extra sequence.
    let mut n = NodeExecutor::new(config(1, ExecutorRules::gshare()));
    for f in 0..2 {
        let function = FunctionId(f);
        let profile = FunctionProfile {
            saturation_milli: 600,
            batch_ppm: 50_000,
            ..profile(Tier::Oversubscribed)
        };
        n.handle(0, Event::InstanceAdded { function, profile });
        n.handle(0, Event::Prefetch { function });
    }
    let _ = n.take_commands();
    let t = 2 * COLD;
    for f in 0..2 {
        let _ = step(&mut n, t, loaded(f, 0));
    }
    // Right-sized beside function 1: 127 milli (see above).
    assert_eq!(
        step(&mut n, t, arrive(1, 0, 200 * MS, t + S)),
        vec![run(1, 0, 0, 127, t + 944_882)]
    );
    // A joiner: 210 ms batched, stepping at 127 of 600 milli, so
    // ⌈210 000 × 600 / 127⌉ µs; its extra work takes 5 % of the batch's
    // 127 milli (7), not 5 % of 600 (30).
    assert_eq!(
        step(&mut n, t, arrive(2, 0, 200 * MS, t + 2 * S)),
        vec![run(2, 0, 0, 7, t + 992_126)]
    );
}

#[test]
fn a_batch_right_sizes_for_the_joiners_its_functions_arrivals_predict() {
    // One GPU, functions 0 and 1 of saturation 600 batching at 5 %.
    let mut n = NodeExecutor::new(config(1, ExecutorRules::gshare()));
    for f in 0..2 {
        let function = FunctionId(f);
        let profile = FunctionProfile {
            saturation_milli: 600,
            batch_ppm: 50_000,
            ..profile(Tier::Oversubscribed)
        };
        n.handle(0, Event::InstanceAdded { function, profile });
        n.handle(0, Event::Prefetch { function });
    }
    let _ = n.take_commands();
    let t = 2 * COLD;
    for f in 0..2 {
        let _ = step(&mut n, t, loaded(f, 0));
    }
    // No arrivals to go by: the floor, 127 milli (see above).
    assert_eq!(
        step(&mut n, t, arrive(1, 0, 200 * MS, t + S)),
        vec![run(1, 0, 0, 127, t + 944_882)]
    );
    let _ = step(&mut n, t + 944_882, finished(1, 0));
    // Requests every 200 ms (rejected at once: due on arrival).
    for k in 1..5 {
        let at = t + k * 200 * MS;
        let out = step(&mut n, at, arrive(10 + k, 0, 200 * MS, at));
        assert!(
            matches!(out.as_slice(), [Command::Reject { .. }]),
            "{out:?}"
        );
    }
    // Function 0's requests come 200 ms apart on average: within
    // 95 % of the 1 s left, 4 joiners are expected, a batch of 5 members
    // (200 ms × 1.2) right-sized to 152 milli; capped where 7 batches of
    // 127 milli, each with room for a 7-milli joiner, still fit: 135.
    let t = t + S;
    assert_eq!(
        step(&mut n, t, arrive(2, 0, 200 * MS, t + S)),
        vec![run(2, 0, 0, 135, t + 888_889)]
    );
}

#[test]
fn a_right_sized_request_is_planned_at_most_eight_times_slower() {
    let (mut n, t) = sixty_percent_shares(2);
    // 2 ms with 5 s to spare: ⌈600 / 8⌉ = 75 milli, 16 ms, not 1 milli and 1.2 s.
    assert_eq!(
        step(&mut n, t, arrive(1, 0, 2 * MS, t + 5 * S)),
        vec![run(1, 0, 0, 75, t + 16 * MS)]
    );
}

#[test]
fn last_arrival_is_the_latest_request_of_a_placed_function() {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    assert_eq!(n.last_arrival(FunctionId(0)), None);
    n.handle(2 * S, arrive(1, 0, S, FAR));
    n.handle(3 * S, arrive(2, 0, S, FAR));
    assert_eq!(n.last_arrival(FunctionId(0)), Some(3 * S));
    n.handle(
        4 * S,
        Event::InstanceRemoved {
            function: FunctionId(0),
        },
    );
    assert_eq!(n.last_arrival(FunctionId(0)), None);
    assert_eq!(n.last_arrival(FunctionId(7)), None);
}

#[test]
fn a_measured_runtime_start_times_every_load_of_its_function() {
    // Functions 0 and 1 on one GPU (room for both); function 0's runtime
    // (a microVM) measured 2.1 s per start.
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed; 2]);
    let boot = 2_100 * MS;
    let measured = Event::StartMeasured {
        function: FunctionId(0),
        start_us: boot,
    };
    assert_eq!(step(&mut n, 0, measured), vec![]);
    // Its cold start takes the measured boot, not setup + bytes / bandwidth;
    // function 1 keeps the bandwidth model.
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, 100 * MS, FAR)),
        vec![cold(0, 0, boot)]
    );
    assert_eq!(
        step(&mut n, 0, arrive(2, 1, 100 * MS, FAR)),
        vec![cold(1, 0, boot + COLD)]
    );
    // A measurement for an unknown function changes nothing.
    let unknown = Event::StartMeasured {
        function: FunctionId(9),
        start_us: 1,
    };
    assert_eq!(step(&mut n, 0, unknown), vec![]);
}

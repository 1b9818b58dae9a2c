//! Pinning: the region's reservation is the executor's input. A pinned
//! function is loaded only on the GPUs the region reserved for it; a
//! `burstable` or `oversubscribed` one may ask for another GPU
//! ([`Command::Reserve`]) and moves only once it is granted, then releases
//! the source ([`Command::Release`]); `exclusive` and `guaranteed` ones
//! never ask.

use super::*;

fn reserve(f: u32, from: u32, to: u32) -> Command {
    Command::Reserve {
        function: FunctionId(f),
        from,
        to,
    }
}

fn release(f: u32, gpu: u32) -> Command {
    Command::Release {
        function: FunctionId(f),
        gpu,
    }
}

fn reserved(f: u32, from: u32, to: u32, granted: bool) -> Event {
    Event::Reserved {
        function: FunctionId(f),
        from,
        to,
        granted,
    }
}

/// Two GPUs; function 0 of `tier` pinned to GPU 1, loaded there and busy
/// with request 1 until `COLD + S`. Its weights are in host memory.
fn busy_on_gpu1(tier: Tier) -> NodeExecutor {
    let mut n = node(2, ExecutorRules::gshare(), &[tier]);
    n.pin(0, FunctionId(0), &[1]);
    assert_eq!(n.take_commands(), vec![]);
    // GPU 0 is the first pristine GPU, but the function is pinned to GPU 1.
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, FAR)),
        vec![cold(0, 1, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 1)),
        vec![run(1, 0, 1, 1000, COLD + S)]
    );
    n
}

#[test]
fn a_pinned_function_runs_only_on_its_gpus() {
    // Unpinned, a request the busy copy cannot serve in time gets a second
    // copy on the free GPU 0 (a swap-in from host memory).
    let mut free = node(2, ExecutorRules::gshare(), &[Tier::Guaranteed]);
    step(&mut free, 0, arrive(1, 0, S, FAR));
    step(&mut free, COLD, loaded(0, 0));
    let out = step(&mut free, COLD, arrive(2, 0, S, COLD + S + SWAP_IN));
    assert!(
        out.contains(&Command::SwapIn {
            function: FunctionId(0),
            gpu: 1,
            ready_at: COLD + SWAP_IN
        }),
        "{out:?}"
    );
    // Pinned and guaranteed: it never shares beyond its GPU, and never asks
    // to move; the request that cannot wait is turned away.
    let mut n = busy_on_gpu1(Tier::Guaranteed);
    let out = step(&mut n, COLD, arrive(2, 0, S, COLD + S + SWAP_IN));
    assert_eq!(
        out,
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: COLD + 2 * S,
                deadline: COLD + S + SWAP_IN,
            },
        }]
    );
    assert_eq!(n.gpu(0).resident().count(), 0);
    // Exclusive likewise.
    let mut n = busy_on_gpu1(Tier::Exclusive);
    let out = step(&mut n, COLD, arrive(2, 0, S, COLD + S + SWAP_IN));
    assert!(
        out.iter().all(|c| matches!(c, Command::Reject { .. })),
        "{out:?}"
    );
    assert_eq!(n.gpu(0).resident().count(), 0);
    assert_eq!(n.reserving(FunctionId(0)), None);
}

#[test]
fn a_granted_remap_moves_then_releases_the_source() {
    let mut n = busy_on_gpu1(Tier::Burstable);
    // GPU 0 would serve it sooner: the executor asks, and moves nothing yet.
    let out = step(&mut n, COLD, arrive(2, 0, S, COLD + S + SWAP_IN));
    assert_eq!(out[0], reserve(0, 1, 0), "{out:?}");
    assert!(
        out[1..].iter().all(|c| matches!(c, Command::Reject { .. })),
        "{out:?}"
    );
    assert_eq!(n.reserving(FunctionId(0)), Some((1, 0)));
    assert_eq!(n.gpu(0).resident().count(), 0);
    // Granted while the copy is busy: GPU 0 is pinned, GPU 1 is left once
    // the copy is idle, and only then released.
    assert_eq!(
        step(&mut n, COLD + 10 * MS, reserved(0, 1, 0, true)),
        vec![]
    );
    assert_eq!(n.pins(FunctionId(0)), Some(&[0][..]));
    assert_eq!(n.reserving(FunctionId(0)), None);
    assert_eq!(
        step(&mut n, COLD + S, finished(1, 1)),
        vec![swap_out(0, 1), release(0, 1)]
    );
    // The next request loads on GPU 0 (a swap-in: weights in host memory).
    let t = COLD + 2 * S;
    assert_eq!(
        step(&mut n, t, arrive(3, 0, S, FAR)),
        vec![Command::SwapIn {
            function: FunctionId(0),
            gpu: 0,
            ready_at: t + SWAP_IN
        }]
    );
}

#[test]
fn a_granted_remap_of_an_idle_copy_is_a_move() {
    let mut n = busy_on_gpu1(Tier::Oversubscribed);
    let out = step(&mut n, COLD, arrive(2, 0, S, COLD + S + SWAP_IN));
    assert_eq!(out[0], reserve(0, 1, 0), "{out:?}");
    assert_eq!(step(&mut n, COLD + S, finished(1, 1)), vec![]);
    let t = COLD + S + 5 * MS;
    assert_eq!(
        step(&mut n, t, reserved(0, 1, 0, true)),
        vec![
            Command::Move {
                function: FunctionId(0),
                from: 1,
                to: 0,
                ready_at: t + SWAP_IN,
            },
            release(0, 1),
        ]
    );
    assert_eq!(n.gpu(1).resident().count(), 0);
    assert_eq!(n.gpu(0).resident().collect::<Vec<_>>(), vec![FunctionId(0)]);
    assert_eq!(step(&mut n, t + SWAP_IN, arrive(3, 0, S, FAR)), vec![]);
    assert_eq!(
        step(&mut n, t + SWAP_IN, loaded(0, 0)),
        vec![run(3, 0, 0, 1000, t + SWAP_IN + S)]
    );
}

#[test]
fn a_refused_reservation_moves_nothing_and_is_not_asked_again_at_once() {
    let mut n = busy_on_gpu1(Tier::Burstable);
    let out = step(&mut n, COLD, arrive(2, 0, S, COLD + S + SWAP_IN));
    assert_eq!(out[0], reserve(0, 1, 0));
    assert_eq!(step(&mut n, COLD + MS, reserved(0, 1, 0, false)), vec![]);
    assert_eq!(n.pins(FunctionId(0)), Some(&[1][..]));
    assert_eq!(n.gpu(1).resident().collect::<Vec<_>>(), vec![FunctionId(0)]);
    // Within the back-off the same situation asks nothing.
    let out = step(&mut n, COLD + 2 * MS, arrive(3, 0, S, COLD + S + SWAP_IN));
    assert!(
        out.iter().all(|c| matches!(c, Command::Reject { .. })),
        "{out:?}"
    );
    // After the back-off it asks again; an ask left unanswered is given up
    // after the timeout (nothing moved meanwhile).
    let t = COLD + 2 * S;
    step(&mut n, t, finished(1, 1));
    let out = step(&mut n, t, arrive(4, 0, 10 * S, FAR));
    assert_eq!(out, vec![run(4, 0, 1, 1000, t + 10 * S)]);
    let out = step(&mut n, t + MS, arrive(5, 0, S, t + 2 * S + SWAP_IN));
    assert_eq!(out[0], reserve(0, 1, 0), "{out:?}");
    assert_eq!(n.reserving(FunctionId(0)), Some((1, 0)));
    assert_eq!(
        step(&mut n, t + MS + RESERVE_TIMEOUT_US, Event::Timer),
        vec![]
    );
    assert_eq!(n.reserving(FunctionId(0)), None);
}

#[test]
fn a_gpu_dropped_from_the_pins_is_left_once_idle() {
    let mut n = busy_on_gpu1(Tier::Oversubscribed);
    // The region moved the reservation to GPU 0 (e.g. after a restart):
    // the busy copy finishes its request, then leaves.
    n.pin(COLD, FunctionId(0), &[0]);
    assert_eq!(n.take_commands(), vec![]);
    assert_eq!(
        step(&mut n, COLD + S, finished(1, 1)),
        vec![swap_out(0, 1), release(0, 1)]
    );
    // Re-pinned where a copy still runs: it stays.
    let mut n = busy_on_gpu1(Tier::Oversubscribed);
    n.pin(COLD, FunctionId(0), &[0]);
    n.pin(COLD, FunctionId(0), &[0, 1]);
    assert_eq!(n.take_commands(), vec![]);
    assert_eq!(step(&mut n, COLD + S, finished(1, 1)), vec![]);
    assert_eq!(n.gpu(1).resident().collect::<Vec<_>>(), vec![FunctionId(0)]);
}

/// Two GPUs, two `guaranteed` functions pinned to GPU 0: function 1 runs
/// there until `COLD + 10 s`; function 0's 1 s request 2 (due `due`) is
/// queued behind it once its copy is loaded, then the region moves
/// function 0 to GPU 1 (its copy on GPU 0 stays for the request). Returns
/// the node and the time it is at.
fn queued_behind_then_moved(due: Micros) -> (NodeExecutor, Micros) {
    let g = Tier::Guaranteed;
    let mut n = node(2, ExecutorRules::gshare(), &[g, g]);
    n.pin(0, FunctionId(0), &[0]);
    n.pin(0, FunctionId(1), &[0]);
    assert_eq!(n.take_commands(), vec![]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 1, 10 * S, FAR)),
        vec![cold(1, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(1, 0)),
        vec![run(1, 1, 0, 1000, COLD + 10 * S)]
    );
    let load = step(&mut n, COLD, arrive(2, 0, S, due));
    let [Command::ColdStart {
        gpu: 0, ready_at, ..
    }] = load[..]
    else {
        panic!("{load:?}")
    };
    assert_eq!(step(&mut n, ready_at, loaded(0, 0)), vec![]);
    assert_eq!(n.gpu(0).queued(), 1);
    n.pin(ready_at, FunctionId(0), &[1]);
    assert_eq!(n.take_commands(), vec![]);
    (n, ready_at)
}

#[test]
fn a_copy_that_waited_only_for_a_cancelled_request_leaves_the_gpu_dropped_from_its_pins() {
    let (mut n, now) = queued_behind_then_moved(FAR);
    // Its queued request is cancelled: the copy leaves now.
    let out = step(&mut n, now, cancelled(2));
    assert!(out.contains(&release(0, 0)), "{out:?}");
    assert!(!n.gpu(0).resident().any(|f| f == FunctionId(0)));
}

#[test]
fn a_copy_that_waited_only_for_a_request_turned_away_leaves_the_gpu_dropped_from_its_pins() {
    // Function 0's request is due 2 s after request 1's predicted end.
    let due = COLD + 12 * S;
    let (mut n, _) = queued_behind_then_moved(due);
    // Request 1 overruns: past `due - 1 s` request 2 cannot make it, and the
    // tick turns it away; function 0's copy has nothing left on GPU 0.
    let out = step(&mut n, due - S + 1, Event::Timer);
    assert!(
        matches!(
            out[0],
            Command::Reject {
                request: RequestId(2),
                ..
            }
        ),
        "{out:?}"
    );
    assert!(out.contains(&release(0, 0)), "{out:?}");
    assert!(!n.gpu(0).resident().any(|f| f == FunctionId(0)));
}

#[test]
fn a_function_not_held_is_not_pinned() {
    let mut n = node(2, ExecutorRules::gshare(), &[Tier::Guaranteed]);
    n.pin(0, FunctionId(7), &[1]);
    assert_eq!(n.pins(FunctionId(7)), None);
    assert_eq!(n.take_commands(), vec![]);
    // A held one is.
    n.pin(0, FunctionId(0), &[1]);
    assert_eq!(n.pins(FunctionId(0)), Some(&[1][..]));
}

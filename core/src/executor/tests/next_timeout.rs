//! [`NodeExecutor::next_timeout`]: a [`Event::Timer`] before it changes
//! nothing, and one at it does what is due, so a caller that sleeps until
//! it (instead of polling) sees the same decisions at the same moments.

use super::*;

/// Ticks a copy of `n` one µs before its next timeout (nothing happens),
/// then ticks `n` at it; returns that time and what the tick did.
fn tick_at_timeout(n: &mut NodeExecutor) -> (Micros, Vec<Command>) {
    let due = n.next_timeout().expect("a timeout is set");
    let mut early = n.clone();
    assert_eq!(
        step(&mut early, due - 1, Event::Timer),
        vec![],
        "a tick 1 µs before the timeout at {due} did something"
    );
    (due, step(n, due, Event::Timer))
}

#[test]
fn nothing_queued_needs_no_tick() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    assert_eq!(n.next_timeout(), None);
    step(&mut n, 0, arrive(1, 0, 5 * S, FAR));
    // Running only: its finish is an event, not a timeout.
    assert_eq!(n.next_timeout(), None);
    step(&mut n, 5 * S, finished(1, 0));
    assert_eq!(n.next_timeout(), None);
}

#[test]
fn a_queued_request_is_due_when_it_can_no_longer_finish_in_time() {
    let mut n = node(1, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    step(&mut n, 0, arrive(1, 0, 5 * S, FAR));
    assert_eq!(step(&mut n, 0, arrive(2, 0, S, 6 * S)), vec![]);
    // Request 2 (1 s) finishes by 6 s while it starts by 5 s.
    assert_eq!(n.next_timeout(), Some(5 * S + 1));
    let (due, out) = tick_at_timeout(&mut n);
    assert_eq!(due, 5 * S + 1);
    assert_eq!(
        out,
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::DeadlineMissedInQueue {
                earliest_finish: 6 * S + 1,
                deadline: 6 * S,
            },
        }]
    );
    assert_eq!(n.next_timeout(), None);
}

#[test]
fn a_request_queued_behind_a_load_is_due_by_its_deadline_not_the_load() {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, 10 * S)),
        vec![cold(0, 0, COLD)]
    );
    // The load ends at 4.5 s: the request is hopeless only after 9 s.
    assert_eq!(n.next_timeout(), Some(9 * S + 1));
    // The load is reported late (a stuck copy): at 9 s + 1 µs it is given up.
    let (_, out) = tick_at_timeout(&mut n);
    assert_eq!(
        out,
        vec![Command::Reject {
            request: RequestId(1),
            reason: RejectReason::DeadlineMissedInQueue {
                earliest_finish: 10 * S + 1,
                deadline: 10 * S,
            },
        }]
    );
    assert_eq!(n.next_timeout(), None);
}

#[test]
fn the_earliest_of_several_queues_comes_first() {
    let mut n = node(2, ExecutorRules::oracle(), &[Tier::Oversubscribed]);
    step(&mut n, 0, arrive(1, 0, 5 * S, FAR));
    step(&mut n, 0, arrive(2, 0, 5 * S, FAR));
    assert_eq!(step(&mut n, 0, arrive(3, 0, S, 8 * S)), vec![]);
    assert_eq!(step(&mut n, 0, arrive(4, 0, 2 * S, 7 * S)), vec![]);
    assert_eq!(n.next_timeout(), Some(5 * S + 1));
    let (_, out) = tick_at_timeout(&mut n);
    assert!(
        matches!(
            out[..],
            [Command::Reject {
                request: RequestId(4),
                ..
            }]
        ),
        "{out:?}"
    );
    assert_eq!(n.next_timeout(), Some(7 * S + 1));
    let (_, out) = tick_at_timeout(&mut n);
    assert!(
        matches!(
            out[..],
            [Command::Reject {
                request: RequestId(3),
                ..
            }]
        ),
        "{out:?}"
    );
}

#[test]
fn a_waiting_request_driven_only_by_its_timeouts_is_rejected_at_the_exact_moment() {
    let mut n = all_busy();
    // Function 3 waits for function 0 to be idle at 25 s: load until
    // 29.5 s, finish 29.6 s ≤ 30 s.
    assert_eq!(
        step(&mut n, 20 * S, arrive(13, 3, 100 * MS, 30 * S)),
        vec![]
    );
    assert_eq!(n.waiting(), 1);
    // Conservative: it may have slipped only once 0.4 s have passed.
    assert_eq!(n.next_timeout(), Some(20_400 * MS + 1));
    // The finish of function 0 is never reported: once past 25 s every µs
    // pushes the prediction one µs later, past the deadline after 25.4 s.
    // Ticking only at the timeouts finds that moment exactly.
    let mut ticks = 0;
    let (due, out) = loop {
        let (due, out) = tick_at_timeout(&mut n);
        ticks += 1;
        assert!(ticks < 100, "no progress at {due}");
        if !out.is_empty() {
            break (due, out);
        }
        assert_eq!(n.waiting(), 1);
        assert!(n.next_timeout() > Some(due), "the timeout moved on");
    };
    assert_eq!(due, 25_400 * MS + 1);
    assert_eq!(
        out,
        vec![Command::Reject {
            request: RequestId(13),
            reason: RejectReason::DeadlineMissedInQueue {
                earliest_finish: 30 * S + 1,
                deadline: 30 * S,
            },
        }]
    );
    assert_eq!(n.waiting(), 0);
}

#[test]
fn an_unanswered_reservation_is_due_at_its_timeout() {
    let mut n = node(2, ExecutorRules::gshare(), &[Tier::Burstable]);
    n.pin(0, FunctionId(0), &[1]);
    step(&mut n, 0, arrive(1, 0, S, FAR));
    step(&mut n, COLD, loaded(0, 1));
    let t = COLD + 2 * S;
    step(&mut n, t, finished(1, 1));
    step(&mut n, t, arrive(2, 0, 100 * S, FAR));
    // Behind a 100 s request on GPU 1, GPU 0 would serve it sooner.
    let out = step(&mut n, t + MS, arrive(3, 0, S, FAR));
    assert_eq!(
        out,
        vec![Command::Reserve {
            function: FunctionId(0),
            from: 1,
            to: 0
        }]
    );
    assert_eq!(n.next_timeout(), Some(t + MS + RESERVE_TIMEOUT_US));
    let (_, out) = tick_at_timeout(&mut n);
    assert_eq!(out, vec![]);
    assert_eq!(n.reserving(FunctionId(0)), None);
    // Request 3 stays queued until it is hopeless at FAR - 1 s + 1 µs.
    assert_eq!(n.next_timeout(), Some(FAR - S + 1));
}

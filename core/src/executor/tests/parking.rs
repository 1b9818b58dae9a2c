//! Parked functions (warm resume): released by the region, their host
//! copy kept, revived with a swap-in.

use super::*;

fn parked(f: u32) -> Event {
    Event::InstanceParked {
        function: FunctionId(f),
    }
}

fn added(f: u32) -> Event {
    Event::InstanceAdded {
        function: FunctionId(f),
        profile: profile(Tier::Oversubscribed),
    }
}

/// Function 0 cold-started on GPU 0, served request 1 and is idle at `COLD + S`.
fn served_once() -> NodeExecutor {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    assert_eq!(
        step(&mut n, 0, arrive(1, 0, S, FAR)),
        vec![cold(0, 0, COLD)]
    );
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + S)]
    );
    assert_eq!(step(&mut n, COLD + S, finished(1, 0)), vec![]);
    n
}

#[test]
fn a_parked_function_keeps_its_host_copy_takes_no_request_and_resumes_with_a_swap_in() {
    let mut n = served_once();
    let t = COLD + 2 * S;
    assert_eq!(
        step(&mut n, t, parked(0)),
        vec![Command::Unload {
            function: FunctionId(0),
            gpu: 0
        }]
    );
    assert_eq!(n.gpu(0).free_mib(), 12_000);
    assert_eq!(n.host_used_mib(), 4_000);
    assert!(n.in_host(FunctionId(0)));
    assert_eq!(n.parked().collect::<Vec<_>>(), vec![(FunctionId(0), 4_000)]);
    // Parked: like a removed function for requests.
    assert_eq!(
        step(&mut n, t, arrive(2, 0, S, FAR)),
        vec![Command::Reject {
            request: RequestId(2),
            reason: RejectReason::UnknownFunction
        }]
    );
    // Revived: the first load is a swap-in.
    assert_eq!(step(&mut n, t + S, added(0)), vec![]);
    assert_eq!(n.parked().count(), 0);
    assert_eq!(
        step(&mut n, t + S, arrive(3, 0, S, FAR)),
        vec![Command::SwapIn {
            function: FunctionId(0),
            gpu: 0,
            ready_at: t + S + SWAP_IN,
        }]
    );
    assert_eq!(n.host_used_mib(), 4_000);
}

#[test]
fn removing_a_parked_function_forgets_its_host_copy() {
    let mut n = served_once();
    step(&mut n, COLD + 2 * S, parked(0));
    assert_eq!(
        step(
            &mut n,
            COLD + 3 * S,
            Event::InstanceRemoved {
                function: FunctionId(0)
            }
        ),
        vec![]
    );
    assert_eq!(n.host_used_mib(), 0);
    assert_eq!(n.parked().count(), 0);
    assert!(!n.in_host(FunctionId(0)));
    // Added again, it is a new function: a cold start.
    step(&mut n, COLD + 3 * S, added(0));
    assert_eq!(
        step(&mut n, COLD + 3 * S, arrive(2, 0, S, FAR)),
        vec![cold(0, 0, COLD + 3 * S + COLD)]
    );
}

#[test]
fn without_a_host_cache_parking_is_removing() {
    let mut n = node(1, ExecutorRules::exclusive(), &[Tier::Oversubscribed]);
    step(&mut n, 0, arrive(1, 0, S, FAR));
    step(&mut n, COLD, loaded(0, 0));
    step(&mut n, COLD + S, finished(1, 0));
    step(&mut n, COLD + 2 * S, parked(0));
    assert_eq!(n.parked().count(), 0);
    assert_eq!(n.host_used_mib(), 0);
}

#[test]
fn a_busy_parked_copy_unloads_when_its_request_finishes() {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    step(&mut n, 0, arrive(1, 0, S, FAR));
    assert_eq!(
        step(&mut n, COLD, loaded(0, 0)),
        vec![run(1, 0, 0, 1000, COLD + S)]
    );
    // Parked while request 1 runs: the copy stays until it finishes.
    assert_eq!(step(&mut n, COLD + 100 * MS, parked(0)), vec![]);
    assert_eq!(n.parked().count(), 1);
    assert_eq!(
        step(&mut n, COLD + S, finished(1, 0)),
        vec![Command::Unload {
            function: FunctionId(0),
            gpu: 0
        }]
    );
    assert_eq!(n.gpu(0).free_mib(), 12_000);
    assert_eq!(n.parked().collect::<Vec<_>>(), vec![(FunctionId(0), 4_000)]);
}

#[test]
fn a_parked_host_copy_is_dropped_least_recently_used_first_when_host_memory_is_needed() {
    let mut c = config(1, ExecutorRules::gshare());
    c.host_memory_mib = 10_000;
    let mut n = NodeExecutor::new(c);
    for f in 0..3 {
        n.handle(0, added(f));
    }
    // Functions 0 then 1 cold-start, serve and are parked (8 000 of 10 000 MiB).
    let mut t = 0;
    for f in 0..2u32 {
        step(&mut n, t, arrive(u64::from(f), f, S, FAR));
        step(&mut n, t + COLD, loaded(f, 0));
        step(&mut n, t + COLD + S, finished(u64::from(f), 0));
        step(&mut n, t + COLD + S, parked(f));
        t += COLD + 2 * S;
    }
    assert_eq!(n.host_used_mib(), 8_000);
    assert_eq!(n.parked().count(), 2);
    // Function 2's cold start needs host memory: function 0, invoked
    // longest ago, loses its copy and is forgotten.
    assert_eq!(
        step(&mut n, t, arrive(9, 2, S, FAR)),
        vec![cold(2, 0, t + COLD)]
    );
    assert_eq!(n.parked().collect::<Vec<_>>(), vec![(FunctionId(1), 4_000)]);
    assert_eq!(n.host_used_mib(), 8_000);
    assert!(!n.in_host(FunctionId(0)));
    // A revival of function 0 now is a new function: a cold start.
    step(&mut n, t, added(0));
    assert!(!n.in_host(FunctionId(0)));
}

#[test]
fn a_host_copy_moved_to_a_fresh_id_resumes_there_and_a_late_answer_for_the_old_id_changes_nothing()
{
    let mut n = served_once();
    let t = COLD + 2 * S;
    step(&mut n, t, parked(0));
    assert!(n.move_host_copy(FunctionId(0), FunctionId(1)));
    assert_eq!(n.parked().collect::<Vec<_>>(), vec![(FunctionId(1), 4_000)]);
    assert!(!n.in_host(FunctionId(0)));
    assert_eq!(n.host_used_mib(), 4_000);
    // Nothing is left to move from 0, and an id in use takes no move.
    assert!(!n.move_host_copy(FunctionId(0), FunctionId(2)));
    assert!(!n.move_host_copy(FunctionId(1), FunctionId(1)));
    // A late load answer for the old id finds nothing of it.
    assert_eq!(step(&mut n, t, loaded(0, 0)), vec![]);
    // Revived under the new id: a swap-in; the old id takes no request.
    assert_eq!(step(&mut n, t + S, added(1)), vec![]);
    assert_eq!(n.parked().count(), 0);
    assert_eq!(
        step(&mut n, t + S, arrive(3, 1, S, FAR)),
        vec![Command::SwapIn {
            function: FunctionId(1),
            gpu: 0,
            ready_at: t + S + SWAP_IN,
        }]
    );
    assert_eq!(
        step(&mut n, t + S, arrive(4, 0, S, FAR)),
        vec![Command::Reject {
            request: RequestId(4),
            reason: RejectReason::UnknownFunction
        }]
    );
    assert_eq!(n.host_used_mib(), 4_000);
}

#[test]
fn a_busy_old_copy_unloads_under_its_old_id_after_the_host_copy_moved() {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    step(&mut n, 0, arrive(1, 0, S, FAR));
    step(&mut n, COLD, loaded(0, 0));
    // Parked while request 1 runs, then moved: the busy copy stays under 0.
    assert_eq!(step(&mut n, COLD + 100 * MS, parked(0)), vec![]);
    assert!(n.move_host_copy(FunctionId(0), FunctionId(1)));
    assert_eq!(n.parked().collect::<Vec<_>>(), vec![(FunctionId(1), 4_000)]);
    assert_eq!(
        step(&mut n, COLD + S, finished(1, 0)),
        vec![Command::Unload {
            function: FunctionId(0),
            gpu: 0
        }]
    );
    assert_eq!(n.gpu(0).free_mib(), 12_000);
    // Old id gone for good; the host copy is the new id's.
    assert!(!n.move_host_copy(FunctionId(0), FunctionId(2)));
    assert_eq!(n.parked().collect::<Vec<_>>(), vec![(FunctionId(1), 4_000)]);
    assert_eq!(n.host_used_mib(), 4_000);
    step(&mut n, COLD + S, added(1));
    assert_eq!(
        step(&mut n, COLD + S, arrive(2, 1, S, FAR)),
        vec![Command::SwapIn {
            function: FunctionId(1),
            gpu: 0,
            ready_at: COLD + S + SWAP_IN,
        }]
    );
}

/// A node agent's life: every hosting under a fresh id (pinned, served,
/// then removed, or parked and revived under the next id), beside one
/// function hosted all along. The node keeps state for what it holds, not
/// for every id it ever saw (it used to keep a slot per id, and its timer
/// scanned them all).
#[test]
fn fresh_ids_per_hosting_leave_only_the_functions_held() {
    let mut n = node(1, ExecutorRules::gshare(), &[Tier::Oversubscribed]);
    let mut t = 0;
    let mut r = 0;
    let mut serve = |n: &mut NodeExecutor, f: u32, t: &mut Micros| {
        r += 1;
        let out = step(n, *t, arrive(r, f, S, *t + FAR));
        if out.iter().any(|c| matches!(c, Command::Run { .. })) {
            *t += S;
        } else {
            *t += COLD + SWAP_IN;
            step(n, *t, loaded(f, 0));
            *t += S;
        }
        step(n, *t, finished(r, 0));
    };
    let mut id = 1;
    while id < 3_000 {
        if id % 100 == 0 {
            serve(&mut n, 0, &mut t);
        }
        step(&mut n, t, added(id));
        n.pin(t, FunctionId(id), &[0]);
        serve(&mut n, id, &mut t);
        if id % 2 == 0 {
            step(
                &mut n,
                t,
                Event::InstanceRemoved {
                    function: FunctionId(id),
                },
            );
            id += 1;
        } else {
            // Parked, then revived under the next id (the agent's resume).
            step(&mut n, t, parked(id));
            assert!(n.move_host_copy(FunctionId(id), FunctionId(id + 1)));
            id += 1;
        }
        assert!(
            n.functions_held() <= 2,
            "after id {id}: {}",
            n.functions_held()
        );
    }
    assert!(n.pins(FunctionId(1)).is_none());
    assert_eq!(n.next_timeout(), None);
    // Function 0 (hosted by `node` from the start) and the parked last id.
    assert_eq!(
        n.parked().collect::<Vec<_>>(),
        vec![(FunctionId(3_000), 4_000)]
    );
    assert_eq!(n.functions_held(), 2);
}

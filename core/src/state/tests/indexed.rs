//! The index over free capacity picks what the full scan picks, and the
//! overlay of pending plans plans as if they were applied: a property test
//! over random places, deletes and reservations on a small region of mixed
//! pools (strict ones too), tiers, quotas and swap. (While plans are pending every write is
//! one of them, as in the scheduler: another writer's change to a node
//! with a pending plan shows only after a release, see `PendingPlans`.)

use super::*;
use proptest::prelude::*;

/// (tier, compute, memory) of the shapes the test deploys.
const SHAPES: [(Tier, u32, u64); 8] = [
    (Tier::Guaranteed, 250, 4_096),
    (Tier::Burstable, 500, 2_048),
    (Tier::Guaranteed, 100, 1_024),
    (Tier::Oversubscribed, 100, 6_144),
    (Tier::Exclusive, 1_000, 8_192),
    (Tier::Guaranteed, 600, 12_288),
    (Tier::Burstable, 300, 8_192),
    (Tier::Oversubscribed, 50, 12_000),
];

/// The pool preferences drawn: the three kinds, and the strict ones.
const PREFS: u8 = 7;

fn pref(p: u8) -> PoolPreference {
    match p % PREFS {
        0 => PoolPreference::Any,
        1 => PoolPreference::Center,
        2 => PoolPreference::Edge("edge-a".into()),
        3 => PoolPreference::Edge("edge-b".into()),
        4 => PoolPreference::EdgeOnly("edge-a".into()),
        5 => PoolPreference::EdgeOnly("edge-b".into()),
        _ => PoolPreference::CenterOnly,
    }
}

fn shape_spec(i: usize, tenant: u8, shape: u8, p: u8) -> FunctionSpec {
    let (tier, c, m) = SHAPES[shape as usize % SHAPES.len()];
    let mut f = spec(
        ["acme", "globex"][tenant as usize % 2],
        &format!("f{i}"),
        tier,
        c,
        m,
    );
    f.pool = pref(p);
    f
}

/// The proposal (or the rejection) of a plan, for comparing.
fn outcome(r: Result<(Proposal, PlanMetric), Box<PlanRejection>>) -> Result<Proposal, String> {
    r.map(|(p, _)| p).map_err(|e| format!("{e:?}"))
}

fn check(steps: &[(u8, u8, u8, u8)]) {
    let mut s = region();
    let shapes = || SHAPES.iter().map(|(_, c, m)| (*c, *m, 1));
    let fgd = FgdRanking::from_shapes(shapes());
    let gshare = GshareRanking::from_shapes(shapes());
    let rankings: [&dyn Ranking; 3] = [&BestFit, &fgd, &gshare];
    let mut pending = PendingPlans::default();
    // The reserved plans: (ticket, the command that applies them).
    let mut reserved: Vec<(Vec<PlanTicket>, DomainCommand)> = Vec::new();
    let mut names: Vec<FunctionSpec> = Vec::new();
    for (i, &(op, tenant, shape, p)) in steps.iter().enumerate() {
        let f = shape_spec(i, tenant, shape, p);
        let ranking = rankings[usize::from(op % 3)];
        // On the applied view: the index picks what the scan picks.
        let full = outcome(plan_on(&s, None, &f, ranking, &PlanOptions::default()));
        let indexed = outcome(plan_on(&s, None, &f, ranking, &PlanOptions::indexed()));
        assert_eq!(indexed, full, "step {i}: {f:?}");
        // A strict preference never leaves its pools.
        if let Ok(p) = &full {
            assert!(
                f.pool.allows(&p.pool, p.pool_kind),
                "step {i}: {p} for {f:?}"
            );
        }
        // Around the pending plans: as on a copy with them applied.
        let mut applied = s.clone();
        for (_, cmd) in &reserved {
            applied
                .apply(cmd.clone(), T0)
                .unwrap_or_else(|e| panic!("step {i}: a pending plan does not apply: {e}"));
        }
        let on_copy = outcome(plan_on(
            &applied,
            None,
            &f,
            ranking,
            &PlanOptions::default(),
        ));
        for options in [PlanOptions::default(), PlanOptions::indexed()] {
            let around = outcome(plan_on(&s, Some(&pending), &f, ranking, &options));
            assert_eq!(
                around, on_copy,
                "step {i} around pending ({options:?}): {f:?}"
            );
        }
        // Every write passes through the overlay while plans are pending
        // (as in the scheduler): a place reserves, a delete waits.
        let op = match op % 10 {
            0..=5 if !reserved.is_empty() => 8,
            6 | 7 if !reserved.is_empty() => 9,
            op => op,
        };
        match op {
            0..=5 => {
                // Place it.
                if let Ok(p) = full {
                    let cmd = DomainCommand::FunctionCreate {
                        spec: f.clone(),
                        placements: vec![p.slices],
                    };
                    s.apply(cmd, T0).unwrap_or_else(|e| panic!("step {i}: {e}"));
                    names.push(f);
                }
            }
            6 | 7 => {
                // Delete a placed function.
                if !names.is_empty() {
                    let g = names.remove(usize::from(shape) % names.len());
                    ok(
                        &mut s,
                        DomainCommand::FunctionDelete {
                            tenant: g.tenant,
                            name: g.name,
                        },
                    );
                }
            }
            8 => {
                // Reserve it around the pending plans, without applying.
                if let Ok(p) = on_copy {
                    let cmd = DomainCommand::FunctionCreate {
                        spec: f.clone(),
                        placements: vec![p.slices],
                    };
                    let tickets = pending.reserve_command(&s, &cmd);
                    assert_eq!(tickets.len(), 1);
                    reserved.push((tickets, cmd));
                    names.push(f);
                }
            }
            _ => {
                // Commit the reserved plans, then release them.
                for (_, cmd) in &reserved {
                    s.apply(cmd.clone(), T0)
                        .unwrap_or_else(|e| panic!("step {i}: {e}"));
                }
                for (tickets, _) in reserved.drain(..) {
                    for t in tickets {
                        pending.release(&s, t);
                    }
                }
                assert!(pending.is_empty());
                assert_eq!(pending.nodes(), 0);
            }
        }
        // The index is kept in step on apply (a rebuilt one is equal).
        s.check_invariants()
            .unwrap_or_else(|e| panic!("step {i}: {e}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn indexed_plans_pick_what_the_full_scan_picks(
        steps in prop::collection::vec((0u8..10, 0u8..2, 0u8..8, 0u8..PREFS), 1..80)
    ) {
        check(&steps);
    }
}

#[test]
fn a_full_region_falls_back_to_the_scans_rejection() {
    // Fill the center with exclusive instances, then ask for more.
    let steps: Vec<(u8, u8, u8, u8)> = (0..8).map(|_| (0, 0, 4, 1)).collect();
    check(&steps);
}

/// `NODES` with a third center node `c3` (after `c2`): every edge node's
/// position moves up by one, and `eb1`'s old position is `ea1`'s now.
fn with_c3() -> Topology {
    let c2 = "[[pools.nodes]]\nname = \"c2\"";
    let c3 = "[[pools.nodes]]\nname = \"c3\"\ncpu_milli = 8_000\nmemory_mib = 65_536\nswap_mib = 8_192\ngpus = [{ model = \"g16\", count = 2 }]\n\n";
    let nodes = NODES.replace(c2, &format!("{c3}{c2}"));
    assert_ne!(nodes, NODES);
    topology(&format!("{nodes}{PRICES}"))
}

/// A plan reserved on `eb1`, with a topology reload (another writer)
/// shifting `eb1`'s position to another pool's node while it commits.
/// Returns the state after the reload and the pending plans.
fn reserved_across_a_reload(
    f: &FunctionSpec,
) -> (RegionState, PendingPlans, Vec<PlanTicket>, DomainCommand) {
    let mut s = region();
    deploy(&mut s, f.clone());
    let (p, _) = plan_on(&s, None, f, &BestFit, &PlanOptions::indexed()).unwrap();
    assert_eq!(p.slices[0].gpu, gpu("eb1", 0));
    let before = s.node_position(&NodeId("eb1".into()));
    let mut pending = PendingPlans::default();
    let cmd = p.command();
    let tickets = pending.reserve_command(&s, &cmd);
    assert_eq!(tickets.len(), 1);
    ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: with_c3(),
        },
    );
    // `eb1`'s old position now holds `ea1`, a node of pool edge-a.
    let old = before.unwrap();
    assert_eq!(s.node_name_at(old), Some(&NodeId("ea1".into())));
    (s, pending, tickets, cmd)
}

fn edge_b_spec(name: &str, strict: bool) -> FunctionSpec {
    let mut f = spec("acme", name, Tier::Guaranteed, 300, 2_048);
    f.pool = if strict {
        PoolPreference::EdgeOnly("edge-b".into())
    } else {
        PoolPreference::Edge("edge-b".into())
    };
    f
}

#[test]
fn a_release_after_a_reload_leaves_no_overlay_entry_behind() {
    let f = edge_b_spec("f", false);
    let (mut s, mut pending, tickets, cmd) = reserved_across_a_reload(&f);
    // The batch commits (it names `eb1`, wherever it sits now), then is
    // released.
    ok(&mut s, cmd);
    for t in tickets {
        pending.release(&s, t);
    }
    assert!(pending.is_empty());
    assert_eq!(pending.nodes(), 0);
    // Every GPU filed by the overlay was taken out with its class (the
    // pool it was filed under, not the pool its position has now).
    assert_eq!(pending.free().classes().count(), 0, "{:?}", pending.free());
    // So an indexed plan around the (empty) pending plans picks what the
    // scan picks: `eb1`, not the node now at its old position.
    let full = indexed_as_full_scan(&mut s, &pending);
    assert_eq!(full.unwrap().slices[0].gpu, gpu("eb1", 0));
}

/// Deploys a strict edge-b function `g` on `s` and plans it around
/// `pending` by the full scan and by the index: they must agree; the full
/// scan's plan.
fn indexed_as_full_scan(s: &mut RegionState, pending: &PendingPlans) -> Result<Proposal, String> {
    let g = edge_b_spec("g", true);
    deploy(s, g.clone());
    let plan = |options: &PlanOptions| outcome(plan_on(s, Some(pending), &g, &BestFit, options));
    let full = plan(&PlanOptions::default());
    assert_eq!(plan(&PlanOptions::indexed()), full);
    full
}

#[test]
fn an_overlay_from_before_a_reload_never_names_a_node_of_another_pool() {
    let f = edge_b_spec("f", false);
    let (mut s, pending, _, _) = reserved_across_a_reload(&f);
    // While the plan is still pending, a strict edge-b function: the
    // overlay's entry for `eb1` was filed under edge-b at a position that
    // is `ea1`'s (edge-a) now.
    let full = indexed_as_full_scan(&mut s, &pending);
    let p = full.unwrap();
    assert_eq!(p.pool, "edge-b", "{p}");
}

//! The checker: a run's [`History`](super::history::History) against the
//! replicas' final state, their meters and the agents' journals. Every
//! check is a pure function of that data, so each is unit-tested on a
//! made-up history that breaks it.
//!
//! | invariant | check |
//! |---|---|
//! | acked writes present, definite failures absent (tenants) | [`tenants`] |
//! | a function's final state is one its deployer's history allows | [`functions`] |
//! | quotas and GPU capacity held on every sampled state | [`samples`] |
//! | successes ≤ billed invocations ≤ successes + unknown outcomes | [`billing`] |
//! | the region's meter = the sum of the agents' journals | [`meter`] |
//! | the healed cluster served a new write and an invocation | [`served_after_heal`] |
//!
//! The function check treats each function as a register written only by
//! its deployer, one op at a time: starting from "absent", an ok deploy or
//! update sets the value (`deadline_ms`), an ok delete sets "absent", a
//! definite failure changes nothing, and an unknown op adds its value to
//! the possible ones (it may have taken effect). The final value must be
//! possible. Raft keeps this sound for an unknown op that takes effect
//! late: its entry commits before any later entry of the same log or never.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use gshare_core::config::Usage;
use gshare_core::model::TenantId;
use gshare_core::state::RegionState;

use super::history::{excerpt, Op, OpKind, Outcome};

/// One broken invariant, with the excerpt of the history that shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub invariant: &'static str,
    /// What was found.
    pub detail: String,
    /// The ops involved and the faults overlapping them.
    pub excerpt: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VIOLATION [{}]: {}\n{}",
            self.invariant, self.detail, self.excerpt
        )
    }
}

fn violation(
    ops: &[Op],
    invariant: &'static str,
    detail: String,
    involved: impl Fn(&Op) -> bool,
) -> Violation {
    Violation {
        invariant,
        detail,
        excerpt: excerpt(ops, involved),
    }
}

/// Every tenant created ok exists with its display name; none whose every
/// attempt was refused exists.
pub fn tenants(ops: &[Op], state: &RegionState) -> Vec<Violation> {
    let mut out = Vec::new();
    for op in ops.iter().filter(|o| o.kind == OpKind::CreateTenant) {
        let have = state.tenant(&TenantId(op.target.clone()));
        let want = format!("v-{}", op.target);
        let bad = match (&op.outcome, have) {
            (Outcome::Ok(_), None) => Some("acknowledged, missing".to_string()),
            (Outcome::Ok(_), Some(t)) if t.display_name.as_deref() != Some(want.as_str()) => {
                Some(format!("acknowledged, display name {:?}", t.display_name))
            }
            (Outcome::Fail(code), Some(_)) => Some(format!("refused ({code}), yet it exists")),
            _ => None,
        };
        if let Some(detail) = bad {
            out.push(violation(
                ops,
                "acked writes present, definite failures absent",
                format!("tenant {}: {detail}", op.target),
                |o| o.kind == OpKind::CreateTenant && o.target == op.target,
            ));
        }
    }
    out
}

/// What a function may be at the end: absent (`None`) or deployed with
/// this `deadline_ms`.
type Register = Option<u64>;

fn written(op: &Op) -> Option<Register> {
    match op.kind {
        OpKind::Deploy | OpKind::Update => op
            .args
            .split_whitespace()
            .find_map(|a| a.strip_prefix("deadline_ms="))
            .and_then(|v| v.parse().ok())
            .map(Some),
        OpKind::Delete => Some(None),
        _ => None,
    }
}

/// Every function of `tenant` (targets `tenant/name`) ends in a state its
/// history allows (see the module's docs), and every function of the
/// tenant in the state was deployed by some client (`except` names those
/// made outside the history).
pub fn functions(ops: &[Op], state: &RegionState, tenant: &str, except: &[&str]) -> Vec<Violation> {
    let id = TenantId(tenant.to_string());
    let mut by_name: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        if let Some(name) = op.target.strip_prefix(&format!("{tenant}/")) {
            if written(op).is_some() {
                by_name.entry(name).or_default().push(op);
            }
        }
    }
    let mut out = Vec::new();
    for (name, history) in &by_name {
        let mut possible: BTreeSet<Register> = BTreeSet::from([None]);
        for op in history {
            let value = written(op).expect("filtered above");
            match op.outcome {
                Outcome::Ok(_) => possible = BTreeSet::from([value]),
                Outcome::Unknown(_) => {
                    possible.insert(value);
                }
                Outcome::Fail(_) => {}
            }
        }
        let have: Register = state.function(&id, name).ok().map(|f| f.spec.deadline_ms);
        if !possible.contains(&have) {
            let show =
                |r: &Register| r.map_or("absent".to_string(), |d| format!("deadline_ms={d}"));
            out.push(violation(
                ops,
                "acked writes present, definite failures absent",
                format!(
                    "function {tenant}/{name} is {} after healing; its history allows only {:?}",
                    show(&have),
                    possible.iter().map(show).collect::<Vec<_>>()
                ),
                |o| o.target == format!("{tenant}/{name}"),
            ));
        }
    }
    for f in state.functions_of(&id) {
        let name = f.spec.name.as_str();
        if !by_name.contains_key(name) && !except.contains(&name) {
            out.push(violation(
                ops,
                "acked writes present, definite failures absent",
                format!("function {tenant}/{name} exists but no client deployed it"),
                |_| false,
            ));
        }
    }
    out
}

/// No sampled state broke quotas or GPU capacity.
pub fn samples(ops: &[Op]) -> Vec<Violation> {
    ops.iter()
        .filter(|o| o.kind == OpKind::Sample && !o.outcome.is_ok())
        .map(|o| {
            let at = o.start_ms;
            violation(
                ops,
                "quota and GPU capacity never exceeded on a sampled state",
                format!("{} at {at} ms: {}", o.target, o.outcome),
                |x| {
                    std::ptr::eq(x, o)
                        || (x.end_ms + 2_000 >= at && x.start_ms <= at && x.kind != OpKind::Invoke)
                },
            )
        })
        .collect()
}

/// Invocation outcomes of the history (client-side count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Invocations {
    /// Ok.
    pub ok: u64,
    /// Definitely failed (nothing ran, nothing billed).
    pub failed: u64,
    /// Unknown.
    pub unknown: u64,
}

/// Counts the invocation ops.
pub fn invocations(ops: &[Op]) -> Invocations {
    let mut n = Invocations::default();
    for o in ops.iter().filter(|o| o.kind == OpKind::Invoke) {
        match o.outcome {
            Outcome::Ok(_) => n.ok += 1,
            Outcome::Fail(_) => n.failed += 1,
            Outcome::Unknown(_) => n.unknown += 1,
        }
    }
    n
}

/// Each key billed at most once, every success billed: `ok ≤ billed ≤ ok +
/// unknown + known`, where `known` counts the double runs [`runs`] let
/// pass (the window docs/chaos.md names; 0 outside it).
pub fn billing(ops: &[Op], billed: u64, known: u64) -> Vec<Violation> {
    let n = invocations(ops);
    let most = n.ok + n.unknown + known;
    if billed >= n.ok && billed <= most {
        return Vec::new();
    }
    let detail = format!(
        "the region bills {billed} invocations; clients saw {} ok, {} unknown, {} definitely failed, {known} known double runs (allowed {}..={most})",
        n.ok,
        n.unknown,
        n.failed,
        n.ok,
    );
    // Too many: the ops that could be double-billed are those with more
    // than one attempt; too few: a success went unbilled.
    let many = billed > most;
    vec![violation(
        ops,
        "every successful invocation billed exactly once",
        detail,
        |o| {
            o.kind == OpKind::Invoke
                && if many {
                    o.attempts > 1
                } else {
                    o.outcome.is_ok() && o.attempts > 1
                }
        },
    )]
}

/// What the agents' journals (read offline after the run) say of each
/// invocation key: how many journals hold its billed answer.
pub type Runs = BTreeMap<String, u32>;

/// Per key, from the journals: every ok invocation ran (and was billed)
/// at least once, no definitely failed one ran, and the region bills
/// exactly the runs the journals hold. A key that ran on two agents is a
/// double run, a violation unless the key had an unknown attempt and
/// either `strict` is off or the op is in the window docs/chaos.md names
/// (an agent fault overlapped it: the key's node can be declared not ready
/// and its instance moved between the attempts, so the retry's node is
/// another); such a key is returned as known.
pub fn runs(ops: &[Op], runs: &Runs, billed: u64, strict: bool) -> (Vec<Violation>, Vec<String>) {
    let mut out = Vec::new();
    let mut known = Vec::new();
    const INV: &str = "every successful invocation billed exactly once";
    let agent_faults: Vec<&Op> = ops
        .iter()
        .filter(|f| {
            f.kind == OpKind::Fault
                && matches!(
                    f.target.as_str(),
                    "IsolateAgent" | "SlowAgent" | "KillAgent"
                )
        })
        .collect();
    for o in ops.iter().filter(|o| o.kind == OpKind::Invoke) {
        let n = runs.get(&o.target).copied().unwrap_or(0);
        let had_unknown = o.trail.iter().any(|t| t.contains("UNKNOWN"));
        let moved = agent_faults
            .iter()
            .any(|f| f.start_ms <= o.end_ms && o.start_ms <= f.end_ms);
        let bad = match &o.outcome {
            Outcome::Ok(_) if n == 0 => Some("answered ok, billed nowhere".to_string()),
            Outcome::Fail(code) if n > 0 => {
                Some(format!("definitely failed ({code}), yet billed {n} times"))
            }
            _ if n > 1 && !(had_unknown && (!strict || moved)) => {
                Some(format!("one key ran and was billed on {n} agents"))
            }
            _ if n > 1 => {
                known.push(o.target.clone());
                None
            }
            _ => None,
        };
        if let Some(detail) = bad {
            out.push(violation(
                ops,
                INV,
                format!("{}: {detail}", o.target),
                |x| std::ptr::eq(x, o),
            ));
        }
    }
    let held: u64 = runs.values().map(|n| u64::from(*n)).sum();
    if held != billed {
        out.push(Violation {
            invariant: INV,
            detail: format!(
                "the region bills {billed} invocations, the journals hold {held} keyed answers"
            ),
            excerpt: String::new(),
        });
    }
    (out, known)
}

/// The region's meter for `tenant` equals the sum of the agents' journals.
pub fn meter(tenant: &str, region: &Usage, journals: &[(String, Usage)]) -> Vec<Violation> {
    let mut sum = Usage::default();
    for (_, u) in journals {
        sum = match sum.checked_add(u) {
            Some(s) => s,
            None => {
                return vec![Violation {
                    invariant: "agents' journals equal the region's meter",
                    detail: format!("{tenant}: the journals' sum overflows: {journals:?}"),
                    excerpt: String::new(),
                }]
            }
        };
    }
    if &sum == region {
        return Vec::new();
    }
    vec![Violation {
        invariant: "agents' journals equal the region's meter",
        detail: format!("{tenant}: region {region:?}, journals {journals:?} (sum {sum:?})"),
        excerpt: String::new(),
    }]
}

/// The probes after healing (client `probe`) all succeeded.
pub fn served_after_heal(ops: &[Op]) -> Vec<Violation> {
    let probes: Vec<&Op> = ops.iter().filter(|o| o.client == "probe").collect();
    let mut out: Vec<Violation> = probes
        .iter()
        .filter(|o| !o.outcome.is_ok())
        .map(|o| {
            violation(
                ops,
                "the cluster serves new writes and invocations after healing",
                format!("{} {} -> {}", o.kind, o.target, o.outcome),
                |x| x.client == "probe",
            )
        })
        .collect();
    for kind in [OpKind::CreateTenant, OpKind::Invoke] {
        if !probes.iter().any(|o| o.kind == kind) {
            out.push(Violation {
                invariant: "the cluster serves new writes and invocations after healing",
                detail: format!("no {kind} probe was run"),
                excerpt: String::new(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: &str, kind: OpKind, target: &str, args: &str, t: u64, outcome: Outcome) -> Op {
        Op {
            client: client.into(),
            kind,
            target: target.into(),
            args: args.into(),
            start_ms: t,
            end_ms: t + 10,
            attempts: 1,
            trail: Vec::new(),
            outcome,
        }
    }

    fn ok() -> Outcome {
        Outcome::Ok(String::new())
    }

    #[test]
    fn the_register_check_allows_unknowns_and_catches_lies() {
        let state = RegionState::default();
        let deployed = [op(
            "d",
            OpKind::Deploy,
            "acme/f",
            " deadline_ms=300",
            0,
            ok(),
        )];
        // Acknowledged, missing from the final state.
        let v = functions(&deployed, &state, "acme", &[]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("absent"), "{}", v[0]);
        assert!(v[0].excerpt.contains("acme/f"), "{}", v[0]);
        // Unknown: absent is allowed; refused: absent is required.
        for outcome in [
            Outcome::Unknown("t".into()),
            Outcome::Fail("quota_exceeded".into()),
        ] {
            let h = [op(
                "d",
                OpKind::Deploy,
                "acme/f",
                " deadline_ms=300",
                0,
                outcome,
            )];
            assert!(functions(&h, &state, "acme", &[]).is_empty());
        }
        // Deployed then deleted ok: absent is right.
        let h = [
            deployed[0].clone(),
            op("d", OpKind::Delete, "acme/f", "", 20, ok()),
        ];
        assert!(functions(&h, &state, "acme", &[]).is_empty());
    }

    #[test]
    fn tenants_acked_must_exist_and_refused_must_not() {
        let state = RegionState::default();
        let h = [op("a", OpKind::CreateTenant, "t1", "", 0, ok())];
        assert_eq!(tenants(&h, &state).len(), 1);
        let h = [op(
            "a",
            OpKind::CreateTenant,
            "t1",
            "",
            0,
            Outcome::Fail("x".into()),
        )];
        assert!(tenants(&h, &state).is_empty());
    }

    #[test]
    fn billing_bounds_are_successes_and_unknowns() {
        let h = [
            op("i", OpKind::Invoke, "k1", "", 0, ok()),
            op(
                "i",
                OpKind::Invoke,
                "k2",
                "",
                10,
                Outcome::Unknown("t".into()),
            ),
            op(
                "i",
                OpKind::Invoke,
                "k3",
                "",
                20,
                Outcome::Fail("no_agent".into()),
            ),
        ];
        assert!(billing(&h, 1, 0).is_empty());
        assert!(billing(&h, 2, 0).is_empty());
        assert_eq!(billing(&h, 0, 0).len(), 1, "a success unbilled");
        assert_eq!(
            billing(&h, 3, 0).len(),
            1,
            "billed beyond what clients caused"
        );
        assert!(billing(&h, 3, 1).is_empty(), "a known double run");
    }

    #[test]
    fn each_key_runs_once_where_it_answered() {
        let mut retried = op("i", OpKind::Invoke, "k1", "", 0, ok());
        retried.trail = vec!["r1 UNKNOWN 502 outcome_unknown".into(), "r1 ok".into()];
        let h = [
            retried,
            op("i", OpKind::Invoke, "k2", "", 10, ok()),
            op(
                "i",
                OpKind::Invoke,
                "k3",
                "",
                20,
                Outcome::Fail("no_agent".into()),
            ),
        ];
        let runs =
            |v: &[(&str, u32)]| -> Runs { v.iter().map(|(k, n)| (k.to_string(), *n)).collect() };
        let fine = runs(&[("k1", 1), ("k2", 1)]);
        assert_eq!(super::runs(&h, &fine, 2, true), (vec![], vec![]));
        // The region bills what the journals do not hold.
        assert_eq!(super::runs(&h, &fine, 3, true).0.len(), 1);
        // A definite failure that ran.
        let failed_ran = runs(&[("k1", 1), ("k2", 1), ("k3", 1)]);
        assert_eq!(super::runs(&h, &failed_ran, 3, true).0.len(), 1);
        // A success that ran nowhere.
        assert!(!super::runs(&h, &runs(&[("k1", 1)]), 1, true).0.is_empty());
        // A double run after an unknown attempt: known unless strict.
        let twice = runs(&[("k1", 2), ("k2", 1)]);
        assert_eq!(
            super::runs(&h, &twice, 3, false),
            (vec![], vec!["k1".to_string()])
        );
        assert_eq!(super::runs(&h, &twice, 3, true).0.len(), 1);
        // Strict: known only while an agent fault overlapped the op.
        let mut cut = op("nemesis", OpKind::Fault, "IsolateAgent", "", 0, ok());
        cut.end_ms = 3;
        let mut moved = h.to_vec();
        moved.push(cut.clone());
        assert_eq!(
            super::runs(&moved, &twice, 3, true),
            (vec![], vec!["k1".to_string()])
        );
        cut.target = "KillFollower".into();
        moved.pop();
        moved.push(cut);
        assert_eq!(super::runs(&moved, &twice, 3, true).0.len(), 1);
        // A double run without an unknown attempt is never known.
        let twice = runs(&[("k1", 1), ("k2", 2)]);
        assert_eq!(super::runs(&h, &twice, 3, false).0.len(), 1);
    }

    #[test]
    fn the_meter_must_equal_the_journals() {
        let u = |i| Usage {
            compute_milli_gpu_ms: 10 * i,
            memory_mib_ms: 100 * i,
            invocations: i,
        };
        let journals = vec![("a".to_string(), u(1)), ("b".to_string(), u(2))];
        assert!(meter("g", &u(3), &journals).is_empty());
        assert_eq!(meter("g", &u(4), &journals).len(), 1);
    }

    #[test]
    fn probes_must_succeed_and_exist() {
        assert_eq!(served_after_heal(&[]).len(), 2);
        let h = [
            op("probe", OpKind::CreateTenant, "p", "", 0, ok()),
            op(
                "probe",
                OpKind::Invoke,
                "k",
                "",
                0,
                Outcome::Unknown("t".into()),
            ),
        ];
        assert_eq!(served_after_heal(&h).len(), 1);
    }
}

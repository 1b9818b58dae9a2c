//! Broken config files: every mistake of a file comes out at once, each
//! with its line and column, key path and offending value.

use gshare_core::config::{ConfigError, IssueKind, Tenants, Topology};

/// A topology with sixteen mistakes (marked `# <-`).
const BROKEN_TOPOLOGY: &str = r#"
regin = "hz"                          # <- unknown key

[[gpu_models]]
name = "A10"
memory_mib = "lots"                   # <- wrong type
h2d_mib_per_s = 22_000

[[gpu_models]]
name = "A10"                          # <- duplicate
memory_mib = 24_576
h2d_mib_per_s = 0                     # <- out of range

[cold_start]
setup_us = 1_000_000
storage_mib_per_s = 1_000

[swap]
setup_us = 5_000

[[pools]]
name = "center"
kind = "cloud"                        # <- not a pool kind

[[pools.nodes]]
name = "n0"
cpu_milli = 8_000
memory_mib = 16_384
swap_mib = 4_096
gpus = [{ model = "A10", count = 2 }]

[[pools.nodes]]
name = "n1"
memory_mib = 16_384                   # <- cpu_milli missing (reported at the node)
swap_mib = 4_096
gpus = [{ model = "A10", cout = 2 }]  # <- unknown key `cout`, and `count` missing

[[pools]]
name = "edge-1"
kind = "edge"

[[pools.nodes]]
name = "n0"                           # <- duplicate node name
cpu_milli = -4                        # <- negative
memory_mib = 8_192
swap_mib = 9_000                      # <- more than memory_mib
gpus = [{ model = "H900", count = 1 }] # <- unknown GPU model

[[pools.nodes]]
name = "n2"
cpu_milli = 4_000
memory_mib = 8_192
swap_mib = 0
gpus = [{ model = "A10", count = 1 }]  # (A10, edge) has no price

[pricing]
currency = "USD"
unit = "micro-USD"
units_per_currency = 1_000_000

[pricing.tiers]
exclusive = { discount_bp = 0 }
guaranteed = { discount_bp = 1_500 }
burstable = { discount_bp = 12_000 }       # <- over 10000 bp
oversubscribed = { discount_bp = 1_000 }   # <- less than guaranteed's 1500

[[pricing.prices]]
gpu_model = "A10"
pool_kind = "center"
gpu_hour = 700_000
memory_gib_hour = 12_500

[[pricing.prices]]
gpu_model = "B200"                    # <- unknown GPU model
pool_kind = "center"
gpu_hour = 1
memory_gib_hour = 1
"#;

fn issue_lines(e: &ConfigError) -> Vec<String> {
    e.to_string().lines().map(str::to_string).collect()
}

/// Asserts that some line of the error mentions `path` (as `: path:`) and
/// contains every fragment.
fn has(lines: &[String], path: &str, fragments: &[&str]) {
    let key = format!(": {path}: ");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&key) && fragments.iter().all(|f| l.contains(f))),
        "no line for {path} with {fragments:?} in:\n{}",
        lines.join("\n")
    );
}

#[test]
fn a_broken_topology_reports_every_mistake_at_once() {
    let e = Topology::from_toml("topology.toml", BROKEN_TOPOLOGY).unwrap_err();
    let lines = issue_lines(&e);
    println!("{e}");
    has(&lines, "regin", &["unknown key", "(got \"hz\")"]);
    has(
        &lines,
        "gpu_models[0].memory_mib",
        &["expected a non-negative integer", "(got \"lots\")"],
    );
    has(
        &lines,
        "gpu_models[1].name",
        &["duplicate GPU model", "gpu_models[0].name", "(got \"A10\")"],
    );
    has(
        &lines,
        "gpu_models[1].h2d_mib_per_s",
        &["must be from 1 to", "(got 0)"],
    );
    has(
        &lines,
        "pools[0].kind",
        &["unknown pool kind", "(got \"cloud\")"],
    );
    has(
        &lines,
        "pools[0].nodes[1].cpu_milli",
        &["missing required key"],
    );
    has(
        &lines,
        "pools[0].nodes[1].gpus[0].count",
        &["missing required key"],
    );
    has(
        &lines,
        "pools[0].nodes[1].gpus[0].cout",
        &["unknown key", "model, count", "(got 2)"],
    );
    has(
        &lines,
        "pools[1].nodes[0].name",
        &["duplicate node name", "(got \"n0\")"],
    );
    has(
        &lines,
        "pools[1].nodes[0].cpu_milli",
        &["must not be negative", "(got -4)"],
    );
    has(
        &lines,
        "pools[1].nodes[0].swap_mib",
        &["cannot exceed", "(8192)", "(got 9_000)"],
    );
    has(
        &lines,
        "pools[1].nodes[0].gpus[0].model",
        &["unknown GPU model", "(got \"H900\")"],
    );
    has(
        &lines,
        "pricing.tiers.burstable.discount_bp",
        &["must be from 0 to 10000", "(got 12_000)"],
    );
    has(
        &lines,
        "pricing.tiers.oversubscribed.discount_bp",
        &["at least guaranteed's 1500 bp", "(got 1_000)"],
    );
    has(
        &lines,
        "pricing.prices",
        &[
            "no price for GPU model \"A10\" in edge pools",
            "pools[1].nodes[1].gpus[0]",
        ],
    );
    has(
        &lines,
        "pricing.prices[1].gpu_model",
        &["unknown GPU model", "(got \"B200\")"],
    );
    assert_eq!(e.issues.len(), 16, "exactly the planted mistakes:\n{e}");
    // Every line names the file and a line:column, and issues come in file order.
    assert!(lines.iter().all(|l| l.starts_with("topology.toml:")));
    let positions: Vec<_> = e
        .issues
        .iter()
        .map(|i| (i.line.unwrap(), i.column.unwrap()))
        .collect();
    let mut sorted = positions.clone();
    sorted.sort();
    assert_eq!(positions, sorted);
    // Line numbers point at the offending value.
    let h900 = e.at("pools[1].nodes[0].gpus[0].model").next().unwrap();
    let line = BROKEN_TOPOLOGY
        .lines()
        .nth(h900.line.unwrap() as usize - 1)
        .unwrap();
    assert!(line.contains("\"H900\""), "{line}");
    assert_eq!(h900.kind, IssueKind::UnknownReference);
}

#[test]
fn a_topology_with_syntax_errors_reports_them_with_line_and_column() {
    let src = "[[gpu_models]]\nname = \"A10\nmemory_mib = 1\n";
    let e = Topology::from_toml("t.toml", src).unwrap_err();
    assert!(!e.issues.is_empty());
    assert!(e.issues.iter().all(|i| i.kind == IssueKind::Syntax));
    let first = &e.issues[0];
    assert_eq!(first.line, Some(2), "{e}");
    assert!(e.to_string().starts_with("t.toml:2:"), "{e}");

    // Every syntax error of the file, each with the text it points at.
    let e = Tenants::from_toml("t.toml", "a = 1\na = 2\n[x]\n[x]\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.toml:2:1: TOML syntax error: duplicate key (got a)\n\
         t.toml:4:2: TOML syntax error: duplicate key (got x)"
    );
}

#[test]
fn an_empty_topology_names_every_missing_section() {
    let e = Topology::from_toml("t.toml", "").unwrap_err();
    let lines = issue_lines(&e);
    for key in ["gpu_models", "cold_start", "swap", "pools", "pricing"] {
        assert!(
            lines
                .iter()
                .any(|l| l.ends_with(&format!(": {key}: missing required key"))),
            "{key} in\n{e}"
        );
    }
}

const BROKEN_TENANTS: &str = r#"
[[tenants]]
name = "acme"
display_name = "ACME"

[tenants.quota.center]
compute_milli = 4_000
memory_mib = 65_536
instances = 5_000_000_000             # <- does not fit u32

[tenants.quota.cloud]                 # <- unknown pool kind
compute_milli = 1

[[tenants]]
name = "acme"                         # <- duplicate
tier = "gold"                         # <- unknown key

[[tenants]]
name = "Globex Inc"                   # <- space in a name
display_name = ""                     # <- blank

[tenants.quota.edge]
compute_milli = 1_000
memory_mib = 8_192                    # <- instances missing
"#;

#[test]
fn a_broken_tenants_file_reports_every_mistake_at_once() {
    let e = Tenants::from_toml("tenants.toml", BROKEN_TENANTS).unwrap_err();
    let lines = issue_lines(&e);
    println!("{e}");
    has(
        &lines,
        "tenants[0].quota.center.instances",
        &["from 0 to 4294967295", "(got 5_000_000_000)"],
    );
    has(
        &lines,
        "tenants[0].quota.cloud",
        &["unknown key", "center, edge", "(got a table)"],
    );
    has(
        &lines,
        "tenants[1].name",
        &["duplicate tenant name", "tenants[0].name", "(got \"acme\")"],
    );
    has(
        &lines,
        "tenants[1].tier",
        &["unknown key", "(got \"gold\")"],
    );
    has(
        &lines,
        "tenants[2].name",
        &["a name is", "(got \"Globex Inc\")"],
    );
    has(
        &lines,
        "tenants[2].display_name",
        &["not blank", "(got \"\")"],
    );
    has(
        &lines,
        "tenants[2].quota.edge.instances",
        &["missing required key"],
    );
    assert_eq!(e.issues.len(), 7, "exactly the planted mistakes:\n{e}");
}

#[test]
fn tenants_without_a_quota_table_have_zero_quota_there() {
    let t = Tenants::from_toml(
        "t.toml",
        "[[tenants]]\nname = \"a\"\n[tenants.quota.edge]\ncompute_milli = 5\nmemory_mib = 6\ninstances = 7\n",
    )
    .unwrap();
    use gshare_core::{PoolKind, Quota};
    assert_eq!(
        t.quota("a", PoolKind::Edge),
        Some(Quota {
            compute_milli: 5,
            memory_mib: 6,
            instances: 7
        })
    );
    assert_eq!(t.quota("a", PoolKind::Center), Some(Quota::default()));
    assert_eq!(t.quota("b", PoolKind::Center), None);
}

//! `gsharectl function deploy -f fn.toml [--no-wait] [--dry-run] |
//! update -f fn.toml [--no-wait] | invoke <name> --tenant t [--data d] |
//! ls | describe <name> | rm <name>` (tenant; the operator reads a
//! tenant's with `ls --tenant t` and `describe <name> --tenant t`, and
//! moves one with `move <name> --tenant t --to <pool|node>`).
//!
//! `update` sends a new spec (`PUT /v1/functions/{name}`). A change of
//! runtime, memory, compute, tier or pool replaces the instances one at a
//! time, make-before-break: a new-version instance is placed beside each
//! old one, and the old one is released once the new one is resident (so
//! invocations keep being served); where capacity or quota has no room
//! for both, that instance is moved in one step instead. Other changes
//! keep the instances. Without `--no-wait` it waits (up to a minute) until
//! the roll is done and the function is ready.
//!
//! `deploy` waits until the function is ready (`POST
//! /v1/functions?wait=ready`: every replica knows it and the hosting
//! agents report its instances resident), so it answers invocations when
//! it returns; not ready in time, it says that the deploy committed and
//! what is missing, and exits non-zero. `--no-wait` returns once the
//! deploy is committed. `describe` shows each instance's state as its
//! agent reports it, from whichever replica it asks.
//! `--dry-run` shows where the instances would go and what the plan passed
//! over, or why nothing fits, and deploys nothing.
//!
//! `fn.toml` holds the fields of `POST /v1/functions` (see
//! `configs/examples/function.toml`); unknown keys are refused here, before
//! anything is sent.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::region_client::{cell, RegionArgs};
use crate::api::functions::FunctionBody;

/// `gsharectl function …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: FunctionCommand,
}

#[derive(Debug, clap::Subcommand)]
enum FunctionCommand {
    /// Deploy a function and place its `min_instances`.
    Deploy {
        /// The function file (TOML).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Return once the deploy is committed, without waiting for the
        /// hosting agents to take the instances.
        #[arg(long)]
        no_wait: bool,
        /// Show where the instances would go (and what was rejected);
        /// deploy nothing.
        #[arg(long, conflicts_with = "no_wait")]
        dry_run: bool,
    },
    /// Replace a deployed function's spec with a function file's (same
    /// name). A new runtime, memory, compute, tier or pool replaces the
    /// instances; other changes keep them.
    Update {
        /// The function file (TOML).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Return once the update is committed, without waiting for the
        /// hosting agents to take the new instances.
        #[arg(long)]
        no_wait: bool,
    },
    /// Invoke a function through the region (prints its answer's body).
    Invoke {
        /// Its name.
        name: String,
        /// The owner (default: `$GSHARE_TENANT`).
        #[arg(long)]
        tenant: Option<String>,
        /// The request body (default: empty).
        #[arg(long, default_value = "")]
        data: String,
        /// The request's deadline, ms (`X-Gshare-Deadline-Ms`); a first
        /// request may wait for a cold start.
        #[arg(long, default_value_t = 30_000)]
        deadline_ms: u64,
    },
    /// List your functions and their instances (operator: `--tenant`).
    Ls {
        /// Another tenant's functions (operator token).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Show one function: each instance's node, slices and state.
    Describe {
        /// Its name.
        name: String,
        /// Another tenant's function (operator token).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Move a tenant's function into a pool, the center or a node
    /// (operator): one instance at a time, make-before-break (a new
    /// instance is placed in the target, and the old one is released once
    /// the new one is ready; invocations keep being served). The leader
    /// does not move them back to the function's pool preference.
    Move {
        /// Its name.
        name: String,
        /// The owner.
        #[arg(long)]
        tenant: String,
        /// Where to: `center`, a pool or node name, `pool:<name>` or
        /// `node:<name>`.
        #[arg(long)]
        to: String,
    },
    /// Delete a function (releases its instances).
    Rm {
        /// Its name.
        name: String,
    },
}

/// Reads and checks a function file.
pub fn load(file: &Path) -> anyhow::Result<FunctionBody> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    parse(&file.display().to_string(), &text)
}

/// Parses the text of function file `file` (the body of `POST /v1/functions`):
/// every mistake at once, as `file:line:col: key: problem` (core's reader).
/// Absent optional keys take the API's defaults.
pub fn parse(file: &str, text: &str) -> anyhow::Result<FunctionBody> {
    let f = gshare_core::config::FunctionFile::from_toml(file, text)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut body = serde_json::json!({
        "name": f.name,
        "runtime": f.runtime,
        "memory_mib": f.memory_mib,
        "compute_milli": f.compute_milli,
        "tier": f.tier,
        "deadline_ms": f.deadline_ms,
    });
    let optional = [
        ("pool", f.pool.map(|p| Value::from(p.to_string()))),
        ("strict_pool", f.strict_pool.map(Value::from)),
        ("min_instances", f.min_instances.map(Value::from)),
        ("max_instances", f.max_instances.map(Value::from)),
        ("idle_timeout_s", f.idle_timeout_s.map(Value::from)),
        (
            "latency",
            f.latency.map(|l| {
                serde_json::json!({
                    "full_gpu_us": l.full_gpu_us,
                    "saturation_milli": l.saturation_milli,
                })
            }),
        ),
    ];
    for (key, v) in optional {
        if let Some(v) = v {
            body[key] = v;
        }
    }
    if let Some(m) = f.model {
        body["model"] = Value::from(m);
    }
    if !f.args.is_empty() {
        body["args"] = serde_json::json!(f.args);
    }
    if !f.env.is_empty() {
        body["env"] = serde_json::json!(f.env);
    }
    serde_json::from_value(body).with_context(|| format!("{file}: the deploy body"))
}

/// Runs `gsharectl function …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    match a.command {
        FunctionCommand::Deploy {
            file,
            no_wait,
            dry_run,
        } => {
            let body = serde_json::to_value(load(&file)?)?;
            let path = match (dry_run, no_wait) {
                (true, _) => "/v1/functions?dry_run=true",
                (false, true) => "/v1/functions",
                (false, false) => "/v1/functions?wait=ready",
            };
            let v = r.call("POST", path, Some(&body))?;
            if dry_run {
                r.show(&v, dry_run_table);
                if v["placeable"] != Value::Bool(true) {
                    anyhow::bail!("would not deploy: {}: {}", cell(&v["code"]), reason(&v));
                }
            } else {
                r.show(&v, |v| table(std::slice::from_ref(v)));
                if v["ready"] == Value::Bool(false) {
                    anyhow::bail!(
                        "{} (see `gsharectl function describe {}`)",
                        v["error"]["message"]
                            .as_str()
                            .unwrap_or("deployed, but not ready in time"),
                        cell(&v["spec"]["name"])
                    );
                }
            }
        }
        FunctionCommand::Update { file, no_wait } => {
            let fb = load(&file)?;
            let path = format!(
                "/v1/functions/{}{}",
                fb.name,
                if no_wait {
                    ""
                } else {
                    "?wait=ready&ready_timeout_ms=60000"
                }
            );
            let body = serde_json::to_value(fb)?;
            let v = r.call("PUT", &path, Some(&body))?;
            r.show(&v, update_table);
            if v["function"]["ready"] == Value::Bool(false) {
                anyhow::bail!(
                    "updated, but not every new instance was placed and taken by its agent in \
                     time (see `gsharectl function describe {}`)",
                    cell(&v["function"]["spec"]["name"])
                );
            }
        }
        FunctionCommand::Invoke {
            name,
            tenant,
            data,
            deadline_ms,
        } => invoke(r, &name, tenant, data.as_bytes(), deadline_ms)?,
        FunctionCommand::Describe { name, tenant } => {
            let v = r.call("GET", &format!("{}/{name}", base(tenant.as_deref())), None)?;
            r.show(&v, describe_table);
        }
        FunctionCommand::Ls { tenant } => {
            let v = r.call("GET", &base(tenant.as_deref()), None)?;
            r.show(&v, |v| table(v.as_array().map_or(&[][..], Vec::as_slice)));
        }
        FunctionCommand::Move { name, tenant, to } => {
            let body = serde_json::json!({ "to": to });
            let v = r.call_within(
                "POST",
                &format!("/v1/tenants/{tenant}/functions/{name}/move"),
                Some(&body),
                MOVE_TIMEOUT,
            )?;
            r.show(&v, move_table);
            let stuck: Vec<String> = v["moves"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .filter(|m| m["outcome"] != "completed")
                .map(|m| {
                    format!(
                        "{} -> {}: {}",
                        cell(&m["from"]),
                        cell(&m["to"]),
                        cell(&m["outcome"])
                    )
                })
                .collect();
            if !stuck.is_empty() {
                anyhow::bail!("not every move completed: {}", stuck.join("; "));
            }
        }
        FunctionCommand::Rm { name } => {
            let v = r.call("DELETE", &format!("/v1/functions/{name}"), None)?;
            r.show(&v, super::region_client::key_values);
        }
    }
    Ok(())
}

/// Longest wait for a move's answer (the region waits for each new
/// instance to become ready, up to a minute each).
const MOVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A move's answer: one row per instance moved.
fn move_table(v: &Value) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "FROM".to_string(),
        "TO".to_string(),
        "NODE".to_string(),
        "OUTCOME".to_string(),
    ]];
    for m in v["moves"].as_array().map_or(&[][..], Vec::as_slice) {
        rows.push(vec![
            cell(&m["from"]),
            cell(&m["to"]),
            cell(&m["node"]),
            cell(&m["outcome"]),
        ]);
    }
    rows.push(Vec::new());
    rows.push(vec![format!(
        "{} moved to {}; {} there already",
        v["moves"].as_array().map_or(0, Vec::len),
        cell(&v["target"]),
        cell(&v["already_there"])
    )]);
    rows
}

/// The functions of the caller, or (operator) of `tenant`.
fn base(tenant: Option<&str>) -> String {
    match tenant {
        Some(t) => format!("/v1/tenants/{t}/functions"),
        None => "/v1/functions".into(),
    }
}

/// `POST /v1/invoke/{tenant}/{name}` through the replica; the answer's
/// body goes to stdout as it came. Retried only under one idempotency
/// key, so a retry never runs the function twice.
fn invoke(
    r: &RegionArgs,
    name: &str,
    tenant: Option<String>,
    data: &[u8],
    deadline_ms: u64,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let tenant = tenant
        .or_else(|| std::env::var("GSHARE_TENANT").ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow::anyhow!("give --tenant or set GSHARE_TENANT"))?;
    let key = format!(
        "cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let deadline = deadline_ms.to_string();
    let headers = [
        ("X-Gshare-Deadline-Ms", deadline.as_str()),
        ("Idempotency-Key", key.as_str()),
        ("Content-Type", "application/octet-stream"),
    ];
    let path = format!("/v1/invoke/{tenant}/{name}");
    let mut attempt = 0;
    let a = loop {
        let a = r.send_raw("POST", &path, &headers, data)?;
        attempt += 1;
        if a.status == 503 && attempt < 10 {
            std::thread::sleep(std::time::Duration::from_millis(300));
            continue;
        }
        break a;
    };
    if !(200..300).contains(&a.status) {
        let v: Value = serde_json::from_slice(&a.body).unwrap_or_default();
        anyhow::bail!(
            "{} {}: {} (idempotency key {key})",
            a.status,
            v["error"]["code"].as_str().unwrap_or("error"),
            v["error"]["message"].as_str().map_or_else(
                || String::from_utf8_lossy(&a.body).into_owned(),
                str::to_string
            )
        );
    }
    let mut out = std::io::stdout();
    out.write_all(&a.body)?;
    if !a.body.ends_with(b"\n") {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// An update: the new version, what it released, the function now.
fn update_table(v: &Value) -> Vec<Vec<String>> {
    let mut rows = describe_table(&v["function"]);
    let released: Vec<String> = v["released"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(cell)
        .collect();
    rows.push(Vec::new());
    let replacing: Vec<String> = v["replacing"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(cell)
        .collect();
    let list = |l: &[String]| {
        if l.is_empty() {
            "none".to_string()
        } else {
            l.join(", ")
        }
    };
    rows.push(vec![format!(
        "version {}; instances replaced make-before-break: {}; released: {}",
        cell(&v["version"]),
        list(&replacing),
        list(&released)
    )]);
    rows
}

/// The rejection of a dry run in one line.
fn reason(v: &Value) -> String {
    let r = &v["rejection"];
    let exhausted = r["exhausted"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    format!(
        "{} ({} nodes, {} GPUs evaluated; rejected by {})",
        r["reason"],
        cell(&r["nodes_evaluated"]),
        cell(&r["gpus_evaluated"]),
        if exhausted.is_empty() {
            "-".into()
        } else {
            exhausted
        }
    )
}

/// A dry run: one row per instance with where it would go and what its plan passed over.
fn dry_run_table(v: &Value) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "INSTANCE",
        "POOL",
        "SLICES",
        "SCORE",
        "NODES",
        "GPUS",
        "REJECTED BY",
    ]
    .map(String::from)
    .to_vec()];
    for (n, i) in v["instances"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .enumerate()
    {
        let m = &i["metric"];
        let rejected = m["exhausted"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .chain(
                        i["metric"]["quota_exhausted"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, d)| format!("{k} quota: {}", cell(d))),
                    )
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        rows.push(vec![
            format!("#{}", n + 1),
            cell(&i["pool"]),
            slices(&i["slices"]),
            cell(&i["score"]),
            cell(&m["nodes_evaluated"]),
            cell(&m["gpus_evaluated"]),
            if rejected.is_empty() {
                "-".into()
            } else {
                rejected
            },
        ]);
    }
    rows
}

fn slices(v: &Value) -> String {
    v.as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|sl| {
            format!(
                "{}/gpu{} ({} milli, {} MiB)",
                cell(&sl["gpu"]["node"]),
                cell(&sl["gpu"]["index"]),
                cell(&sl["compute_milli"]),
                cell(&sl["memory_mib"])
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A spec's pool preference as a person writes it: `strict:edge:a` (the
/// state's form of `strict_pool = true`) is `edge:a (strict)`.
fn pool(v: &Value) -> String {
    let p = cell(v);
    match p.strip_prefix("strict:") {
        Some(preferred) => format!("{preferred} (strict)"),
        None => p,
    }
}

/// One function: one row per instance with its node, slices and state.
fn describe_table(f: &Value) -> Vec<Vec<String>> {
    let mut rows = table(std::slice::from_ref(f));
    rows.push(Vec::new());
    rows.push(
        ["INSTANCE", "VERSION", "NODE", "POOL", "SLICES", "STATE"]
            .map(String::from)
            .to_vec(),
    );
    for i in f["instances"].as_array().map_or(&[][..], Vec::as_slice) {
        let version = if i["outgoing"] == Value::Bool(true) {
            format!("{} (outgoing)", cell(&i["version"]))
        } else {
            cell(&i["version"])
        };
        rows.push(vec![
            cell(&i["instance"]),
            version,
            cell(&i["slices"][0]["gpu"]["node"]),
            cell(&i["pool"]),
            slices(&i["slices"]),
            cell(&i["state"]),
        ]);
    }
    let load = &f["load"];
    if load.is_object() {
        let idle = match load["idle_ms"].as_u64() {
            Some(u64::MAX) | None => "never invoked".to_string(),
            Some(ms) => format!("{ms} ms"),
        };
        rows.push(Vec::new());
        rows.push(
            [
                "LOAD",
                "ARRIVALS",
                "DEADLINE MISSES",
                "EARLY REJECTS",
                "SWAPS",
                "IDLE",
            ]
            .map(String::from)
            .to_vec(),
        );
        rows.push(vec![
            format!("{} in flight or waiting", cell(&load["concurrency"])),
            cell(&load["arrivals"]),
            cell(&load["deadline_misses"]),
            cell(&load["early_rejects"]),
            cell(&load["swaps"]),
            idle,
        ]);
    }
    if let Some(a) = autoscale_row(&f["autoscale"]) {
        rows.push(Vec::new());
        rows.push(vec!["AUTOSCALE".to_string(), a]);
    }
    let copies: Vec<&str> = f["host_copies"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let migrations: Vec<String> = f["migrations"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|m| {
            format!(
                "{} -> {} on {} ({})",
                cell(&m["from"]),
                cell(&m["to"]),
                cell(&m["to_node"]),
                cell(&m["cause"])
            )
        })
        .collect();
    if !migrations.is_empty() {
        rows.push(Vec::new());
        rows.push(vec![
            "MIGRATING".to_string(),
            format!(
                "{} (both serve; the old one goes once the new one is ready)",
                migrations.join(", ")
            ),
        ]);
    }
    if !copies.is_empty() {
        rows.push(Vec::new());
        rows.push(vec![
            "HOST COPIES".to_string(),
            format!(
                "{} (weights in host memory: a start from zero there is a swap-in)",
                copies.join(", ")
            ),
        ]);
    }
    rows
}

/// The `autoscale` block in one line: `desired 3 (current 1), rule panic,
/// concurrency stable 2.1 / panic 8.4, target 1.4 per instance, 0.4 s ago`
/// (`None`: no block).
fn autoscale_row(a: &Value) -> Option<String> {
    let milli = |v: &Value| {
        let m = v.as_u64().unwrap_or(0);
        format!("{}.{}", m / 1000, (m % 1000) / 100)
    };
    match a["status"].as_str()? {
        "decided" => {
            let d = &a["decision"];
            let ago = a["age_ms"].as_u64().map_or(String::new(), |ms| {
                format!(", {}.{} s ago", ms / 1000, (ms % 1000) / 100)
            });
            Some(format!(
                "desired {} (current {}), rule {}, concurrency stable {} / panic {}, \
                 target {} per instance{ago}",
                cell(&d["desired"]),
                cell(&d["current"]),
                cell(&d["rule"]),
                milli(&d["stable_concurrency_milli"]),
                milli(&d["panic_concurrency_milli"]),
                milli(&d["target_milli"]),
            ))
        }
        "undecided" => Some(format!("no decision yet (leader {})", cell(&a["leader"]))),
        "fixed" => Some("fixed count (min_instances = max_instances)".to_string()),
        _ => Some(format!("unknown: {}", cell(&a["reason"]))),
    }
}

fn table(fns: &[Value]) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "NAME",
        "VERSION",
        "TIER",
        "COMPUTE",
        "MEMORY MiB",
        "POOL",
        "INSTANCES",
        "PLACED ON",
    ]
    .map(String::from)
    .to_vec()];
    for f in fns {
        let s = &f["spec"];
        let inst = f["instances"].as_array().cloned().unwrap_or_default();
        let gpus: Vec<String> = inst
            .iter()
            .flat_map(|i| i["slices"].as_array().cloned().unwrap_or_default())
            .map(|sl| {
                format!(
                    "{}/gpu{}",
                    cell(&sl["gpu"]["node"]),
                    cell(&sl["gpu"]["index"])
                )
            })
            .collect();
        rows.push(vec![
            cell(&s["name"]),
            cell(&f["version"]),
            cell(&s["tier"]),
            cell(&s["compute_milli"]),
            cell(&s["memory_mib"]),
            pool(&s["pool"]),
            format!("{}/{}", inst.len(), cell(&s["max_instances"])),
            gpus.join(","),
        ]);
    }
    rows
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_function_file_reports_every_mistake_with_its_place() {
        let text = "name = \"f\"\nruntime = \"vllm\"\nmemory_mb = 1024\ncompute_milli = 5000\n\
                    tier = \"burstable\"\ndeadline_ms = 100\n";
        let e = super::parse("fn.toml", text).unwrap_err().to_string();
        assert!(e.contains("fn.toml:3:1: memory_mb: unknown key"), "{e}");
        assert!(
            e.contains("fn.toml:1:1: memory_mib: missing required key"),
            "{e}"
        );
        assert!(
            e.contains("fn.toml:4:17: compute_milli: a burstable function"),
            "{e}"
        );
    }

    #[test]
    fn a_function_file_passes_model_args_and_env_to_the_spec() {
        let text = "name = \"f\"\nruntime = \"vllm\"\nmemory_mib = 1024\ncompute_milli = 500\n\
                    tier = \"burstable\"\ndeadline_ms = 100\nmodel = \"org/model\"\n\
                    args = [\"--max-model-len\", \"4096\"]\n[env]\nHF_HOME = \"/c\"\n";
        let spec = super::parse("fn.toml", text)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_spec(gshare_core::model::TenantId("acme".into()))
            .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(spec.model.as_deref(), Some("org/model"));
        assert_eq!(spec.args, ["--max-model-len", "4096"]);
        assert_eq!(spec.env["HF_HOME"], "/c");
    }

    #[test]
    fn a_function_file_passes_strict_pool_to_the_body_and_ls_shows_it() {
        let base = "name = \"f\"\nruntime = \"vllm\"\nmemory_mib = 1024\ncompute_milli = 500\n\
                    tier = \"burstable\"\ndeadline_ms = 100\n";
        let f = super::parse(
            "fn.toml",
            &format!("{base}pool = \"edge:edge-a\"\nstrict_pool = true\n"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(f.strict_pool);
        let spec = f
            .into_spec(gshare_core::model::TenantId("acme".into()))
            .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(spec.pool.to_string(), "strict:edge:edge-a");
        let f = super::parse("fn.toml", base).unwrap();
        assert!(!f.strict_pool);
        let e = super::parse("fn.toml", &format!("{base}strict_pool = true\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fn.toml:7:15: strict_pool: pool is absent (any)"),
            "{e}"
        );
        let row = |pool: &str| {
            let f = serde_json::json!({"spec": {"name": "f", "pool": pool}, "instances": []});
            super::table(&[f])[1][5].clone()
        };
        assert_eq!(row("strict:edge:edge-a"), "edge:edge-a (strict)");
        assert_eq!(row("strict:center"), "center (strict)");
        assert_eq!(row("edge:edge-a"), "edge:edge-a");
    }

    #[test]
    fn describe_shows_the_latest_autoscaling_decision() {
        let f = serde_json::json!({
            "spec": {"name": "f", "max_instances": 3}, "version": 1, "instances": [],
            "autoscale": {"status": "decided", "age_ms": 420, "leader": 1, "decided_at_ms": 5,
                "decision": {"desired": 3, "current": 1, "rule": "panic", "panic": true,
                    "stable_concurrency_milli": 2_150, "panic_concurrency_milli": 8_400,
                    "target_milli": 1_400}},
        });
        let rows = super::describe_table(&f);
        assert_eq!(
            rows.last().unwrap(),
            &[
                "AUTOSCALE",
                "desired 3 (current 1), rule panic, concurrency stable 2.1 / panic 8.4, \
                 target 1.4 per instance, 0.4 s ago"
            ]
            .map(String::from)
        );
        let unknown = serde_json::json!({"instances": [],
            "autoscale": {"status": "unknown", "reason": "no leader"}});
        let rows = super::describe_table(&unknown);
        assert_eq!(rows.last().unwrap()[1], "unknown: no leader");
        let none = serde_json::json!({"instances": []});
        let rows = super::describe_table(&none);
        assert!(!rows
            .iter()
            .any(|r| r.first().is_some_and(|c| c == "AUTOSCALE")));
    }

    #[test]
    fn describe_names_the_nodes_holding_host_copies() {
        let f = serde_json::json!({
            "spec": {"name": "f", "max_instances": 2}, "version": 1, "instances": [],
            "host_copies": ["local-c1", "local-c2"],
        });
        let rows = super::describe_table(&f);
        let last = rows.last().unwrap();
        assert_eq!(last[0], "HOST COPIES");
        assert!(last[1].starts_with("local-c1, local-c2 ("), "{last:?}");
        let none = serde_json::json!({"instances": []});
        let rows = super::describe_table(&none);
        assert!(!rows
            .iter()
            .any(|r| r.first().is_some_and(|c| c == "HOST COPIES")));
    }

    #[test]
    fn describe_shows_the_load_block_when_there_is_one() {
        let f = serde_json::json!({
            "spec": {"name": "f", "max_instances": 2}, "version": 1, "instances": [],
            "load": {"arrivals": 7, "concurrency": 3, "deadline_misses": 1,
                     "early_rejects": 2, "swaps": 4, "idle_ms": 250},
        });
        let rows = super::describe_table(&f);
        let last = rows.last().unwrap();
        assert_eq!(
            last,
            &["3 in flight or waiting", "7", "1", "2", "4", "250 ms"].map(String::from)
        );
        let mut never = f.clone();
        never["load"]["idle_ms"] = serde_json::json!(u64::MAX);
        let rows = super::describe_table(&never);
        assert_eq!(rows.last().unwrap()[5], "never invoked");
        let mut none = f;
        none.as_object_mut().unwrap().remove("load");
        let rows = super::describe_table(&none);
        assert!(!rows.iter().any(|r| r.first().is_some_and(|c| c == "LOAD")));
    }

    #[test]
    fn the_example_function_file_parses_strictly() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../configs/examples/function.toml");
        let f = super::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.name, "llama-8b-chat");
        // Defaults are the API's: the example sets every key but these.
        let text = std::fs::read_to_string(&path).unwrap();
        let short: String = text
            .lines()
            .filter(|l| !l.starts_with("pool") && !l.starts_with("min_instances"))
            .map(|l| format!("{l}\n"))
            .collect();
        let f = super::parse("short.toml", &short).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.min_instances, 1);
        assert_eq!(f.pool.to_string(), "any");
        assert_eq!(f.max_instances, Some(4));
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&bad, format!("gpus = 2\n{text}")).unwrap();
        let e = super::load(&bad).unwrap_err().to_string();
        assert!(e.contains(":1:1: gpus: unknown key"), "{e}");
    }
}

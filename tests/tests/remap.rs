//! The reservation is the executor's input: a real `gshare-edge` under a
//! load that swaps and remaps, against three real replicas. At every
//! sample the GPUs where the agent holds a copy of a function are among
//! the slices the region reserved for its instances, on every replica; no
//! GPU's reserved memory passes its capacity; when the load stops, the
//! agent's placement equals the region's reservation. At least one remap
//! (reserve → move → release, through Raft) and one swap must happen.

use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODE: &str = "pin-c1";
const GPU_MIB: u64 = 16_384;
const SWAP_MIB: u64 = 65_536;
/// Oversubscribed functions of 7 000 MiB: three share each GPU (21 000 MiB
/// mapped on 16 384), so at most two are resident at once.
const OVERSUBSCRIBED: usize = 6;

const TOPOLOGY: &str = r#"
[[gpu_models]]
name = "sim-gpu-16g"
memory_mib = 16_384
h2d_mib_per_s = 12_000

[cold_start]
setup_us = 50_000
storage_mib_per_s = 20_000

[swap]
setup_us = 2_000

[[pools]]
name = "center"
kind = "center"

[[pools.nodes]]
name = "pin-c1"
cpu_milli = 8_000
memory_mib = 131_072
swap_mib = 65_536
gpus = [{ model = "sim-gpu-16g", count = 2 }]

[pricing]
currency = "USD"
unit = "micro-USD"
units_per_currency = 1_000_000

[pricing.tiers]
exclusive = { discount_bp = 0 }
guaranteed = { discount_bp = 1_500 }
burstable = { discount_bp = 3_500 }
oversubscribed = { discount_bp = 6_000 }

[[pricing.prices]]
gpu_model = "sim-gpu-16g"
pool_kind = "center"
gpu_hour = 500_000
memory_gib_hour = 10_000
"#;

const TENANTS: &str = r#"
[[tenants]]
name = "acme"

[tenants.quota.center]
compute_milli = 16_000
memory_mib = 262_144
instances = 64
"#;

fn call(addr: SocketAddr, method: &str, path: &str, token: &str, body: Option<&str>) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(20),
    )
    .unwrap_or_else(|e| HttpReply {
        status: 0,
        body: e.to_string(),
        ..HttpReply::default()
    })
}

fn json_of(r: &HttpReply) -> Value {
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

fn until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One hosted function as the agent reports it: its instances with the
/// GPUs of their slices, the GPUs holding a copy, and whether a remap is
/// in flight.
type FunctionView = (Vec<(u64, BTreeSet<u64>)>, BTreeSet<u64>, bool);

/// The agent's placement: per function, its instances' GPUs as the agent
/// holds them and the GPUs holding a copy; plus its counters.
#[derive(Debug, Clone, PartialEq)]
struct AgentView {
    functions: Vec<FunctionView>,
    remaps: u64,
    swap_outs: u64,
    swap_ins: u64,
}

fn agent_view(ingress: SocketAddr) -> Option<AgentView> {
    let r = call(ingress, "GET", "/v1/agent/placement", "-", None);
    let v = json_of(&r);
    let functions = v["functions"]
        .as_array()?
        .iter()
        .map(|f| {
            let instances = f["instances"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| {
                    let gpus = i[1].as_array().into_iter().flatten();
                    (
                        i[0].as_u64().unwrap_or(0),
                        gpus.filter_map(Value::as_u64).collect(),
                    )
                })
                .collect();
            let copies = f["copies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .collect();
            (instances, copies, !f["reserving"].is_null())
        })
        .collect();
    Some(AgentView {
        functions,
        remaps: v["remaps"].as_u64()?,
        swap_outs: v["swap_outs"].as_u64()?,
        swap_ins: v["swap_ins"].as_u64()?,
    })
}

/// A replica's reservation: instance id → (tier, GPUs of its slices), and
/// the check that no GPU is over-reserved.
fn reservation(state: &Value) -> BTreeMap<u64, (String, Vec<u64>)> {
    let mut out = BTreeMap::new();
    let mut resident = [0u64; 2];
    let mut oversub = [0u64; 2];
    let mut largest = [0u64; 2];
    for (id, i) in state["instances"].as_object().into_iter().flatten() {
        let tier = i["tier"].as_str().unwrap_or("").to_string();
        let mut gpus = Vec::new();
        for s in i["slices"].as_array().into_iter().flatten() {
            assert_eq!(s["gpu"]["node"], NODE, "{s}");
            let g = s["gpu"]["index"].as_u64().unwrap() as usize;
            let mib = s["memory_mib"].as_u64().unwrap();
            if tier == "oversubscribed" {
                oversub[g] += mib;
                largest[g] = largest[g].max(mib);
            } else {
                resident[g] += mib;
            }
            gpus.push(g as u64);
        }
        out.insert(id.parse().unwrap(), (tier, gpus));
    }
    let mut swap_need = 0;
    for g in 0..2 {
        assert!(
            resident[g] <= GPU_MIB,
            "GPU {g}: {} MiB reserved resident, capacity {GPU_MIB}: {state}",
            resident[g]
        );
        assert!(
            largest[g] <= GPU_MIB - resident[g],
            "GPU {g}: an oversubscribed slice of {} MiB beside {} MiB reserved",
            largest[g],
            resident[g]
        );
        swap_need += oversub[g].saturating_sub(GPU_MIB - resident[g]);
    }
    assert!(
        swap_need <= SWAP_MIB,
        "swap need {swap_need} MiB past {SWAP_MIB}"
    );
    out
}

fn last_applied(region: &TestRegion, id: u64) -> u64 {
    let r = call(region.http(id), "GET", "/v1/cluster", TOKEN, None);
    json_of(&r)["last_applied"].as_u64().unwrap_or(0)
}

#[test]
fn the_agents_placement_stays_within_the_regions_reservation_under_swaps_and_remaps() {
    let mut region = TestRegion::new(3).expect("region");
    std::fs::write(region.path("topology.toml"), TOPOLOGY).unwrap();
    std::fs::write(region.path("tenants.toml"), TENANTS).unwrap();
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    let token = until("token", 30, || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then(|| json_of(&r)["token"].as_str().unwrap().to_string())
    });
    let mut names: Vec<String> = (0..OVERSUBSCRIBED).map(|i| format!("o{i}")).collect();
    let specs = names
        .iter()
        .map(|n| {
            json!({
                "name": n, "runtime": "pytorch", "memory_mib": 7000, "compute_milli": 200,
                "tier": "oversubscribed", "deadline_ms": 10000, "pool": "center",
                "min_instances": 1, "max_instances": 1,
                "latency": {"full_gpu_us": 40000, "saturation_milli": 500},
            })
        })
        .chain(std::iter::once(json!({
            "name": "g", "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 300,
            "tier": "guaranteed", "deadline_ms": 10000, "pool": "center",
            "min_instances": 1, "max_instances": 1,
            "latency": {"full_gpu_us": 20000, "saturation_milli": 300},
        })))
        .collect::<Vec<_>>();
    names.push("g".into());
    for f in &specs {
        let body = f.to_string();
        let r = until("deploy", 30, || {
            let r = call(http, "POST", "/v1/functions", &token, Some(&body));
            (r.status != 0 && r.status != 503).then_some(r)
        });
        assert!(r.status == 200 || r.status == 201, "{r:?}");
    }
    let placed = until("all placed", 30, || {
        let s = json_of(&call(http, "GET", "/v1/cluster/state", TOKEN, None));
        let n = s["instances"].as_object().map_or(0, |m| m.len());
        (n == names.len()).then(|| reservation(&s))
    });
    println!("placed: {placed:?}");
    let guaranteed: Vec<(u64, Vec<u64>)> = placed
        .iter()
        .filter(|(_, (tier, _))| tier == "guaranteed")
        .map(|(id, (_, g))| (*id, g.clone()))
        .collect();

    let certs = region.certs();
    let (ok, out) = region
        .gsharectl(&[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--name",
            NODE,
        ])
        .unwrap();
    assert!(ok, "{out}");
    let ingress = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let replicas: String = region
        .replicas
        .values()
        .map(|r| format!("[[replicas]]\nquic_addr = \"{}\"\n", r.raft_addr))
        .collect();
    let config = region.root().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"node = "{NODE}"
pool = "center"
pool_kind = "center"
data_dir = "data/agent"
ingress_addr = "{ingress}"
host_swap_mib = {SWAP_MIB}
heartbeat_ms = 200
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim-gpu-16g"
memory_mib = {GPU_MIB}
h2d_mib_per_s = 12000
count = 2
[load]
cold_setup_us = 50000
{replicas}
[tls]
ca_cert = "certs/ca.pem"
cert = "certs/{NODE}.pem"
key = "certs/{NODE}.key"
"#
        ),
    )
    .unwrap();
    let log = std::fs::File::create(region.root().join("agent.log")).unwrap();
    let mut agent = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "gshare_edge=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    for n in &names {
        until("served through the agent", 60, || {
            let r = call(
                ingress,
                "POST",
                &format!("/v1/invoke/acme/{n}"),
                &token,
                Some("{}"),
            );
            (r.status == 200).then_some(())
        });
    }

    // The load: concurrent clients over every function, for a while.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..12)
        .map(|c| {
            let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
            let (token, names) = (token.clone(), names.clone());
            std::thread::spawn(move || {
                let mut k = c;
                while !stop.load(Ordering::Relaxed) {
                    let n = &names[k % names.len()];
                    k += 5;
                    let r = call(
                        ingress,
                        "POST",
                        &format!("/v1/invoke/acme/{n}"),
                        &token,
                        Some("x"),
                    );
                    if r.status == 200 {
                        served.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();

    // Samples: agent placement P1, then every replica's state at an index
    // at least the highest applied when P1 was read, then P2. A copy held
    // in both P1 and P2 was held throughout, so its slice was reserved in
    // every state read in between (the agent releases a slice only after
    // leaving it).
    let started = Instant::now();
    let (mut samples, mut checked) = (0u32, 0u32);
    let mut last = None;
    while started.elapsed() < Duration::from_secs(12)
        || last.as_ref().is_some_and(|v: &AgentView| v.remaps == 0)
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no remap within 60 s of load: {last:?}"
        );
        let Some(p1) = agent_view(ingress) else {
            continue;
        };
        let floor = (1..=3).map(|id| last_applied(&region, id)).max().unwrap();
        let mut states = Vec::new();
        for id in 1..=3 {
            until("replica caught up", 10, || {
                (last_applied(&region, id) >= floor).then_some(())
            });
            let s = json_of(&call(
                region.http(id),
                "GET",
                "/v1/cluster/state",
                TOKEN,
                None,
            ));
            states.push((id, reservation(&s)));
        }
        let Some(p2) = agent_view(ingress) else {
            continue;
        };
        samples += 1;
        for (f1, f2) in p1.functions.iter().zip(&p2.functions) {
            if f1.0.iter().map(|i| i.0).ne(f2.0.iter().map(|i| i.0)) {
                continue;
            }
            let held: BTreeSet<u64> = f1.1.intersection(&f2.1).copied().collect();
            for (id, r) in &states {
                let reserved: BTreeSet<u64> =
                    f1.0.iter()
                        .flat_map(|(inst, _)| r.get(inst).map(|x| x.1.clone()).unwrap_or_default())
                        .collect();
                assert!(
                    held.is_subset(&reserved),
                    "replica {id}: the agent holds copies on GPUs {held:?} of instances {:?}, \
                     the region reserved {reserved:?}\nP1 {p1:?}\nP2 {p2:?}",
                    f1.0
                );
                checked += held.len() as u32;
            }
        }
        for (id, r) in &states {
            for (g, gpus) in &guaranteed {
                assert_eq!(
                    r.get(g).map(|x| &x.1),
                    Some(gpus),
                    "replica {id}: the guaranteed instance moved"
                );
            }
        }
        last = Some(p2);
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let last = last.unwrap();
    println!(
        "{samples} samples, {checked} copy checks; served {}, failed {}; remaps {}, swap-outs {}, swap-ins {}",
        served.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        last.remaps,
        last.swap_outs,
        last.swap_ins
    );
    assert!(samples > 0 && checked > 0, "nothing was checked");
    assert!(last.remaps >= 1, "no remap happened: {last:?}");
    assert!(
        last.swap_outs >= 1 && last.swap_ins >= 1,
        "no swap happened: {last:?}"
    );

    // Quiet: the agent's placement equals the reservation on every replica
    // (one slice per instance, the one the agent holds; copies only there).
    until("placement equals the reservation when quiet", 30, || {
        let p = agent_view(ingress)?;
        let floor = (1..=3).map(|id| last_applied(&region, id)).max().unwrap();
        for id in 1..=3 {
            if last_applied(&region, id) < floor {
                return None;
            }
            let r = reservation(&json_of(&call(
                region.http(id),
                "GET",
                "/v1/cluster/state",
                TOKEN,
                None,
            )));
            if r.len() != names.len() {
                return None;
            }
            for (instances, copies, reserving) in &p.functions {
                if *reserving {
                    return None;
                }
                for (inst, gpus) in instances {
                    let region_gpus: BTreeSet<u64> = r.get(inst)?.1.iter().copied().collect();
                    if region_gpus.len() != 1 || &region_gpus != gpus || !copies.is_subset(gpus) {
                        return None;
                    }
                }
            }
        }
        Some(())
    });
    let _ = agent.kill();
    let _ = agent.wait();
}

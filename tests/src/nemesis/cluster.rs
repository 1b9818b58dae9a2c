//! The processes a nemesis run works on: three replicas, two simulated
//! agents, and a [`FaultProxy`] on every link that can be cut.
//!
//! ```text
//!            ┌──────── raft ────────┐
//!   r1 ◀─────┤ r2 ◀─ P2   r3 ◀─ P3  │   (peers send to P2/P3; r1 is named by
//!            └──────────────────────┘    its own address: it initializes)
//!   agent local-c1 ─ A(c1,1..3) ─▶ r1 r2 r3      one proxy per agent × replica
//!   agent local-c2 ─ A(c2,1..3) ─▶ r1 r2 r3
//!   r3's data dir: a 64 MiB tmpfs when the machine allows the mount
//! ```
//!
//! Tenants: `acme` deploys, updates and deletes functions (the local
//! topology's quotas, which run out); `globex` has one function, `steady`
//! (2 fixed instances), that the invokers call. Agents journal residency
//! only when an instance goes (`[metering] interval_ms` 10 min), so the
//! journals stop moving once the load stops.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::{call, json_of, until, AgentProcess, FaultProxy, ProxyLimits, TestRegion, TOKEN};

/// The function every invoker calls (tenant `globex`).
pub const STEADY: &str = "steady";
/// The replica whose data directory can fill up.
pub const DISK_REPLICA: u64 = 3;
const DISK_SIZE: &str = "64m";

/// One simulated agent and the proxies of its links to the replicas.
pub struct Agent {
    /// Its node in the local topology.
    pub node: String,
    /// Its ingress (HTTP).
    pub ingress: SocketAddr,
    /// Its links: one proxy per replica, in replica order.
    pub links: Vec<FaultProxy>,
    config: PathBuf,
    process: Option<AgentProcess>,
    starts: u32,
}

/// A small tmpfs under one replica's data directory.
#[derive(Debug)]
pub struct SmallDisk {
    /// Where it is mounted.
    pub mount: PathBuf,
    ballast: PathBuf,
}

/// The region, its agents and the proxies between them.
pub struct Cluster {
    /// Replica [`DISK_REPLICA`]'s small data disk, if the mount worked
    /// (first: it unmounts before the region's directory is removed).
    pub disk: Option<SmallDisk>,
    /// The replicas.
    pub region: TestRegion,
    /// Proxies in front of replicas 2 and 3's QUIC endpoints (raft traffic
    /// from the other replicas goes through them), by replica id.
    pub raft_links: Vec<(u64, FaultProxy)>,
    /// The agents.
    pub agents: Vec<Agent>,
    /// Why there is no small disk.
    pub disk_skipped: Option<String>,
    /// A token of `acme`.
    pub acme: String,
    /// A token of `globex`.
    pub globex: String,
    paused: BTreeSet<u64>,
    rt: tokio::runtime::Runtime,
}

impl SmallDisk {
    /// Mounts a 64 MiB tmpfs at `path` (created if missing); `Err` says why
    /// the machine refused (not root, no `CAP_SYS_ADMIN`).
    pub fn mount(path: &std::path::Path) -> Result<SmallDisk, String> {
        mount_tmpfs(path)?;
        Ok(SmallDisk {
            ballast: path.join("ballast"),
            mount: path.to_path_buf(),
        })
    }

    /// Fills it until the file system refuses; returns the bytes written.
    pub fn fill(&self) -> anyhow::Result<u64> {
        use std::io::Write;
        let mut f = std::fs::File::create(&self.ballast)?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        while f.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
        }
        // The rest, to the last byte.
        let mut small = vec![0u8; 4096];
        while let Ok(n) = f.write(&small) {
            if n == 0 {
                break;
            }
            written += n as u64;
            small.truncate(small.len().max(2) / 2);
        }
        let _ = f.sync_all();
        Ok(written)
    }

    /// Removes the ballast.
    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.ballast);
    }
}

impl Drop for SmallDisk {
    /// Unmounts (lazily if still busy: drop it after the processes using it).
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mount)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}

fn mount_tmpfs(path: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={DISK_SIZE}"), "tmpfs"])
        .arg(path)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount -t tmpfs refused: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Cluster {
    /// Starts everything and waits until `globex/steady` is ready.
    pub fn start(seed: u64) -> anyhow::Result<Cluster> {
        Self::start_with(seed, "")
    }

    /// [`Cluster::start`] with `extra` top-level lines in every replica's
    /// config (e.g. `node_replace_grace_ms = 60000`).
    pub fn start_with(seed: u64, extra: &str) -> anyhow::Result<Cluster> {
        let mut region = TestRegion::with_config(3, extra)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let mut raft_links = Vec::new();
        for id in [2u64, 3] {
            let upstream = region.replicas[&id].raft_addr;
            let proxy = rt.block_on(FaultProxy::start_with(
                "127.0.0.1:0".parse()?,
                upstream,
                seed.wrapping_add(id),
                ProxyLimits::default(),
            ))?;
            region.route_peers_via(id, proxy.addr())?;
            raft_links.push((id, proxy));
        }
        let data = region.path(&format!("data/r{DISK_REPLICA}"));
        let (disk, disk_skipped) = match SmallDisk::mount(&data) {
            Ok(d) => (Some(d), None),
            Err(why) => (None, Some(why)),
        };
        for id in 1..=3 {
            region.start(id, id == 1)?;
        }
        region.wait_leader(&[1, 2, 3], Duration::from_secs(30))?;
        let http = region.http(1);
        until("tenants loaded", 30, || {
            let r = call(http, "GET", "/v1/tenants", TOKEN, None);
            json_of(&r)
                .as_array()
                .is_some_and(|a| a.len() == 2)
                .then_some(())
        });
        let token = |tenant: &str| -> String {
            let path = format!("/v1/tenants/{tenant}/tokens");
            until(&format!("token of {tenant}"), 30, || {
                let r = call(http, "POST", &path, TOKEN, None);
                json_of(&r)["token"].as_str().map(String::from)
            })
        };
        let acme = token("acme");
        let globex = token("globex");
        let mut cluster = Cluster {
            region,
            raft_links,
            agents: Vec::new(),
            disk,
            disk_skipped,
            acme,
            globex,
            paused: BTreeSet::new(),
            rt,
        };
        for (i, node) in ["local-c1", "local-c2"].into_iter().enumerate() {
            let mut links = Vec::new();
            for (j, r) in cluster.region.replicas.values().enumerate() {
                links.push(cluster.rt.block_on(FaultProxy::start_with(
                    "127.0.0.1:0".parse()?,
                    r.raft_addr,
                    seed.wrapping_add(100 + 10 * i as u64 + j as u64),
                    ProxyLimits::default(),
                ))?);
            }
            let quic: Vec<SocketAddr> = links.iter().map(FaultProxy::addr).collect();
            let (config, ingress) = cluster.region.sim_agent_config_via(
                node,
                &quic,
                "center",
                "center",
                2,
                "[metering]\ninterval_ms = 600000\n",
            )?;
            cluster.agents.push(Agent {
                node: node.to_string(),
                ingress,
                links,
                config,
                process: None,
                starts: 0,
            });
            cluster.start_agent(i)?;
        }
        for node in ["local-c1", "local-c2"] {
            until(&format!("{node} ready"), 30, || {
                let r = call(http, "GET", "/v1/nodes", TOKEN, None);
                json_of(&r)
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|n| n["node"] == json!(node) && n["state"] == json!("ready"))
                    .then_some(())
            });
        }
        let spec = json!({
            "name": STEADY, "runtime": "pytorch", "memory_mib": 2000, "compute_milli": 200,
            "tier": "guaranteed", "deadline_ms": 5000, "pool": "center",
            "min_instances": 2, "max_instances": 2,
            "latency": {"full_gpu_us": 2000, "saturation_milli": 200},
        })
        .to_string();
        let globex = cluster.globex.clone();
        until("globex/steady deployed and ready", 60, || {
            let r = call(
                http,
                "POST",
                "/v1/functions?wait=ready",
                &globex,
                Some(&spec),
            );
            (r.status == 201 || error_is(&r, "duplicate_name")).then_some(())
        });
        Ok(cluster)
    }

    /// The replicas' HTTP addresses, by id order.
    pub fn replica_http(&self) -> Vec<SocketAddr> {
        self.region.replicas.values().map(|r| r.http_addr).collect()
    }

    /// The agents' ingress addresses.
    pub fn agent_ingress(&self) -> Vec<SocketAddr> {
        self.agents.iter().map(|a| a.ingress).collect()
    }

    /// The leader the running replicas agree on, if one is found soon.
    pub fn leader(&self) -> Option<u64> {
        let running = self.region.running();
        let live: Vec<u64> = running
            .into_iter()
            .filter(|id| !self.paused.contains(id))
            .collect();
        self.region.wait_leader(&live, Duration::from_secs(5)).ok()
    }

    /// Kills replica `id` with SIGKILL (resuming it first if paused).
    pub fn kill_replica(&mut self, id: u64) -> anyhow::Result<()> {
        if self.paused.remove(&id) {
            let _ = self.region.signal(id, "CONT");
        }
        self.region.kill9(id)
    }

    /// Starts replica `id` again if it is not running.
    pub fn restart_replica(&mut self, id: u64) -> anyhow::Result<()> {
        if !self.region.alive(id) {
            self.region.kill9(id)?;
            self.region.start(id, false)?;
        }
        Ok(())
    }

    /// SIGSTOPs replica `id`.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.region.signal(id, "STOP")?;
        self.paused.insert(id);
        Ok(())
    }

    /// SIGCONTs replica `id` if paused.
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        if self.paused.remove(&id) {
            self.region.signal(id, "CONT")?;
        }
        Ok(())
    }

    /// Starts agent `i` (its log: `agent-<node>.<n>.err`).
    pub fn start_agent(&mut self, i: usize) -> anyhow::Result<()> {
        let root = self.region.root().to_path_buf();
        let a = &mut self.agents[i];
        a.starts += 1;
        let log = root.join(format!("agent-{}.{}.err", a.node, a.starts));
        a.process = Some(AgentProcess::start_logged(&a.config, &log)?);
        Ok(())
    }

    /// Kills agent `i` with SIGKILL.
    pub fn kill_agent(&mut self, i: usize) {
        self.agents[i].process = None;
    }

    /// Whether agent `i` runs.
    pub fn agent_alive(&mut self, i: usize) -> bool {
        self.agents[i].process.as_mut().is_some_and(|p| p.alive())
    }

    /// Fills the small disk; returns the bytes written.
    pub fn fill_disk(&self) -> anyhow::Result<u64> {
        self.disk.as_ref().context("no small disk")?.fill()
    }

    /// Frees the small disk's ballast.
    pub fn free_disk(&self) {
        if let Some(d) = &self.disk {
            d.free();
        }
    }

    /// Removes every fault: links healed, replicas resumed and restarted,
    /// agents restarted, the disk freed.
    pub fn heal_all(&mut self) -> anyhow::Result<()> {
        for (_, p) in &self.raft_links {
            p.heal();
        }
        for a in &self.agents {
            for p in &a.links {
                p.heal();
            }
        }
        self.free_disk();
        let paused: Vec<u64> = self.paused.iter().copied().collect();
        for id in paused {
            self.resume(id)?;
        }
        for id in 1..=3 {
            self.restart_replica(id)?;
        }
        for i in 0..self.agents.len() {
            if !self.agent_alive(i) {
                self.start_agent(i)?;
            }
        }
        Ok(())
    }

    /// The last lines of replica `id`'s logs (every start), for a report.
    pub fn replica_log_tail(&self, id: u64, lines: usize) -> String {
        let mut all = Vec::new();
        for n in 1..=20u32 {
            let text = self.region.stderr(id, n);
            if text.is_empty() && n > 1 {
                break;
            }
            all.extend(text.lines().map(|l| format!("r{id}.{n}: {l}")));
        }
        let from = all.len().saturating_sub(lines);
        all[from..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.agents {
            a.process = None;
        }
        let ids: Vec<u64> = self.region.replicas.keys().copied().collect();
        for id in ids {
            let _ = self.region.signal(id, "CONT");
            let _ = self.region.kill9(id);
        }
        // Then the fields drop: the small disk unmounts once nothing uses it.
    }
}

/// Whether `r` is an error answer with code `code`.
pub fn error_is(r: &gshare_region::http_client::HttpReply, code: &str) -> bool {
    json_of(r)["error"]["code"] == code
}

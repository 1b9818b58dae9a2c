//! A region of real replica processes in a temporary directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gshare_region::http_client::{request, HttpReply};
use gshare_region::tls;

/// The operator token every test region uses.
pub const TOKEN: &str = "test-operator-token";

const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// `configs/local/topology.toml`: 2 center nodes × 2 GPUs, 2 edge nodes × 1 GPU (16 GiB each).
pub const LOCAL_TOPOLOGY: &str = include_str!("../../configs/local/topology.toml");
/// `configs/local/tenants.toml`: tenants `acme` and `globex`.
pub const LOCAL_TENANTS: &str = include_str!("../../configs/local/tenants.toml");

/// One replica of a [`TestRegion`].
#[derive(Debug)]
pub struct ReplicaProc {
    /// Raft id.
    pub id: u64,
    /// QUIC address.
    pub raft_addr: SocketAddr,
    /// HTTP address.
    pub http_addr: SocketAddr,
    /// Its config file.
    pub config: PathBuf,
    child: Option<Child>,
    starts: u32,
}

/// Replica processes sharing a CA, in one temporary directory.
#[derive(Debug)]
pub struct TestRegion {
    /// The temporary directory (certs, configs, data, logs).
    pub dir: tempfile::TempDir,
    /// Replicas by id (started or not).
    pub replicas: BTreeMap<u64, ReplicaProc>,
    /// Top-level config lines added to every replica's file (e.g. `snapshot_every = 16`).
    extra: String,
    /// The address the other replicas' configs name for a replica's QUIC
    /// endpoint, where it is not its own (a [`crate::FaultProxy`] in front
    /// of it: see [`TestRegion::route_peers_via`]).
    peer_routes: BTreeMap<u64, SocketAddr>,
}

fn free_udp_port() -> anyhow::Result<SocketAddr> {
    Ok(crate::ports::free(true)?)
}

fn free_tcp_port() -> anyhow::Result<SocketAddr> {
    Ok(crate::ports::free(false)?)
}

impl TestRegion {
    /// Prepares `n` replicas (ids 1..=n) whose configs name each other as peers.
    pub fn new(n: u64) -> anyhow::Result<TestRegion> {
        Self::with_config(n, "")
    }

    /// Like [`TestRegion::new`], with `extra` top-level lines in every config.
    pub fn with_config(n: u64, extra: &str) -> anyhow::Result<TestRegion> {
        crate::build_binaries();
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        tls::init_ca(&certs)?;
        // The local demo region's files: `--init` loads them (tests may
        // overwrite them before the first start, or to reload).
        fs::write(dir.path().join("topology.toml"), LOCAL_TOPOLOGY)?;
        fs::write(dir.path().join("tenants.toml"), LOCAL_TENANTS)?;
        let mut region = TestRegion {
            dir,
            replicas: BTreeMap::new(),
            extra: extra.to_string(),
            peer_routes: BTreeMap::new(),
        };
        for id in 1..=n {
            region.prepare(id)?;
        }
        let ids: Vec<u64> = region.replicas.keys().copied().collect();
        for id in ids {
            region.write_config(id, true)?;
        }
        Ok(region)
    }

    fn prepare(&mut self, id: u64) -> anyhow::Result<()> {
        let certs = self.dir.path().join("certs");
        tls::issue(
            &certs,
            &format!("r{id}"),
            &tls::default_sans(&format!("r{id}")),
        )?;
        self.replicas.insert(
            id,
            ReplicaProc {
                id,
                raft_addr: free_udp_port()?,
                http_addr: free_tcp_port()?,
                config: self.dir.path().join(format!("r{id}.toml")),
                child: None,
                starts: 0,
            },
        );
        Ok(())
    }

    /// Prepares one more replica `id` (not a member until added).
    pub fn add_replica_config(&mut self, id: u64) -> anyhow::Result<()> {
        self.prepare(id)?;
        self.write_config(id, false)
    }

    fn write_config(&self, id: u64, with_peers: bool) -> anyhow::Result<()> {
        let r = &self.replicas[&id];
        let mut text = format!(
            "{}\nid = {id}\nraft_addr = \"{}\"\nhttp_addr = \"{}\"\ndata_dir = \"data/r{id}\"\n\
             topology = \"topology.toml\"\ntenants = \"tenants.toml\"\noperator_token = \"{TOKEN}\"\n\n\
             [tls]\nca_cert = \"certs/ca.pem\"\ncert = \"certs/r{id}.pem\"\nkey = \"certs/r{id}.key\"\n",
            self.extra, r.raft_addr, r.http_addr
        );
        if with_peers {
            for p in self.replicas.values().filter(|p| p.id != id) {
                let raft_addr = self.peer_routes.get(&p.id).unwrap_or(&p.raft_addr);
                text.push_str(&format!(
                    "\n[[peers]]\nid = {}\nraft_addr = \"{}\"\nhttp_addr = \"{}\"\n",
                    p.id, raft_addr, p.http_addr
                ));
            }
        }
        fs::write(&r.config, text)?;
        Ok(())
    }

    /// Names `via` (e.g. a [`crate::FaultProxy`] forwarding to replica
    /// `id`'s QUIC address) as replica `id`'s address in the other replicas'
    /// configs, rewritten now (call before the first start). The
    /// membership `--init` creates takes the initializing replica's own
    /// bind address for itself, so its inbound Raft traffic cannot be routed.
    pub fn route_peers_via(&mut self, id: u64, via: SocketAddr) -> anyhow::Result<()> {
        if !self.replicas.contains_key(&id) {
            bail!("no replica {id}");
        }
        self.peer_routes.insert(id, via);
        let ids: Vec<u64> = self.replicas.keys().copied().collect();
        for id in ids {
            self.write_config(id, true)?;
        }
        Ok(())
    }

    /// Path of a file in the region's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts replica `id` (with `--init` if asked); its output goes to `r<id>.<n>.out/err`.
    pub fn start(&mut self, id: u64, init: bool) -> anyhow::Result<()> {
        self.start_with_args(id, init, &[])
    }

    /// [`TestRegion::start`] with extra command-line arguments (e.g. `--log-format json`).
    pub fn start_with_args(&mut self, id: u64, init: bool, extra: &[&str]) -> anyhow::Result<()> {
        let bin = crate::binary("gshare-region");
        let dir = self.dir.path().to_path_buf();
        let r = self
            .replicas
            .get_mut(&id)
            .ok_or_else(|| anyhow!("no replica {id}"))?;
        if r.child.is_some() {
            bail!("replica {id} is already running");
        }
        r.starts += 1;
        let out = fs::File::create(dir.join(format!("r{id}.{}.out", r.starts)))?;
        let err = fs::File::create(dir.join(format!("r{id}.{}.err", r.starts)))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&r.config)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        if init {
            cmd.arg("--init");
        }
        cmd.args(extra);
        r.child = Some(cmd.spawn().context("spawn gshare-region")?);
        Ok(())
    }

    /// The stdout of start number `n` (1-based) of replica `id`.
    pub fn stdout(&self, id: u64, n: u32) -> String {
        fs::read_to_string(self.path(&format!("r{id}.{n}.out"))).unwrap_or_default()
    }

    /// The stderr (its log) of start number `n` (1-based) of replica `id`.
    pub fn stderr(&self, id: u64, n: u32) -> String {
        fs::read_to_string(self.path(&format!("r{id}.{n}.err"))).unwrap_or_default()
    }

    /// Kills replica `id` with SIGKILL and reaps it.
    pub fn kill9(&mut self, id: u64) -> anyhow::Result<()> {
        let r = self
            .replicas
            .get_mut(&id)
            .ok_or_else(|| anyhow!("no replica {id}"))?;
        if let Some(mut c) = r.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Sends replica `id` a signal by name (`STOP` pauses it, `CONT` resumes it).
    pub fn signal(&self, id: u64, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .replicas
            .get(&id)
            .and_then(|r| r.child.as_ref())
            .map(|c| c.id())
            .ok_or_else(|| anyhow!("replica {id} is not running"))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .context("kill")?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// Whether replica `id`'s process is still running.
    pub fn alive(&mut self, id: u64) -> bool {
        match self.replicas.get_mut(&id).and_then(|r| r.child.as_mut()) {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Ids of replicas whose process runs.
    pub fn running(&self) -> Vec<u64> {
        self.replicas
            .values()
            .filter(|r| r.child.is_some())
            .map(|r| r.id)
            .collect()
    }

    /// HTTP address of replica `id`.
    pub fn http(&self, id: u64) -> SocketAddr {
        self.replicas[&id].http_addr
    }

    /// `GET /v1/cluster` of replica `id`.
    pub fn status(&self, id: u64) -> anyhow::Result<serde_json::Value> {
        let r = request(
            self.http(id),
            "GET",
            "/v1/cluster",
            None,
            None,
            HTTP_TIMEOUT,
        )?;
        if r.status != 200 {
            bail!("status of {id}: HTTP {} {}", r.status, r.body);
        }
        Ok(serde_json::from_str(&r.body)?)
    }

    /// Waits until every replica in `among` agrees on one leader that is in
    /// `among` and reports itself leader; returns its id.
    pub fn wait_leader(&self, among: &[u64], timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let views: Vec<Option<u64>> = among
                .iter()
                .map(|id| self.status(*id).ok().and_then(|s| s["leader"].as_u64()))
                .collect();
            if let Some(Some(l)) = views.first() {
                if views.iter().all(|v| *v == Some(*l)) && among.contains(l) {
                    if let Ok(s) = self.status(*l) {
                        if s["role"] == "leader" {
                            return Ok(*l);
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                let why: Vec<String> = among.iter().map(|id| self.describe(*id)).collect();
                bail!(
                    "no agreed leader among {among:?} within {timeout:?} (views {views:?})\n{}",
                    why.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What a failed wait reports of replica `id`: its process (running,
    /// exited or never started), its status answer or why there is none,
    /// and the last lines of its latest output.
    pub fn describe(&self, id: u64) -> String {
        let Some(r) = self.replicas.get(&id) else {
            return format!("replica {id}: unknown");
        };
        let process = match &r.child {
            None => "not running (not started, or stopped by the test)".to_string(),
            Some(c) => match fs::read_to_string(format!("/proc/{}/stat", c.id())) {
                // The state follows the parenthesised name: Z is a zombie.
                Ok(stat) => match stat.rsplit(") ").next().and_then(|s| s.chars().next()) {
                    Some('Z') => format!("pid {} exited (not yet reaped)", c.id()),
                    Some(state) => format!("pid {} running (state {state})", c.id()),
                    None => format!("pid {} (unreadable state)", c.id()),
                },
                Err(_) => format!("pid {} gone", c.id()),
            },
        };
        let status = match self.status(id) {
            Ok(s) => s.to_string(),
            Err(e) => format!("no status: {e:#}"),
        };
        let tail = |text: String| -> String {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n    ")
        };
        format!(
            "replica {id}: {process}; {status}\n  stdout (start {n}):\n    {}\n  stderr (start {n}):\n    {}",
            tail(self.stdout(id, r.starts)),
            tail(self.stderr(id, r.starts)),
            n = r.starts
        )
    }

    /// One attempt to write `key = value` through replica `via` (see [`write_at`]).
    pub fn try_write(&self, via: u64, key: &str, value: &str) -> anyhow::Result<HttpReply> {
        write_at(self.http(via), key, value)
    }

    /// Writes `key = value`, retrying through the running replicas for up to `timeout`.
    pub fn write(&self, key: &str, value: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let ids = self.running();
        let mut i = 0;
        loop {
            let via = ids[i % ids.len()];
            i += 1;
            match self.try_write(via, key, value) {
                Ok(r) if acknowledged(&r) => return Ok(()),
                Ok(r) if matches!(r.status, 400 | 401 | 403 | 422) => {
                    bail!("write {key} refused: {}", r.body)
                }
                _ if Instant::now() > deadline => {
                    bail!("write {key} not acknowledged within {timeout:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Replica `id`'s applied writes under `prefix` (tenant name → display
    /// name, from its local `GET /v1/tenants`).
    pub fn entries(&self, id: u64, prefix: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let r = request(
            self.http(id),
            "GET",
            "/v1/tenants",
            Some(TOKEN),
            None,
            HTTP_TIMEOUT,
        )?;
        if r.status != 200 {
            bail!("entries of {id}: HTTP {} {}", r.status, r.body);
        }
        let v: serde_json::Value = serde_json::from_str(&r.body)?;
        let tenants = v
            .as_array()
            .ok_or_else(|| anyhow!("no tenant list in {}", r.body))?;
        Ok(tenants
            .iter()
            .filter_map(|t| {
                let name = t["name"].as_str()?;
                name.starts_with(prefix).then(|| {
                    let value = t["display_name"].as_str().unwrap_or_default();
                    (name.to_string(), value.to_string())
                })
            })
            .collect())
    }

    /// Waits until replica `id` holds every `expected` entry; returns the missing ones at the deadline.
    pub fn wait_entries(
        &self,
        id: u64,
        prefix: &str,
        expected: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> BTreeSet<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let missing: BTreeSet<String> = match self.entries(id, prefix) {
                Ok(have) => expected
                    .iter()
                    .filter(|(k, v)| have.get(*k) != Some(*v))
                    .map(|(k, _)| k.clone())
                    .collect(),
                Err(_) => expected.keys().cloned().collect(),
            };
            if missing.is_empty() || Instant::now() > deadline {
                return missing;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `gsharectl` with `args`; returns (success, stdout + stderr).
    pub fn gsharectl(&self, args: &[&str]) -> anyhow::Result<(bool, String)> {
        let out = Command::new(crate::binary("gsharectl"))
            .args(args)
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text))
    }

    /// The region's CA directory.
    pub fn certs(&self) -> PathBuf {
        self.path("certs")
    }

    /// A second certificate of the region's CA for replica `id` (named
    /// `r<id>`, as the peer port requires), issued in a directory of its
    /// own (the replica's own files stay as they are): a probe that speaks
    /// the peer protocol as that replica.
    pub fn replica_probe(&self, id: u64) -> anyhow::Result<(tempfile::TempDir, tls::TlsPaths)> {
        let certs = self.certs();
        let dir = tempfile::tempdir()?;
        for f in ["ca.pem", "ca.key"] {
            fs::copy(certs.join(f), dir.path().join(f))?;
        }
        let name = format!("r{id}");
        let (cert, key) = tls::issue(dir.path(), &name, &tls::default_sans(&name))?;
        let paths = tls::TlsPaths {
            ca_cert: certs.join("ca.pem"),
            cert,
            key,
        };
        Ok((dir, paths))
    }

    /// Writes the config of a simulated center agent for `node` (two
    /// 16 GiB GPUs, 200 ms heartbeats) with a certificate issued by the
    /// region's CA, listing the replicas `order` first, then the others
    /// (the agent links to the first that answers). Returns the config's
    /// path and the agent's ingress address.
    pub fn sim_agent_config(
        &self,
        node: &str,
        order: &[u64],
    ) -> anyhow::Result<(PathBuf, SocketAddr)> {
        self.sim_agent_config_in(node, order, "center", "center", 2)
    }

    /// [`TestRegion::sim_agent_config`] for a node of pool `pool` (of kind
    /// `kind`) with `gpus` 16 GiB GPUs (an edge node of the local
    /// topology: `edge-a`, `edge`, 1).
    pub fn sim_agent_config_in(
        &self,
        node: &str,
        order: &[u64],
        pool: &str,
        kind: &str,
        gpus: u32,
    ) -> anyhow::Result<(PathBuf, SocketAddr)> {
        let mut ids: Vec<u64> = self.replicas.keys().copied().collect();
        ids.sort_by_key(|id| {
            (
                order.iter().position(|o| o == id).unwrap_or(usize::MAX),
                *id,
            )
        });
        let quic: Vec<SocketAddr> = ids.iter().map(|id| self.replicas[id].raft_addr).collect();
        self.sim_agent_config_via(node, &quic, pool, kind, gpus, "")
    }

    /// [`TestRegion::sim_agent_config_in`] with the replicas' QUIC
    /// addresses given in order (e.g. [`crate::FaultProxy`]s in front of
    /// them) and `extra` config lines (sections such as `[metering]`).
    pub fn sim_agent_config_via(
        &self,
        node: &str,
        quic: &[SocketAddr],
        pool: &str,
        kind: &str,
        gpus: u32,
        extra: &str,
    ) -> anyhow::Result<(PathBuf, SocketAddr)> {
        let certs = self.certs();
        let certs = certs.to_str().context("certs path")?;
        let (ok, out) = self.gsharectl(&["certs", "issue", "--dir", certs, "--name", node])?;
        if !ok {
            bail!("certs issue --name {node}: {out}");
        }
        let ingress = free_tcp_port()?;
        let replicas: String = quic
            .iter()
            .map(|a| format!("[[replicas]]\nquic_addr = \"{a}\"\n"))
            .collect();
        let config = self.root().join(format!("agent-{node}.toml"));
        fs::write(
            &config,
            format!(
                r#"node = "{node}"
pool = "{pool}"
pool_kind = "{kind}"
data_dir = "data/agent-{node}"
ingress_addr = "{ingress}"
host_swap_mib = 8192
heartbeat_ms = 200
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim-gpu-16g"
memory_mib = 16384
h2d_mib_per_s = 12000
count = {gpus}
[load]
cold_setup_us = 20000
{extra}
{replicas}
[tls]
ca_cert = "certs/ca.pem"
cert = "certs/{node}.pem"
key = "certs/{node}.key"
"#
            ),
        )?;
        Ok((config, ingress))
    }

    /// The config directory of the region.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

/// One domain write of `key = value` to the replica at `addr`: create
/// tenant `key` with display name `value` (`POST /v1/tenants`, a Raft
/// entry like any other; followers forward it to the leader). Keys must be
/// unique per write and valid tenant names; see [`acknowledged`].
pub fn write_at(addr: SocketAddr, key: &str, value: &str) -> anyhow::Result<HttpReply> {
    let body = serde_json::json!({ "name": key, "display_name": value }).to_string();
    Ok(request(
        addr,
        "POST",
        "/v1/tenants",
        Some(TOKEN),
        Some(&body),
        HTTP_TIMEOUT,
    )?)
}

/// Whether `r` acknowledges a [`write_at`]: `201`, or `409 duplicate_name`
/// when an earlier attempt of the same write was applied but its answer
/// was lost (keys are unique per write; the value is checked when read back).
pub fn acknowledged(r: &HttpReply) -> bool {
    r.status == 201
        || (r.status == 409
            && serde_json::from_str::<serde_json::Value>(&r.body)
                .is_ok_and(|v| v["error"]["code"] == "duplicate_name"))
}

impl Drop for TestRegion {
    fn drop(&mut self) {
        for r in self.replicas.values_mut() {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

//! The files of a local region: a CA and certificates, the operator's
//! topology and tenants files, one config per replica and per agent, and
//! the free loopback ports they name.
//!
//! ```text
//! <dir>/certs/{ca,r1,r2,r3,<node>…}.{pem,key}   one CA, a certificate per process
//! <dir>/topology.toml, tenants.toml            copies of configs/local/ (embedded)
//! <dir>/r<i>.toml                              replica configs (peers: the other two)
//! <dir>/agent-<node>.toml                      agent configs (simulated GPUs of the node)
//! <dir>/data/{r<i>,agent-<node>}/              sled data
//! <dir>/logs/{r<i>,agent-<node>}.log           each process's stdout and stderr
//! <dir>/runtimes/, <dir>/metrics-token          with --runtime microvm only (microvm.rs)
//! ```

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use anyhow::Context;
use gshare_core::config::Topology;

use super::microvm::MicrovmSetup;
use crate::tls;

/// `configs/local/topology.toml`, embedded.
pub const LOCAL_TOPOLOGY: &str = include_str!("../../../../configs/local/topology.toml");
/// `configs/local/tenants.toml`, embedded.
pub const LOCAL_TENANTS: &str = include_str!("../../../../configs/local/tenants.toml");

/// Agents send a heartbeat this often (finer than the 1 s default, so the
/// utilization samples of a short demo have more points).
const HEARTBEAT_MS: u64 = 200;

/// One replica's place in the layout.
#[derive(Debug, Clone)]
pub struct ReplicaSlot {
    /// Raft id (1-based).
    pub id: u64,
    /// QUIC (UDP) address.
    pub raft_addr: SocketAddr,
    /// HTTP (TCP) address.
    pub http_addr: SocketAddr,
    /// Config file.
    pub config: PathBuf,
    /// Log file.
    pub log: PathBuf,
}

/// One agent's place in the layout.
#[derive(Debug, Clone)]
pub struct AgentSlot {
    /// The topology node it runs.
    pub node: String,
    /// The node's pool.
    pub pool: String,
    /// HTTP ingress (TCP) address.
    pub ingress: SocketAddr,
    /// Simulated GPUs on the node.
    pub gpus: u32,
    /// Config file.
    pub config: PathBuf,
    /// Log file.
    pub log: PathBuf,
}

/// Everything written for a local region.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The region's directory.
    pub dir: PathBuf,
    /// The replicas.
    pub replicas: Vec<ReplicaSlot>,
    /// One agent per topology node.
    pub agents: Vec<AgentSlot>,
    /// The parsed topology.
    pub topology: Topology,
    /// The demo's functions run in microVMs (`--runtime microvm`).
    pub microvm: Option<MicrovmSetup>,
}

/// Free loopback ports: each socket is held until all are chosen, so no
/// two are the same; they are released for the children to bind.
#[derive(Default)]
struct PortPicker {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
}

impl PortPicker {
    fn udp(&mut self) -> anyhow::Result<SocketAddr> {
        let s = UdpSocket::bind("127.0.0.1:0").context("finding a free UDP port")?;
        let a = s.local_addr()?;
        self.udp.push(s);
        Ok(a)
    }

    fn tcp(&mut self) -> anyhow::Result<SocketAddr> {
        let s = TcpListener::bind("127.0.0.1:0").context("finding a free TCP port")?;
        let a = s.local_addr()?;
        self.tcp.push(s);
        Ok(a)
    }
}

impl Layout {
    /// Writes certificates and configs of `replicas` replicas and one agent
    /// per node of the local topology into `dir`, on free ports; with
    /// `microvm`, the agents run the demo's runtime in microVMs.
    pub fn write(
        dir: &Path,
        replicas: u64,
        operator_token: &str,
        microvm: Option<MicrovmSetup>,
    ) -> anyhow::Result<Layout> {
        let topology = Topology::from_toml("configs/local/topology.toml", LOCAL_TOPOLOGY)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for sub in ["certs", "data", "logs"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| dir.join(sub).display().to_string())?;
        }
        std::fs::write(dir.join("topology.toml"), LOCAL_TOPOLOGY)?;
        std::fs::write(dir.join("tenants.toml"), LOCAL_TENANTS)?;
        let certs = dir.join("certs");
        tls::init_ca(&certs).context("creating the CA")?;
        let mut ports = PortPicker::default();
        let mut layout = Layout {
            dir: dir.to_path_buf(),
            replicas: Vec::new(),
            agents: Vec::new(),
            topology,
            microvm,
        };
        if let Some(m) = &layout.microvm {
            m.write(dir)?;
        }
        for id in 1..=replicas {
            let name = format!("r{id}");
            tls::issue(&certs, &name, &tls::default_sans(&name))
                .with_context(|| format!("issuing {name}'s certificate"))?;
            layout.replicas.push(ReplicaSlot {
                id,
                raft_addr: ports.udp()?,
                http_addr: ports.tcp()?,
                config: dir.join(format!("{name}.toml")),
                log: dir.join("logs").join(format!("{name}.log")),
            });
        }
        let nodes: Vec<_> = layout.topology.nodes().cloned().collect();
        for node in nodes {
            let name = node.name.0.clone();
            tls::issue(&certs, &name, &tls::default_sans(&name))
                .with_context(|| format!("issuing {name}'s certificate"))?;
            layout.agents.push(AgentSlot {
                node: name.clone(),
                pool: node.pool.clone(),
                ingress: ports.tcp()?,
                gpus: node.gpu_count(),
                config: dir.join(format!("agent-{name}.toml")),
                log: dir.join("logs").join(format!("agent-{name}.log")),
            });
        }
        drop(ports);
        for r in &layout.replicas {
            std::fs::write(&r.config, layout.replica_config(r, operator_token))?;
        }
        for a in &layout.agents {
            std::fs::write(&a.config, layout.agent_config(a)?)?;
        }
        Ok(layout)
    }

    fn replica_config(&self, r: &ReplicaSlot, operator_token: &str) -> String {
        let id = r.id;
        let mut t = format!(
            "# Replica {id} of the local region started by `gsharectl up`.\n\
             id = {id}\nraft_addr = \"{}\"\nhttp_addr = \"{}\"\ndata_dir = \"data/r{id}\"\n\
             topology = \"topology.toml\"\ntenants = \"tenants.toml\"\n\
             operator_token = \"{operator_token}\"\n\n\
             [tls]\nca_cert = \"certs/ca.pem\"\ncert = \"certs/r{id}.pem\"\nkey = \"certs/r{id}.key\"\n",
            r.raft_addr, r.http_addr
        );
        for p in self.replicas.iter().filter(|p| p.id != id) {
            let _ = write!(
                t,
                "\n[[peers]]\nid = {}\nraft_addr = \"{}\"\nhttp_addr = \"{}\"\n",
                p.id, p.raft_addr, p.http_addr
            );
        }
        t
    }

    /// The agent config of `a`: the node's simulated GPUs and load costs
    /// as the topology gives them (same shape as
    /// `configs/local/agent-local-c1.toml`).
    fn agent_config(&self, a: &AgentSlot) -> anyhow::Result<String> {
        let node = self
            .topology
            .node(&a.node)
            .ok_or_else(|| anyhow::anyhow!("node {} not in the topology", a.node))?;
        let mut t = format!(
            "# The agent of node {node_name} (pool {pool}) started by `gsharectl up`.\n\
             node = \"{node_name}\"\npool = \"{pool}\"\npool_kind = \"{kind}\"\n\
             data_dir = \"data/agent-{node_name}\"\ningress_addr = \"{ingress}\"\n\
             host_swap_mib = {swap}\nheartbeat_ms = {HEARTBEAT_MS}\n",
            node_name = a.node,
            pool = node.pool,
            kind = node.kind.as_str(),
            ingress = a.ingress,
            swap = node.swap_mib,
        );
        if let Some(m) = &self.microvm {
            t.push_str(&m.agent_keys());
        }
        t.push_str("\n[gpus]\nbackend = \"simulated\"\n");
        for g in &node.gpus {
            let _ = write!(
                t,
                "\n[[gpus.simulated]]\nmodel = \"{}\"\nmemory_mib = {}\nh2d_mib_per_s = {}\ncount = {}\n",
                g.model, g.memory_mib, g.h2d_mib_per_s, g.count
            );
        }
        let _ = write!(
            t,
            "\n[load]\nswap_setup_us = {}\ncold_setup_us = {}\nstorage_mib_per_s = {}\n",
            node.swap.setup_us, node.cold_start.setup_us, node.cold_start.storage_mib_per_s
        );
        for r in &self.replicas {
            let _ = write!(t, "\n[[replicas]]\nquic_addr = \"{}\"\n", r.raft_addr);
        }
        let _ = write!(
            t,
            "\n[tls]\nca_cert = \"certs/ca.pem\"\ncert = \"certs/{0}.pem\"\nkey = \"certs/{0}.key\"\n",
            a.node
        );
        if let Some(m) = &self.microvm {
            t.push_str(&m.agent_runtimes());
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_configs_that_the_replica_and_agent_parsers_accept() {
        let dir = tempfile::tempdir().unwrap();
        let l = Layout::write(dir.path(), 3, "tok", None).unwrap();
        assert_eq!(l.replicas.len(), 3);
        assert_eq!(
            l.agents.iter().map(|a| a.node.as_str()).collect::<Vec<_>>(),
            ["local-c1", "local-c2", "local-ea1", "local-eb1"]
        );
        for r in &l.replicas {
            let c = crate::config::ReplicaConfig::load(&r.config).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.peers.len(), 2);
            assert!(c.tls.cert.exists());
        }
        let mut addrs = std::collections::BTreeSet::new();
        for a in &l.agents {
            let text = std::fs::read_to_string(&a.config).unwrap();
            let c = gshare_core::config::AgentConfig::from_toml("agent.toml", &text)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(c.node.0, a.node);
            assert!(addrs.insert(a.ingress));
            assert!(dir.path().join(format!("certs/{}.pem", a.node)).exists());
            assert!(c.runtimes.listed.is_empty(), "sim only: {text}");
        }
        for r in &l.replicas {
            assert!(addrs.insert(r.http_addr), "ports are distinct");
        }
    }

    #[test]
    fn with_microvm_every_agent_runs_the_demo_runtime_in_microvms() {
        let dir = tempfile::tempdir().unwrap();
        let setup = MicrovmSetup {
            image: PathBuf::from("/images/microvm"),
            metrics_token: "m-tok".into(),
        };
        let l = Layout::write(dir.path(), 3, "tok", Some(setup)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(super::super::microvm::METRICS_TOKEN_FILE))
                .unwrap(),
            "m-tok"
        );
        assert!(dir.path().join("runtimes/demo_function.py").is_file());
        for a in &l.agents {
            let text = std::fs::read_to_string(&a.config).unwrap();
            let c = gshare_core::config::AgentConfig::from_toml("agent.toml", &text)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(c.metrics_token_file.as_deref(), Some("metrics-token"));
            let r = &c.runtimes.listed;
            assert_eq!(r.len(), 1, "{text}");
            assert_eq!(r[0].runtime, gshare_core::model::Runtime::Pytorch);
            assert_eq!(r[0].driver, gshare_core::config::DriverKind::Microvm);
            let template = r[0].template.as_ref().expect("template");
            assert!(dir.path().join(&template.path).is_file(), "{text}");
            assert_eq!(
                r[0].image.as_ref().map(|i| i.path.as_str()),
                Some("/images/microvm")
            );
        }
    }
}

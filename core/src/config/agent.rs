//! A node agent's configuration (`gshare-edge --config <file>`), validated.

use crate::model::{Mib, Micros, NodeId, PoolKind};
use std::net::SocketAddr;

/// What the agent does when NVML is unavailable (no driver, no library,
/// no permission).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmlFallback {
    /// Refuse to start.
    Error,
    /// Warn and use the `[[gpus.simulated]]` GPUs instead.
    Simulated,
}

/// How the agent's usage journal makes an append durable
/// (`[metering] journal_sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JournalSync {
    /// `"direct"` (default): through the journal's write-ahead log, one
    /// `O_DIRECT` write per group commit on ext4 and XFS (elsewhere written
    /// as `Dsync`); the write returns once the device has it (the level of
    /// sled's own flush, `sync_file_range`: a device's volatile write cache
    /// is not flushed).
    #[default]
    Direct,
    /// `"dsync"`: the same log written `O_DIRECT | O_DSYNC`: each write also
    /// flushes the device's volatile cache (disks without power-loss
    /// protection).
    Dsync,
    /// `"sled"`: no log; each group commit flushes sled (as before the log).
    Sled,
}

/// A group of identical simulated GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatedGpus {
    /// GPU model name (as in the topology's catalog).
    pub model: String,
    /// Memory of each GPU, MiB.
    pub memory_mib: Mib,
    /// Host-to-device bandwidth, MiB/s (times swap-ins).
    pub h2d_mib_per_s: u64,
    /// How many.
    pub count: u32,
}

/// Where the node's GPUs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// The GPUs listed in the config, with exact accounting.
    Simulated(Vec<SimulatedGpus>),
    /// Discovered through NVML; `fallback` decides what happens without a
    /// driver, `simulated` is used when it says so.
    Nvml {
        /// Without NVML: error or simulated.
        fallback: NvmlFallback,
        /// The fallback GPUs (empty unless `fallback` is `Simulated`).
        simulated: Vec<SimulatedGpus>,
        /// Host-to-device bandwidth assumed for discovered GPUs, MiB/s.
        h2d_mib_per_s: u64,
    },
}

/// Swap-in and cold-start costs of the node (the topology's `[swap]` and
/// `[cold_start]` rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLoadCosts {
    /// Fixed cost of a swap-in, µs.
    pub swap_setup_us: Micros,
    /// Fixed cost of a cold start, µs.
    pub cold_setup_us: Micros,
    /// Storage bandwidth for cold starts, MiB/s.
    pub storage_mib_per_s: u64,
}

/// The agent's certificates (paths as written; relative to the config file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTls {
    /// The operator CA (PEM).
    pub ca_cert: String,
    /// The agent's certificate (PEM), issued by that CA.
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

/// The certificate and key of the agent's HTTPS ingress (`[http_tls]`;
/// paths as written, relative to the config file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTls {
    /// The server certificate chain (PEM), e.g. from `gsharectl certs issue`.
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

/// A validated agent config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The node this agent runs (must be in the region's topology).
    pub node: NodeId,
    /// The node's pool.
    pub pool: String,
    /// The pool's kind.
    pub pool_kind: PoolKind,
    /// Where the agent keeps its data (usage journal).
    pub data_dir: String,
    /// HTTP ingress for invocations.
    pub ingress_addr: SocketAddr,
    /// QUIC addresses of the region's replicas.
    pub replicas: Vec<SocketAddr>,
    /// Local address of the agent's QUIC endpoint (`quic_bind`; default:
    /// the unspecified address of the first replica's family, any port).
    pub quic_bind: SocketAddr,
    /// Certificates.
    pub tls: AgentTls,
    /// GPUs.
    pub gpus: GpuSource,
    /// Host memory for swapped-out weights, MiB.
    pub host_swap_mib: Mib,
    /// Load costs.
    pub load: AgentLoadCosts,
    /// Heartbeat period, ms.
    pub heartbeat_ms: u64,
    /// The runtime driver of each runtime (`[runtimes]`; `sim` when unlisted).
    pub runtimes: super::RuntimeDrivers,
    /// How often resident GPU memory is metered and journaled, ms
    /// (`[metering] interval_ms`, default 1000).
    pub metering_interval_ms: u64,
    /// How long an invocation's outcome is kept under its idempotency key
    /// in the usage journal, s (`[metering] invoke_key_window_s`, 60 to
    /// 604,800, default 600).
    pub invoke_key_window_s: u64,
    /// How a journal append is made durable (`[metering] journal_sync`).
    pub journal_sync: JournalSync,
    /// `allow_fewer_gpus = true`: the region accepts fewer discovered GPUs
    /// than the topology gives the node and marks the missing ones
    /// unavailable (default false: any difference refuses registration).
    pub allow_fewer_gpus: bool,
    /// `[http_tls]`: the ingress speaks HTTPS with this certificate.
    pub http_tls: Option<HttpTls>,
    /// `insecure_http = true`: plain HTTP on a non-loopback ingress address
    /// (bearer tokens in clear); without it such a bind needs `[http_tls]`.
    pub insecure_http: bool,
    /// The certificate files named (`tls.*`, `http_tls.*`) with their
    /// places, for the agent's start-up check that each one exists.
    pub files: Vec<super::FileRef>,
    /// `metrics_token_file`: the file (relative to the config) holding the
    /// token that shows the tenant-labelled series of `/metrics`; without
    /// it they are shown to nobody.
    pub metrics_token_file: Option<String>,
    /// `max_request_bytes`: the largest invocation request body the
    /// ingress accepts (default
    /// [`crate::protocol::DEFAULT_MAX_REQUEST_BYTES`], 4 MiB; 1 KiB to 7 MiB).
    pub max_request_bytes: usize,
    /// `body_idle_timeout_ms`: the longest a request body may pause (no
    /// bytes arriving) before its upload is cut and the call aborted
    /// (`408 body_timeout`; default
    /// [`crate::protocol::DEFAULT_BODY_IDLE_TIMEOUT_MS`], 10 s; 100 ms to
    /// 10 min).
    pub body_idle_timeout_ms: u64,
}

impl AgentConfig {
    /// Parses and validates an agent config; every mistake is reported at once.
    pub fn from_toml(file: &str, src: &str) -> Result<Self, super::ConfigError> {
        super::agent_file::parse_agent(file, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
node = "n1"
pool = "center"
pool_kind = "center"
data_dir = "d"
ingress_addr = "127.0.0.1:9000"
host_swap_mib = 1024
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "g"
memory_mib = 1000
h2d_mib_per_s = 10
count = 2
[[replicas]]
quic_addr = "127.0.0.1:7000"
[tls]
ca_cert = "ca.pem"
cert = "c.pem"
key = "c.key"
"#;

    #[test]
    fn the_request_body_cap_has_one_default_and_a_checked_range() {
        let c = AgentConfig::from_toml("a.toml", GOOD).unwrap();
        assert_eq!(
            c.max_request_bytes,
            crate::protocol::DEFAULT_MAX_REQUEST_BYTES
        );
        let set = format!("max_request_bytes = 65536\n{GOOD}");
        let c = AgentConfig::from_toml("a.toml", &set).unwrap();
        assert_eq!(c.max_request_bytes, 65536);
        for bad in ["max_request_bytes = 100", "max_request_bytes = 8_388_608"] {
            let e = AgentConfig::from_toml("a.toml", &format!("{bad}\n{GOOD}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("a.toml:1:21: max_request_bytes: must be from 1024 to 7340032"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_journal_sync_defaults_to_direct_and_names_its_choices() {
        let c = AgentConfig::from_toml("a.toml", GOOD).unwrap();
        assert_eq!(c.journal_sync, JournalSync::Direct);
        for (v, want) in [
            ("direct", JournalSync::Direct),
            ("dsync", JournalSync::Dsync),
            ("sled", JournalSync::Sled),
        ] {
            let f = format!("{GOOD}[metering]\njournal_sync = \"{v}\"\n");
            assert_eq!(
                AgentConfig::from_toml("a.toml", &f).unwrap().journal_sync,
                want
            );
        }
        let f = format!("{GOOD}[metering]\njournal_sync = \"fsync\"\n");
        let e = AgentConfig::from_toml("a.toml", &f)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("metering.journal_sync: expected \"direct\", \"dsync\" or \"sled\""),
            "{e}"
        );
    }

    #[test]
    fn the_body_idle_timeout_has_one_default_and_a_checked_range() {
        let c = AgentConfig::from_toml("a.toml", GOOD).unwrap();
        assert_eq!(c.body_idle_timeout_ms, 10_000);
        let set = format!("body_idle_timeout_ms = 250\n{GOOD}");
        let c = AgentConfig::from_toml("a.toml", &set).unwrap();
        assert_eq!(c.body_idle_timeout_ms, 250);
        for bad in [
            "body_idle_timeout_ms = 99",
            "body_idle_timeout_ms = 600_001",
        ] {
            let e = AgentConfig::from_toml("a.toml", &format!("{bad}\n{GOOD}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("a.toml:1:24: body_idle_timeout_ms: must be from 100 to 600000"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_good_file_parses_with_defaults() {
        let c = AgentConfig::from_toml("a.toml", GOOD).unwrap();
        assert_eq!(c.node, NodeId("n1".into()));
        assert_eq!(c.heartbeat_ms, 1000);
        assert_eq!(c.metering_interval_ms, 1000);
        assert_eq!(c.invoke_key_window_s, 600);
        let w = format!("{GOOD}[metering]\ninvoke_key_window_s = 3600\n");
        assert_eq!(
            AgentConfig::from_toml("a.toml", &w)
                .unwrap()
                .invoke_key_window_s,
            3600
        );
        let w = format!("{GOOD}[metering]\ninvoke_key_window_s = 5\n");
        let e = AgentConfig::from_toml("a.toml", &w)
            .unwrap_err()
            .to_string();
        assert!(e.contains("metering.invoke_key_window_s"), "{e}");
        let m = format!("{GOOD}[metering]\ninterval_ms = 250\n");
        assert_eq!(
            AgentConfig::from_toml("a.toml", &m)
                .unwrap()
                .metering_interval_ms,
            250
        );
        for bad in [
            "interval_ms = 5",
            "interval_ms = \"fast\"",
            "intervl_ms = 100",
        ] {
            let m = format!("{GOOD}[metering]\n{bad}\n");
            let e = AgentConfig::from_toml("a.toml", &m)
                .unwrap_err()
                .to_string();
            assert!(e.contains("metering.inter"), "{bad}: {e}");
        }
        assert_eq!(c.load.swap_setup_us, 2_000);
        assert_eq!(c.replicas.len(), 1);
        match c.gpus {
            GpuSource::Simulated(g) => assert_eq!(g[0].count, 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn quic_bind_defaults_to_the_first_replicas_family() {
        let c = AgentConfig::from_toml("a.toml", GOOD).unwrap();
        assert_eq!(c.quic_bind, "0.0.0.0:0".parse::<SocketAddr>().unwrap());
        let v6 = GOOD.replace("127.0.0.1:7000", "[::1]:7000");
        let c = AgentConfig::from_toml("a.toml", &v6).unwrap();
        assert_eq!(c.quic_bind, "[::]:0".parse::<SocketAddr>().unwrap());
        let set = format!("quic_bind = \"10.0.0.5:0\"\n{GOOD}");
        let c = AgentConfig::from_toml("a.toml", &set).unwrap();
        assert_eq!(c.quic_bind, "10.0.0.5:0".parse::<SocketAddr>().unwrap());
        for (bad, needle) in [
            (
                "quic_bind = \"anywhere\"",
                "quic_bind: expected an ip:port address",
            ),
            ("quic_bind = 5", "quic_bind:"),
        ] {
            let e = AgentConfig::from_toml("a.toml", &format!("{bad}\n{GOOD}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        let mixed = format!("quic_bind = \"0.0.0.0:0\"\n{v6}");
        let e = AgentConfig::from_toml("a.toml", &mixed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("quic_bind: an IPv4 address cannot reach"), "{e}");
    }

    #[test]
    fn every_mistake_is_reported_with_its_key_path() {
        let bad = GOOD
            .replace("pool_kind = \"center\"", "pool_kind = \"middle\"")
            .replace("127.0.0.1:9000", "nowhere")
            .replace("count = 2", "count = 2\ncuont = 3")
            .replace(
                "backend = \"simulated\"",
                "backend = \"simulated\"\nnvml_fallback = \"error\"",
            );
        let e = AgentConfig::from_toml("a.toml", &bad)
            .unwrap_err()
            .to_string();
        for needle in [
            "a.toml:",
            "pool_kind:",
            "ingress_addr: expected an ip:port address",
            "gpus.simulated[0].cuont: unknown key",
            "gpus.nvml_fallback: only meaningful",
        ] {
            assert!(e.contains(needle), "{needle:?} missing in:\n{e}");
        }
        assert_eq!(e.lines().count(), 4, "{e}");
    }

    #[test]
    fn nvml_with_simulated_fallback_needs_groups() {
        let nvml = GOOD.replace(
            "backend = \"simulated\"",
            "backend = \"nvml\"\nnvml_fallback = \"simulated\"",
        );
        let c = AgentConfig::from_toml("a.toml", &nvml).unwrap();
        assert!(matches!(
            c.gpus,
            GpuSource::Nvml {
                fallback: NvmlFallback::Simulated,
                ..
            }
        ));
        let start = nvml.find("[[gpus.simulated]]").unwrap();
        let end = nvml.find("[[replicas]]").unwrap();
        let no_groups = format!("{}{}", &nvml[..start], &nvml[end..]);
        let e = AgentConfig::from_toml("a.toml", &no_groups)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpus.nvml_fallback: nvml_fallback = \"simulated\" needs"),
            "{e}"
        );
    }

    #[test]
    fn a_non_loopback_ingress_needs_http_tls_or_insecure_http() {
        let c = AgentConfig::from_toml("a.toml", GOOD).unwrap();
        assert!(!c.allow_fewer_gpus && !c.insecure_http && c.http_tls.is_none());
        for bind in ["0.0.0.0:9000", "192.168.1.5:9000", "[::]:9000"] {
            let bad = GOOD.replace("127.0.0.1:9000", bind);
            let e = AgentConfig::from_toml("a.toml", &bad).unwrap_err();
            let text = e.to_string();
            assert_eq!(e.issues.len(), 1, "{text}");
            assert!(text.starts_with("a.toml:6:"), "{text}");
            assert!(text.contains("ingress_addr: "), "{text}");
            assert!(
                text.contains("[http_tls]") && text.contains("insecure_http = true"),
                "{text}"
            );
        }
        let open = GOOD.replace("127.0.0.1:9000", "0.0.0.0:9000");
        let ok = open.replace("host_swap_mib", "insecure_http = true\nhost_swap_mib");
        assert!(AgentConfig::from_toml("a.toml", &ok).unwrap().insecure_http);
        let tls = format!("{open}[http_tls]\ncert = \"h.pem\"\nkey = \"h.key\"\n");
        let c = AgentConfig::from_toml("a.toml", &tls).unwrap();
        assert_eq!(
            c.http_tls,
            Some(HttpTls {
                cert: "h.pem".into(),
                key: "h.key".into()
            })
        );
        let half = format!("{open}[http_tls]\ncert = \"h.pem\"\n");
        let e = AgentConfig::from_toml("a.toml", &half)
            .unwrap_err()
            .to_string();
        assert!(e.contains("http_tls.key"), "{e}");
        let fewer = GOOD.replace("host_swap_mib", "allow_fewer_gpus = true\nhost_swap_mib");
        assert!(
            AgentConfig::from_toml("a.toml", &fewer)
                .unwrap()
                .allow_fewer_gpus
        );
        let typo = GOOD.replace("host_swap_mib", "allow_fewer_gpus = \"yes\"\nhost_swap_mib");
        let e = AgentConfig::from_toml("a.toml", &typo)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("allow_fewer_gpus: expected true or false"),
            "{e}"
        );
    }
}

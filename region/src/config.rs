//! A replica's configuration file, parsed strictly with every error at once.
//!
//! ```toml
//! id = 1
//! raft_addr = "127.0.0.1:7101"      # QUIC: Raft RPC and forwarded writes
//! http_addr = "127.0.0.1:8101"      # HTTP API
//! data_dir = "data/r1"              # relative paths are relative to this file
//! topology = "topology.toml"
//! tenants = "tenants.toml"
//! operator_token_file = "operator.token"  # file holding the operator's bearer token
//! # operator_token = "change-me"    # or inline (for tests and local demos only)
//! metrics_token_file = "metrics.token"  # optional: unlocks tenant series on /metrics
//! snapshot_every = 20000            # optional: entries between snapshots
//! keep_logs = 1000                  # optional: entries kept behind a snapshot
//! agent_join_grace_s = 60           # optional: a never-seen node takes placements this long
//! node_ready_grace_ms = 3000        # optional: silence after which a node is not_ready
//! node_replace_grace_ms = 2000      # optional: not_ready this long: its instances move
//!
//! [autoscale]                       # optional: the leader's autoscaler (defaults shown)
//! stable_window_ms = 60000          # 1 ..= 3600000
//! panic_window_ms = 6000            # 1 ..= stable_window_ms
//! panic_threshold_pct = 200         # 100 ..= 10000
//! target_utilization_pct = 70       # 1 ..= 100
//! max_scale_down_ratio = 2          # ≥ 1
//! max_scale_up_ratio = 1000         # ≥ 1
//!
//! [tls]                             # QUIC mutual TLS (Raft, agents)
//! ca_cert = "certs/ca.pem"
//! cert = "certs/r1.pem"
//! key = "certs/r1.key"
//!
//! [http_tls]                        # optional: the HTTP API over TLS
//! cert = "certs/r1.pem"             # e.g. from `gsharectl certs issue --san <host>`
//! key = "certs/r1.key"
//! # ca_cert = "certs/ca.pem"        # trusted for forwards to peers (default: tls.ca_cert)
//! # insecure_http = true            # plain HTTP on a non-loopback http_addr (tokens in clear)
//!
//! [[peers]]                         # the other replicas of the initial cluster
//! id = 2
//! raft_addr = "127.0.0.1:7102"
//! http_addr = "127.0.0.1:8102"
//! ```
//!
//! Each problem is reported as `<file>:<line>:<col>: <key path>: <what is wrong>`
//! (core's config reader, as for the topology files), all of them at once,
//! with the files named that do not exist.
//! An `http_addr` that is not a loopback address needs `[http_tls]` or
//! `insecure_http = true`; `[tls]` alone does not switch HTTP to TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::tls::TlsPaths;

/// One other replica named in the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its Raft id.
    pub id: u64,
    /// Its QUIC address.
    pub raft_addr: SocketAddr,
    /// Its HTTP address.
    pub http_addr: SocketAddr,
}

/// The HTTP API's certificate (`[http_tls]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTlsPaths {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA that the peers' HTTP certificates chain to (PEM): trusted
    /// when this replica forwards an invocation to a peer.
    pub ca_cert: PathBuf,
}

/// A validated replica configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// This replica's Raft id (non-zero).
    pub id: u64,
    /// QUIC listen address.
    pub raft_addr: SocketAddr,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Where the Raft log and state live.
    pub data_dir: PathBuf,
    /// The operator's topology file.
    pub topology: PathBuf,
    /// The operator's tenants file.
    pub tenants: PathBuf,
    /// Bearer token for operator requests.
    pub operator_token: String,
    /// Bearer token that shows tenant-labelled series on `/metrics`
    /// (`metrics_token_file`; without it only the operator token does).
    pub metrics_token: Option<String>,
    /// Certificate paths.
    pub tls: TlsPaths,
    /// The other replicas of the initial cluster.
    pub peers: Vec<PeerConfig>,
    /// Applied entries between two snapshots.
    pub snapshot_every: u64,
    /// Log entries kept behind the last snapshot when purging.
    pub keep_logs: u64,
    /// `[http_tls]`: the HTTP API speaks HTTPS with this certificate.
    pub http_tls: Option<HttpTlsPaths>,
    /// `insecure_http = true`: plain HTTP allowed on a non-loopback address.
    pub insecure_http: bool,
    /// `agent_join_grace_s`, `node_ready_grace_ms`, `node_replace_grace_ms`.
    pub liveness: gshare_core::state::LivenessRules,
    /// `[autoscale]`: the leader's autoscaler constants.
    pub autoscale: gshare_core::autoscale::Params,
    /// `max_request_bytes`: the largest invocation request body accepted.
    pub max_request_bytes: usize,
    /// `body_idle_timeout_ms`: the longest pause of a request body before
    /// its upload is cut.
    pub body_idle_timeout_ms: u64,
}

pub use gshare_core::config::{ConfigError, DEFAULT_KEEP_LOGS, DEFAULT_SNAPSHOT_EVERY};
use gshare_core::config::{ConfigIssue, FileRef, ReplicaFile, TokenSource};

/// The token in the file `f` (trimmed; must not be empty).
fn read_token(base: &Path, f: &FileRef) -> Result<String, ConfigIssue> {
    let p = base.join(&f.path);
    match std::fs::read_to_string(&p) {
        Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        Ok(_) => Err(f.issue(format!("{} is empty", p.display()))),
        Err(e) => Err(f.issue(format!("{}: {e}", p.display()))),
    }
}

impl ReplicaConfig {
    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::in_file_order(
                &file,
                vec![ConfigIssue {
                    kind: gshare_core::config::IssueKind::Invalid,
                    path: String::new(),
                    line: None,
                    column: None,
                    message: e.to_string(),
                    got: None,
                }],
            )
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_file(&file, &text, base)
    }

    /// Parses config text; relative paths are resolved against `base`.
    /// Every problem at once (see [`ReplicaConfig::parse_file`]).
    pub fn parse(text: &str, base: &Path) -> Result<Self, Vec<ConfigIssue>> {
        Self::parse_file("replica.toml", text, base).map_err(|e| e.issues)
    }

    /// Parses the text of config `file` with core's reader (line, column and
    /// key path of every mistake), then checks that the files it names
    /// exist and reads the token files: the mistakes of the text and the
    /// missing files come back together, in file order.
    pub fn parse_file(file: &str, text: &str, base: &Path) -> Result<Self, ConfigError> {
        let parsed = ReplicaFile::from_toml(file, text);
        let (f, mut issues) = match parsed {
            Ok(f) => {
                let missing = gshare_core::net::missing_files(base, &f.files());
                (Some(f), missing)
            }
            Err(e) => {
                let refs: Vec<&FileRef> = e.files.iter().collect();
                let mut issues = e.error.issues;
                issues.extend(gshare_core::net::missing_files(base, &refs));
                (None, issues)
            }
        };
        let Some(f) = f else {
            return Err(ConfigError::in_file_order(file, issues));
        };
        let path = |r: &FileRef| base.join(&r.path);
        let token = |src: &TokenSource, issues: &mut Vec<ConfigIssue>| match src {
            TokenSource::Inline(t) => Some(t.clone()),
            TokenSource::File(r) if path(r).exists() => {
                read_token(base, r).map_err(|i| issues.push(i)).ok()
            }
            TokenSource::File(_) => None,
        };
        let operator_token = token(&f.operator_token, &mut issues);
        let metrics_token = f
            .metrics_token_file
            .as_ref()
            .and_then(|r| token(&TokenSource::File(r.clone()), &mut issues));
        if !issues.is_empty() {
            return Err(ConfigError::in_file_order(file, issues));
        }
        let Some(operator_token) = operator_token else {
            return Err(ConfigError::in_file_order(file, issues));
        };
        let tls = TlsPaths {
            ca_cert: path(&f.tls.ca_cert),
            cert: path(&f.tls.cert),
            key: path(&f.tls.key),
        };
        let http_tls = f.http_tls.as_ref().map(|h| HttpTlsPaths {
            cert: path(&h.cert),
            key: path(&h.key),
            ca_cert: h.ca_cert.as_ref().map_or(tls.ca_cert.clone(), path),
        });
        Ok(ReplicaConfig {
            id: f.id,
            raft_addr: f.raft_addr,
            http_addr: f.http_addr,
            data_dir: base.join(&f.data_dir),
            topology: path(&f.topology),
            tenants: path(&f.tenants),
            operator_token,
            metrics_token,
            tls,
            peers: f
                .peers
                .iter()
                .map(|p| PeerConfig {
                    id: p.id,
                    raft_addr: p.raft_addr,
                    http_addr: p.http_addr,
                })
                .collect(),
            snapshot_every: f.snapshot_every,
            keep_logs: f.keep_logs,
            http_tls,
            insecure_http: f.insecure_http,
            liveness: f.liveness,
            autoscale: f.autoscale,
            max_request_bytes: f.max_request_bytes,
            body_idle_timeout_ms: f.body_idle_timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_problem_with_key_paths() {
        let text = r#"
            id = 0
            raft_addr = "nowhere"
            data_dir = "d"
            topology = "missing-topology.toml"
            tenants = 5
            operator_token = "t"
            colour = "blue"
            [tls]
            ca_cert = "no-ca.pem"
            cert = "no.pem"
            key = "no.key"
            [[peers]]
            id = 2
            raft_addr = "127.0.0.1:1"
            http_addr = "x"
        "#;
        let problems = ReplicaConfig::parse(text, Path::new("/nonexistent")).unwrap_err();
        let keys: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for want in [
            "id",
            "raft_addr",
            "http_addr",
            "topology",
            "tenants",
            "colour",
            "tls.ca_cert",
            "tls.cert",
            "tls.key",
            "peers[0].http_addr",
        ] {
            assert!(keys.contains(&want), "missing {want} in {keys:?}");
        }
        let err = ConfigError::in_file_order("r1.toml", problems);
        let text = err.to_string();
        assert!(
            text.contains("r1.toml:3:25: raft_addr: expected an ip:port address (got \"nowhere\")"),
            "{text}"
        );
        // A missing file is reported in the same run as the other mistakes,
        // at its line, and a missing CA says how to make one.
        assert!(
            text.contains("r1.toml:10:23: tls.ca_cert: /nonexistent/no-ca.pem does not exist; create the region's CA once with `gsharectl certs init"),
            "{text}"
        );
        assert!(
            text.contains(
                "r1.toml:5:24: topology: /nonexistent/missing-topology.toml does not exist"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_peer_with_the_replicas_own_id_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["topo.toml", "ten.toml", "ca.pem", "r1.pem", "r1.key"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let text = "id = 1\nraft_addr = \"127.0.0.1:7001\"\nhttp_addr = \"127.0.0.1:8001\"\n\
                    data_dir = \"data\"\ntopology = \"topo.toml\"\ntenants = \"ten.toml\"\n\
                    operator_token = \"t\"\n[tls]\nca_cert = \"ca.pem\"\ncert = \"r1.pem\"\n\
                    key = \"r1.key\"\n[[peers]]\nid = 1\nraft_addr = \"127.0.0.1:7002\"\n\
                    http_addr = \"127.0.0.1:8002\"\n";
        let e = ReplicaConfig::parse_file("r1.toml", text, dir.path()).unwrap_err();
        let s = e.to_string();
        assert_eq!(e.issues.len(), 1, "{s}");
        assert!(
            s.starts_with("r1.toml:13:6: peers[0].id: this is the replica's own id"),
            "{s}"
        );
    }

    #[test]
    fn accepts_a_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["topo.toml", "ten.toml", "ca.pem", "r1.pem", "r1.key"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let text = r#"
            id = 1
            raft_addr = "127.0.0.1:7001"
            http_addr = "127.0.0.1:8001"
            data_dir = "data"
            topology = "topo.toml"
            tenants = "ten.toml"
            operator_token = "t"
            [tls]
            ca_cert = "ca.pem"
            cert = "r1.pem"
            key = "r1.key"
            [[peers]]
            id = 2
            raft_addr = "127.0.0.1:7002"
            http_addr = "127.0.0.1:8002"
        "#;
        let c = ReplicaConfig::parse(text, dir.path()).unwrap();
        assert_eq!(c.id, 1);
        assert_eq!(c.data_dir, dir.path().join("data"));
        assert_eq!(c.peers.len(), 1);

        // The operator token from a file (trimmed); not both; not empty.
        std::fs::write(dir.path().join("op.token"), "s3cret\n").unwrap();
        let from_file = text.replace(
            "operator_token = \"t\"",
            "operator_token_file = \"op.token\"",
        );
        let c = ReplicaConfig::parse(&from_file, dir.path()).unwrap();
        assert_eq!(c.operator_token, "s3cret");
        let both = text.replace(
            "operator_token = \"t\"",
            "operator_token = \"t\"\noperator_token_file = \"op.token\"",
        );
        let p = ReplicaConfig::parse(&both, dir.path()).unwrap_err();
        assert_eq!(p[0].path, "operator_token_file");
        std::fs::write(dir.path().join("op.token"), " \n").unwrap();
        let p = ReplicaConfig::parse(&from_file, dir.path()).unwrap_err();
        assert!(p[0].message.contains("is empty"), "{p:?}");

        // The metrics token is optional, read from its file (trimmed).
        assert_eq!(
            ReplicaConfig::parse(text, dir.path())
                .unwrap()
                .metrics_token,
            None
        );
        std::fs::write(dir.path().join("m.token"), "m3trics\n").unwrap();
        let with_metrics = format!("metrics_token_file = \"m.token\"\n{text}");
        let c = ReplicaConfig::parse(&with_metrics, dir.path()).unwrap();
        assert_eq!(c.metrics_token.as_deref(), Some("m3trics"));
        let missing = format!("metrics_token_file = \"nope.token\"\n{text}");
        let p = ReplicaConfig::parse(&missing, dir.path()).unwrap_err();
        assert_eq!(p[0].path, "metrics_token_file", "{p:?}");
    }

    #[test]
    fn a_non_loopback_http_addr_needs_tls_or_insecure_http() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["topo.toml", "ten.toml", "ca.pem", "r1.pem", "r1.key"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let text = |http: &str, extra: &str| {
            format!(
                "id = 1\nraft_addr = \"127.0.0.1:7001\"\nhttp_addr = \"{http}\"\n\
                 data_dir = \"data\"\ntopology = \"topo.toml\"\ntenants = \"ten.toml\"\n\
                 operator_token = \"t\"\n{extra}\n\
                 [tls]\nca_cert = \"ca.pem\"\ncert = \"r1.pem\"\nkey = \"r1.key\"\n"
            )
        };
        // Loopback: plain HTTP is fine, no TLS switched on by [tls].
        let c = ReplicaConfig::parse(&text("127.0.0.1:8001", ""), dir.path()).unwrap();
        assert_eq!(c.http_tls, None);
        assert!(!c.insecure_http);
        // Any other address without [http_tls]: refused, with the way out.
        for bind in ["0.0.0.0:8001", "10.1.2.3:8001", "[::]:8001"] {
            let p = ReplicaConfig::parse(&text(bind, ""), dir.path()).unwrap_err();
            assert_eq!(p.len(), 1, "{p:?}");
            assert_eq!(p[0].path, "http_addr");
            assert!(p[0].message.contains("[http_tls]"), "{p:?}");
            assert!(p[0].message.contains("insecure_http = true"), "{p:?}");
            let err = ConfigError::in_file_order("r1.toml", p);
            assert!(
                err.to_string().contains("r1.toml:3:13: http_addr: "),
                "{err}"
            );
        }
        // The explicit opt-out, or TLS.
        let c = ReplicaConfig::parse(&text("0.0.0.0:8001", "insecure_http = true"), dir.path())
            .unwrap();
        assert!(c.insecure_http);
        let tls = "[http_tls]\ncert = \"r1.pem\"\nkey = \"r1.key\"\n";
        let with_tls = text("0.0.0.0:8001", "").replace("[tls]", &format!("{tls}[tls]"));
        let c = ReplicaConfig::parse(&with_tls, dir.path()).unwrap();
        let h = c.http_tls.unwrap();
        assert_eq!(h.cert, dir.path().join("r1.pem"));
        assert_eq!(h.ca_cert, dir.path().join("ca.pem"));
        // A wrong type is reported, not ignored.
        let p = ReplicaConfig::parse(&text("0.0.0.0:8001", "insecure_http = \"yes\""), dir.path())
            .unwrap_err();
        assert!(p.iter().any(|p| p.path == "insecure_http"), "{p:?}");
    }
}

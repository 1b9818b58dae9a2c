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
//! Each problem is reported as `<file>: <key path>: <what is wrong>`.
//! An `http_addr` that is not a loopback address needs `[http_tls]` or
//! `insecure_http = true`; `[tls]` alone does not switch HTTP to TLS.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use toml::Value;

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
}

/// Default of `snapshot_every`.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 20_000;
/// Default of `keep_logs`.
pub const DEFAULT_KEEP_LOGS: u64 = 1_000;

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted key path, e.g. `peers[1].raft_addr`.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

/// Every problem found in one config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// All problems, in file order where known.
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "{} problem{} in {}",
            n,
            if n == 1 { "" } else { "s" },
            self.file.display()
        )?;
        for p in &self.problems {
            write!(f, "\n  {}: {}: {}", self.file.display(), p.key, p.problem)?;
        }
        Ok(())
    }
}

struct Checker<'a> {
    base: &'a Path,
    problems: Vec<ConfigProblem>,
}

impl Checker<'_> {
    fn problem(&mut self, key: &str, problem: impl Into<String>) {
        self.problems.push(ConfigProblem {
            key: key.to_string(),
            problem: problem.into(),
        });
    }

    fn table<'v>(&mut self, v: &'v Value, key: &str) -> Option<&'v toml::Table> {
        match v.as_table() {
            Some(t) => Some(t),
            None => {
                self.problem(key, format!("expected a table, found {}", v.type_str()));
                None
            }
        }
    }

    fn unknown(&mut self, t: &toml::Table, prefix: &str, known: &[&str]) {
        for k in t.keys() {
            if !known.contains(&k.as_str()) {
                self.problem(
                    &join(prefix, k),
                    format!("unknown key (expected one of: {})", known.join(", ")),
                );
            }
        }
    }

    fn required<'v>(&mut self, t: &'v toml::Table, prefix: &str, key: &str) -> Option<&'v Value> {
        let v = t.get(key);
        if v.is_none() {
            self.problem(&join(prefix, key), "missing");
        }
        v
    }

    fn id(&mut self, t: &toml::Table, prefix: &str) -> Option<u64> {
        let key = join(prefix, "id");
        match self.required(t, prefix, "id")? {
            Value::Integer(i) if *i > 0 => Some(*i as u64),
            Value::Integer(i) => {
                self.problem(&key, format!("must be a positive integer, found {i}"));
                None
            }
            other => {
                self.problem(
                    &key,
                    format!("expected an integer, found {}", other.type_str()),
                );
                None
            }
        }
    }

    fn optional_count(&mut self, t: &toml::Table, key: &str, default: u64, min: i64) -> u64 {
        match t.get(key) {
            None => default,
            Some(Value::Integer(i)) if *i >= min => *i as u64,
            Some(Value::Integer(i)) => {
                self.problem(key, format!("must be at least {min}, found {i}"));
                default
            }
            Some(other) => {
                self.problem(
                    key,
                    format!("expected an integer, found {}", other.type_str()),
                );
                default
            }
        }
    }

    fn string(&mut self, t: &toml::Table, prefix: &str, key: &str) -> Option<String> {
        match self.required(t, prefix, key)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::String(_) => {
                self.problem(&join(prefix, key), "must not be empty");
                None
            }
            other => {
                self.problem(
                    &join(prefix, key),
                    format!("expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    fn addr(&mut self, t: &toml::Table, prefix: &str, key: &str) -> Option<SocketAddr> {
        let s = self.string(t, prefix, key)?;
        match s.parse() {
            Ok(a) => Some(a),
            Err(_) => {
                self.problem(
                    &join(prefix, key),
                    format!("{s:?} is not an ip:port address"),
                );
                None
            }
        }
    }

    /// The token in the file named by `key` (trimmed; must not be empty).
    fn token_file(&mut self, t: &toml::Table, key: &str) -> Option<String> {
        let p = self.path(t, "", key, true)?;
        match std::fs::read_to_string(&p) {
            Ok(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Ok(_) => {
                self.problem(key, format!("{} is empty", p.display()));
                None
            }
            Err(e) => {
                self.problem(key, format!("{}: {e}", p.display()));
                None
            }
        }
    }

    fn path(
        &mut self,
        t: &toml::Table,
        prefix: &str,
        key: &str,
        must_exist: bool,
    ) -> Option<PathBuf> {
        let s = self.string(t, prefix, key)?;
        let p = self.base.join(s);
        if must_exist && !p.exists() {
            self.problem(
                &join(prefix, key),
                format!("{} does not exist", p.display()),
            );
        }
        Some(p)
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

impl ReplicaConfig {
    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let fail = |problem: String| ConfigError {
            file: path.to_path_buf(),
            problems: vec![ConfigProblem {
                key: "(file)".into(),
                problem,
            }],
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base).map_err(|problems| ConfigError {
            file: path.to_path_buf(),
            problems,
        })
    }

    /// Parses config text; relative paths are resolved against `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, Vec<ConfigProblem>> {
        let root: toml::Table = toml::from_str(text).map_err(|e| {
            vec![ConfigProblem {
                key: "(syntax)".into(),
                problem: e.to_string().trim().to_string(),
            }]
        })?;
        let mut c = Checker {
            base,
            problems: Vec::new(),
        };
        c.unknown(
            &root,
            "",
            &[
                "id",
                "raft_addr",
                "http_addr",
                "data_dir",
                "topology",
                "tenants",
                "operator_token",
                "operator_token_file",
                "metrics_token_file",
                "snapshot_every",
                "keep_logs",
                "tls",
                "http_tls",
                "insecure_http",
                "peers",
            ],
        );
        let id = c.id(&root, "");
        let raft_addr = c.addr(&root, "", "raft_addr");
        let http_addr = c.addr(&root, "", "http_addr");
        let data_dir = c.path(&root, "", "data_dir", false);
        let topology = c.path(&root, "", "topology", true);
        let tenants = c.path(&root, "", "tenants", true);
        let operator_token = match (
            root.contains_key("operator_token"),
            root.contains_key("operator_token_file"),
        ) {
            (_, false) => c.string(&root, "", "operator_token"),
            (false, true) => c.token_file(&root, "operator_token_file"),
            (true, true) => {
                c.problem(
                    "operator_token_file",
                    "give operator_token or operator_token_file, not both",
                );
                None
            }
        };
        let metrics_token = root
            .contains_key("metrics_token_file")
            .then(|| c.token_file(&root, "metrics_token_file"))
            .flatten();
        let snapshot_every = c.optional_count(&root, "snapshot_every", DEFAULT_SNAPSHOT_EVERY, 1);
        let keep_logs = c.optional_count(&root, "keep_logs", DEFAULT_KEEP_LOGS, 0);
        let tls = c
            .required(&root, "", "tls")
            .and_then(|v| c.table(v, "tls"))
            .and_then(|t| {
                c.unknown(t, "tls", &["ca_cert", "cert", "key"]);
                let ca_cert = c.path(t, "tls", "ca_cert", true);
                let cert = c.path(t, "tls", "cert", true);
                let key = c.path(t, "tls", "key", true);
                Some(TlsPaths {
                    ca_cert: ca_cert?,
                    cert: cert?,
                    key: key?,
                })
            });
        let insecure_http = match root.get("insecure_http") {
            None => false,
            Some(Value::Boolean(b)) => *b,
            Some(other) => {
                c.problem(
                    "insecure_http",
                    format!("expected true or false, found {}", other.type_str()),
                );
                false
            }
        };
        let http_tls = root
            .get("http_tls")
            .and_then(|v| c.table(v, "http_tls"))
            .and_then(|t| {
                c.unknown(t, "http_tls", &["cert", "key", "ca_cert"]);
                let cert = c.path(t, "http_tls", "cert", true);
                let key = c.path(t, "http_tls", "key", true);
                let ca_cert = if t.contains_key("ca_cert") {
                    c.path(t, "http_tls", "ca_cert", true)
                } else {
                    tls.as_ref().map(|t| t.ca_cert.clone())
                };
                Some(HttpTlsPaths {
                    cert: cert?,
                    key: key?,
                    ca_cert: ca_cert?,
                })
            });
        if let Some(a) = http_addr {
            let has_tls = root.contains_key("http_tls");
            if let Err(m) = gshare_core::config::check_http_bind(a, has_tls, insecure_http) {
                c.problem("http_addr", m);
            }
        }
        let mut peers = Vec::new();
        match root.get("peers") {
            None => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let prefix = format!("peers[{i}]");
                    let Some(t) = c.table(item, &prefix) else {
                        continue;
                    };
                    c.unknown(t, &prefix, &["id", "raft_addr", "http_addr"]);
                    let pid = c.id(t, &prefix);
                    let pr = c.addr(t, &prefix, "raft_addr");
                    let ph = c.addr(t, &prefix, "http_addr");
                    if let (Some(id), Some(raft_addr), Some(http_addr)) = (pid, pr, ph) {
                        peers.push(PeerConfig {
                            id,
                            raft_addr,
                            http_addr,
                        });
                    }
                }
            }
            Some(other) => c.problem(
                "peers",
                format!("expected an array of tables, found {}", other.type_str()),
            ),
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(id) = id {
            seen.insert(id);
        }
        for (i, p) in peers.iter().enumerate() {
            if !seen.insert(p.id) {
                c.problem(
                    &format!("peers[{i}].id"),
                    format!("id {} is used twice", p.id),
                );
            }
        }
        if !c.problems.is_empty() {
            return Err(c.problems);
        }
        match (
            id,
            raft_addr,
            http_addr,
            data_dir,
            topology,
            tenants,
            operator_token,
            tls,
        ) {
            (
                Some(id),
                Some(raft_addr),
                Some(http_addr),
                Some(data_dir),
                Some(topology),
                Some(tenants),
                Some(operator_token),
                Some(tls),
            ) => Ok(ReplicaConfig {
                id,
                raft_addr,
                http_addr,
                data_dir,
                topology,
                tenants,
                operator_token,
                metrics_token,
                tls,
                peers,
                snapshot_every,
                keep_logs,
                http_tls,
                insecure_http,
            }),
            _ => Err(vec![ConfigProblem {
                key: "(file)".into(),
                problem: "incomplete configuration".into(),
            }]),
        }
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
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
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
        let err = ConfigError {
            file: "r1.toml".into(),
            problems,
        };
        assert!(err
            .to_string()
            .contains("r1.toml: raft_addr: \"nowhere\" is not an ip:port address"));
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
        assert_eq!(p[0].key, "operator_token_file");
        std::fs::write(dir.path().join("op.token"), " \n").unwrap();
        let p = ReplicaConfig::parse(&from_file, dir.path()).unwrap_err();
        assert!(p[0].problem.contains("is empty"), "{p:?}");

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
        assert_eq!(p[0].key, "metrics_token_file", "{p:?}");
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
            assert_eq!(p[0].key, "http_addr");
            assert!(p[0].problem.contains("[http_tls]"), "{p:?}");
            assert!(p[0].problem.contains("insecure_http = true"), "{p:?}");
            let err = ConfigError {
                file: "r1.toml".into(),
                problems: p,
            };
            assert!(err.to_string().contains("r1.toml: http_addr: "), "{err}");
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
        assert!(p.iter().any(|p| p.key == "insecure_http"), "{p:?}");
    }
}

//! Reading and validating a region replica's config (`gshare-region
//! --config`) with the reader of the topology files: every mistake at once,
//! each with line, column and key path.
//!
//! ```text
//!   r1.toml ─▶ ReplicaFile::from_toml ─▶ ReplicaFile (paths as FileRef: the replica
//!                    │                    checks they exist and reads the token files)
//!                    └─▶ Err(ReplicaFileError { error, files })
//!                         files: the paths that did parse, so that a missing one is
//!                         reported in the same run as the other mistakes
//! ```
//!
//! The schema is documented on the region's `config` module and in
//! `docs/region.md`.

use super::agent_file::{addr, check_http_bind, nonempty};
use super::error::{ConfigError, IssueKind};
use super::file_ref::{file_ref, FileRef};
use super::reader::{check_range, parse_document, quote, Field, Issues, TableReader};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Default of `snapshot_every`.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 20_000;
/// Default of `keep_logs`.
pub const DEFAULT_KEEP_LOGS: u64 = 1_000;

/// Where the operator's token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `operator_token = "…"` (tests and local demos).
    Inline(String),
    /// `operator_token_file = "…"`: a file holding it.
    File(FileRef),
}

/// One other replica of the initial cluster (`[[peers]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPeer {
    /// Its Raft id.
    pub id: u64,
    /// Its QUIC address.
    pub raft_addr: SocketAddr,
    /// Its HTTP address.
    pub http_addr: SocketAddr,
}

/// `[tls]`: QUIC mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaTls {
    /// The region's CA certificate.
    pub ca_cert: FileRef,
    /// This replica's certificate.
    pub cert: FileRef,
    /// Its key.
    pub key: FileRef,
}

/// `[http_tls]`: the HTTP API over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaHttpTls {
    /// Server certificate chain.
    pub cert: FileRef,
    /// Its key.
    pub key: FileRef,
    /// The CA trusted for forwards to peers (default: `tls.ca_cert`).
    pub ca_cert: Option<FileRef>,
}

/// A replica config checked for shape, types and meaning (not yet for
/// the files it names: core does no I/O).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaFile {
    /// This replica's Raft id (non-zero).
    pub id: u64,
    /// QUIC listen address.
    pub raft_addr: SocketAddr,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Where the Raft log and state live (as written).
    pub data_dir: String,
    /// The topology file.
    pub topology: FileRef,
    /// The tenants file.
    pub tenants: FileRef,
    /// The operator's token.
    pub operator_token: TokenSource,
    /// `metrics_token_file`.
    pub metrics_token_file: Option<FileRef>,
    /// Applied entries between two snapshots.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot.
    pub keep_logs: u64,
    /// `[tls]`.
    pub tls: ReplicaTls,
    /// `[http_tls]`.
    pub http_tls: Option<ReplicaHttpTls>,
    /// `insecure_http = true`.
    pub insecure_http: bool,
    /// `[[peers]]`.
    pub peers: Vec<ReplicaPeer>,
    /// `agent_join_grace_s`, `node_ready_grace_ms`, `node_replace_grace_ms`
    /// (the leader's node liveness; defaults in [`crate::state::LivenessRules`]).
    pub liveness: crate::state::LivenessRules,
    /// `[autoscale]`: the leader's autoscaler constants (defaults in
    /// [`crate::autoscale::Params`]).
    pub autoscale: crate::autoscale::Params,
    /// `max_request_bytes`: the largest invocation request body the
    /// replica's invoke routes accept (the agent's key, same default and
    /// range: [`crate::protocol::DEFAULT_MAX_REQUEST_BYTES`]).
    pub max_request_bytes: usize,
    /// `body_idle_timeout_ms`: the longest a request body may pause before
    /// its upload is cut (the agent's key, same default and range:
    /// [`crate::protocol::DEFAULT_BODY_IDLE_TIMEOUT_MS`]).
    pub body_idle_timeout_ms: u64,
}

/// Longest `autoscale.stable_window_ms`: an autoscaler keeps at most
/// 4,096 signals (one a tick, a tick a second), so a longer window would
/// average over fewer than it names.
pub const MAX_AUTOSCALE_WINDOW_MS: u64 = 3_600_000;

impl ReplicaFile {
    /// The files this config names, each to be opened by the replica.
    pub fn files(&self) -> Vec<&FileRef> {
        let mut out = vec![&self.topology, &self.tenants];
        if let TokenSource::File(f) = &self.operator_token {
            out.push(f);
        }
        out.extend(&self.metrics_token_file);
        out.extend([&self.tls.ca_cert, &self.tls.cert, &self.tls.key]);
        if let Some(h) = &self.http_tls {
            out.extend([&h.cert, &h.key]);
            out.extend(&h.ca_cert);
        }
        out
    }

    /// Parses and validates replica config `file` whose text is `src`.
    pub fn from_toml(file: &str, src: &str) -> Result<Self, ReplicaFileError> {
        let mut is = Issues::new(src);
        let mut files = Vec::new();
        let Some(doc) = parse_document(src, &mut is) else {
            return Err(ReplicaFileError {
                error: is.into_error(file),
                files,
            });
        };
        let parsed = read(&mut is, src, &doc, &mut files);
        match parsed {
            Some(f) if is.is_empty() => Ok(f),
            _ => Err(ReplicaFileError {
                error: is.into_error(file),
                files,
            }),
        }
    }
}

/// A replica config with mistakes: all of them, and the paths that did
/// parse (checked for existence too, so the person sees everything at once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct ReplicaFileError {
    /// Every mistake found in the text.
    pub error: ConfigError,
    /// The files named by keys that parsed.
    pub files: Vec<FileRef>,
}

fn read(
    is: &mut Issues<'_>,
    src: &str,
    doc: &toml::Spanned<toml::de::DeTable<'_>>,
    files: &mut Vec<FileRef>,
) -> Option<ReplicaFile> {
    let mut root = TableReader::root(doc);
    let id = root.uint::<u64>(is, "id", true);
    let raft_addr = root.string(is, "raft_addr", true);
    let http_addr = root.string(is, "http_addr", true);
    let data_dir = root.string(is, "data_dir", true);
    let mut path = |is: &mut Issues<'_>, t: &mut TableReader<'_, '_>, key, required| {
        let f = t.string(is, key, required);
        let r = nonempty(is, f.clone()).and_then(|_| file_ref(src, &f));
        files.extend(r.clone());
        r
    };
    let topology = path(is, &mut root, "topology", true);
    let tenants = path(is, &mut root, "tenants", true);
    let operator_token = match (root.has("operator_token"), root.has("operator_token_file")) {
        (_, false) => {
            let f = root.string(is, "operator_token", true);
            nonempty(is, f).map(TokenSource::Inline)
        }
        (false, true) => path(is, &mut root, "operator_token_file", true).map(TokenSource::File),
        (true, true) => {
            let _ = root.string(is, "operator_token", true);
            let f = root.string(is, "operator_token_file", true);
            is.report(
                &f.at,
                IssueKind::Inconsistent,
                "give operator_token or operator_token_file, not both".into(),
                None,
            );
            None
        }
    };
    let metrics_written = root.has("metrics_token_file");
    let metrics_token_file = path(is, &mut root, "metrics_token_file", false);
    let snapshot_every = count(is, &mut root, "snapshot_every", DEFAULT_SNAPSHOT_EVERY, 1);
    let keep_logs = count(is, &mut root, "keep_logs", DEFAULT_KEEP_LOGS, 0);
    let max_request_bytes = super::agent_file::max_request_bytes(is, &mut root);
    let body_idle_timeout_ms = super::agent_file::body_idle_timeout_ms(is, &mut root);
    let d = crate::state::LivenessRules::default();
    let join_grace_s = bounded(
        is,
        &mut root,
        "agent_join_grace_s",
        crate::state::DEFAULT_AGENT_JOIN_GRACE_S,
        (0, 365 * 86_400),
    );
    let ready_grace_ms = bounded(
        is,
        &mut root,
        "node_ready_grace_ms",
        d.ready_grace_ms,
        (100, 86_400_000),
    );
    let replace_grace_ms = bounded(
        is,
        &mut root,
        "node_replace_grace_ms",
        d.replace_grace_ms,
        (0, 7 * 86_400_000),
    );
    let autoscale = root.table(is, "autoscale", false).map(|mut t| {
        let p = autoscale_params(is, &mut t);
        t.finish(is);
        p
    });
    let tls = root.table(is, "tls", true).map(|mut t| {
        let ca_cert = path(is, &mut t, "ca_cert", true);
        let cert = path(is, &mut t, "cert", true);
        let key = path(is, &mut t, "key", true);
        t.finish(is);
        (ca_cert, cert, key)
    });
    let http_tls_written = root.has("http_tls");
    let http_tls = root.table(is, "http_tls", false).map(|mut t| {
        let cert = path(is, &mut t, "cert", true);
        let key = path(is, &mut t, "key", true);
        let ca_written = t.has("ca_cert");
        let ca_cert = path(is, &mut t, "ca_cert", false);
        t.finish(is);
        (cert, key, ca_written, ca_cert)
    });
    let insecure_http = root.boolean(is, "insecure_http", false);
    let raw_peers: Vec<_> = root
        .tables(is, "peers", false)
        .into_iter()
        .map(|mut t| {
            let id = t.uint::<u64>(is, "id", true);
            let raft = t.string(is, "raft_addr", true);
            let http = t.string(is, "http_addr", true);
            t.finish(is);
            (id, raft, http)
        })
        .collect();
    root.finish(is);

    // Meaning.
    let id = check_range(is, &id, 1, u64::MAX);
    let raft_addr = addr(is, &raft_addr);
    let http_addr_at = http_addr.at.clone();
    let http_addr = addr(is, &http_addr);
    let data_dir = nonempty(is, data_dir);
    if let Some(a) = http_addr {
        let insecure = insecure_http.v == Some(true);
        if let Err(m) = check_http_bind(a, http_tls_written, insecure) {
            is.report(
                &http_addr_at,
                IssueKind::Inconsistent,
                m,
                Some(quote(&a.to_string())),
            );
        }
    }
    let mut peers = Vec::new();
    // Raft ids and QUIC addresses already taken, with where.
    let mut ids: BTreeMap<u64, String> = BTreeMap::new();
    let mut addrs: BTreeMap<SocketAddr, String> = BTreeMap::new();
    if let Some(own) = id {
        ids.insert(own, "id".into());
    }
    if let Some(own) = raft_addr {
        addrs.insert(own, "raft_addr".into());
    }
    for (pid, raft, http) in &raw_peers {
        let p_id = check_range(is, pid, 1, u64::MAX);
        let p_raft = addr(is, raft);
        let p_http = addr(is, http);
        if let Some(i) = p_id {
            match ids.get(&i).map(String::as_str) {
                Some("id") => is.report(
                    &pid.at,
                    IssueKind::Inconsistent,
                    "this is the replica's own id: [[peers]] lists only the other replicas".into(),
                    Some(i.to_string()),
                ),
                Some(first) => is.report(
                    &pid.at,
                    IssueKind::Duplicate,
                    format!("a second peer with this id (first at {first})"),
                    Some(i.to_string()),
                ),
                None => {
                    ids.insert(i, pid.at.path.clone());
                }
            }
        }
        if let Some(a) = p_raft {
            if let Some(first) = addrs.get(&a) {
                is.report(
                    &raft.at,
                    IssueKind::Duplicate,
                    format!("this address is already {first}'s"),
                    Some(quote(&a.to_string())),
                );
            } else {
                addrs.insert(a, raft.at.path.clone());
            }
        }
        if let (Some(id), Some(raft_addr), Some(http_addr)) = (p_id, p_raft, p_http) {
            peers.push(ReplicaPeer {
                id,
                raft_addr,
                http_addr,
            });
        }
    }

    let (Some((Some(ca_cert), Some(cert), Some(key))), Some(snapshot_every), Some(keep_logs)) =
        (tls, snapshot_every, keep_logs)
    else {
        return None;
    };
    let liveness = crate::state::LivenessRules {
        join_grace_ms: join_grace_s?.saturating_mul(1000),
        ready_grace_ms: ready_grace_ms?,
        replace_grace_ms: replace_grace_ms?,
    };
    let autoscale = match autoscale {
        None => crate::autoscale::Params::default(),
        Some(p) => p?,
    };
    let http_tls = match http_tls {
        None => None,
        Some((Some(cert), Some(key), ca_written, ca_cert)) if !ca_written || ca_cert.is_some() => {
            Some(ReplicaHttpTls { cert, key, ca_cert })
        }
        Some(_) => return None,
    };
    if metrics_written && metrics_token_file.is_none() {
        return None;
    }
    Some(ReplicaFile {
        id: id?,
        raft_addr: raft_addr?,
        http_addr: http_addr?,
        data_dir: data_dir?,
        topology: topology?,
        tenants: tenants?,
        operator_token: operator_token?,
        metrics_token_file,
        snapshot_every,
        keep_logs,
        tls: ReplicaTls { ca_cert, cert, key },
        http_tls,
        insecure_http: insecure_http.v.unwrap_or(false),
        peers,
        liveness,
        autoscale,
        max_request_bytes: max_request_bytes?,
        body_idle_timeout_ms: body_idle_timeout_ms?,
    })
}

/// `[autoscale]`: every key optional (the default when absent); windows
/// from 1 ms to [`MAX_AUTOSCALE_WINDOW_MS`] with the panic window no
/// longer than the stable one, the threshold from 100 to 10,000 %, the
/// utilization from 1 to 100 %, the ratios at least 1.
fn autoscale_params(
    is: &mut Issues<'_>,
    t: &mut TableReader<'_, '_>,
) -> Option<crate::autoscale::Params> {
    let d = crate::autoscale::Params::default();
    let window = (1, MAX_AUTOSCALE_WINDOW_MS);
    let stable = bounded(is, t, "stable_window_ms", d.stable_window_ms, window);
    let panic_written = t.has("panic_window_ms");
    let panic_f: Field<u64> = t.uint(is, "panic_window_ms", false);
    let panic = if panic_written {
        check_range(is, &panic_f, window.0, window.1)
    } else {
        Some(d.panic_window_ms)
    };
    let pct = |is: &mut Issues<'_>, t: &mut TableReader<'_, '_>, key, default: u32, range| {
        bounded(is, t, key, u64::from(default), range).and_then(|v| u32::try_from(v).ok())
    };
    let ratio = (1, u64::from(u32::MAX));
    let panic_threshold_pct = pct(
        is,
        t,
        "panic_threshold_pct",
        d.panic_threshold_pct,
        (100, 10_000),
    );
    let target_utilization_pct = pct(
        is,
        t,
        "target_utilization_pct",
        d.target_utilization_pct,
        (1, 100),
    );
    let max_scale_down_ratio = pct(is, t, "max_scale_down_ratio", d.max_scale_down_ratio, ratio);
    let max_scale_up_ratio = pct(is, t, "max_scale_up_ratio", d.max_scale_up_ratio, ratio);
    let (stable_window_ms, panic_window_ms) = (stable?, panic?);
    if panic_window_ms > stable_window_ms {
        is.report(
            &panic_f.at,
            IssueKind::Inconsistent,
            if panic_written {
                format!("must not be longer than stable_window_ms ({stable_window_ms})")
            } else {
                format!(
                    "the default ({panic_window_ms}) is longer than stable_window_ms \
                     ({stable_window_ms}): give a shorter one"
                )
            },
            Some(panic_window_ms.to_string()),
        );
        return None;
    }
    Some(crate::autoscale::Params {
        stable_window_ms,
        panic_window_ms,
        panic_threshold_pct: panic_threshold_pct?,
        target_utilization_pct: target_utilization_pct?,
        max_scale_down_ratio: max_scale_down_ratio?,
        max_scale_up_ratio: max_scale_up_ratio?,
    })
}

/// An optional count within `range` (`default` when absent).
fn bounded(
    is: &mut Issues<'_>,
    t: &mut TableReader<'_, '_>,
    key: &'static str,
    default: u64,
    (min, max): (u64, u64),
) -> Option<u64> {
    let written = t.has(key);
    let f: Field<u64> = t.uint(is, key, false);
    if !written {
        return Some(default);
    }
    check_range(is, &f, min, max)
}

/// An optional count of at least `min` (`default` when absent).
fn count(
    is: &mut Issues<'_>,
    t: &mut TableReader<'_, '_>,
    key: &'static str,
    default: u64,
    min: u64,
) -> Option<u64> {
    let written = t.has(key);
    let f: Field<u64> = t.uint(is, key, false);
    if !written {
        return Some(default);
    }
    check_range(is, &f, min, u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "id = 1\n\
        raft_addr = \"127.0.0.1:7001\"\n\
        http_addr = \"127.0.0.1:8001\"\n\
        data_dir = \"data\"\n\
        topology = \"topo.toml\"\n\
        tenants = \"ten.toml\"\n\
        operator_token = \"t\"\n\
        [tls]\n\
        ca_cert = \"ca.pem\"\n\
        cert = \"r1.pem\"\n\
        key = \"r1.key\"\n\
        [[peers]]\n\
        id = 2\n\
        raft_addr = \"127.0.0.1:7002\"\n\
        http_addr = \"127.0.0.1:8002\"\n";

    #[test]
    fn a_valid_file_names_its_files_with_their_places() {
        let f = ReplicaFile::from_toml("r1.toml", VALID).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.id, 1);
        assert_eq!(f.snapshot_every, DEFAULT_SNAPSHOT_EVERY);
        assert_eq!(f.peers.len(), 1);
        let keys: Vec<_> = f.files().iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            ["topology", "tenants", "tls.ca_cert", "tls.cert", "tls.key"]
        );
        assert_eq!((f.tls.cert.line, f.tls.cert.column), (Some(10), Some(8)));
    }

    #[test]
    fn the_liveness_graces_are_optional_and_checked() {
        let f = ReplicaFile::from_toml("r1.toml", VALID).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.liveness, crate::state::LivenessRules::default());
        assert_eq!(f.liveness.join_grace_ms, 60_000);
        let text = VALID.replace(
            "operator_token = \"t\"\n",
            "operator_token = \"t\"\nagent_join_grace_s = 2\nnode_ready_grace_ms = 700\nnode_replace_grace_ms = 0\n",
        );
        let f = ReplicaFile::from_toml("r1.toml", &text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f.liveness,
            crate::state::LivenessRules {
                join_grace_ms: 2_000,
                ready_grace_ms: 700,
                replace_grace_ms: 0,
            }
        );
        let text = VALID.replace(
            "operator_token = \"t\"\n",
            "operator_token = \"t\"\nagent_join_grace_s = -1\nnode_ready_grace_ms = 5\n",
        );
        let s = ReplicaFile::from_toml("r1.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(s.contains("agent_join_grace_s"), "{s}");
        assert!(s.contains("node_ready_grace_ms"), "{s}");
    }

    #[test]
    fn the_autoscale_table_is_optional_and_checked_all_at_once() {
        let f = ReplicaFile::from_toml("r1.toml", VALID).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.autoscale, crate::autoscale::Params::default());
        let with = |table: &str| format!("{VALID}[autoscale]\n{table}");
        let text = with(
            "stable_window_ms = 30000\npanic_window_ms = 3000\npanic_threshold_pct = 150\n\
             target_utilization_pct = 80\nmax_scale_down_ratio = 4\nmax_scale_up_ratio = 10\n",
        );
        let f = ReplicaFile::from_toml("r1.toml", &text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f.autoscale,
            crate::autoscale::Params {
                stable_window_ms: 30_000,
                panic_window_ms: 3_000,
                panic_threshold_pct: 150,
                target_utilization_pct: 80,
                max_scale_down_ratio: 4,
                max_scale_up_ratio: 10,
            }
        );
        // A key left out keeps its default.
        let f = ReplicaFile::from_toml("r1.toml", &with("target_utilization_pct = 50\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f.autoscale,
            crate::autoscale::Params {
                target_utilization_pct: 50,
                ..Default::default()
            }
        );
        // Every mistake at once, each at its key (the table starts at line 16).
        let text = with(
            "stable_window_ms = 0\npanic_window_ms = 7200000\npanic_threshold_pct = 50\n\
             target_utilization_pct = 101\nmax_scale_down_ratio = 0\nmax_scale_up_ratio = -1\n\
             colour = 1\n",
        );
        let e = ReplicaFile::from_toml("r1.toml", &text).unwrap_err();
        let s = e.to_string();
        for want in [
            "r1.toml:17:20: autoscale.stable_window_ms: must be from 1 to 3600000",
            "r1.toml:18:19: autoscale.panic_window_ms: must be from 1 to 3600000",
            "r1.toml:19:23: autoscale.panic_threshold_pct: must be from 100 to 10000",
            "r1.toml:20:26: autoscale.target_utilization_pct: must be from 1 to 100",
            "r1.toml:21:24: autoscale.max_scale_down_ratio: must be from 1 to",
            "r1.toml:22:22: autoscale.max_scale_up_ratio: must not be negative",
            "r1.toml:23:1: autoscale.colour: unknown key",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
        assert_eq!(e.error.issues.len(), 7, "{s}");
        // The panic window no longer than the stable one, written or not.
        let s = ReplicaFile::from_toml(
            "r1.toml",
            &with("stable_window_ms = 10000\npanic_window_ms = 20000\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            s.contains("r1.toml:18:19: autoscale.panic_window_ms: must not be longer than stable_window_ms (10000)"),
            "{s}"
        );
        let s = ReplicaFile::from_toml("r1.toml", &with("stable_window_ms = 1000\n"))
            .unwrap_err()
            .to_string();
        assert!(
            s.contains("autoscale.panic_window_ms: the default (6000) is longer than stable_window_ms (1000)"),
            "{s}"
        );
    }

    #[test]
    fn a_peer_with_the_replicas_own_id_says_so() {
        let text = VALID.replace("id = 2", "id = 1");
        let e = ReplicaFile::from_toml("r1.toml", &text).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("r1.toml:13:6: peers[0].id: this is the replica's own id"),
            "{s}"
        );
        assert!(!s.contains("used twice"), "{s}");
        // The files that parsed are still handed back for their check.
        assert_eq!(e.files.len(), 5);
    }

    #[test]
    fn the_request_body_cap_has_one_default_and_a_checked_range() {
        let f = ReplicaFile::from_toml("r1.toml", VALID).unwrap();
        assert_eq!(
            f.max_request_bytes,
            crate::protocol::DEFAULT_MAX_REQUEST_BYTES
        );
        let set = format!("max_request_bytes = 65536\n{VALID}");
        let f = ReplicaFile::from_toml("r1.toml", &set).unwrap();
        assert_eq!(f.max_request_bytes, 65536);
        let bad = format!("max_request_bytes = 100\n{VALID}");
        let e = ReplicaFile::from_toml("r1.toml", &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("r1.toml:1:21: max_request_bytes: must be from 1024 to 7340032 (got 100)"),
            "{e}"
        );
        let f = ReplicaFile::from_toml("r1.toml", VALID).unwrap();
        assert_eq!(f.body_idle_timeout_ms, 10_000);
        let set = format!("body_idle_timeout_ms = 250\n{VALID}");
        assert_eq!(
            ReplicaFile::from_toml("r1.toml", &set)
                .unwrap()
                .body_idle_timeout_ms,
            250
        );
        let bad = format!("body_idle_timeout_ms = 50\n{VALID}");
        let e = ReplicaFile::from_toml("r1.toml", &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("r1.toml:1:24: body_idle_timeout_ms: must be from 100 to 600000 (got 50)"),
            "{e}"
        );
    }

    #[test]
    fn every_mistake_is_reported_at_once_with_line_and_column() {
        let text = "id = 0\n\
            raft_addr = \"nowhere\"\n\
            data_dir = \"d\"\n\
            topology = \"topo.toml\"\n\
            tenants = 5\n\
            operator_token = \"t\"\n\
            colour = \"blue\"\n\
            snapshot_every = 0\n\
            [tls]\n\
            ca_cert = \"ca.pem\"\n\
            cert = \"\"\n\
            [[peers]]\n\
            id = 2\n\
            raft_addr = \"127.0.0.1:1\"\n\
            http_addr = \"x\"\n\
            [[peers]]\n\
            id = 2\n\
            raft_addr = \"127.0.0.1:1\"\n\
            http_addr = \"127.0.0.1:2\"\n";
        let e = ReplicaFile::from_toml("r1.toml", text).unwrap_err();
        let s = e.to_string();
        for want in [
            "r1.toml:1:6: id: must be from 1 to",
            "r1.toml:2:13: raft_addr: expected an ip:port address (got \"nowhere\")",
            "r1.toml:1:1: http_addr: missing required key",
            "r1.toml:5:11: tenants: expected a string, found an integer",
            "r1.toml:7:1: colour: unknown key",
            "r1.toml:8:18: snapshot_every: must be from 1 to",
            "r1.toml:11:8: tls.cert: must not be empty",
            "tls.key: missing required key",
            "r1.toml:15:13: peers[0].http_addr: expected an ip:port address",
            "r1.toml:17:6: peers[1].id: a second peer with this id (first at peers[0].id)",
            "r1.toml:18:13: peers[1].raft_addr: this address is already peers[0].raft_addr's",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
        assert_eq!(e.error.issues.len(), 11, "{s}");
    }

    #[test]
    fn token_sources_and_the_http_bind() {
        let both = VALID.replace(
            "operator_token = \"t\"",
            "operator_token = \"t\"\noperator_token_file = \"op.token\"",
        );
        let s = ReplicaFile::from_toml("r1.toml", &both)
            .unwrap_err()
            .to_string();
        assert!(
            s.contains("operator_token_file: give operator_token or"),
            "{s}"
        );
        let file = VALID.replace("operator_token = \"t\"", "operator_token_file = \"op\"");
        let f = ReplicaFile::from_toml("r1.toml", &file).unwrap();
        assert!(matches!(f.operator_token, TokenSource::File(ref r) if r.path == "op"));
        let open = VALID.replace("127.0.0.1:8001", "0.0.0.0:8001");
        let s = ReplicaFile::from_toml("r1.toml", &open)
            .unwrap_err()
            .to_string();
        assert!(
            s.contains("r1.toml:3:13: http_addr: 0.0.0.0 is not a loopback"),
            "{s}"
        );
        let insecure = format!("insecure_http = true\n{open}");
        assert!(
            ReplicaFile::from_toml("r1.toml", &insecure)
                .unwrap()
                .insecure_http
        );
    }
}

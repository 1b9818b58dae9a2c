//! Reading and validating an agent config into [`AgentConfig`] (the same
//! two passes as the topology file: shape and types, then meaning).

use super::agent::{
    AgentConfig, AgentLoadCosts, AgentTls, GpuSource, HttpTls, JournalSync, NvmlFallback,
    SimulatedGpus,
};
use super::error::{ConfigError, IssueKind};
use super::file_ref::file_ref;
use super::names::check_name;
use super::reader::{check_range, parse_document, quote, Field, Issues, TableReader};
use super::runtime_drivers::read_runtimes;
use crate::model::{NodeId, PoolKind};
use std::net::SocketAddr;

/// Fixed cost of a swap-in when `[load] swap_setup_us` is not given, µs.
pub const DEFAULT_SWAP_SETUP_US: u64 = 2_000;
const DEFAULT_COLD_SETUP_US: u64 = 500_000;
const DEFAULT_STORAGE_MIB_PER_S: u64 = 2_000;
/// Host-to-device bandwidth assumed for NVML GPUs when
/// `[gpus] nvml_h2d_mib_per_s` is not given, MiB/s.
pub const DEFAULT_H2D_MIB_PER_S: u64 = 12_000;
const DEFAULT_HEARTBEAT_MS: u64 = 1_000;
const DEFAULT_METERING_INTERVAL_MS: u64 = 1_000;
/// How long an invocation's outcome is kept under its idempotency key, s.
pub const DEFAULT_INVOKE_KEY_WINDOW_S: u64 = 600;

pub(crate) fn addr(is: &mut Issues<'_>, f: &Field<String>) -> Option<SocketAddr> {
    let s = f.v.as_ref()?;
    match s.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            is.report(
                &f.at,
                IssueKind::Invalid,
                "expected an ip:port address".into(),
                Some(quote(s)),
            );
            None
        }
    }
}

pub(crate) fn nonempty(is: &mut Issues<'_>, f: Field<String>) -> Option<String> {
    let s = f.v?;
    if s.is_empty() {
        is.report(
            &f.at,
            IssueKind::Invalid,
            "must not be empty".into(),
            Some(quote(&s)),
        );
        return None;
    }
    Some(s)
}

fn simulated_groups(is: &mut Issues<'_>, t: &mut TableReader<'_, '_>) -> Vec<SimulatedGpus> {
    let mut out = Vec::new();
    for mut g in t.tables(is, "simulated", false) {
        let model = g.string(is, "model", true);
        let memory_mib = g.uint::<u64>(is, "memory_mib", true);
        let h2d = g.uint::<u64>(is, "h2d_mib_per_s", true);
        let count = g.uint::<u32>(is, "count", false);
        g.finish(is);
        let model = check_name(is, &model);
        let memory_mib = check_range(is, &memory_mib, 1, 1 << 24);
        let h2d = check_range(is, &h2d, 1, 1 << 24);
        let count = if count.v.is_some() {
            check_range(is, &count, 1, 64)
        } else {
            Some(1)
        };
        if let (Some(model), Some(memory_mib), Some(h2d_mib_per_s), Some(count)) =
            (model, memory_mib, h2d, count)
        {
            out.push(SimulatedGpus {
                model,
                memory_mib,
                h2d_mib_per_s,
                count,
            });
        }
    }
    out
}

/// Whether an HTTP listener on `addr` may start: a loopback address may
/// serve plain HTTP; any other needs TLS or an explicit `insecure_http`.
/// The error says what to add.
pub fn check_http_bind(addr: SocketAddr, tls: bool, insecure_http: bool) -> Result<(), String> {
    if tls || insecure_http || addr.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "{} is not a loopback address: plain HTTP there sends bearer tokens in clear; \
         add an [http_tls] section (cert, key) or set insecure_http = true",
        addr.ip()
    ))
}

/// The default `quic_bind`: the unspecified address of the first
/// replica's family (IPv4 without replicas), any port.
fn default_quic_bind(replicas: &[SocketAddr]) -> SocketAddr {
    let ip: std::net::IpAddr = match replicas.first() {
        Some(SocketAddr::V6(_)) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        _ => std::net::Ipv4Addr::UNSPECIFIED.into(),
    };
    SocketAddr::new(ip, 0)
}

/// Parses and validates the agent config `file` whose text is `src`.
/// `max_request_bytes` of `t` (the agent's and the replica's config): the
/// default when absent, else checked against
/// [`crate::protocol::MAX_REQUEST_BYTES_RANGE`].
pub(crate) fn max_request_bytes(is: &mut Issues<'_>, t: &mut TableReader<'_, '_>) -> Option<usize> {
    use crate::protocol::{DEFAULT_MAX_REQUEST_BYTES, MAX_REQUEST_BYTES_RANGE};
    let written = t.has("max_request_bytes");
    let f: Field<usize> = t.uint(is, "max_request_bytes", false);
    if !written {
        return Some(DEFAULT_MAX_REQUEST_BYTES);
    }
    let (lo, hi) = MAX_REQUEST_BYTES_RANGE;
    check_range(is, &f, lo, hi)
}

/// `body_idle_timeout_ms` of `t` (the agent's and the replica's config):
/// the default when absent, else checked against
/// [`crate::protocol::BODY_IDLE_TIMEOUT_MS_RANGE`].
pub(crate) fn body_idle_timeout_ms(
    is: &mut Issues<'_>,
    t: &mut TableReader<'_, '_>,
) -> Option<u64> {
    use crate::protocol::{BODY_IDLE_TIMEOUT_MS_RANGE, DEFAULT_BODY_IDLE_TIMEOUT_MS};
    let written = t.has("body_idle_timeout_ms");
    let f: Field<u64> = t.uint(is, "body_idle_timeout_ms", false);
    if !written {
        return Some(DEFAULT_BODY_IDLE_TIMEOUT_MS);
    }
    let (lo, hi) = BODY_IDLE_TIMEOUT_MS_RANGE;
    check_range(is, &f, lo, hi)
}

pub fn parse_agent(file: &str, src: &str) -> Result<AgentConfig, ConfigError> {
    let mut is = Issues::new(src);
    let Some(doc) = parse_document(src, &mut is) else {
        return Err(is.into_error(file));
    };
    let mut root = TableReader::root(&doc);
    let node = root.string(&mut is, "node", true);
    let pool = root.string(&mut is, "pool", true);
    let pool_kind = root.string(&mut is, "pool_kind", true);
    let data_dir = root.string(&mut is, "data_dir", true);
    let ingress = root.string(&mut is, "ingress_addr", true);
    let host_swap = root.uint::<u64>(&mut is, "host_swap_mib", true);
    let heartbeat = root.uint::<u64>(&mut is, "heartbeat_ms", false);
    let allow_fewer_gpus = root.boolean(&mut is, "allow_fewer_gpus", false);
    let insecure_http = root.boolean(&mut is, "insecure_http", false);
    let max_request_bytes = max_request_bytes(&mut is, &mut root);
    let body_idle_timeout_ms = body_idle_timeout_ms(&mut is, &mut root);
    // The certificate files the agent opens, for its start-up check.
    let mut files = Vec::new();
    let http_tls = root.table(&mut is, "http_tls", false).map(|mut t| {
        let cert = t.string(&mut is, "cert", true);
        let key = t.string(&mut is, "key", true);
        t.finish(&mut is);
        files.extend([&cert, &key].into_iter().filter_map(|f| file_ref(src, f)));
        (nonempty(&mut is, cert), nonempty(&mut is, key))
    });
    let quic_bind = root.string(&mut is, "quic_bind", false);
    let metrics_token_file = root.string(&mut is, "metrics_token_file", false);
    let metrics_token_file = metrics_token_file
        .v
        .is_some()
        .then(|| nonempty(&mut is, metrics_token_file))
        .flatten();

    let mut replicas = Vec::new();
    let replicas_at = root.loc_of("replicas");
    for mut r in root.tables(&mut is, "replicas", true) {
        let f = r.string(&mut is, "quic_addr", true);
        r.finish(&mut is);
        if let Some(a) = addr(&mut is, &f) {
            if replicas.contains(&a) {
                is.report(
                    &f.at,
                    IssueKind::Duplicate,
                    "replica listed twice".into(),
                    Some(a.to_string()),
                );
            }
            replicas.push(a);
        }
    }
    if replicas.is_empty() && root.has("replicas") {
        is.report(
            &replicas_at,
            IssueKind::Invalid,
            "at least one replica is needed".into(),
            None,
        );
    }

    let tls = root.table(&mut is, "tls", true).map(|mut t| {
        let ca = t.string(&mut is, "ca_cert", true);
        let cert = t.string(&mut is, "cert", true);
        let key = t.string(&mut is, "key", true);
        t.finish(&mut is);
        files.extend(
            [&ca, &cert, &key]
                .into_iter()
                .filter_map(|f| file_ref(src, f)),
        );
        (
            nonempty(&mut is, ca),
            nonempty(&mut is, cert),
            nonempty(&mut is, key),
        )
    });

    let load = match root.table(&mut is, "load", false) {
        Some(mut t) => {
            let s = t.uint::<u64>(&mut is, "swap_setup_us", false);
            let c = t.uint::<u64>(&mut is, "cold_setup_us", false);
            let b = t.uint::<u64>(&mut is, "storage_mib_per_s", false);
            t.finish(&mut is);
            let b = if b.v.is_some() {
                check_range(&mut is, &b, 1, 1 << 24)
            } else {
                Some(DEFAULT_STORAGE_MIB_PER_S)
            };
            Some(AgentLoadCosts {
                swap_setup_us: s.v.unwrap_or(DEFAULT_SWAP_SETUP_US),
                cold_setup_us: c.v.unwrap_or(DEFAULT_COLD_SETUP_US),
                storage_mib_per_s: b.unwrap_or(DEFAULT_STORAGE_MIB_PER_S),
            })
        }
        None => Some(AgentLoadCosts {
            swap_setup_us: DEFAULT_SWAP_SETUP_US,
            cold_setup_us: DEFAULT_COLD_SETUP_US,
            storage_mib_per_s: DEFAULT_STORAGE_MIB_PER_S,
        }),
    };

    let (metering_interval, invoke_key_window, journal_sync) =
        match root.table(&mut is, "metering", false) {
            Some(mut t) => {
                let f = t.uint::<u64>(&mut is, "interval_ms", false);
                let w = t.uint::<u64>(&mut is, "invoke_key_window_s", false);
                let sync = t.string(&mut is, "journal_sync", false);
                t.finish(&mut is);
                let interval = if f.v.is_some() {
                    check_range(&mut is, &f, 10, 3_600_000)
                } else {
                    Some(DEFAULT_METERING_INTERVAL_MS)
                };
                let window = if w.v.is_some() {
                    check_range(&mut is, &w, 60, 7 * 86_400)
                } else {
                    Some(DEFAULT_INVOKE_KEY_WINDOW_S)
                };
                let sync = match sync.v.as_deref() {
                    None | Some("direct") => Some(JournalSync::Direct),
                    Some("dsync") => Some(JournalSync::Dsync),
                    Some("sled") => Some(JournalSync::Sled),
                    Some(other) => {
                        is.report(
                            &sync.at,
                            IssueKind::Invalid,
                            "expected \"direct\", \"dsync\" or \"sled\"".into(),
                            Some(quote(other)),
                        );
                        None
                    }
                };
                (interval, window, sync)
            }
            None => (
                Some(DEFAULT_METERING_INTERVAL_MS),
                Some(DEFAULT_INVOKE_KEY_WINDOW_S),
                Some(JournalSync::Direct),
            ),
        };

    let gpus = root.table(&mut is, "gpus", true).and_then(|mut t| {
        let backend = t.string(&mut is, "backend", true);
        let fallback = t.string(&mut is, "nvml_fallback", false);
        let h2d = t.uint::<u64>(&mut is, "nvml_h2d_mib_per_s", false);
        let groups = simulated_groups(&mut is, &mut t);
        let table_at = t.loc().clone();
        t.finish(&mut is);
        match backend.v.as_deref() {
            Some("simulated") => {
                if fallback.v.is_some() {
                    is.report(
                        &fallback.at,
                        IssueKind::Inconsistent,
                        "only meaningful with backend = \"nvml\"".into(),
                        is.as_written(&fallback.at),
                    );
                }
                if groups.is_empty() {
                    let mut at = table_at.clone();
                    at.path = table_at.key("simulated");
                    is.report(
                        &at,
                        IssueKind::MissingKey,
                        "backend \"simulated\" needs at least one [[gpus.simulated]] group".into(),
                        None,
                    );
                    return None;
                }
                Some(GpuSource::Simulated(groups))
            }
            Some("nvml") => {
                let fb = match fallback.v.as_deref() {
                    None | Some("error") => Some(NvmlFallback::Error),
                    Some("simulated") => Some(NvmlFallback::Simulated),
                    Some(other) => {
                        is.report(
                            &fallback.at,
                            IssueKind::Invalid,
                            "expected \"error\" or \"simulated\"".into(),
                            Some(quote(other)),
                        );
                        None
                    }
                };
                if fb == Some(NvmlFallback::Simulated) && groups.is_empty() {
                    is.report(
                        &fallback.at,
                        IssueKind::Inconsistent,
                        "nvml_fallback = \"simulated\" needs [[gpus.simulated]] groups".into(),
                        None,
                    );
                    return None;
                }
                let h2d = if h2d.v.is_some() {
                    check_range(&mut is, &h2d, 1, 1 << 24)?
                } else {
                    DEFAULT_H2D_MIB_PER_S
                };
                Some(GpuSource::Nvml {
                    fallback: fb?,
                    simulated: groups,
                    h2d_mib_per_s: h2d,
                })
            }
            Some(other) => {
                is.report(
                    &backend.at,
                    IssueKind::Invalid,
                    "expected \"simulated\" or \"nvml\"".into(),
                    Some(quote(other)),
                );
                None
            }
            None => None,
        }
    });
    let runtimes = read_runtimes(&mut is, src, &mut root);
    root.finish(&mut is);

    let node = check_name(&mut is, &node);
    let pool = check_name(&mut is, &pool);
    let pool_kind = pool_kind
        .v
        .as_ref()
        .and_then(|s| match s.parse::<PoolKind>() {
            Ok(k) => Some(k),
            Err(e) => {
                is.report(
                    &pool_kind.at,
                    IssueKind::Invalid,
                    e.to_string(),
                    Some(quote(s)),
                );
                None
            }
        });
    let data_dir = nonempty(&mut is, data_dir);
    let ingress_at = ingress.at.clone();
    let ingress = addr(&mut is, &ingress);
    if let Some(a) = ingress {
        if let Err(m) = check_http_bind(a, http_tls.is_some(), insecure_http.v == Some(true)) {
            is.report(
                &ingress_at,
                IssueKind::Inconsistent,
                m,
                Some(quote(&a.to_string())),
            );
        }
    }
    let quic_bind = match quic_bind.v {
        Some(_) => addr(&mut is, &quic_bind).inspect(|b| {
            if b.is_ipv4() && replicas.iter().any(SocketAddr::is_ipv6) {
                is.report(
                    &quic_bind.at,
                    IssueKind::Inconsistent,
                    "an IPv4 address cannot reach the IPv6 replicas listed".into(),
                    Some(b.to_string()),
                );
            }
        }),
        None => Some(default_quic_bind(&replicas)),
    };
    let host_swap = check_range(&mut is, &host_swap, 0, 1 << 32);
    let heartbeat = if heartbeat.v.is_some() {
        check_range(&mut is, &heartbeat, 10, 60_000)
    } else {
        Some(DEFAULT_HEARTBEAT_MS)
    };

    if !is.is_empty() {
        return Err(is.into_error(file));
    }
    let (
        Some(metering_interval_ms),
        Some(invoke_key_window_s),
        Some(journal_sync),
        Some(max_request_bytes),
        Some(body_idle_timeout_ms),
    ) = (
        metering_interval,
        invoke_key_window,
        journal_sync,
        max_request_bytes,
        body_idle_timeout_ms,
    )
    else {
        return Err(is.into_error(file));
    };
    let Some(quic_bind) = quic_bind else {
        return Err(is.into_error(file));
    };
    match (
        node, pool, pool_kind, data_dir, ingress, host_swap, heartbeat, tls, gpus, load, runtimes,
    ) {
        (
            Some(node),
            Some(pool),
            Some(pool_kind),
            Some(data_dir),
            Some(ingress_addr),
            Some(host_swap_mib),
            Some(heartbeat_ms),
            Some((Some(ca_cert), Some(cert), Some(key))),
            Some(gpus),
            Some(load),
            Some(runtimes),
        ) => Ok(AgentConfig {
            node: NodeId(node),
            pool,
            pool_kind,
            data_dir,
            ingress_addr,
            replicas,
            quic_bind,
            tls: AgentTls { ca_cert, cert, key },
            gpus,
            host_swap_mib,
            load,
            heartbeat_ms,
            runtimes,
            metering_interval_ms,
            invoke_key_window_s,
            journal_sync,
            allow_fewer_gpus: allow_fewer_gpus.v.unwrap_or(false),
            http_tls: match http_tls {
                Some((Some(cert), Some(key))) => Some(HttpTls { cert, key }),
                _ => None,
            },
            insecure_http: insecure_http.v.unwrap_or(false),
            files: files.into_iter().filter(|f| !f.path.is_empty()).collect(),
            metrics_token_file,
            max_request_bytes,
            body_idle_timeout_ms,
        }),
        _ => Err(is.into_error(file)),
    }
}

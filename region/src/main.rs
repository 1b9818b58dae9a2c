//! `gshare-region --config <file> [--init]`: one replica of the region.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::Parser;
use gshare_core::logging::{exit_with, LogFormat};
use gshare_raft_store::ReplicaNode;
use gshare_region::config::ReplicaConfig;
use gshare_region::http::{self, HttpContext};
use gshare_region::replica::{InitOutcome, Replica, ReplicaSpec};
use gshare_region::tls;

#[derive(Debug, Parser)]
#[command(
    name = "gshare-region",
    version,
    about = "A replica of the gshare region"
)]
struct Args {
    /// The replica's TOML config.
    #[arg(long)]
    config: PathBuf,
    /// Initialize a new cluster of this replica and its configured peers
    /// (a no-op if this replica already belongs to one).
    #[arg(long)]
    init: bool,
    /// Log lines as `text` (colour only on a terminal) or `json` (one
    /// object per line), on stderr; `RUST_LOG` sets the filter.
    #[arg(long, default_value_t = LogFormat::Text, value_parser = log_format_parser())]
    log_format: LogFormat,
}

/// `text` or `json`, listed in `--help`.
fn log_format_parser() -> impl clap::builder::TypedValueParser<Value = LogFormat> {
    clap::builder::PossibleValuesParser::new(LogFormat::NAMES)
        .map(|s| s.parse::<LogFormat>().unwrap_or_default())
}

/// openraft's errors for an RPC to a peer that failed (vote requests and
/// replication to a replica that is not up yet, or down): the region's peer
/// links report each peer going away and coming back once
/// ([`gshare_region::peer_link`]), so under the default filter these repeats
/// are dropped. Storage errors and everything else openraft says stay.
fn peer_rpc_noise(m: &tracing::Metadata<'_>) -> bool {
    if *m.level() != tracing::Level::ERROR {
        return false;
    }
    let has = |f: &str| m.fields().field(f).is_some();
    match m.target() {
        // "while requesting vote", "timeout" (vote), "timeout while confirming leadership"
        "openraft::core::raft_core" => has("target") && has("error"),
        // "RPCError" (replication); storage errors use the field `error`.
        "openraft::replication" => has("err"),
        _ => false,
    }
}

fn main() {
    let args = Args::parse();
    let format = args.log_format;
    gshare_core::logging::init(
        format,
        "warn,openraft=error,gshare_region=info",
        Some(peer_rpc_noise),
    );
    let config = match ReplicaConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => exit_with(format, &format!("gshare-region: {e}"), 2),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => exit_with(
            format,
            &format!("gshare-region: cannot start the runtime: {e}"),
            1,
        ),
    };
    if let Err(e) = runtime.block_on(run(config, args.init, format)) {
        exit_with(format, &format!("gshare-region: {e:#}"), 1);
    }
}

/// Resolves once this replica's Raft core has stopped on a fatal error (a
/// storage error such as a full disk: openraft does not recover from one).
/// The process then exits instead of serving a state that no longer
/// advances; restarted, it recovers from its log on disk.
async fn raft_stopped(replica: &Replica) -> String {
    let mut metrics = replica.raft.metrics();
    loop {
        if let Err(e) = &metrics.borrow().running_state {
            return e.to_string();
        }
        if metrics.changed().await.is_err() {
            return "its metrics channel closed".to_string();
        }
    }
}

async fn run(config: ReplicaConfig, init: bool, format: LogFormat) -> anyhow::Result<()> {
    let initial = if init {
        match gshare_region::bootstrap::initial_commands(&config) {
            Ok(c) => c,
            Err(e) => exit_with(format, &format!("gshare-region: {e}"), 2),
        }
    } else {
        Vec::new()
    };
    let replica = Replica::start(&ReplicaSpec::from(&config)).await?;
    if init {
        let mut members = BTreeMap::new();
        members.insert(config.id, replica.node.clone());
        for p in &config.peers {
            members.insert(
                p.id,
                ReplicaNode {
                    raft_addr: p.raft_addr.to_string(),
                    http_addr: p.http_addr.to_string(),
                },
            );
        }
        let n = members.len();
        match replica.initialize(members).await? {
            InitOutcome::Initialized => {
                println!("gshare-region: initialized a new cluster of {n} replicas")
            }
            InitOutcome::AlreadyInitialized => {
                println!(
                    "gshare-region: already part of an initialized cluster; --init changed nothing"
                )
            }
        }
        let r = replica.clone();
        tokio::spawn(async move {
            let n = gshare_region::bootstrap::propose_initial(&r, initial).await;
            if n > 0 {
                println!("gshare-region: --init loaded the topology and tenants ({n} commands)");
            }
        });
    }
    let (server_tls, forward_tls) = match &config.http_tls {
        Some(t) => (
            Some(tls::http_server_config(&t.cert, &t.key)?),
            Some(std::sync::Arc::new(tls::http_client_config(&t.ca_cert)?)),
        ),
        None => (None, None),
    };
    let scheme = if server_tls.is_some() {
        "https"
    } else {
        "http"
    };
    if server_tls.is_none() {
        tracing::warn!(
            addr = %config.http_addr,
            insecure_http = config.insecure_http,
            "the HTTP API is plain HTTP: bearer tokens cross the network in clear \
             (add [http_tls] to serve HTTPS)"
        );
    }
    let ctx = HttpContext {
        replica: replica.clone(),
        operator_token: config.operator_token.clone(),
        metrics_token: config.metrics_token.clone(),
        api: std::sync::Arc::new(gshare_region::api::ApiState::new(Some(
            config.topology.clone(),
        ))),
        forward_tls,
        body_limits: gshare_core::net::http_client::BodyLimits {
            max_bytes: config.max_request_bytes,
            idle: std::time::Duration::from_millis(config.body_idle_timeout_ms),
        },
    };
    let server = http::server(ctx, config.http_addr, 2, server_tls)?;
    let handle = server.handle();
    println!(
        "gshare-region {} serving: raft (QUIC) {} {scheme} {}",
        config.id, config.raft_addr, config.http_addr
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = server => r?,
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        why = raft_stopped(&replica) => {
            handle.stop(false).await;
            anyhow::bail!("the Raft core stopped ({why}); exiting so that the replica is restarted");
        }
    }
    handle.stop(true).await;
    replica.shutdown().await;
    Ok(())
}

//! `gshare-region --config <file> [--init]`: one replica of the region.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use gshare_raft_store::ReplicaNode;
use gshare_region::config::ReplicaConfig;
use gshare_region::http::{self, HttpContext};
use gshare_region::replica::{InitOutcome, Replica, ReplicaSpec};
use gshare_region::tls;

#[derive(Debug, Parser)]
#[command(name = "gshare-region", about = "A replica of the gshare region")]
struct Args {
    /// The replica's TOML config.
    #[arg(long)]
    config: PathBuf,
    /// Initialize a new cluster of this replica and its configured peers
    /// (a no-op if this replica already belongs to one).
    #[arg(long)]
    init: bool,
}

fn main() {
    let args = Args::parse();
    let config = match ReplicaConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gshare-region: {e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,openraft=error,gshare_region=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gshare-region: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(config, args.init)) {
        eprintln!("gshare-region: {e:#}");
        std::process::exit(1);
    }
}

async fn run(config: ReplicaConfig, init: bool) -> anyhow::Result<()> {
    let initial = if init {
        match gshare_region::bootstrap::initial_commands(&config) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("gshare-region: {e}");
                std::process::exit(2);
            }
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
    };
    tokio::spawn(gshare_region::api::placement_loop::run(ctx.clone()));
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
    }
    handle.stop(true).await;
    replica.shutdown().await;
    Ok(())
}

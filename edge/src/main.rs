//! `gshare-edge --config <file>`: the node agent.

use anyhow::Context as _;
use clap::builder::TypedValueParser as _;
use clap::Parser;
use gshare_core::logging::{exit_with, LogFormat};
use gshare_edge::agent::{Metering, NodeAgent, NodeSetup, StopRuntimes};
use gshare_edge::gpu::discover;
use gshare_edge::runtime::process::ProcessLedger;
use gshare_edge::runtime::Drivers;
use gshare_edge::{ingress, region_link};
use std::path::PathBuf;

/// The gshare node agent.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// The agent's config (TOML).
    #[arg(long)]
    config: PathBuf,
    /// HTTP ingress worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
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

fn main() {
    let args = Args::parse();
    let format = args.log_format;
    gshare_core::logging::init(format, "info", None);
    let text = match std::fs::read_to_string(&args.config) {
        Ok(t) => t,
        Err(e) => exit_with(format, &format!("{}: {e}", args.config.display()), 2),
    };
    let config = match gshare_core::config::AgentConfig::from_toml(
        &args.config.display().to_string(),
        &text,
    ) {
        Ok(c) => c,
        Err(e) => exit_with(format, &e.to_string(), 2),
    };
    let base = args.config.parent().map(PathBuf::from).unwrap_or_default();
    // Every certificate file named must exist: found now, with its line,
    // not later as a failed handshake.
    let files: Vec<_> = config.files.iter().collect();
    let missing = gshare_core::net::missing_files(&base, &files);
    if !missing.is_empty() {
        let e = gshare_core::config::ConfigError::in_file_order(
            &args.config.display().to_string(),
            missing,
        );
        exit_with(format, &e.to_string(), 2);
    }
    let drivers = match load_drivers(&args.config, &base, &config) {
        Ok(d) => d,
        Err(e) => exit_with(format, &e.to_string(), 2),
    };
    if let Err(e) = run(config, base, drivers, args.workers) {
        exit_with(format, &format!("gshare-edge: {e:#}"), 1);
    }
}

/// The runtime drivers of `[runtimes]`, with their templates read (every
/// problem reported at its key). Function output goes to
/// `<data_dir>/function-logs/`.
fn load_drivers(
    file: &std::path::Path,
    base: &std::path::Path,
    config: &gshare_core::config::AgentConfig,
) -> Result<Drivers, gshare_core::config::ConfigError> {
    let log_dir = base.join(&config.data_dir).join("function-logs");
    Drivers::load(
        &file.display().to_string(),
        base,
        &config.runtimes,
        Some(log_dir),
    )
}

fn run(
    config: gshare_core::config::AgentConfig,
    base: PathBuf,
    mut drivers: Drivers,
    workers: usize,
) -> anyhow::Result<()> {
    // An agent is the node its certificate names: refuse to start as another.
    gshare_core::net::check_certificate_file(&base.join(&config.tls.cert), &config.node.0)
        .map_err(|e| anyhow::anyhow!("identity: {e}"))?;
    let ingress_tls = match &config.http_tls {
        Some(t) => Some(
            gshare_core::net::http_server_config(&base.join(&t.cert), &base.join(&t.key))
                .context("[http_tls]")?,
        ),
        None => {
            tracing::warn!(
                ingress = %config.ingress_addr,
                insecure_http = config.insecure_http,
                "the ingress is plain HTTP: bearer tokens cross the network in clear \
                 (add [http_tls] to serve HTTPS)"
            );
            None
        }
    };
    let metrics_token = match &config.metrics_token_file {
        Some(f) => {
            let path = base.join(f);
            let token = std::fs::read_to_string(&path)
                .with_context(|| format!("metrics_token_file {}", path.display()))?;
            let token = token.trim().to_string();
            anyhow::ensure!(
                !token.is_empty(),
                "metrics_token_file {}: the file is empty",
                path.display()
            );
            Some(token)
        }
        None => None,
    };
    let discovered = discover(&config.gpus).context("finding GPUs")?;
    if let Some(w) = &discovered.fallback_warning {
        tracing::warn!("{w}");
    }
    tracing::info!(node = %config.node.0, gpus = discovered.gpus.len(), "starting");
    if let Some(nvml) = &discovered.nvml {
        log_inventory(nvml, &discovered.gpus);
    }
    drivers.set_gpu_memory_mib(discovered.gpus.iter().map(|g| g.memory_mib).min());
    // Function processes a killed predecessor left running hold GPU memory
    // this agent would hand out again: stop them first.
    let ledger_dir = base.join(&config.data_dir).join("function-processes");
    let ledger = ProcessLedger::open(&ledger_dir)
        .with_context(|| format!("process ledger {}", ledger_dir.display()))?;
    let reaped = ledger.reap();
    if !reaped.killed.is_empty() {
        tracing::warn!(
            groups = ?reaped.killed,
            "stopped function processes left running by a previous agent"
        );
    }
    drivers.set_ledger(ledger);
    let journal_dir = base.join(&config.data_dir).join("journal");
    let journal = gshare_edge::journal::UsageJournal::open_with(
        &journal_dir,
        gshare_core::state::AgentId(config.node.0.clone()),
        config.journal_sync,
    )
    .with_context(|| format!("opening the usage journal {}", journal_dir.display()))?;
    journal.set_key_window(std::time::Duration::from_secs(config.invoke_key_window_s));
    let metering = Metering {
        journal: std::sync::Arc::new(journal),
        appended: std::sync::Arc::default(),
        interval: std::time::Duration::from_millis(config.metering_interval_ms),
        pool_kind: config.pool_kind,
    };
    // Bound before anything starts: a taken port is a plain error.
    let listener = std::net::TcpListener::bind(config.ingress_addr).with_context(|| {
        format!(
            "binding ingress_addr {} (is another agent or program using it?)",
            config.ingress_addr
        )
    })?;
    let health = region_link::LinkHealth::default();
    let system = actix_rt::System::new();
    let journal = metering.journal.clone();
    let result = system.block_on(async move {
        let agent = actix::Actor::start(
            NodeAgent::new(NodeSetup {
                node: config.node.clone(),
                gpus: discovered.gpus.clone(),
                host_swap_mib: config.host_swap_mib,
                load: config.load,
                process_counters: drivers.counters(),
                driver: drivers.into_factory(),
                clock: gshare_core::clock::SystemClock::shared(),
            })
            .with_metering(metering.clone())
            .with_metrics_token(metrics_token.as_deref()),
        );
        let journal = Some(metering.journal.clone());
        let server = ingress::serve_listener(
            listener,
            agent.clone(),
            workers,
            journal,
            ingress_tls,
            (
                health.clone(),
                gshare_core::net::http_client::BodyLimits {
                    max_bytes: config.max_request_bytes,
                    idle: std::time::Duration::from_millis(config.body_idle_timeout_ms),
                },
            ),
        )
        .with_context(|| format!("serving ingress {}", config.ingress_addr))?;
        let handle = server.handle();
        let link = region_link::RegionLink::start_with_health(
            &config,
            &base,
            &discovered,
            agent.clone(),
            Some(&metering),
            health,
        )
        .context("region link")?;
        tracing::info!(ingress = %config.ingress_addr, "serving");
        let srv = actix_rt::spawn(server);
        shutdown_signal().await;
        tracing::info!("shutting down: draining invocations");
        handle.stop(true).await;
        let _ = srv.await;
        // Function processes get SIGTERM and their grace (not a SIGKILL on drop).
        let _ = agent.send(StopRuntimes).await;
        // Residency up to now (the processes are stopped) goes into the journal.
        let _ = agent.send(gshare_edge::agent::FlushUsage).await;
        // Deliver what is journaled while the link is still up (bounded);
        // what is left is sent by the next start, never lost.
        let left = drain_journal(&metering.journal, SHUTDOWN_DRAIN).await;
        if left > 0 {
            tracing::warn!(
                records = left,
                "usage journal not drained; sent on the next start"
            );
        } else {
            tracing::info!("usage journal drained");
        }
        drop(link);
        actix_rt::System::current().stop();
        anyhow::Ok(())
    });
    if result.is_err() {
        // A start-up error inside the system: its actors still hold
        // runtime resources whose drop outside the runtime would panic
        // ("there is no reactor running"); the process is exiting, so
        // leave them to it.
        std::mem::forget(system);
    }
    result?;
    // The journal stopped taking appends (its log holds an entry its tree
    // lacks) and the agent is stopping before its own exit: exit 70 all the
    // same, so that the supervisor restarts it and the restart replays the
    // log (`Restart=on-failure`; a clean exit would leave it stopped).
    if let Some(why) = journal.refusing() {
        tracing::error!("usage journal stopped taking appends ({why}); exiting 70 to replay it");
        std::process::exit(70);
    }
    tracing::info!("stopped");
    Ok(())
}

/// How long a stopping agent waits for the region to acknowledge its
/// journaled usage.
const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Waits until the journal holds no unacknowledged record or `limit`
/// passed; the records left.
async fn drain_journal(
    journal: &std::sync::Arc<gshare_edge::journal::UsageJournal>,
    limit: std::time::Duration,
) -> usize {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let j = journal.clone();
        let left = tokio::task::spawn_blocking(move || j.pending())
            .await
            .unwrap_or(usize::MAX);
        if left == 0 || tokio::time::Instant::now() >= until {
            return left;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// One line per NVML GPU: what placement uses (model, memory) and what an
/// operator checks it against (UUID, MIG and compute mode, PCIe link).
fn log_inventory(nvml: &nvml_wrapper::Nvml, gpus: &[gshare_edge::gpu::GpuInfo]) {
    let inv = match gshare_edge::gpu::inventory(nvml) {
        Ok(inv) => inv,
        Err(e) => {
            tracing::warn!("NVML inventory: {e}");
            return;
        }
    };
    for (g, d) in gpus.iter().zip(&inv.gpus) {
        tracing::info!(
            gpu = g.index,
            model = %g.model,
            memory_mib = g.memory_mib,
            uuid = d.uuid.as_deref().unwrap_or("?"),
            mig = ?d.mig_enabled,
            compute_mode = d.compute_mode.as_deref().unwrap_or("?"),
            pcie = ?(d.pcie_max_gen, d.pcie_max_width),
            driver = inv.driver_version.as_deref().unwrap_or("?"),
            "NVML GPU"
        );
        if d.mig_enabled == Some(true) {
            tracing::warn!(
                gpu = g.index,
                "MIG is enabled on this GPU: CUDA processes see its MIG instances, not the whole GPU the agent places slices on; disable MIG for MPS slices"
            );
        }
    }
    for u in &inv.unreadable {
        tracing::debug!("NVML: {u}");
    }
}

//! What a process instance runs: argv, environment, slice, timings.

use super::template::{FunctionArgs, MpsOrdinals, RuntimeTemplate, TemplateError, TemplateVars};
use gshare_core::model::{Mib, MilliGpu, Slice};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The GPU slice a process is limited to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceLimits {
    /// Node GPU indices (one for a slice, several for whole GPUs).
    pub gpus: Vec<u32>,
    /// Compute per GPU, milli-GPU (1..=1000).
    pub compute_milli: MilliGpu,
    /// GPU memory per GPU, MiB.
    pub memory_mib: Mib,
    /// The GPU's total memory, MiB, if known (for `{memory_fraction}`).
    pub gpu_memory_mib: Option<Mib>,
}

impl SliceLimits {
    /// Limits from core's slices (all on one node); `None` for no slices.
    pub fn from_slices(slices: &[Slice], gpu_memory_mib: Option<Mib>) -> Option<Self> {
        let first = slices.first()?;
        Some(Self {
            gpus: slices.iter().map(|s| s.gpu.index).collect(),
            compute_milli: first.compute_milli,
            memory_mib: first.memory_mib,
            gpu_memory_mib,
        })
    }

    /// `0` or `2,3`: the value of `CUDA_VISIBLE_DEVICES`.
    pub fn gpu_list(&self) -> String {
        self.gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: compute_milli / 10, at least 1,
    /// at most 100.
    pub fn compute_percent(&self) -> u32 {
        (self.compute_milli / 10).clamp(1, 100)
    }

    /// Memory as a fraction of the GPU's, 3 decimals (`1.000` if unknown).
    pub fn memory_fraction(&self) -> String {
        match self.gpu_memory_mib {
            Some(total) if total > 0 => {
                let permille = (self.memory_mib.min(total) * 1000) / total;
                format!("{}.{:03}", permille / 1000, permille % 1000)
            }
            _ => "1.000".into(),
        }
    }

    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: `<gpu>=<MiB>M` per GPU, comma-separated.
    pub fn mps_memory_limit(&self, ordinals: MpsOrdinals) -> String {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let n = match ordinals {
                    MpsOrdinals::Node => *g as usize,
                    MpsOrdinals::Visible => i,
                };
                format!("{n}={}M", self.memory_mib)
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The CUDA/MPS environment of the slice.
    pub fn cuda_env(&self, ordinals: MpsOrdinals) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("CUDA_VISIBLE_DEVICES".to_string(), self.gpu_list()),
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
                self.compute_percent().to_string(),
            ),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                self.mps_memory_limit(ordinals),
            ),
        ])
    }
}

/// Restart delays: `initial`, doubled after each failed start or crash, at
/// most `max`; back to `initial` once a start stayed healthy for `reset_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Cap.
    pub max: Duration,
    /// Healthy time after which the delay resets.
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay before restart number `attempt` (1-based, counted since the
    /// last reset).
    pub fn delay(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << shift)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// Everything needed to run one function instance as a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Instance id (for logs and errors).
    pub instance: String,
    /// argv, rendered (program first).
    pub argv: Vec<String>,
    /// Environment added to the agent's (the CUDA/MPS variables included).
    pub env: BTreeMap<String, String>,
    /// Working directory (the agent's if `None`).
    pub workdir: Option<PathBuf>,
    /// Where the server listens.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The second port `{aux_port}` stood for (0 if the template has none).
    pub aux_port: u16,
    /// Health path (GET → 200 when ready).
    pub health_path: String,
    /// Invocation path (POST).
    pub invoke_path: String,
    /// Largest response body taken from the server, bytes.
    pub max_reply_bytes: usize,
    /// Longest wait for health after a (re)start.
    pub startup_timeout: Duration,
    /// Time between health polls.
    pub health_interval: Duration,
    /// Timeout of one health request.
    pub health_request_timeout: Duration,
    /// Grace between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Restart delays.
    pub backoff: Backoff,
    /// Give up (state `Failed`) after this many restarts in a row without a
    /// healthy start; `None`: never.
    pub max_failed_starts: Option<u32>,
}

impl ProcessSpec {
    /// Renders `template` for one instance of `function` (its `{model}`,
    /// `args` and `env`). `port = 0` picks a free loopback port now (kept
    /// across restarts).
    pub fn from_template(
        template: &RuntimeTemplate,
        instance: &str,
        function: FunctionArgs<'_>,
        port: u16,
        slice: SliceLimits,
    ) -> Result<Self, TemplateError> {
        let no_port = |e: std::io::Error| TemplateError::Invalid {
            file: instance.to_string(),
            key: "port".into(),
            message: format!("no free port: {e}"),
        };
        let port = if port == 0 {
            free_port().map_err(no_port)?
        } else {
            port
        };
        let wants_aux = template
            .command
            .iter()
            .chain(template.env.values())
            .any(|a| a.contains("{aux_port}"));
        let aux_port = if wants_aux {
            free_port().map_err(no_port)?
        } else {
            0
        };
        let vars = TemplateVars {
            instance: instance.to_string(),
            model: function.model.to_string(),
            host: "127.0.0.1".into(),
            port,
            aux_port,
            slice: slice.clone(),
        };
        let (argv, env) =
            template.render_process(&vars, function, slice.cuda_env(template.mps_ordinals))?;
        Ok(Self {
            instance: instance.to_string(),
            argv,
            env,
            workdir: None,
            host: vars.host,
            port,
            aux_port,
            health_path: template.health_path.clone(),
            invoke_path: template.invoke_path.clone(),
            max_reply_bytes: template.max_reply_bytes,
            startup_timeout: Duration::from_secs(template.startup_timeout_s),
            health_interval: Duration::from_millis(50),
            health_request_timeout: Duration::from_secs(2),
            stop_grace: Duration::from_secs(template.stop_grace_s),
            backoff: Backoff {
                initial: Duration::from_millis(template.restart_initial_ms),
                max: Duration::from_millis(template.restart_max_ms),
                ..Backoff::default()
            },
            max_failed_starts: (template.max_failed_starts > 0)
                .then_some(template.max_failed_starts),
        })
    }
}

/// A loopback TCP port free right now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

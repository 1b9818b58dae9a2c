//! A runtime's command template (`configs/examples/runtimes/*.toml`).
//!
//! ```toml
//! runtime = "vllm"
//! command = ["python3", "-m", "vllm.entrypoints.openai.api_server",
//!            "--model", "{model}", "--port", "{port}"]
//! health_path = "/health"
//! invoke_path = "/v1/completions"
//! ```
//!
//! Placeholders, replaced in every `command` argument and `env` value:
//!
//! | placeholder | value |
//! |---|---|
//! | `{port}` | the TCP port the server must listen on |
//! | `{aux_port}` | a second free port (a runtime's gRPC or metrics port) |
//! | `{host}` | the address it must listen on (`127.0.0.1`) |
//! | `{model}` | the function's model (path or name) |
//! | `{gpu}` | the node GPU indices of the slice, comma-separated (`0`, `2,3`) |
//! | `{compute_milli}` | the slice's compute, milli-GPU per GPU |
//! | `{compute_percent}` | the same in percent (what MPS takes), at least 1 |
//! | `{memory_mib}` | the slice's GPU memory, MiB per GPU |
//! | `{memory_fraction}` | memory ÷ the GPU's memory, 3 decimals (vLLM's `--gpu-memory-utilization`) |
//! | `{instance}` | the instance id |
//!
//! `{{` and `}}` stand for literal braces. An unknown placeholder is an
//! error when the template is rendered.
//!
//! `{model}` is the function's `model` (`org/model`), or its name when it
//! has none. What else a function may add is the operator's choice:
//!
//! ```toml
//! allow_args = ["--max-model-len=", "--enable-prefix-caching"]  # `=`: takes a value
//! allow_env = ["HF_TOKEN"]
//! ```
//!
//! A function's `args` are appended to the command and its `env` set over
//! the template's, as written (not rendered); anything else is refused
//! when the instance starts ([`TemplateError::NotAllowed`]). The slice's
//! CUDA variables are set last and cannot be allowed.
//!
//! With `driver = "microvm"` the command runs inside the guest, where
//! `{host}` is `0.0.0.0` and `{port}` the guest port; the optional `[vm]`
//! table says what else the guest needs (see [`VmTemplate`],
//! docs/microvm.md):
//!
//! ```toml
//! [vm]
//! files = ["echo_server.py"]   # copied into the guest's /fn (relative to this file)
//! memory_mib = 256
//! guest_port = 8080
//! ```

use super::spec::SliceLimits;
use serde::Deserialize;
use std::collections::BTreeMap;

/// How `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` numbers the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MpsOrdinals {
    /// The node's GPU indices (`2=4096M` for GPU 2).
    #[default]
    Node,
    /// The ordinals the process sees after `CUDA_VISIBLE_DEVICES` (`0=4096M`).
    Visible,
}

/// A runtime's command template, as written in a TOML file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeTemplate {
    /// The runtime it serves (`vllm`, `sglang`, `tf-serving`, `pytorch`, `custom`).
    pub runtime: String,
    /// One line for humans.
    #[serde(default)]
    pub description: String,
    /// The server's argv (program first), with placeholders.
    pub command: Vec<String>,
    /// Extra environment variables (values may hold placeholders).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// HTTP path answering 200 once the server is ready.
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// HTTP path invocations are POSTed to.
    #[serde(default = "default_invoke_path")]
    pub invoke_path: String,
    /// Largest response body taken from the server, bytes (a larger one
    /// fails the invocation: `instance_failed`).
    #[serde(default = "default_max_reply_bytes")]
    pub max_reply_bytes: usize,
    /// How long a start may take before the health check gives up (s).
    #[serde(default = "default_startup_timeout_s")]
    pub startup_timeout_s: u64,
    /// Grace between SIGTERM and SIGKILL on stop (s).
    #[serde(default = "default_stop_grace_s")]
    pub stop_grace_s: u64,
    /// GPU numbering of the MPS memory limit.
    #[serde(default)]
    pub mps_ordinals: MpsOrdinals,
    /// First delay before restarting a crashed process (ms); doubled after
    /// each failed start.
    #[serde(default = "default_restart_initial_ms")]
    pub restart_initial_ms: u64,
    /// Longest delay between restarts (ms).
    #[serde(default = "default_restart_max_ms")]
    pub restart_max_ms: u64,
    /// Failed restarts in a row after which the instance gives up
    /// (invocations then fail until the function is loaded again); 0: never.
    #[serde(default = "default_max_failed_starts")]
    pub max_failed_starts: u32,
    /// How the command runs in a microVM (`driver = "microvm"` only).
    #[serde(default)]
    pub vm: VmTemplate,
    /// The flags a function's `args` may append to the command: `--flag`
    /// (a switch) or `--flag=` (takes one value, written `--flag=v` or
    /// `--flag v`). Empty: a function may add none.
    #[serde(default)]
    pub allow_args: Vec<String>,
    /// The environment variables a function's `env` may set (over the
    /// template's `env`; never the slice's CUDA variables). Empty: none.
    #[serde(default)]
    pub allow_env: Vec<String>,
}

/// What one function asks of the template: `{model}`, and its `args` and
/// `env` (core's `FunctionSpec::{model, args, env}`).
#[derive(Debug, Clone, Copy)]
pub struct FunctionArgs<'a> {
    /// What `{model}` stands for.
    pub model: &'a str,
    /// Arguments appended to the command.
    pub args: &'a [String],
    /// Environment set over the template's.
    pub env: &'a BTreeMap<String, String>,
}

static NO_ENV: BTreeMap<String, String> = BTreeMap::new();

impl<'a> FunctionArgs<'a> {
    /// `{model}` = `model`, nothing else asked.
    pub fn model(model: &'a str) -> Self {
        Self {
            model,
            args: &[],
            env: &NO_ENV,
        }
    }

    /// What `spec` asks (`{model}`: its model, else its name).
    pub fn of(spec: &'a gshare_core::model::FunctionSpec) -> Self {
        Self {
            model: spec.model_or_name(),
            args: &spec.args,
            env: &spec.env,
        }
    }
}

/// The variables the slice sets; a function may never set them.
pub const SLICE_ENV: [&str; 3] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
];

/// Variables that change what the slice's variables mean or what the
/// process loads: a template may never let a function set them.
pub const ISOLATION_ENV: [&str; 7] = [
    "CUDA_DEVICE_ORDER",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "NVIDIA_VISIBLE_DEVICES",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
];

/// The `[vm]` table of a template: what a `microvm` guest needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmTemplate {
    /// The function's files, relative to the template's directory, copied
    /// into the guest's `/fn` (its working directory) under their names.
    #[serde(default)]
    pub files: Vec<String>,
    /// Guest memory, MiB.
    #[serde(default = "default_vm_memory_mib")]
    pub memory_mib: u32,
    /// The port the server listens on inside the guest (`{port}` there);
    /// the driver forwards a loopback port of the host to it.
    #[serde(default = "default_guest_port")]
    pub guest_port: u16,
    /// The start estimate the executor uses before the first boot is
    /// measured (ms).
    #[serde(default = "default_boot_ms")]
    pub default_boot_ms: u64,
}

impl Default for VmTemplate {
    fn default() -> Self {
        Self {
            files: Vec::new(),
            memory_mib: default_vm_memory_mib(),
            guest_port: default_guest_port(),
            default_boot_ms: default_boot_ms(),
        }
    }
}

/// Smallest and largest `vm.memory_mib` accepted.
pub const VM_MEMORY_MIB: std::ops::RangeInclusive<u32> = 64..=65_536;

fn default_vm_memory_mib() -> u32 {
    256
}
fn default_guest_port() -> u16 {
    8080
}
fn default_boot_ms() -> u64 {
    3_000
}

/// Longest `startup_timeout_s` accepted (a day).
pub const MAX_STARTUP_TIMEOUT_S: u64 = 86_400;
/// Longest `stop_grace_s` accepted (an hour).
pub const MAX_STOP_GRACE_S: u64 = 3_600;
/// Longest `restart_max_ms` accepted (a day).
pub const MAX_RESTART_MS: u64 = 86_400_000;

fn default_restart_initial_ms() -> u64 {
    200
}
fn default_restart_max_ms() -> u64 {
    30_000
}
fn default_max_failed_starts() -> u32 {
    10
}

fn default_max_reply_bytes() -> usize {
    super::MAX_RESPONSE_BODY
}

/// Smallest and largest `max_reply_bytes` accepted (1 KiB to 1 GiB).
pub const MAX_REPLY_BYTES: std::ops::RangeInclusive<usize> = 1024..=(1 << 30);

fn default_health_path() -> String {
    "/health".into()
}
fn default_invoke_path() -> String {
    "/invoke".into()
}
fn default_startup_timeout_s() -> u64 {
    120
}
fn default_stop_grace_s() -> u64 {
    10
}

/// A template that cannot be parsed or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The TOML text is invalid (file name, then the parser's message).
    #[error("{file}: {message}")]
    Parse {
        /// The file (or a label).
        file: String,
        /// What the parser said (key path included).
        message: String,
    },
    /// A field has an invalid value.
    #[error("{file}: {key}: {message}")]
    Invalid {
        /// The file (or a label).
        file: String,
        /// The key path.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A function asks for an argument or variable the template does not allow.
    #[error("{key}: {message}")]
    NotAllowed {
        /// Where in the function's spec (e.g. `args[2]`, `env.HF_HOME`).
        key: String,
        /// What is not allowed, and what is.
        message: String,
    },
    /// A placeholder is not one of the known names, or a brace is unmatched.
    #[error("{key}: {message}")]
    Placeholder {
        /// Where (e.g. `command[3]`).
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// The values placeholders are replaced with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateVars {
    /// The instance id.
    pub instance: String,
    /// The model (path or name).
    pub model: String,
    /// Listen address.
    pub host: String,
    /// Listen port.
    pub port: u16,
    /// A second free port.
    pub aux_port: u16,
    /// The slice.
    pub slice: SliceLimits,
}

impl TemplateVars {
    fn lookup(&self, name: &str) -> Option<String> {
        Some(match name {
            "port" => self.port.to_string(),
            "aux_port" => self.aux_port.to_string(),
            "host" => self.host.clone(),
            "model" => self.model.clone(),
            "gpu" => self.slice.gpu_list(),
            "compute_milli" => self.slice.compute_milli.to_string(),
            "compute_percent" => self.slice.compute_percent().to_string(),
            "memory_mib" => self.slice.memory_mib.to_string(),
            "memory_fraction" => self.slice.memory_fraction(),
            "instance" => self.instance.clone(),
            _ => return None,
        })
    }
}

/// Replaces the placeholders of `text`; `key` names it in errors.
pub fn render(text: &str, key: &str, vars: &TemplateVars) -> Result<String, TemplateError> {
    let err = |message: String| TemplateError::Placeholder {
        key: key.to_string(),
        message,
    };
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(ch) => name.push(ch),
                        None => return Err(err(format!("unclosed placeholder {{{name}"))),
                    }
                }
                let value = vars
                    .lookup(&name)
                    .ok_or_else(|| err(format!("unknown placeholder {{{name}}}")))?;
                out.push_str(&value);
            }
            '}' => return Err(err("unmatched `}` (write `}}` for a literal brace)".into())),
            c => out.push(c),
        }
    }
    Ok(out)
}

impl RuntimeTemplate {
    /// Parses a template from TOML text; `file` names it in errors. Every
    /// placeholder is checked against the known names.
    pub fn parse(text: &str, file: &str) -> Result<Self, TemplateError> {
        let t: RuntimeTemplate = toml::from_str(text).map_err(|e| TemplateError::Parse {
            file: file.to_string(),
            message: e.to_string().trim().to_string(),
        })?;
        let invalid = |key: &str, message: &str| TemplateError::Invalid {
            file: file.to_string(),
            key: key.to_string(),
            message: message.to_string(),
        };
        if t.command.is_empty() || t.command[0].is_empty() {
            return Err(invalid("command", "needs at least the program"));
        }
        for (key, path) in [
            ("health_path", &t.health_path),
            ("invoke_path", &t.invoke_path),
        ] {
            if !path.starts_with('/') || path.contains(char::is_whitespace) {
                return Err(invalid(key, "must start with `/` and hold no spaces"));
            }
        }
        // Upper bounds too: these become deadlines (`now + timeout`), and an
        // instant that far out does not exist (the addition would panic).
        if !(1..=MAX_STARTUP_TIMEOUT_S).contains(&t.startup_timeout_s) {
            return Err(invalid(
                "startup_timeout_s",
                &format!("must be from 1 to {MAX_STARTUP_TIMEOUT_S}"),
            ));
        }
        if t.stop_grace_s > MAX_STOP_GRACE_S {
            return Err(invalid(
                "stop_grace_s",
                &format!("must be from 0 to {MAX_STOP_GRACE_S}"),
            ));
        }
        if t.restart_max_ms > MAX_RESTART_MS {
            return Err(invalid(
                "restart_max_ms",
                &format!("must be at most {MAX_RESTART_MS}"),
            ));
        }
        if t.restart_initial_ms == 0 || t.restart_max_ms < t.restart_initial_ms {
            return Err(invalid(
                "restart_max_ms",
                "restart delays must satisfy 1 <= restart_initial_ms <= restart_max_ms",
            ));
        }
        if !VM_MEMORY_MIB.contains(&t.vm.memory_mib) {
            return Err(invalid(
                "vm.memory_mib",
                &format!(
                    "must be from {} to {}",
                    VM_MEMORY_MIB.start(),
                    VM_MEMORY_MIB.end()
                ),
            ));
        }
        if !MAX_REPLY_BYTES.contains(&t.max_reply_bytes) {
            return Err(invalid(
                "max_reply_bytes",
                &format!(
                    "must be from {} to {}",
                    MAX_REPLY_BYTES.start(),
                    MAX_REPLY_BYTES.end()
                ),
            ));
        }
        if t.vm.guest_port == 0 {
            return Err(invalid("vm.guest_port", "must be from 1 to 65535"));
        }
        if !(1..=MAX_STARTUP_TIMEOUT_S.saturating_mul(1000)).contains(&t.vm.default_boot_ms) {
            return Err(invalid(
                "vm.default_boot_ms",
                "must be at least 1 and at most startup_timeout_s's limit",
            ));
        }
        for (i, f) in t.vm.files.iter().enumerate() {
            let p = std::path::Path::new(f);
            let plain = !f.is_empty()
                && p.is_relative()
                && p.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain {
                return Err(invalid(
                    &format!("vm.files[{i}]"),
                    &format!("{f:?}: must be a relative path without `..`"),
                ));
            }
        }
        for (i, a) in t.allow_args.iter().enumerate() {
            let flag = a.strip_suffix('=').unwrap_or(a);
            let ok = flag.starts_with('-')
                && flag.len() > 1
                && !flag.contains('=')
                && !flag.chars().any(|c| c.is_whitespace() || c.is_control());
            if !ok {
                return Err(invalid(
                    &format!("allow_args[{i}]"),
                    &format!(
                        "{a:?}: write a flag as `--flag` (a switch) or `--flag=` (with a value)"
                    ),
                ));
            }
        }
        for (i, name) in t.allow_env.iter().enumerate() {
            if !gshare_core::serving::is_env_name(name) {
                return Err(invalid(
                    &format!("allow_env[{i}]"),
                    &format!("{name:?} is not a variable name"),
                ));
            }
            if SLICE_ENV.contains(&name.as_str()) {
                return Err(invalid(
                    &format!("allow_env[{i}]"),
                    &format!("{name} is the slice's (set by the agent for the GPU slice)"),
                ));
            }
            if ISOLATION_ENV.contains(&name.as_str()) {
                return Err(invalid(
                    &format!("allow_env[{i}]"),
                    &format!(
                        "{name} would let a function escape its slice or the agent's \
                         loader (never allowable)"
                    ),
                ));
            }
        }
        // Render once with sample values: unknown placeholders fail now.
        let sample = TemplateVars {
            instance: "i-1".into(),
            model: "m".into(),
            host: "127.0.0.1".into(),
            port: 1,
            aux_port: 2,
            slice: SliceLimits {
                gpus: vec![0],
                compute_milli: 1000,
                memory_mib: 1,
                gpu_memory_mib: None,
            },
        };
        t.render_command(&sample)
            .and_then(|_| t.render_env(&sample))
            .map_err(|e| match e {
                TemplateError::Placeholder { key, message } => TemplateError::Invalid {
                    file: file.to_string(),
                    key,
                    message,
                },
                other => other,
            })?;
        Ok(t)
    }

    /// The argv with placeholders replaced.
    pub fn render_command(&self, vars: &TemplateVars) -> Result<Vec<String>, TemplateError> {
        self.command
            .iter()
            .enumerate()
            .map(|(i, a)| render(a, &format!("command[{i}]"), vars))
            .collect()
    }

    /// The argv and environment of one instance: the command and `env`
    /// rendered with `vars`, then the function's `args` appended and its
    /// `env` set (each only if `allow_args` / `allow_env` allow it; taken
    /// as written, not rendered), then the slice's CUDA variables (which
    /// nothing overrides).
    pub fn render_process(
        &self,
        vars: &TemplateVars,
        function: FunctionArgs<'_>,
        ordinals_env: BTreeMap<String, String>,
    ) -> Result<(Vec<String>, BTreeMap<String, String>), TemplateError> {
        let mut argv = self.render_command(vars)?;
        let mut env = self.render_env(vars)?;
        self.check_args(function.args)?;
        argv.extend(function.args.iter().cloned());
        for (k, v) in function.env {
            if !self.allow_env.contains(k) {
                return Err(TemplateError::NotAllowed {
                    key: format!("env.{k}"),
                    message: format!(
                        "runtime {:?} lets a function set only {:?} (its template's allow_env)",
                        self.runtime, self.allow_env
                    ),
                });
            }
            env.insert(k.clone(), v.clone());
        }
        env.extend(ordinals_env);
        Ok((argv, env))
    }

    /// Whether every one of `args` is a flag of `allow_args` (or the value
    /// of the one before it).
    fn check_args(&self, args: &[String]) -> Result<(), TemplateError> {
        let not_allowed = |i: usize, message: String| TemplateError::NotAllowed {
            key: format!("args[{i}]"),
            message,
        };
        let switch = |f: &str| self.allow_args.iter().any(|a| a == f);
        let valued = |f: &str| {
            self.allow_args
                .iter()
                .any(|a| a.strip_suffix('=') == Some(f))
        };
        let allowed = || {
            format!(
                "runtime {:?} lets a function add only {:?} (its template's allow_args;                  `--flag=` takes a value)",
                self.runtime, self.allow_args
            )
        };
        let mut i = 0;
        while let Some(a) = args.get(i) {
            let ok = match a.split_once('=') {
                Some((flag, _)) => valued(flag),
                None if switch(a) => true,
                None if valued(a) => match args.get(i + 1) {
                    Some(v) if !v.starts_with('-') => {
                        i += 1;
                        true
                    }
                    _ => {
                        return Err(not_allowed(
                            i,
                            format!(
                                "{a} needs a value (write {a}=<value> for one starting with `-`)"
                            ),
                        ))
                    }
                },
                None => false,
            };
            if !ok {
                return Err(not_allowed(
                    i,
                    format!("{a:?} is not allowed: {}", allowed()),
                ));
            }
            i += 1;
        }
        Ok(())
    }

    /// The extra environment with placeholders replaced.
    pub fn render_env(
        &self,
        vars: &TemplateVars,
    ) -> Result<BTreeMap<String, String>, TemplateError> {
        self.env
            .iter()
            .map(|(k, v)| Ok((k.clone(), render(v, &format!("env.{k}"), vars)?)))
            .collect()
    }
}

//! The runtime driver of each runtime, from the agent config's `[runtimes]`.

use super::microvm::{self, Accel, MicrovmImage, MicrovmOptions};
use super::process::{ProcessLedger, RuntimeTemplate};
use super::{ProcessCounters, ProcessDriver, ProcessOptions, RuntimeDriver, SimDriver};
use gshare_core::config::{ConfigError, DriverKind, RuntimeDrivers};
use gshare_core::model::{FunctionSpec, Mib, Runtime};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The agent's drivers: `process` and `microvm` for the runtimes the config
/// names so (with their templates, and guest images, read and checked),
/// `sim` for every other one.
#[derive(Debug, Default)]
pub struct Drivers {
    process: Vec<(Runtime, Arc<ProcessOptions>)>,
    counters: ProcessCounters,
}

impl Drivers {
    /// Only the sim driver.
    pub fn sim_only() -> Self {
        Self::default()
    }

    /// Reads the templates of the `process` and `microvm` runtimes of
    /// `runtimes` (paths relative to `base`, the agent config's directory).
    /// Every template that cannot be read or parsed, or is written for
    /// another runtime, is reported at once, at its `template` key of the
    /// agent config `file`; a guest image that is incomplete (or QEMU
    /// missing) at its `image` key. Function output goes to `log_dir`
    /// (a microVM's serial console too); processes run in their template
    /// file's directory, and microVM initramfs files are written beside
    /// `log_dir` (`../microvm/`). The first microVM runtime decides KVM or
    /// TCG ([`Accel::detect`]) and logs which and why.
    pub fn load(
        file: &str,
        base: &Path,
        runtimes: &RuntimeDrivers,
        log_dir: Option<PathBuf>,
    ) -> Result<Self, ConfigError> {
        let counters = ProcessCounters::new();
        let mut process = Vec::new();
        let mut issues = Vec::new();
        let mut accel: Option<Accel> = None;
        for c in &runtimes.listed {
            let (true, Some(t)) = (c.driver.runs_template(), &c.template) else {
                continue;
            };
            let path = base.join(&t.path);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => {
                    issues.push(t.issue(format!("cannot read template {}: {e}", path.display())));
                    continue;
                }
            };
            let template = match RuntimeTemplate::parse(&text, &path.display().to_string()) {
                Ok(template) => template,
                Err(e) => {
                    issues.push(t.issue(format!("invalid template: {e}")));
                    continue;
                }
            };
            if template.runtime != c.runtime.as_str() {
                issues.push(t.issue(format!(
                    "template {} is for runtime {:?}, not {:?}",
                    path.display(),
                    template.runtime,
                    c.runtime.as_str()
                )));
                continue;
            }
            let workdir = path.parent().map(Path::to_path_buf);
            let vm = match (c.driver, &c.image) {
                (DriverKind::Microvm, Some(image)) => {
                    let dir = base.join(&image.path);
                    let opened = MicrovmImage::open(&dir)
                        .map_err(|e| e.to_string())
                        .and_then(|i| {
                            which(microvm::QEMU).map(|_| i).ok_or_else(|| {
                                format!(
                                    "{} not found on PATH (apt-get install qemu-system-x86)",
                                    microvm::QEMU
                                )
                            })
                        });
                    let image = match opened {
                        Ok(i) => i,
                        Err(e) => {
                            issues.push(image.issue(e));
                            continue;
                        }
                    };
                    let a = *accel.get_or_insert_with(|| {
                        let (a, why) = Accel::detect();
                        match a {
                            Accel::Kvm => tracing::info!(accel = "kvm", "microVMs use KVM: {why}"),
                            Accel::Tcg => tracing::warn!(
                                accel = "tcg",
                                "microVMs fall back to TCG (software emulation, slower boots): {why}"
                            ),
                        }
                        a
                    });
                    counters.register_vm_runtime(
                        c.runtime,
                        a == Accel::Kvm,
                        template.vm.default_boot_ms.saturating_mul(1000),
                    );
                    let run_dir = log_dir.as_deref().and_then(Path::parent).map_or_else(
                        || std::env::temp_dir().join("gshare-microvm"),
                        |d| d.join("microvm"),
                    );
                    Some(Arc::new(MicrovmOptions {
                        image,
                        accel: a,
                        qemu: microvm::QEMU.into(),
                        run_dir,
                        tsc_khz: microvm::host_tsc_khz(),
                    }))
                }
                _ => None,
            };
            process.push((
                c.runtime,
                Arc::new(ProcessOptions {
                    template,
                    workdir,
                    log_dir: log_dir.clone(),
                    gpu_memory_mib: None,
                    counters: counters.clone(),
                    ledger: None,
                    vm,
                }),
            ));
        }
        if !issues.is_empty() {
            return Err(ConfigError {
                file: file.to_string(),
                issues,
            });
        }
        Ok(Self { process, counters })
    }

    /// The memory of the node's GPUs (known after discovery), for the
    /// templates' `{memory_fraction}` (`1.000` while unknown).
    pub fn set_gpu_memory_mib(&mut self, mib: Option<Mib>) {
        for (_, options) in &mut self.process {
            let mut o = ProcessOptions::clone(options);
            o.gpu_memory_mib = mib;
            *options = Arc::new(o);
        }
    }

    /// Records every process group the drivers start in `ledger` (see
    /// [`ProcessLedger`]).
    pub fn set_ledger(&mut self, ledger: ProcessLedger) {
        for (_, options) in &mut self.process {
            let mut o = ProcessOptions::clone(options);
            o.ledger = Some(ledger.clone());
            *options = Arc::new(o);
        }
    }

    /// The counters of the node's function processes.
    pub fn counters(&self) -> ProcessCounters {
        self.counters.clone()
    }

    /// The driver kind of `runtime`.
    pub fn kind(&self, runtime: Runtime) -> DriverKind {
        match self.process.iter().find(|(r, _)| *r == runtime) {
            Some((_, o)) if o.vm.is_some() => DriverKind::Microvm,
            Some(_) => DriverKind::Process,
            None => DriverKind::Sim,
        }
    }

    /// A new (stopped) driver for a hosted function.
    pub fn driver_for(&self, spec: &FunctionSpec) -> Box<dyn RuntimeDriver> {
        match self.process.iter().find(|(r, _)| *r == spec.runtime) {
            Some((_, options)) => Box::new(ProcessDriver::new(options.clone())),
            None => Box::new(SimDriver::new()),
        }
    }

    /// As the agent's driver factory.
    pub fn into_factory(self) -> crate::agent::DriverFactory {
        Box::new(move |spec| self.driver_for(spec))
    }
}

/// `program`'s path on `PATH` (or itself when it names a file).
fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).is_file().then(|| PathBuf::from(program));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::config::AgentConfig;
    use gshare_core::model::{LatencyProfile, PoolPreference, TenantId, Tier};

    const BASE: &str = r#"node = "n1"
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
[[replicas]]
quic_addr = "127.0.0.1:7000"
[tls]
ca_cert = "ca.pem"
cert = "c.pem"
key = "c.key"
"#;

    fn function(runtime: Runtime) -> FunctionSpec {
        FunctionSpec {
            model: None,
            args: Vec::new(),
            env: Default::default(),
            tenant: TenantId("t".into()),
            name: "f".into(),
            runtime,
            memory_mib: 1,
            compute_milli: 100,
            tier: Tier::Burstable,
            deadline_ms: 100,
            pool: PoolPreference::Any,
            min_instances: 0,
            max_instances: 1,
            idle_timeout_s: 1,
            latency: LatencyProfile {
                full_gpu_us: 1,
                saturation_milli: 100,
            },
        }
    }

    #[test]
    fn the_example_agent_and_templates_load() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/examples");
        let file = examples.join("agent-sh-l4-0.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let c = AgentConfig::from_toml("agent-sh-l4-0.toml", &text).unwrap();
        let d = Drivers::load("agent-sh-l4-0.toml", &examples, &c.runtimes, None).unwrap();
        assert_eq!(d.kind(Runtime::Vllm), DriverKind::Process);
        assert_eq!(d.kind(Runtime::Pytorch), DriverKind::Process);
        assert_eq!(d.kind(Runtime::Sglang), DriverKind::Sim);
        // Every shipped template loads for its runtime.
        let text = format!(
            "{BASE}[runtimes.vllm]\ndriver = \"process\"\ntemplate = \"runtimes/vllm.toml\"\n\
             [runtimes.sglang]\ndriver = \"process\"\ntemplate = \"runtimes/sglang.toml\"\n\
             [runtimes.pytorch]\ndriver = \"process\"\ntemplate = \"runtimes/pytorch.toml\"\n\
             [runtimes.tf-serving]\ndriver = \"process\"\ntemplate = \"runtimes/tf-serving.toml\"\n"
        );
        let c = AgentConfig::from_toml("agent.toml", &text).unwrap();
        let d = Drivers::load("agent.toml", &examples, &c.runtimes, None).unwrap();
        for r in [
            Runtime::Vllm,
            Runtime::Sglang,
            Runtime::Pytorch,
            Runtime::TfServing,
        ] {
            assert_eq!(d.kind(r), DriverKind::Process, "{r}");
        }
        assert_eq!(d.kind(Runtime::Custom), DriverKind::Sim);
        // A sim function gets a driver that serves at once.
        let mut sim = d.driver_for(&function(Runtime::Custom));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            sim.start(&function(Runtime::Custom), &[]).await.unwrap();
            let inv = super::super::Invocation {
                request: gshare_core::executor::RequestId(0),
                gpu: 0,
                compute_milli: 100,
                service_us: 0,
                deadline: None,
                body: b"x".to_vec().into(),
                http: None,
                stream_to: None,
            };
            assert_eq!(sim.invoke(inv).await.unwrap().body, b"x".to_vec());
        });
    }

    #[test]
    fn an_incomplete_microvm_image_is_reported_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("echo.toml"),
            "runtime = \"custom\"\ncommand = [\"python3\"]\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("img")).unwrap();
        std::fs::write(dir.path().join("img/vmlinuz"), "k").unwrap();
        let text = format!(
            "{BASE}[runtimes.custom]\ndriver = \"microvm\"\ntemplate = \"echo.toml\"\nimage = \"img\"\n"
        );
        let c = AgentConfig::from_toml("agent.toml", &text).unwrap();
        let e = Drivers::load("agent.toml", dir.path(), &c.runtimes, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("runtimes.custom.image: guest image file ")
                && e.contains("initramfs.cpio")
                && e.ends_with("(got \"img\")"),
            "{e}"
        );
    }

    #[test]
    fn every_bad_template_is_reported_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("broken.toml"),
            "runtime = \"sglang\"\ncommand = [\"x\", \"{prot}\"]\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("vllm.toml"),
            "runtime = \"vllm\"\ncommand = [\"vllm\"]\n",
        )
        .unwrap();
        let text = format!(
            "{BASE}[runtimes.vllm]\ndriver = \"process\"\ntemplate = \"missing.toml\"\n\
             [runtimes.sglang]\ndriver = \"process\"\ntemplate = \"broken.toml\"\n\
             [runtimes.custom]\ndriver = \"process\"\ntemplate = \"vllm.toml\"\n"
        );
        let c = AgentConfig::from_toml("agent.toml", &text).unwrap();
        let e = Drivers::load("agent.toml", dir.path(), &c.runtimes, None)
            .unwrap_err()
            .to_string();
        let line = |key: &str| {
            text.lines()
                .position(|l| l.contains(key))
                .map(|i| i + 1)
                .unwrap()
        };
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 3, "{e}");
        assert!(
            lines[0].starts_with(&format!(
                "agent.toml:{}:12: runtimes.vllm.template: cannot read template ",
                line("missing.toml")
            )) && lines[0].ends_with("(got \"missing.toml\")"),
            "{e}"
        );
        assert!(
            lines[1].starts_with(&format!(
                "agent.toml:{}:12: runtimes.sglang.template: invalid template: ",
                line("broken.toml")
            )) && lines[1].contains("unknown placeholder {prot}"),
            "{e}"
        );
        assert!(
            lines[2].contains("runtimes.custom.template: template ")
                && lines[2].contains("is for runtime \"vllm\", not \"custom\""),
            "{e}"
        );
    }
}

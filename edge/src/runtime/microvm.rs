//! The `microvm` runtime driver: each instance's server runs in its own
//! lightweight VM (a QEMU `microvm` machine), the rest is the `process`
//! driver's.
//!
//! ```text
//!  ProcessDriver::start/place (vm = Some)
//!    ─▶ guest_spec: render the template for the guest ({host}=0.0.0.0, {port}=vm.guest_port)
//!         │ /fn/run  = `export …; exec <command>`      ┐ a small cpio archive appended
//!         │ /fn/<vm.files>  (from the template's dir)  ┘ to the image's initramfs.cpio
//!         ▼ argv = qemu-system-x86_64 -M microvm -accel tcg|kvm -kernel vmlinuz -initrd <both>
//!                  -netdev user,restrict=on,hostfwd=tcp:127.0.0.1:<host port>-:<guest port>
//!    ─▶ ProcessInstance (unchanged): spawn qemu in its own group (ledger entry),
//!       GET health through the forward until 200, POST invocations to it,
//!       QEMU exits (the function, PID 1 in the guest, died → kernel panic →
//!       -no-reboot) ─▶ restart with the template's backoff, stop = SIGTERM
//!    ─▶ boot-to-ready (spawn → first 200) ─▶ ProcessCounters::vm_booted
//!       ─▶ the executor times this function's loads by it (Event::StartMeasured)
//! ```
//!
//! Isolation: the guest sees only its initramfs (no host file system) and a
//! user-mode network whose `restrict=on` drops every connection the guest
//! opens (the host's loopback at 10.0.2.2 included); only the forwarded
//! port reaches it, from the host's loopback.
//!
//! Readiness: QEMU's forward accepts a connection before the guest
//! listens (and then closes it), so a connection proves nothing; the probe
//! is the process driver's, which needs an HTTP 200 from the health path.
//!
//! Swap-out stops the VM like a process (its RAM goes); swap-in is a boot.
//! See docs/microvm.md for the image, the acceleration rule and figures.

mod cpio;

pub use cpio::{archive, Entry};

use super::process::{
    FunctionArgs, ProcessSpec, RuntimeTemplate, SliceLimits, TemplateError, TemplateVars,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The QEMU binary looked up on `PATH`.
pub const QEMU: &str = "qemu-system-x86_64";

/// The guest image: a kernel and an initramfs (`scripts/microvm-image.sh`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicrovmImage {
    /// `vmlinuz`.
    pub kernel: PathBuf,
    /// `initramfs.cpio` (uncompressed newc).
    pub initramfs: PathBuf,
}

impl MicrovmImage {
    /// The image in `dir`; an error names the file that is missing.
    pub fn open(dir: &Path) -> Result<Self, MicrovmError> {
        let image = Self {
            kernel: dir.join("vmlinuz"),
            initramfs: dir.join("initramfs.cpio"),
        };
        for f in [&image.kernel, &image.initramfs] {
            std::fs::metadata(f).map_err(|source| MicrovmError::Image {
                path: f.clone(),
                source,
            })?;
        }
        Ok(image)
    }
}

/// How the VMs are accelerated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's software emulation (slower boots, works anywhere).
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// KVM when it is real on this host, else TCG; with the reason.
    pub fn detect() -> (Self, String) {
        Self::detect_at(Path::new("/dev/kvm"), Path::new("/sys/module"))
    }

    /// [`detect`](Self::detect) with the device and `/sys/module` given.
    /// KVM is used only when the device opens read-write and the host's
    /// KVM is not PVM (`kvm_pvm`, a host that is itself a VM without
    /// vmx/svm: stock guest kernels die there on emulation failures).
    pub fn detect_at(dev_kvm: &Path, sys_module: &Path) -> (Self, String) {
        if !dev_kvm.exists() {
            return (Accel::Tcg, format!("{} is absent", dev_kvm.display()));
        }
        if sys_module.join("kvm_pvm").exists() {
            return (
                Accel::Tcg,
                format!(
                    "{} is PVM-backed ({} loaded): guests fail under it",
                    dev_kvm.display(),
                    sys_module.join("kvm_pvm").display()
                ),
            );
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dev_kvm)
        {
            Ok(_) => (Accel::Kvm, format!("{} usable", dev_kvm.display())),
            Err(e) => (
                Accel::Tcg,
                format!("{} cannot be opened: {e}", dev_kvm.display()),
            ),
        }
    }
}

/// What every microVM of one runtime shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicrovmOptions {
    /// The guest image.
    pub image: MicrovmImage,
    /// The acceleration.
    pub accel: Accel,
    /// The QEMU binary.
    pub qemu: String,
    /// Where each instance's initramfs (image + its files) is written.
    pub run_dir: PathBuf,
    /// The host's TSC frequency, kHz (`tsc_early_khz`: without it about
    /// one boot in twenty hung calibrating the TSC).
    pub tsc_khz: Option<u64>,
}

/// Why a microVM could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum MicrovmError {
    /// A file of the image is missing or unreadable.
    #[error("guest image file {path}: {source}")]
    Image {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A function file of the template's `vm.files` cannot be read.
    #[error("vm.files: {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The instance's initramfs cannot be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The template does not render for the guest.
    #[error("template: {0}")]
    Template(#[from] TemplateError),
    /// Something the guest cannot take (a bad environment name, a huge file).
    #[error("{0}")]
    Invalid(String),
}

/// The host's TSC (CPU) frequency from `/proc/cpuinfo`, kHz.
pub fn host_tsc_khz() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = text
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    (mhz.is_finite() && mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

/// `s` quoted for the guest's `sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The guest's `/fn/run`: the environment, then `exec` of the command.
pub fn run_script(argv: &[String], env: &BTreeMap<String, String>) -> Result<String, MicrovmError> {
    let mut out = String::from("# written by the gshare microvm driver\n");
    for (k, v) in env {
        let ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(MicrovmError::Invalid(format!(
                "env.{k}: not a shell variable name (the guest's /fn/run exports it)"
            )));
        }
        out.push_str(&format!("export {k}={}\n", sh_quote(v)));
    }
    let cmd: Vec<String> = argv.iter().map(|a| sh_quote(a)).collect();
    out.push_str(&format!("exec {}\n", cmd.join(" ")));
    Ok(out)
}

/// The per-function archive: `/fn`, its files, `/fn/run`.
pub fn function_archive(
    template: &RuntimeTemplate,
    workdir: Option<&Path>,
    run: &str,
) -> Result<Vec<u8>, MicrovmError> {
    let mut entries = vec![Entry::Dir("fn".into())];
    let mut dirs = std::collections::BTreeSet::new();
    for f in &template.vm.files {
        let path = workdir.map_or_else(|| PathBuf::from(f), |d| d.join(f));
        let data = std::fs::read(&path).map_err(|source| MicrovmError::File {
            path: path.clone(),
            source,
        })?;
        // Parent directories first (vm.files are checked relative, no `..`).
        let mut parent = PathBuf::from("fn");
        if let Some(p) = Path::new(f).parent() {
            for c in p.components() {
                parent.push(c);
                let name = parent.to_string_lossy().into_owned();
                if dirs.insert(name.clone()) {
                    entries.push(Entry::Dir(name));
                }
            }
        }
        let exec = std::fs::metadata(&path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
            .unwrap_or(false);
        entries.push(Entry::File(format!("fn/{f}"), data, exec));
    }
    entries.push(Entry::File("fn/run".into(), run.as_bytes().to_vec(), false));
    archive(&entries)
        .ok_or_else(|| MicrovmError::Invalid("a vm.files entry is 4 GiB or more".into()))
}

/// The QEMU command line of one VM forwarding `host_port` to `guest_port`.
pub fn qemu_argv(
    vm: &MicrovmOptions,
    initrd: &Path,
    memory_mib: u32,
    host_port: u16,
    guest_port: u16,
) -> Vec<String> {
    let (accel, cpu) = match vm.accel {
        Accel::Kvm => ("kvm", "host"),
        Accel::Tcg => ("tcg", "max"),
    };
    // panic=-1: reboot at once when the function (PID 1) dies; reboot=t:
    // by triple fault, which -no-reboot turns into QEMU's exit (the default
    // order of reset methods once took seconds under TCG).
    let mut append = String::from("console=ttyS0 panic=-1 reboot=t quiet");
    if let Some(khz) = vm.tsc_khz {
        append.push_str(&format!(" tsc_early_khz={khz}"));
    }
    [
        vm.qemu.as_str(),
        "-M",
        "microvm",
        "-accel",
        accel,
        "-cpu",
        cpu,
        "-smp",
        "1",
        "-m",
        &memory_mib.to_string(),
        "-kernel",
        &vm.image.kernel.to_string_lossy(),
        "-initrd",
        &initrd.to_string_lossy(),
        "-append",
        &append,
        "-nographic",
        "-nodefaults",
        "-serial",
        "stdio",
        "-no-reboot",
        "-netdev",
        &format!("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{host_port}-:{guest_port}"),
        "-device",
        "virtio-net-device,netdev=n0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The process spec of one microVM instance: the template rendered for the
/// guest, its initramfs written to `vm.run_dir`, QEMU as the process.
/// Returns the spec and the initramfs written (removed when it stops).
pub fn guest_spec(
    template: &RuntimeTemplate,
    workdir: Option<&Path>,
    vm: &MicrovmOptions,
    instance: &str,
    function: FunctionArgs<'_>,
    limits: SliceLimits,
) -> Result<(ProcessSpec, PathBuf), MicrovmError> {
    // Host side: a free loopback port (the forward), the template's timings.
    let mut spec = ProcessSpec::from_template(template, instance, function, 0, limits.clone())?;
    let vars = TemplateVars {
        instance: instance.to_string(),
        model: function.model.to_string(),
        host: "0.0.0.0".into(),
        port: template.vm.guest_port,
        aux_port: spec.aux_port,
        slice: limits.clone(),
    };
    let (argv, env) =
        template.render_process(&vars, function, limits.cuda_env(template.mps_ordinals))?;
    let run = run_script(&argv, &env)?;
    let overlay = function_archive(template, workdir, &run)?;
    std::fs::create_dir_all(&vm.run_dir).map_err(|source| MicrovmError::Write {
        path: vm.run_dir.clone(),
        source,
    })?;
    let initrd = vm.run_dir.join(format!("{instance}-{}.cpio", spec.port));
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        std::fs::copy(&vm.image.initramfs, &initrd)?;
        let mut f = std::fs::OpenOptions::new().append(true).open(&initrd)?;
        f.write_all(&overlay)?;
        f.sync_data()
    };
    write().map_err(|source| MicrovmError::Write {
        path: initrd.clone(),
        source,
    })?;
    spec.argv = qemu_argv(
        vm,
        &initrd,
        template.vm.memory_mib,
        spec.port,
        template.vm.guest_port,
    );
    // The function's environment is the guest's (in /fn/run), not QEMU's.
    spec.env = BTreeMap::new();
    Ok((spec, initrd))
}

/// Resident memory of process `pid`, KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod vm_tests;

//! A `gshare-edge` child process of a test, and the process probes the
//! runtime tests share (`process_runtime`, `microvm_runtime`).

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A free loopback TCP port ([`crate::ports::free`]).
pub fn free_port() -> SocketAddr {
    crate::ports::free(false).expect("a free TCP port")
}

/// The agent process; SIGTERM (then SIGKILL) if a test ends early.
pub struct AgentProc(pub Option<Child>);

impl AgentProc {
    /// SIGTERM and wait; the exit status and stderr.
    pub fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        let child = self.0.take().expect("agent running");
        signal(child.id(), "-TERM");
        let out = child.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            signal(c.id(), "-TERM");
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sends `sig` (e.g. `-TERM`) to `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// Whether `pid` is a live process (not gone, not a zombie).
pub fn alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Whether `pid` is gone within `within`.
pub async fn gone(pid: u64, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The microVM guest image directory (`$GSHARE_MICROVM_IMAGE`, else
/// `target/microvm`) when it and QEMU are there; else `None` with the
/// reason printed, or a panic naming `what` under `GSHARE_CI` (where
/// `.ci/run` installs both, so a missing one is a failure, not a skip).
pub fn microvm_image_dir(what: &str) -> Option<std::path::PathBuf> {
    use std::path::{Path, PathBuf};
    let dir = std::env::var_os("GSHARE_MICROVM_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/microvm"));
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let why = if !dir.join("vmlinuz").exists() || !dir.join("initramfs.cpio").exists() {
        format!(
            "no guest image in {} (run scripts/microvm-image.sh)",
            dir.display()
        )
    } else if !qemu {
        "qemu-system-x86_64 not on PATH".to_string()
    } else {
        return Some(dir);
    };
    assert!(
        std::env::var_os("GSHARE_CI").is_none(),
        "GSHARE_CI is set but {what} cannot run: {why}"
    );
    eprintln!("SKIPPED: {why}");
    None
}

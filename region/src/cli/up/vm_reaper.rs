//! What stops the microVMs of `gsharectl up --runtime microvm` when `up`
//! dies by `kill -9`.
//!
//! ```text
//!  gsharectl up ──spawn──▶ gsharectl up-vm-reaper --parent <up> --dir <dir>/data   (own process group)
//!     │ kill -9                  │ every 200 ms: is my parent still <up>?
//!     ▼                          ▼ no (reparented)
//!  agents die (PDEATHSIG)   SIGKILL every process whose command line names <dir>/data
//!  their QEMUs stay         (the VMs: their initramfs lies under the agents' data), 3 passes
//!
//!  clean end / panic: `up` stops its agents (they stop their VMs), then
//!  SIGKILLs the reaper and waits for it ([`VmReaper`]'s `Drop`).
//! ```
//!
//! The agents' death signal cannot cover QEMU: a parent-death signal is
//! not inherited by a child, and the driver deliberately lets a VM outlive
//! a `kill -9` of its agent (the next agent's process ledger stops it,
//! docs/microvm.md). Under `up` no next agent comes, so this process does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use rustix::process::{Pid, Signal};

/// How often the reaper checks its parent.
const POLL: Duration = Duration::from_millis(200);
/// Passes over `/proc` once the parent is gone (a VM spawned as its agent
/// died may show up late).
const PASSES: u32 = 3;

/// `gsharectl up-vm-reaper --parent <pid> --dir <dir>` (internal).
#[derive(Debug, clap::Args)]
pub struct VmReaperArgs {
    /// The pid of the `gsharectl up` to outlive.
    #[arg(long)]
    parent: i32,
    /// Processes whose command line names this directory are killed.
    #[arg(long)]
    dir: PathBuf,
}

/// Runs `gsharectl up-vm-reaper`: waits until its parent is gone, then
/// kills what is left under `dir`.
pub fn run_vm_reaper(a: VmReaperArgs) -> anyhow::Result<()> {
    let parent = || rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    while parent() == Some(a.parent) {
        std::thread::sleep(POLL);
    }
    let me = std::process::id();
    let needle = a.dir.display().to_string();
    for _ in 0..PASSES {
        for pid in processes_naming(&needle).into_iter().filter(|p| *p != me) {
            if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Pids whose command line contains `needle`.
fn processes_naming(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// The running reaper; dropping it kills it (after the agents stopped
/// their VMs themselves).
#[derive(Debug)]
pub struct VmReaper(Child);

impl VmReaper {
    /// Starts `launcher up-vm-reaper` for the VMs under `data_dir`, in its
    /// own process group (a Ctrl-C reaches `up` alone).
    pub fn start(launcher: &Path, data_dir: &Path) -> anyhow::Result<VmReaper> {
        use std::os::unix::process::CommandExt;
        let child = Command::new(launcher)
            .arg("up-vm-reaper")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .context("starting gsharectl up-vm-reaper")?;
        Ok(VmReaper(child))
    }
}

impl Drop for VmReaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_processes_by_a_directory_in_their_command_line() {
        let dir = tempfile::tempdir().unwrap();
        // `sh -c <script> <$0>`: the directory is in sh's command line.
        // The script waits on a builtin (`read` on a pipe nobody writes
        // to), so sh forks no child: a child forked for `sleep` carries
        // sh's command line until its exec and was found beside it once.
        let mut sleeper = Command::new("sh")
            .args(["-c", "read line"])
            .arg(dir.path().join("x"))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A process just spawned may not show its new command line in
        // /proc at once (seen once under a loaded full-suite run): look
        // again for a while before giving up.
        let needle = dir.path().display().to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut found = processes_naming(&needle);
        while found.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            found = processes_naming(&needle);
        }
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert_eq!(found, vec![sleeper.id()]);
    }
}

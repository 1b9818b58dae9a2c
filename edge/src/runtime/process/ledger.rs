//! The ledger of function process groups an agent started, on disk, so a
//! restarted agent can stop what its killed predecessor left running.
//!
//! ```text
//!   spawn ─▶ record(pgid): <dir>/<pgid> = "<start time of the leader>\n"
//!            (and entries whose group is gone are pruned)
//!   agent start ─▶ reap(): every entry whose group still runs ─▶ SIGKILL the group ─▶ entry removed
//! ```
//!
//! A function process runs in its own process group (so it can be stopped
//! with its children), which also means it outlives an agent killed with
//! `kill -9`: on a GPU node such a leftover holds GPU memory the new agent
//! would hand out again. The ledger closes that gap without a parent-death
//! signal.
//!
//! An entry names a group the agent created: the group leader's pid (=
//! pgid) and its start time (field 22 of `/proc/<pid>/stat`, in clock
//! ticks since boot). A group counts as still ours when its leader runs
//! with the recorded start time, or when the leader is gone but members of
//! the group remain (Linux does not hand out a pid again while a process
//! group still uses it as its id). A pid reused by an unrelated process is
//! never signalled.

use rustix::process::{kill_process_group, Pid, Signal};
use std::path::{Path, PathBuf};

/// Process groups started by this agent (see the module docs).
#[derive(Debug, Clone)]
pub struct ProcessLedger {
    dir: PathBuf,
}

/// What [`ProcessLedger::reap`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Groups still running, now sent SIGKILL.
    pub killed: Vec<i32>,
    /// Entries whose group was already gone (removed).
    pub gone: usize,
}

impl ProcessLedger {
    /// A ledger in `dir` (created).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records the group led by `pgid` (just spawned) and prunes entries
    /// of groups that are gone. Failures are logged, not returned: a
    /// process must not fail to start because its ledger entry could not
    /// be written.
    pub fn record(&self, pgid: i32) {
        let Some(start) = start_time(pgid) else {
            return;
        };
        let path = self.dir.join(pgid.to_string());
        if let Err(e) = std::fs::write(&path, format!("{start}\n")) {
            tracing::warn!("process ledger {}: {e}", path.display());
        }
        for (pgid, recorded, path) in self.entries() {
            if !ours_and_running(pgid, recorded) {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// SIGKILLs every recorded group that still runs (a predecessor's
    /// leftovers) and empties the ledger. Call before starting processes.
    pub fn reap(&self) -> Reaped {
        let mut out = Reaped::default();
        for (pgid, recorded, path) in self.entries() {
            if ours_and_running(pgid, recorded) {
                if let Some(pid) = Pid::from_raw(pgid) {
                    let _ = kill_process_group(pid, Signal::KILL);
                }
                out.killed.push(pgid);
            } else {
                out.gone += 1;
            }
            let _ = std::fs::remove_file(path);
        }
        out
    }

    /// The entries: (pgid, recorded start time or `None` if unreadable, path).
    fn entries(&self) -> Vec<(i32, Option<u64>, PathBuf)> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| {
                let pgid: i32 = e.file_name().to_str()?.parse().ok()?;
                let recorded = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                Some((pgid, recorded, e.path()))
            })
            .filter(|(pgid, _, _)| *pgid > 1)
            .collect()
    }
}

/// Whether the group `pgid` recorded with leader start time `recorded` is
/// the one the agent started and still has a live member.
fn ours_and_running(pgid: i32, recorded: Option<u64>) -> bool {
    match (stat(pgid), recorded) {
        // The leader runs: ours only if it is the same process.
        (Some((_, _, start)), Some(r)) => start == r && super::group_alive(pgid),
        (Some(_), None) => false,
        // The leader is gone: the pgid cannot have been reused while
        // members of the group remain.
        (None, _) => super::group_alive(pgid),
    }
}

/// The start time of process `pid` (clock ticks since boot).
fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, _, start)| start)
}

/// (state, pgrp, start time) of process `pid` from `/proc/<pid>/stat`.
pub(super) fn stat(pid: i32) -> Option<(String, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt
    //  majflt cmajflt utime stime cutime cstime priority nice num_threads
    //  itrealvalue starttime …"; comm may hold spaces and parentheses.
    let (_, rest) = text.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split(' ').collect();
    let state = (*fields.first()?).to_string();
    let pgrp = fields.get(2)?.parse().ok()?;
    // starttime is field 22 overall; `rest` starts at field 3.
    let start = fields.get(19)?.parse().ok()?;
    Some((state, pgrp, start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn sleeper() -> std::process::Child {
        use std::os::unix::process::CommandExt;
        Command::new("sleep")
            .arg("30")
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep")
    }

    fn wait_gone(child: &mut std::process::Child) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn reap_kills_recorded_groups_that_still_run() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ProcessLedger::open(&dir.path().join("l")).unwrap();
        let mut child = sleeper();
        let pgid = child.id() as i32;
        ledger.record(pgid);
        assert!(ledger.dir().join(pgid.to_string()).exists());
        // A new agent (another ledger handle on the same directory) reaps it.
        let reaped = ProcessLedger::open(&dir.path().join("l")).unwrap().reap();
        assert_eq!(reaped.killed, vec![pgid]);
        assert!(wait_gone(&mut child), "the recorded group was not killed");
        assert!(!ledger.dir().join(pgid.to_string()).exists());
        assert_eq!(ledger.reap(), Reaped::default());
    }

    #[test]
    fn a_reused_pid_or_a_finished_group_is_never_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ProcessLedger::open(dir.path()).unwrap();
        let mut child = sleeper();
        let pgid = child.id() as i32;
        // Recorded with another start time: as if the pid had been reused.
        std::fs::write(dir.path().join(pgid.to_string()), "1\n").unwrap();
        // And an entry for a group that no longer exists.
        let mut done = Command::new("true").spawn().unwrap();
        let done_pid = done.id() as i32;
        done.wait().unwrap();
        std::fs::write(dir.path().join(done_pid.to_string()), "5\n").unwrap();
        let reaped = ledger.reap();
        assert!(reaped.killed.is_empty(), "{reaped:?}");
        assert_eq!(reaped.gone, 2);
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "an unrelated process was killed"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn record_prunes_entries_of_finished_groups() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ProcessLedger::open(dir.path()).unwrap();
        let mut first = sleeper();
        let first_pgid = first.id() as i32;
        ledger.record(first_pgid);
        first.kill().unwrap();
        first.wait().unwrap();
        let mut second = sleeper();
        let second_pgid = second.id() as i32;
        ledger.record(second_pgid);
        assert!(!dir.path().join(first_pgid.to_string()).exists());
        assert!(dir.path().join(second_pgid.to_string()).exists());
        second.kill().unwrap();
        second.wait().unwrap();
    }

    #[test]
    fn stat_reads_this_process() {
        let me = std::process::id() as i32;
        let (state, _, start) = stat(me).unwrap();
        assert!(!state.is_empty());
        assert!(start > 0);
    }
}

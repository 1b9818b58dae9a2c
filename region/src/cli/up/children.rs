//! The processes `gsharectl up` starts, and how they end with it.
//!
//! Every child is started through `gsharectl up-child --parent <pid> --
//! <program> <args>` (hidden): that re-executed `gsharectl` asks the kernel
//! for `SIGKILL` when its parent thread dies (`PR_SET_PDEATHSIG`), checks
//! that its parent is still the `gsharectl up` that spawned it, then
//! `exec`s the real program, which keeps the death signal (it is preserved
//! across `execve` of a non-setuid binary). So even `kill -9` of
//! `gsharectl up` leaves no replica or agent behind. The death signal
//! fires when the *thread* that forked the child exits: children are
//! spawned from the main thread, which lives as long as the process.
//!
//! Each child runs in its own process group (`setpgid(0, 0)`): a Ctrl-C in
//! the terminal reaches `gsharectl` alone, which then reads the final bills
//! from the still-running replicas and stops the children itself (SIGTERM,
//! then SIGKILL after a grace period) — agents first, replicas last.
//! [`Children`]'s `Drop` does the same, so a panic that unwinds stops them
//! too.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rustix::process::{Pid, Signal};

/// How long a child may take to stop after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// `gsharectl up-child --parent <pid> -- <program> [args…]` (internal).
#[derive(Debug, clap::Args)]
pub struct ChildArgs {
    /// The pid of the `gsharectl up` that starts this child.
    #[arg(long)]
    parent: i32,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs `gsharectl up-child`: sets the parent-death signal and becomes
/// the program. Returns only on failure.
pub fn exec_child(a: ChildArgs) -> anyhow::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .context("prctl(PR_SET_PDEATHSIG)")?;
    // The parent may have died between fork and prctl: then nobody would
    // ever send the signal.
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(a.parent) {
        anyhow::bail!("parent {} is gone", a.parent);
    }
    let (program, args) = a
        .command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("no program given"))?;
    let e = Command::new(program).args(args).exec();
    Err(anyhow::anyhow!("exec {program}: {e}"))
}

/// One started child.
#[derive(Debug)]
pub struct ChildProc {
    /// Short name (`r1`, `agent local-c1`).
    pub name: String,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    program: PathBuf,
    args: Vec<String>,
    cwd: PathBuf,
    child: Child,
    exited: Option<ExitStatus>,
}

impl ChildProc {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

/// The last `lines` lines of a file (at most its last 64 KiB are read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut raw = Vec::new();
        let _ = f.read_to_end(&mut raw);
        text = String::from_utf8_lossy(&raw).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The children of `gsharectl up`, stopped in reverse start order when
/// [`Children::stop`] is called or the value is dropped.
#[derive(Debug)]
pub struct Children {
    launcher: PathBuf,
    procs: Vec<ChildProc>,
    /// Children killed on purpose ([`Children::kill`]), kept to be
    /// started again ([`Children::revive`]).
    killed: Vec<ChildProc>,
}

impl Children {
    /// No children yet; they will be started through `launcher` (this
    /// `gsharectl` executable).
    pub fn new(launcher: PathBuf) -> Self {
        Self {
            launcher,
            procs: Vec::new(),
            killed: Vec::new(),
        }
    }

    /// Starts `program args…` in `cwd` with stdout and stderr appended to
    /// `log`. Call from the main thread (see the module docs).
    pub fn spawn(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        cwd: &Path,
        log: &Path,
    ) -> anyhow::Result<&mut ChildProc> {
        let child = self.launch(name, program, args, cwd, log)?;
        self.procs.push(ChildProc {
            name: name.to_string(),
            log: log.to_path_buf(),
            program: program.to_path_buf(),
            args: args.to_vec(),
            cwd: cwd.to_path_buf(),
            child,
            exited: None,
        });
        let last = self.procs.len() - 1;
        Ok(&mut self.procs[last])
    }

    /// Stops the child named `name` (SIGTERM, SIGKILL after
    /// [`STOP_GRACE`]) and starts it again with the same program, arguments
    /// and log (appended to). Call from the main thread. Returns the new
    /// process, and whether the old one had to be killed.
    pub fn restart(&mut self, name: &str) -> anyhow::Result<(&mut ChildProc, bool)> {
        let i = self
            .procs
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| anyhow::anyhow!("no child named {name}"))?;
        let mut going = vec![self.procs.remove(i)];
        let killed = !end(&mut going).is_empty();
        let old = going.remove(0);
        let child = self.launch(name, &old.program, &old.args, &old.cwd, &old.log)?;
        self.procs.push(ChildProc {
            child,
            exited: None,
            ..old
        });
        let last = self.procs.len() - 1;
        Ok((&mut self.procs[last], killed))
    }

    /// Kills the child named `name` with SIGKILL (no chance to stop
    /// cleanly: an agent's goodbye is never sent) and waits for it. It is
    /// no longer a running child ([`Children::first_exited`] does not see
    /// it) until [`Children::revive`] starts it again. Returns its pid.
    pub fn kill(&mut self, name: &str) -> anyhow::Result<u32> {
        let i = self
            .procs
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| anyhow::anyhow!("no child named {name}"))?;
        let mut p = self.procs.remove(i);
        let pid = p.pid();
        if p.exited().is_none() {
            // Child::kill sends SIGKILL.
            let _ = p.child.kill();
        }
        p.exited = p.child.wait().ok();
        self.killed.push(p);
        Ok(pid)
    }

    /// Starts a child [`Children::kill`] killed again, with the same
    /// program, arguments and log (appended to). Call from the main thread.
    pub fn revive(&mut self, name: &str) -> anyhow::Result<&mut ChildProc> {
        let i = self
            .killed
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| anyhow::anyhow!("no killed child named {name}"))?;
        let old = self.killed.remove(i);
        let child = match self.launch(name, &old.program, &old.args, &old.cwd, &old.log) {
            Ok(c) => c,
            Err(e) => {
                self.killed.push(old);
                return Err(e);
            }
        };
        self.procs.push(ChildProc {
            child,
            exited: None,
            ..old
        });
        let last = self.procs.len() - 1;
        Ok(&mut self.procs[last])
    }

    fn launch(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        cwd: &Path,
        log: &Path,
    ) -> anyhow::Result<Child> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| log.display().to_string())?;
        let err = out.try_clone()?;
        Command::new(&self.launcher)
            .arg("up-child")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--")
            .arg(program)
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))
    }

    /// The children, in start order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut ChildProc> {
        self.procs.iter_mut()
    }

    /// The first child that has exited, with its status.
    pub fn first_exited(&mut self) -> Option<(&ChildProc, ExitStatus)> {
        let i = self.procs.iter_mut().position(|p| p.exited().is_some())?;
        let status = self.procs[i].exited?;
        Some((&self.procs[i], status))
    }

    /// Stops every child: SIGTERM to the newest first, then each is waited
    /// for up to [`STOP_GRACE`] and killed after it. Returns the names of
    /// those that had to be killed.
    pub fn stop(&mut self) -> Vec<String> {
        self.stop_where(|_| true)
    }

    /// Stops the children `which` selects, like [`Children::stop`]; the
    /// others keep running.
    pub fn stop_where(&mut self, which: impl Fn(&ChildProc) -> bool) -> Vec<String> {
        let (mut going, staying): (Vec<ChildProc>, Vec<ChildProc>) =
            std::mem::take(&mut self.procs)
                .into_iter()
                .partition(|p| which(p));
        self.procs = staying;
        end(&mut going)
    }
}

/// SIGTERM to each of `going`, newest first, then each is waited for up to
/// [`STOP_GRACE`] and killed after it. Returns the names of those that had
/// to be killed.
fn end(going: &mut [ChildProc]) -> Vec<String> {
    for p in going.iter_mut().rev() {
        if p.exited().is_none() {
            if let Some(pid) = Pid::from_raw(p.pid() as i32) {
                let _ = rustix::process::kill_process(pid, Signal::TERM);
            }
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    let mut killed = Vec::new();
    for p in going.iter_mut().rev() {
        while p.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if p.exited().is_none() {
            let _ = p.child.kill();
            p.exited = p.child.wait().ok();
            killed.push(p.name.clone());
        }
    }
    killed
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

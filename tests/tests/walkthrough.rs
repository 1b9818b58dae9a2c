//! docs/walkthrough.md, run as written: its `walkthrough` blocks are
//! extracted from the page (so page and test cannot drift) and run by bash
//! on one machine. Each machine of the page (`m1`, `m2`, `m3`, `n1`) is a
//! home directory of its own; `ssh <machine> …` and `scp … <machine>:path`
//! are stand-ins that run in / copy to that directory; the page's
//! addresses block is replaced by loopback addresses on free ports (the
//! test checks it defines the same variables). Blocks tagged `background`
//! are the long-running processes (replicas, the agent), started in their
//! own process group and stopped at the end. The walk ends with the
//! tenant's first invocation answering the request's body.

use std::collections::BTreeSet;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One fenced block of the page tagged `walkthrough`.
#[derive(Debug, Clone)]
struct Block {
    /// Line of the opening fence (1-based), for messages.
    line: usize,
    /// `addresses`: the variables every machine's shell has.
    addresses: bool,
    /// The machines it runs on (in order).
    machines: Vec<String>,
    /// A long-running process.
    background: bool,
    /// The commands.
    text: String,
}

/// The page's `walkthrough` blocks, in order.
fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in page.lines().enumerate() {
        match &mut open {
            None => {
                let Some(info) = line.strip_prefix("```") else {
                    continue;
                };
                let words: Vec<&str> = info.split_whitespace().collect();
                if words.get(1) != Some(&"walkthrough") {
                    // Another block: skipped to its end.
                    open = Some(Block {
                        line: 0,
                        addresses: false,
                        machines: Vec::new(),
                        background: false,
                        text: String::new(),
                    });
                    continue;
                }
                let machines = words
                    .iter()
                    .find_map(|w| w.strip_prefix("machine="))
                    .map(|m| m.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
                open = Some(Block {
                    line: i + 1,
                    addresses: words.contains(&"addresses"),
                    machines,
                    background: words.contains(&"background"),
                    text: String::new(),
                });
            }
            Some(b) => {
                if line.starts_with("```") {
                    let b = open.take().expect("open block");
                    if b.line > 0 {
                        out.push(b);
                    }
                } else {
                    b.text.push_str(line);
                    b.text.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "an unclosed code block in the page");
    out
}

/// The names `export`ed by a block.
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|a| a.split_once('=').map(|(k, _)| k.to_string()))
        .collect()
}

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The addresses block for loopback: every "machine" is 127.0.0.1, each
/// service on a port of its own.
fn loopback_addresses() -> String {
    let mut s = String::from("export R1_IP=127.0.0.1 R2_IP=127.0.0.1 R3_IP=127.0.0.1\n");
    s.push_str(&format!(
        "export R1_RAFT=127.0.0.1:{} R2_RAFT=127.0.0.1:{} R3_RAFT=127.0.0.1:{}\n",
        free_udp(),
        free_udp(),
        free_udp()
    ));
    s.push_str(&format!(
        "export R1_HTTP=127.0.0.1:{} R2_HTTP=127.0.0.1:{} R3_HTTP=127.0.0.1:{}\n",
        free_tcp(),
        free_tcp(),
        free_tcp()
    ));
    s.push_str(&format!("export N1_INGRESS=127.0.0.1:{}\n", free_tcp()));
    s
}

/// `ssh` and `scp` for machines that are directories under `root`.
fn write_shims(root: &Path) -> PathBuf {
    let dir = root.join("shims");
    std::fs::create_dir_all(&dir).unwrap();
    let ssh = r#"#!/usr/bin/env bash
# ssh <machine> <command…>: runs the command in that machine's home.
set -euo pipefail
host=$1; shift
cd "$WALK_ROOT/$host" && HOME="$WALK_ROOT/$host" bash -c "$*"
"#;
    let scp = r#"#!/usr/bin/env bash
# scp <file>… <machine>:<path>: copies into that machine's home.
set -euo pipefail
args=("$@")
dest=${args[-1]}
unset 'args[-1]'
host=${dest%%:*}
path=${dest#*:}
cp -p "${args[@]}" "$WALK_ROOT/$host/$path"
"#;
    for (name, text) in [("ssh", ssh), ("scp", scp)] {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// A bash process for `block` on `machine`.
fn bash(root: &Path, path: &str, addresses: &str, machine: &str, text: &str) -> Command {
    let home = root.join(machine);
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!("set -euo pipefail\n{addresses}\n{text}"))
        .current_dir(&home)
        .env("HOME", &home)
        .env("PATH", path)
        .env("WALK_ROOT", root)
        .env_remove("GSHARE_REGION")
        .env_remove("GSHARE_TOKEN")
        .env_remove("GSHARE_CA")
        .env_remove("RUST_LOG");
    c
}

/// The background processes, each its own process group, stopped on drop.
struct Background(Vec<(String, Child)>);

impl Drop for Background {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", child.id())])
                .status();
        }
        for (_, child) in &mut self.0 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
        }
    }
}

/// Runs `cmd` for at most `limit`; (success, stdout + stderr).
fn run_for(mut cmd: Command, limit: Duration) -> (bool, String) {
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_file.reopen().unwrap()))
        .stderr(Stdio::from(out_file.reopen().unwrap()))
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(out_file.path()).unwrap_or_default();
    match status {
        Some(s) => (s.success(), text),
        None => (false, format!("{text}\n(killed after {limit:?})")),
    }
}

#[test]
fn the_walkthrough_page_runs_as_written() {
    let page_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/walkthrough.md");
    let page = std::fs::read_to_string(&page_path).unwrap();
    let blocks = blocks(&page);
    let addresses: Vec<&Block> = blocks.iter().filter(|b| b.addresses).collect();
    assert_eq!(addresses.len(), 1, "one addresses block");
    let loopback = loopback_addresses();
    assert_eq!(
        exported(&addresses[0].text),
        exported(&loopback),
        "the page's addresses block and the test's loopback one define other variables"
    );
    let steps: Vec<&Block> = blocks.iter().filter(|b| !b.addresses).collect();
    assert!(steps.len() >= 8, "{steps:?}");
    for b in &steps {
        assert!(!b.machines.is_empty(), "line {}: no machine=", b.line);
    }

    let bins = gshare_tests::build_binaries();
    let root = tempfile::tempdir().unwrap();
    for m in ["m1", "m2", "m3", "n1"] {
        std::fs::create_dir_all(root.path().join(m)).unwrap();
    }
    let shims = write_shims(root.path());
    let path = format!(
        "{}:{}:{}",
        shims.display(),
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut background = Background(Vec::new());
    let logs = |bg: &Background| -> String {
        bg.0.iter()
            .map(|(name, _)| {
                let text = std::fs::read_to_string(root.path().join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!(
                    "--- {name} (last lines)\n{}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect()
    };
    let mut outputs: Vec<(usize, String)> = Vec::new();
    for b in &steps {
        for m in &b.machines {
            let cmd = bash(root.path(), &path, &loopback, m, &b.text);
            if b.background {
                let name = format!("{m}-line{}", b.line);
                let log = std::fs::File::create(root.path().join(format!("{name}.log"))).unwrap();
                let mut cmd = cmd;
                let child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::from(log.try_clone().unwrap()))
                    .stderr(Stdio::from(log))
                    .process_group(0)
                    .spawn()
                    .unwrap();
                background.0.push((name, child));
                continue;
            }
            let (ok, out) = run_for(cmd, Duration::from_secs(120));
            assert!(
                ok,
                "docs/walkthrough.md line {} on {m} failed:\n{}\n--- output\n{out}\n{}",
                b.line,
                b.text,
                logs(&background)
            );
            outputs.push((b.line, out));
            // A background process that died is a failed step.
            for (name, child) in &mut background.0 {
                if let Some(s) = child.try_wait().unwrap() {
                    panic!(
                        "{name} exited ({s}) during line {}:\n{}",
                        b.line,
                        std::fs::read_to_string(root.path().join(format!("{name}.log")))
                            .unwrap_or_default()
                    );
                }
            }
        }
    }
    // The tenant's first invocation answered with the request's body.
    let invoke = steps
        .iter()
        .find(|b| b.text.contains("gsharectl function invoke echo"))
        .expect("the page no longer invokes");
    let (_, out) = outputs
        .iter()
        .find(|(line, _)| *line == invoke.line)
        .expect("the invoke block ran");
    assert!(out.contains("hello, gshare"), "{out}");
    // The operator's view at the end lists the tenant's function.
    let (_, out) = outputs.last().expect("a step ran");
    assert!(out.contains("echo") && out.contains("USD"), "{out}");
}

//! `gsharectl up --runtime microvm`: the demo's functions served in
//! microVMs, and the report of each VM's boot-to-ready.
//!
//! ```text
//!  --runtime microvm ─▶ guest image (--microvm-image, $GSHARE_MICROVM_IMAGE,
//!                       or target/microvm beside the binaries' directory) and QEMU checked
//!                     ─▶ <dir>/runtimes/demo-vm.toml + demo_function.py (the server in the guest)
//!                     ─▶ every agent: [runtimes.pytorch] driver = "microvm" (the demo's runtime),
//!                        metrics_token_file = "metrics-token"
//!  after the warm-up  ─▶ GET <agent>/metrics with that token
//!                        gshare_edge_microvm_vm_boot_seconds{tenant,function,pid} (measured by the
//!                        agent when the VM became ready) + gshare_edge_microvm_vm_rss_bytes (now)
//!                     ─▶ one line per running VM, and median / min / max over those lines
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use super::demo::DemoFunction;
use super::layout::AgentSlot;
use super::report::print_indented;

/// The server every demo function runs in its VM.
pub const DEMO_FUNCTION_PY: &str = include_str!("demo_function.py");
/// Its template, for the demo's runtime (`pytorch`): run in a microVM.
pub const DEMO_TEMPLATE: &str = "\
# The runtime template of the demo's functions under `gsharectl up --runtime microvm`:
# each instance boots its own microVM (docs/microvm.md) running demo_function.py.
runtime = \"pytorch\"
description = \"gsharectl up --runtime microvm: the demo function server in a microVM\"
command = [\"python3\", \"demo_function.py\", \"--host\", \"{host}\", \"--port\", \"{port}\"]
# Boots are CPU-bound: a dozen at once under TCG on a small machine take a while.
startup_timeout_s = 180
stop_grace_s = 5

[vm]
files = [\"demo_function.py\"]
memory_mib = 160
";
/// The template's file, relative to the region's directory.
pub const TEMPLATE_FILE: &str = "runtimes/demo-vm.toml";
/// The agents' metrics token's file, relative to the region's directory.
pub const METRICS_TOKEN_FILE: &str = "metrics-token";
/// QEMU, as the agent's driver runs it.
const QEMU: &str = "qemu-system-x86_64";
/// How long one scrape of an agent's /metrics may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the demo's functions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DemoRuntime {
    /// No process: the agent waits out the predicted service time.
    #[default]
    Sim,
    /// Each instance in its own QEMU microVM running a small function server.
    Microvm,
}

/// What the agents of a `--runtime microvm` region are given.
#[derive(Debug, Clone)]
pub struct MicrovmSetup {
    /// The guest image directory (absolute).
    pub image: PathBuf,
    /// The agents' metrics token (their per-VM series carry a tenant label).
    pub metrics_token: String,
}

impl MicrovmSetup {
    /// Finds and checks the guest image and QEMU: `flag`, else
    /// `$GSHARE_MICROVM_IMAGE`, else `target/microvm` (the parent of the
    /// binaries' directory `bin_dir`, e.g. `target/release/..`).
    pub fn locate(flag: Option<&Path>, bin_dir: &Path) -> anyhow::Result<MicrovmSetup> {
        let (dir, from) = match (flag, std::env::var_os("GSHARE_MICROVM_IMAGE")) {
            (Some(d), _) => (d.to_path_buf(), "--microvm-image"),
            (None, Some(d)) => (PathBuf::from(d), "$GSHARE_MICROVM_IMAGE"),
            (None, None) => (
                bin_dir
                    .parent()
                    .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
                    .join("microvm"),
                "the default, target/microvm beside the binaries",
            ),
        };
        let missing: Vec<&str> = ["vmlinuz", "initramfs.cpio"]
            .into_iter()
            .filter(|f| !dir.join(f).is_file())
            .collect();
        if !missing.is_empty() {
            bail!(
                "--runtime microvm: no guest image in {} ({from}): {} missing. Build it with \
                 `scripts/microvm-image.sh` from the repository (it writes target/microvm; \
                 `GSHARE_MICROVM_IMAGE=<dir> scripts/microvm-image.sh` writes <dir>, then pass \
                 --microvm-image <dir>); it needs busybox-static and python3.11 (docs/microvm.md)",
                dir.display(),
                missing.join(" and "),
            );
        }
        let qemu = std::process::Command::new(QEMU)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !qemu {
            bail!("--runtime microvm: {QEMU} not found on PATH (apt-get install qemu-system-x86)");
        }
        let image = std::fs::canonicalize(&dir).with_context(|| dir.display().to_string())?;
        let metrics_token = crate::api::auth::new_secret().map_err(|e| anyhow!("{e}"))?;
        Ok(MicrovmSetup {
            image,
            metrics_token,
        })
    }

    /// Writes the template, the function server and the metrics token
    /// into the region's directory `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let runtimes = dir.join("runtimes");
        std::fs::create_dir_all(&runtimes).with_context(|| runtimes.display().to_string())?;
        for (path, text) in [
            (dir.join(TEMPLATE_FILE), DEMO_TEMPLATE),
            (runtimes.join("demo_function.py"), DEMO_FUNCTION_PY),
            (dir.join(METRICS_TOKEN_FILE), self.metrics_token.as_str()),
        ] {
            std::fs::write(&path, text).with_context(|| path.display().to_string())?;
        }
        Ok(())
    }

    /// The agent config's top-level keys for it.
    pub fn agent_keys(&self) -> String {
        format!("metrics_token_file = \"{METRICS_TOKEN_FILE}\"\n")
    }

    /// The agent config's `[runtimes]` section for it.
    pub fn agent_runtimes(&self) -> String {
        format!(
            "\n[runtimes.pytorch]\ndriver = \"microvm\"\ntemplate = \"{TEMPLATE_FILE}\"\nimage = {:?}\n",
            self.image.display().to_string()
        )
    }
}

/// One running microVM as its agent reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSeen {
    /// `tenant/name`.
    pub function: String,
    /// The agent's node.
    pub node: String,
    /// QEMU's pid.
    pub pid: u32,
    /// Boot-to-ready the agent measured when the VM started, ms (printed
    /// whole, cut as the agent's `boot_to_ready_ms` log field is).
    pub boot_ms: f64,
    /// QEMU's resident memory when scraped, MiB (`None`: not shown).
    pub rss_mib: Option<f64>,
}

/// What the agents' /metrics say about their microVMs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VmReport {
    /// Every running VM, by function then node.
    pub vms: Vec<VmSeen>,
    /// How the VMs are accelerated (`tcg`, `kvm`), per agent that said.
    pub accel: BTreeMap<String, String>,
    /// Boots each agent measured so far (placements, swap-ins, moves).
    pub boots: BTreeMap<String, u64>,
    /// Agents whose /metrics could not be read, with why.
    pub unread: Vec<(String, String)>,
}

impl VmReport {
    /// Reads every agent's /metrics with `token`.
    pub fn scrape(agents: &[AgentSlot], token: &str) -> VmReport {
        let mut r = VmReport::default();
        for a in agents {
            match scrape_text(a.ingress, token) {
                Ok(text) => r.add(&a.node, &text),
                Err(e) => r.unread.push((a.node.clone(), format!("{e:#}"))),
            }
        }
        r.vms
            .sort_by(|x, y| (&x.function, &x.node, x.pid).cmp(&(&y.function, &y.node, y.pid)));
        r
    }

    /// Adds the VMs of `node` from its exposition `text`.
    fn add(&mut self, node: &str, text: &str) {
        let mut rss: BTreeMap<(String, u32), f64> = BTreeMap::new();
        for (name, labels, value) in text.lines().filter_map(parse_sample) {
            let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
            match name {
                "gshare_edge_microvm_accel" if value == 1.0 => {
                    self.accel.insert(node.to_string(), label("accel"));
                }
                "gshare_edge_microvm_boots_total" => {
                    self.boots.insert(node.to_string(), value as u64);
                }
                "gshare_edge_microvm_vm_boot_seconds" => self.vms.push(VmSeen {
                    function: format!("{}/{}", label("tenant"), label("function")),
                    node: node.to_string(),
                    pid: label("pid").parse().unwrap_or(0),
                    boot_ms: value * 1000.0,
                    rss_mib: None,
                }),
                "gshare_edge_microvm_vm_rss_bytes" => {
                    let pid = label("pid").parse().unwrap_or(0);
                    rss.insert((node.to_string(), pid), value / (1024.0 * 1024.0));
                }
                _ => {}
            }
        }
        for v in self.vms.iter_mut().filter(|v| v.node == node) {
            v.rss_mib = rss.get(&(v.node.clone(), v.pid)).copied();
        }
    }

    /// The boot-to-ready figures of the listed VMs, ascending, ms.
    fn boots_ms(&self) -> Vec<f64> {
        let mut b: Vec<f64> = self.vms.iter().map(|v| v.boot_ms).collect();
        b.sort_by(f64::total_cmp);
        b
    }

    /// `median (lower of the middle two for an even count), min, max` of
    /// the listed VMs' boot-to-ready, ms: each one a measured boot.
    pub fn summary(&self) -> Option<(f64, f64, f64)> {
        let b: Vec<f64> = self.boots_ms().into_iter().map(f64::floor).collect();
        Some((b[(b.len().checked_sub(1)?) / 2], *b.first()?, *b.last()?))
    }

    /// Prints the table of running VMs, the functions of `deployed` with
    /// none, and the summary line.
    pub fn print(&self, deployed: &[DemoFunction]) {
        let accel: Vec<&str> = {
            let mut a: Vec<&str> = self.accel.values().map(String::as_str).collect();
            a.dedup();
            a
        };
        println!(
            "up: microVMs running (accel {}): boot-to-ready as each agent measured it when the VM \
             started (QEMU spawned → first 200 from the guest's /health), RSS of its QEMU now:",
            if accel.is_empty() {
                "unknown".to_string()
            } else {
                accel.join(", ")
            }
        );
        let mut rows = vec![[
            "FUNCTION",
            "NODE",
            "QEMU PID",
            "BOOT-TO-READY ms",
            "RSS MiB",
        ]
        .map(String::from)
        .to_vec()];
        for v in &self.vms {
            rows.push(vec![
                v.function.clone(),
                v.node.clone(),
                v.pid.to_string(),
                format!("{:.0}", v.boot_ms.floor()),
                v.rss_mib.map_or("-".into(), |m| format!("{m:.0}")),
            ]);
        }
        print_indented(&rows);
        let without: Vec<String> = deployed
            .iter()
            .map(DemoFunction::id)
            .filter(|id| !self.vms.iter().any(|v| v.function == *id))
            .collect();
        if !without.is_empty() {
            println!(
                "up: no VM running now for {} (swapped out, scaled to zero, not placed yet, or \
                 restarted after a crash: such a restart's boot is not measured)",
                without.join(", ")
            );
        }
        for (node, why) in &self.unread {
            println!("up: agent {node}'s /metrics could not be read: {why}");
        }
        match self.summary() {
            Some((median, min, max)) => println!(
                "up: microvm boot-to-ready: vms={} median_ms={median:.0} min_ms={min:.0} \
                 max_ms={max:.0}",
                self.vms.len()
            ),
            None => println!("up: microvm boot-to-ready: vms=0 (no VM running)"),
        }
    }

    /// One line per agent with VMs: boots measured so far.
    pub fn print_boots(&self) {
        let parts: Vec<String> = self
            .boots
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(node, n)| format!("{node} {n}"))
            .collect();
        println!(
            "up: microVM boots measured by the agents so far (placements, swap-ins, moves): {}",
            if parts.is_empty() {
                "none".to_string()
            } else {
                parts.join(", ")
            }
        );
    }
}

/// `GET /metrics` of the agent at `ingress` with `token`.
fn scrape_text(ingress: SocketAddr, token: &str) -> anyhow::Result<String> {
    let r = crate::http_client::request(
        ingress,
        "GET",
        "/metrics",
        Some(token),
        None,
        SCRAPE_TIMEOUT,
    )
    .map_err(|e| anyhow!("{e}"))?;
    if r.status != 200 {
        bail!("HTTP {}: {}", r.status, r.body);
    }
    Ok(r.body)
}

/// One sample line of the Prometheus text format: name, labels, value.
fn parse_sample(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.trim().parse().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, BTreeMap::new(), value));
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest.strip_suffix('}')?;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut v = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => v.push('\n'),
                    c => v.push(c),
                },
                (i, '"') => break i,
                (_, c) => v.push(c),
            }
        };
        labels.insert(key.trim_start_matches(',').to_string(), v);
        rest = &after[end + 1..];
    }
    Some((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP gshare_edge_microvm_accel x
gshare_edge_microvm_accel{accel=\"tcg\"} 1
gshare_edge_microvm_boots_total 3
gshare_edge_microvm_vm_boot_seconds{function=\"rank\",pid=\"41\",tenant=\"acme\"} 6.27
gshare_edge_microvm_vm_rss_bytes{function=\"rank\",pid=\"41\",tenant=\"acme\"} 314572800
gshare_edge_microvm_vm_boot_seconds{function=\"a\\\"b\",pid=\"42\",tenant=\"globex\"} 5.5
";

    #[test]
    fn reads_each_vm_of_an_agent_with_its_rss_and_summarizes_measured_boots() {
        let mut r = VmReport::default();
        r.add("c1", TEXT);
        assert_eq!(r.accel["c1"], "tcg");
        assert_eq!(r.boots["c1"], 3);
        assert_eq!(r.vms.len(), 2);
        assert_eq!(r.vms[0].function, "acme/rank");
        assert_eq!(r.vms[0].pid, 41);
        assert_eq!(r.vms[0].rss_mib, Some(300.0));
        assert!((r.vms[0].boot_ms - 6270.0).abs() < 1e-6);
        assert_eq!(r.vms[1].function, "globex/a\"b");
        assert_eq!(r.vms[1].rss_mib, None);
        // Two VMs: the lower middle one, itself a measured boot.
        assert_eq!(r.summary(), Some((5500.0, 5500.0, 6270.0)));
        r.vms[0].boot_ms = 6270.9;
        assert_eq!(r.summary(), Some((5500.0, 5500.0, 6270.0)), "whole ms, cut");
        assert_eq!(VmReport::default().summary(), None);
    }

    #[test]
    fn a_missing_image_is_refused_with_the_command_that_builds_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = MicrovmSetup::locate(Some(dir.path()), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("scripts/microvm-image.sh"), "{e}");
        assert!(e.contains("vmlinuz and initramfs.cpio missing"), "{e}");
    }

    #[test]
    fn the_template_parses_for_the_demo_runtime() {
        let v: toml::Value = toml::from_str(DEMO_TEMPLATE).unwrap();
        assert_eq!(v["runtime"].as_str(), Some("pytorch"));
        assert_eq!(v["vm"]["files"][0].as_str(), Some("demo_function.py"));
    }
}

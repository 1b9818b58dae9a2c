//! The agent config's `[runtimes]` section: which runtime driver serves the
//! functions of each runtime, and the command template of `process` ones.
//!
//! ```toml
//! [runtimes.vllm]
//! driver = "process"               # "sim" | "process"
//! template = "runtimes/vllm.toml"  # relative to the agent config file
//!
//! [runtimes.custom]
//! driver = "sim"
//! ```
//!
//! Keys of `[runtimes]` are runtime names (`vllm`, `sglang`, `pytorch`,
//! `tf-serving`, `custom`); a runtime that is not listed (or a file without
//! the section) is served by the `sim` driver. `template` is required with
//! `driver = "process"` and refused with `sim`. The template file itself is
//! read by the agent (core does no I/O): a [`TemplateRef`] keeps the key
//! path and place of `template` so that a missing or invalid file is
//! reported as `agent.toml:12:12: runtimes.vllm.template: … (got "…")`.

use super::error::IssueKind;
use super::file_ref::{file_ref, FileRef};
use super::reader::{quote, Field, Issues, TableReader};
use crate::model::Runtime;

/// The runtimes that can be listed, in the order they are read.
const RUNTIMES: [Runtime; 5] = [
    Runtime::Vllm,
    Runtime::Sglang,
    Runtime::Pytorch,
    Runtime::TfServing,
    Runtime::Custom,
];

/// A runtime driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// Simulated service times from the function's latency profile.
    Sim,
    /// The function's server as a supervised process (per instance).
    Process,
}

impl DriverKind {
    /// The name used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            DriverKind::Sim => "sim",
            DriverKind::Process => "process",
        }
    }
}

/// A runtime's command template file (see [`FileRef`]).
pub type TemplateRef = FileRef;

/// The driver of one listed runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeDriverConfig {
    /// The runtime.
    pub runtime: Runtime,
    /// Its driver.
    pub driver: DriverKind,
    /// The command template (`Some` exactly when `driver` is `Process`).
    pub template: Option<TemplateRef>,
}

/// The drivers of the listed runtimes; the others use [`DriverKind::Sim`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeDrivers {
    /// The listed runtimes, in [`Runtime`] order.
    pub listed: Vec<RuntimeDriverConfig>,
}

impl RuntimeDrivers {
    /// The configuration of `runtime`, if listed.
    pub fn get(&self, runtime: Runtime) -> Option<&RuntimeDriverConfig> {
        self.listed.iter().find(|c| c.runtime == runtime)
    }

    /// The driver serving `runtime` (`Sim` unless listed otherwise).
    pub fn driver_for(&self, runtime: Runtime) -> DriverKind {
        self.get(runtime).map_or(DriverKind::Sim, |c| c.driver)
    }
}

fn driver_kind(is: &mut Issues<'_>, f: &Field<String>) -> Option<DriverKind> {
    match f.v.as_deref()? {
        "sim" => Some(DriverKind::Sim),
        "process" => Some(DriverKind::Process),
        other => {
            is.report(
                &f.at,
                IssueKind::Invalid,
                "expected \"sim\" or \"process\"".into(),
                Some(quote(other)),
            );
            None
        }
    }
}

/// Reads the optional `[runtimes]` table of the agent config (`src` is the
/// file's text, for the place of `template` values). `None` when a mistake
/// was reported.
pub(crate) fn read_runtimes(
    is: &mut Issues<'_>,
    src: &str,
    root: &mut TableReader<'_, '_>,
) -> Option<RuntimeDrivers> {
    let Some(mut table) = root.table(is, "runtimes", false) else {
        // Absent (or reported as not a table; then `is` is not empty).
        return Some(RuntimeDrivers::default());
    };
    let mut listed = Vec::new();
    let mut ok = true;
    for runtime in RUNTIMES {
        let Some(mut t) = table.table(is, runtime.as_str(), false) else {
            continue;
        };
        let driver = t.string(is, "driver", true);
        let template = t.string(is, "template", false);
        let table_at = t.loc().clone();
        t.finish(is);
        let kind = driver_kind(is, &driver);
        let template = match (kind, template.v.as_deref()) {
            (Some(DriverKind::Process), None) => {
                let mut at = table_at;
                at.path = template.at.path.clone();
                is.report(
                    &at,
                    IssueKind::MissingKey,
                    "driver = \"process\" needs a command template".into(),
                    None,
                );
                ok = false;
                None
            }
            (Some(DriverKind::Sim), Some(path)) => {
                is.report(
                    &template.at,
                    IssueKind::Inconsistent,
                    "only meaningful with driver = \"process\"".into(),
                    Some(quote(path)),
                );
                ok = false;
                None
            }
            (_, Some("")) => {
                is.report(
                    &template.at,
                    IssueKind::Invalid,
                    "must not be empty".into(),
                    Some(quote("")),
                );
                ok = false;
                None
            }
            (_, Some(_)) => file_ref(src, &template),
            (_, None) => None,
        };
        match kind {
            Some(driver) => listed.push(RuntimeDriverConfig {
                runtime,
                driver,
                template,
            }),
            None => ok = false,
        }
    }
    table.finish(is);
    ok.then_some(RuntimeDrivers { listed })
}

#[cfg(test)]
mod tests {
    use super::super::AgentConfig;
    use super::*;

    const BASE: &str = r#"
node = "n1"
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

    #[test]
    fn without_the_section_every_runtime_is_simulated() {
        let c = AgentConfig::from_toml("a.toml", BASE).unwrap();
        assert_eq!(c.runtimes, RuntimeDrivers::default());
        assert_eq!(c.runtimes.driver_for(Runtime::Vllm), DriverKind::Sim);
    }

    #[test]
    fn listed_runtimes_get_their_driver_and_template_place() {
        let text = format!(
            "{BASE}[runtimes.vllm]\ndriver = \"process\"\ntemplate = \"runtimes/vllm.toml\"\n\
             [runtimes.tf-serving]\ndriver = \"sim\"\n"
        );
        let c = AgentConfig::from_toml("a.toml", &text).unwrap();
        assert_eq!(c.runtimes.driver_for(Runtime::Vllm), DriverKind::Process);
        assert_eq!(c.runtimes.driver_for(Runtime::TfServing), DriverKind::Sim);
        assert_eq!(c.runtimes.driver_for(Runtime::Custom), DriverKind::Sim);
        let t = c.runtimes.get(Runtime::Vllm).unwrap().template.clone();
        let t = t.unwrap();
        assert_eq!(t.path, "runtimes/vllm.toml");
        assert_eq!(t.key, "runtimes.vllm.template");
        let line = text
            .lines()
            .position(|l| l.starts_with("template ="))
            .unwrap() as u32
            + 1;
        assert_eq!((t.line, t.column), (Some(line), Some(12)));
        let shown = t.issue("cannot read template: gone".into()).to_string();
        assert_eq!(
            shown,
            format!(
                "{line}:12: runtimes.vllm.template: cannot read template: gone (got \"runtimes/vllm.toml\")"
            )
        );
    }

    #[test]
    fn every_mistake_of_the_section_is_reported_at_once() {
        let text = format!(
            "{BASE}[runtimes.vllm]\ndriver = \"docker\"\n\
             [runtimes.sglang]\ndriver = \"process\"\n\
             [runtimes.pytorch]\ndriver = \"sim\"\ntemplate = \"p.toml\"\n\
             [runtimes.custom]\ndriver = \"process\"\ntemplate = \"\"\ncomand = 1\n\
             [runtimes.tensorrt]\ndriver = \"sim\"\n"
        );
        let e = AgentConfig::from_toml("a.toml", &text)
            .unwrap_err()
            .to_string();
        for needle in [
            "runtimes.vllm.driver: expected \"sim\" or \"process\" (got \"docker\")",
            "runtimes.sglang.template: driver = \"process\" needs a command template",
            "runtimes.pytorch.template: only meaningful with driver = \"process\" (got \"p.toml\")",
            "runtimes.custom.template: must not be empty",
            "runtimes.custom.comand: unknown key",
            "runtimes.tensorrt: unknown key (expected one of: vllm, sglang, pytorch, tf-serving, custom)",
        ] {
            assert!(e.contains(needle), "{needle:?} missing in:\n{e}");
        }
        assert_eq!(e.lines().count(), 6, "{e}");
        assert!(e.lines().all(|l| l.starts_with("a.toml:")), "{e}");
    }

    #[test]
    fn the_section_must_be_a_table_and_drivers_strings() {
        let text = format!("runtimes = 3\n{BASE}");
        let e = AgentConfig::from_toml("a.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtimes: expected a table"), "{e}");
        let text = format!("{BASE}[runtimes.vllm]\ndriver = 1\n");
        let e = AgentConfig::from_toml("a.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtimes.vllm.driver: expected a string"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

//! The agent config's `[runtimes]` section: which runtime driver serves the
//! functions of each runtime, and the command template of `process` ones.
//!
//! ```toml
//! [runtimes.vllm]
//! driver = "process"               # "sim" | "process" | "microvm"
//! template = "runtimes/vllm.toml"  # relative to the agent config file
//!
//! [runtimes.pytorch]
//! driver = "microvm"               # the template's command runs in a VM per instance
//! template = "runtimes/pytorch.toml"
//! image = "../../target/microvm"   # vmlinuz + initramfs.cpio (scripts/microvm-image.sh)
//!
//! [runtimes.custom]
//! driver = "sim"
//! ```
//!
//! Keys of `[runtimes]` are runtime names (`vllm`, `sglang`, `pytorch`,
//! `tf-serving`, `custom`); a runtime that is not listed (or a file without
//! the section) is served by the `sim` driver. `template` is required with
//! `driver = "process"` and `"microvm"` and refused with `sim`; `image` is
//! required with `"microvm"` and refused otherwise (docs/microvm.md). The template file itself is
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
    /// The function's server inside a microVM (a QEMU process) per instance.
    Microvm,
}

impl DriverKind {
    /// The name used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            DriverKind::Sim => "sim",
            DriverKind::Process => "process",
            DriverKind::Microvm => "microvm",
        }
    }

    /// Whether functions of this driver run a command template.
    pub fn runs_template(self) -> bool {
        matches!(self, DriverKind::Process | DriverKind::Microvm)
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
    /// The command template (`Some` exactly when `driver` is `Process`
    /// or `Microvm`).
    pub template: Option<TemplateRef>,
    /// The guest image directory (`Some` exactly when `driver` is `Microvm`).
    pub image: Option<FileRef>,
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
        "microvm" => Some(DriverKind::Microvm),
        other => {
            is.report(
                &f.at,
                IssueKind::Invalid,
                "expected \"sim\", \"process\" or \"microvm\"".into(),
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
        let image = t.string(is, "image", false);
        let table_at = t.loc().clone();
        t.finish(is);
        let kind = driver_kind(is, &driver);
        let template = match (kind, template.v.as_deref()) {
            (Some(k), None) if k.runs_template() => {
                let mut at = table_at.clone();
                at.path = template.at.path.clone();
                is.report(
                    &at,
                    IssueKind::MissingKey,
                    format!("driver = {} needs a command template", quote(k.as_str())),
                    None,
                );
                ok = false;
                None
            }
            (Some(DriverKind::Sim), Some(path)) => {
                is.report(
                    &template.at,
                    IssueKind::Inconsistent,
                    "only meaningful with driver = \"process\" or \"microvm\"".into(),
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
        let image = match (kind, image.v.as_deref()) {
            (Some(DriverKind::Microvm), None) => {
                let mut at = table_at;
                at.path = image.at.path.clone();
                is.report(
                    &at,
                    IssueKind::MissingKey,
                    "driver = \"microvm\" needs a guest image directory \
                     (built by scripts/microvm-image.sh)"
                        .into(),
                    None,
                );
                ok = false;
                None
            }
            (Some(DriverKind::Sim | DriverKind::Process), Some(path)) => {
                is.report(
                    &image.at,
                    IssueKind::Inconsistent,
                    "only meaningful with driver = \"microvm\"".into(),
                    Some(quote(path)),
                );
                ok = false;
                None
            }
            (_, Some("")) => {
                is.report(
                    &image.at,
                    IssueKind::Invalid,
                    "must not be empty".into(),
                    Some(quote("")),
                );
                ok = false;
                None
            }
            (_, Some(_)) => file_ref(src, &image),
            (_, None) => None,
        };
        match kind {
            Some(driver) => listed.push(RuntimeDriverConfig {
                runtime,
                driver,
                template,
                image,
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
    fn a_microvm_runtime_needs_a_template_and_an_image() {
        let text = format!(
            "{BASE}[runtimes.custom]\ndriver = \"microvm\"\ntemplate = \"echo.toml\"\n\
             image = \"../target/microvm\"\n"
        );
        let c = AgentConfig::from_toml("a.toml", &text).unwrap();
        let m = c.runtimes.get(Runtime::Custom).unwrap();
        assert_eq!(m.driver, DriverKind::Microvm);
        assert_eq!(m.template.as_ref().unwrap().path, "echo.toml");
        let image = m.image.clone().unwrap();
        assert_eq!(
            (image.path.as_str(), image.key.as_str()),
            ("../target/microvm", "runtimes.custom.image")
        );
        let text = format!(
            "{BASE}[runtimes.custom]\ndriver = \"microvm\"\n\
             [runtimes.vllm]\ndriver = \"process\"\ntemplate = \"v.toml\"\nimage = \"i\"\n"
        );
        let e = AgentConfig::from_toml("a.toml", &text)
            .unwrap_err()
            .to_string();
        for needle in [
            "runtimes.custom.template: driver = \"microvm\" needs a command template",
            "runtimes.custom.image: driver = \"microvm\" needs a guest image directory",
            "runtimes.vllm.image: only meaningful with driver = \"microvm\" (got \"i\")",
        ] {
            assert!(e.contains(needle), "{needle:?} missing in:\n{e}");
        }
        assert_eq!(e.lines().count(), 3, "{e}");
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
            "runtimes.vllm.driver: expected \"sim\", \"process\" or \"microvm\" (got \"docker\")",
            "runtimes.sglang.template: driver = \"process\" needs a command template",
            "runtimes.pytorch.template: only meaningful with driver = \"process\" or \"microvm\" (got \"p.toml\")",
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

//! `gsharectl function deploy -f fn.toml | ls | rm <name>` (tenant).
//!
//! `fn.toml` holds the fields of `POST /v1/functions` (see
//! `configs/examples/function.toml`); unknown keys are refused here, before
//! anything is sent.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::region_client::{cell, RegionArgs};
use crate::api::functions::FunctionBody;

/// `gsharectl function …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: FunctionCommand,
}

#[derive(Debug, clap::Subcommand)]
enum FunctionCommand {
    /// Deploy a function and place its `min_instances`.
    Deploy {
        /// The function file (TOML).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// List your functions and their instances.
    Ls,
    /// Delete a function (releases its instances).
    Rm {
        /// Its name.
        name: String,
    },
}

/// Reads and checks a function file.
pub fn load(file: &Path) -> anyhow::Result<FunctionBody> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    parse(&file.display().to_string(), &text)
}

/// Parses the text of function file `file` (the body of `POST /v1/functions`).
pub fn parse(file: &str, text: &str) -> anyhow::Result<FunctionBody> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{file}: {}", e.to_string().trim()))
}

/// Runs `gsharectl function …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    match a.command {
        FunctionCommand::Deploy { file } => {
            let body = serde_json::to_value(load(&file)?)?;
            let v = r.call("POST", "/v1/functions", Some(&body))?;
            r.show(&v, |v| table(std::slice::from_ref(v)));
        }
        FunctionCommand::Ls => {
            let v = r.call("GET", "/v1/functions", None)?;
            r.show(&v, |v| table(v.as_array().map_or(&[][..], Vec::as_slice)));
        }
        FunctionCommand::Rm { name } => {
            let v = r.call("DELETE", &format!("/v1/functions/{name}"), None)?;
            r.show(&v, super::region_client::key_values);
        }
    }
    Ok(())
}

fn table(fns: &[Value]) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "NAME",
        "VERSION",
        "TIER",
        "COMPUTE",
        "MEMORY MiB",
        "POOL",
        "INSTANCES",
        "PLACED ON",
    ]
    .map(String::from)
    .to_vec()];
    for f in fns {
        let s = &f["spec"];
        let inst = f["instances"].as_array().cloned().unwrap_or_default();
        let gpus: Vec<String> = inst
            .iter()
            .flat_map(|i| i["slices"].as_array().cloned().unwrap_or_default())
            .map(|sl| {
                format!(
                    "{}/gpu{}",
                    cell(&sl["gpu"]["node"]),
                    cell(&sl["gpu"]["index"])
                )
            })
            .collect();
        rows.push(vec![
            cell(&s["name"]),
            cell(&f["version"]),
            cell(&s["tier"]),
            cell(&s["compute_milli"]),
            cell(&s["memory_mib"]),
            cell(&s["pool"]),
            format!("{}/{}", inst.len(), cell(&s["max_instances"])),
            gpus.join(","),
        ]);
    }
    rows
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_function_file_parses_strictly() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../configs/examples/function.toml");
        let f = super::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.name, "llama-8b-chat");
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&bad, format!("gpus = 2\n{text}")).unwrap();
        let e = super::load(&bad).unwrap_err().to_string();
        assert!(e.contains("unknown field `gpus`"), "{e}");
    }
}

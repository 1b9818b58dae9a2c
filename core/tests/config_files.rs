//! Every config file shipped in `configs/` parses and validates cleanly.
//!
//! `topology.toml` and `tenants.toml` files are parsed and validated with
//! their own parsers; any other `*.toml` (files of other components) must
//! at least be valid TOML. The test fails if the directory holds no file.

use gshare_core::config::{AgentConfig, Tenants, Topology};
use std::path::{Path, PathBuf};

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_shipped_config_file_is_valid() {
    let mut files = Vec::new();
    toml_files(&configs_dir(), &mut files);
    files.sort();
    assert!(
        !files.is_empty(),
        "no *.toml under {}",
        configs_dir().display()
    );
    let mut failures = Vec::new();
    let (mut topologies, mut tenants, mut agents) = (0, 0, 0);
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable config file");
        let name = path.display().to_string();
        let result = match path.file_name().and_then(|n| n.to_str()) {
            Some("topology.toml") => {
                topologies += 1;
                Topology::from_toml(&name, &text)
                    .map(|t| {
                        assert!(t.total_gpus() > 0, "{name}: a shipped topology has GPUs");
                    })
                    .map_err(|e| e.to_string())
            }
            Some("tenants.toml") => {
                tenants += 1;
                Tenants::from_toml(&name, &text)
                    .map(|t| assert!(!t.all().is_empty(), "{name}: no tenants"))
                    .map_err(|e| e.to_string())
            }
            Some(n) if n.starts_with("agent") => {
                agents += 1;
                AgentConfig::from_toml(&name, &text)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            _ => text
                .parse::<toml::Table>()
                .map(|_| ())
                .map_err(|e| format!("{name}: {e}")),
        };
        if let Err(e) = result {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        topologies >= 2 && tenants >= 2,
        "configs/local and configs/examples each need both files"
    );
    assert!(
        agents >= 2,
        "configs/local and configs/examples each need an agent file"
    );
}

#[test]
fn the_example_region_has_a_center_and_two_edge_pools() {
    let path = configs_dir().join("examples/topology.toml");
    let text = std::fs::read_to_string(&path).expect("examples/topology.toml");
    let t = Topology::from_toml("examples/topology.toml", &text).expect("valid");
    let kinds: Vec<_> = t.pools().iter().map(|p| p.kind.as_str()).collect();
    assert_eq!(kinds, ["center", "edge", "edge"]);
    // Everything the serving simulator needs is there for every GPU.
    for (id, gpu) in t.gpus() {
        let node = t.node(&id.node.0).expect("node of a GPU");
        assert!(gpu.memory_mib > 0 && gpu.h2d_mib_per_s > 0, "{id}");
        assert!(node.swap_mib > 0, "{id}");
        let w = 6_656; // a 6.5 GiB checkpoint
        assert!(t.cold_start_us(&node.name.0, w) > t.swap_us(&id, w), "{id}");
        assert!(t.pricing().price(&gpu.model, node.kind).is_some(), "{id}");
    }
}

#[test]
fn the_schema_samples_in_configs_readme_are_valid() {
    let path = configs_dir().join("README.md");
    let text = std::fs::read_to_string(&path).expect("configs/README.md");
    let blocks: Vec<&str> = text
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().expect("closed block"))
        .collect();
    assert_eq!(blocks.len(), 2, "a topology and a tenants sample");
    let t =
        Topology::from_toml("README topology sample", blocks[0]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.total_gpus(), 3);
    Tenants::from_toml("README tenants sample", blocks[1]).unwrap_or_else(|e| panic!("{e}"));
}

//! Finds (building if needed) the workspace binaries the tests start.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn target_profile_dir() -> PathBuf {
    // The test executable lives in target/<profile>/deps/.
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Builds `gshare-region`'s and `gshare-edge`'s binaries once per test process, in the profile of
/// the running tests, and returns the directory holding them. After `cargo test --workspace` this
/// is a no-op: the two packages alone unify the same dependency features as the test build (see
/// core/Cargo.toml's `logging` feature), so nothing is rebuilt.
pub fn build_binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = target_profile_dir();
        let release = dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root()).args([
            "build",
            "-q",
            "-p",
            "gshare-region",
            "-p",
            "gshare-edge",
            "--bins",
        ]);
        // cargo gives the test process CARGO_MANIFEST_DIR, CARGO_PKG_* and
        // friends; build scripts that watch them (ring's does) would see a
        // change and rebuild, then the next `cargo test` rebuilds back.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("CARGO_") && k != "CARGO_HOME" {
                cmd.env_remove(&k);
            }
        }
        if release {
            cmd.arg("--release");
        }
        // Build into the same target dir as the tests themselves.
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let status = cmd.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p gshare-region -p gshare-edge --bins failed"
        );
        dir
    })
}

/// The path of a workspace binary, built if needed.
pub fn binary(name: &str) -> PathBuf {
    let p = build_binaries().join(name);
    assert!(p.exists(), "{} not found after building", p.display());
    p
}

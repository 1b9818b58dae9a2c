//! The binaries `gsharectl up` starts: `gshare-region` and `gshare-edge`
//! from the directory of the running `gsharectl`.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};

/// The binaries `gsharectl up` starts.
#[derive(Debug)]
pub struct Binaries {
    /// This `gsharectl` (it starts the children, see `children.rs`).
    pub gsharectl: PathBuf,
    /// `gshare-region`.
    pub region: PathBuf,
    /// `gshare-edge`.
    pub edge: PathBuf,
}

impl Binaries {
    /// The directory they sit in (e.g. `target/release`).
    pub fn dir(&self) -> &std::path::Path {
        self.gsharectl
            .parent()
            .unwrap_or_else(|| std::path::Path::new("."))
    }

    /// Finds the binaries next to the running executable.
    pub fn locate() -> anyhow::Result<Binaries> {
        let gsharectl = std::env::current_exe().context("finding gsharectl's own path")?;
        let dir = gsharectl
            .parent()
            .ok_or_else(|| anyhow!("{} has no directory", gsharectl.display()))?;
        let find = |name: &str| -> anyhow::Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                bail!(
                    "{name} not found at {}: `gsharectl up` starts the {name} binary that sits \
                     next to gsharectl. Build the workspace's binaries first: \
                     `cargo build --release`, then run target/release/gsharectl up",
                    p.display()
                )
            }
        };
        Ok(Binaries {
            region: find("gshare-region")?,
            edge: find("gshare-edge")?,
            gsharectl,
        })
    }
}

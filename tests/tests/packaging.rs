//! What an operator installs: every binary answers `--version`; the systemd
//! units start the binaries with flags they accept and stop the whole cgroup;
//! the `cargo deb` metadata names files that exist and packages that can be
//! installed side by side; release binaries carry no debug info.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

const BINARIES: [&str; 6] = [
    "gshare-region",
    "gsharectl",
    "region-bench",
    "gshare-edge",
    "invoke-bench",
    "gshare-gpu-probe",
];

#[test]
fn every_binary_answers_version() {
    for name in BINARIES {
        let o = Command::new(gshare_tests::binary(name))
            .arg("--version")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{name} --version: {:?} {out}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            out.trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION")),
            "{name}"
        );
    }
}

/// `key=value` lines of one `[section]` of a unit file.
fn unit_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
        } else if inside && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }
    out
}

fn get<'a>(kv: &'a [(String, String)], key: &str) -> Option<&'a str> {
    kv.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_units_run_the_binaries_with_flags_they_accept_and_stop_the_whole_cgroup() {
    for (unit, binary) in [
        ("gshare-region.service", "gshare-region"),
        ("gshare-edge.service", "gshare-edge"),
    ] {
        let path = root().join("configs/systemd").join(unit);
        let text = std::fs::read_to_string(&path).unwrap();
        let service = unit_section(&text, "Service");
        assert_eq!(get(&service, "KillMode"), Some("control-group"), "{unit}");
        assert!(get(&service, "User").is_some(), "{unit} runs as root");
        assert_eq!(
            get(&unit_section(&text, "Install"), "WantedBy"),
            Some("multi-user.target")
        );
        let exec = get(&service, "ExecStart").expect("ExecStart");
        let mut words = exec.split_whitespace();
        assert_eq!(words.next(), Some(&*format!("/usr/bin/{binary}")), "{unit}");
        let args: Vec<&str> = words.collect();
        // The same flags, with the config pointing where nothing is: the
        // binary must get as far as reading the config (flags accepted).
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("/etc/gshare/") {
                    missing.display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let o = Command::new(gshare_tests::binary(binary))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{unit}: {err}");
        assert!(err.contains("missing.toml"), "{unit}: {err}");
        assert!(!err.contains("unexpected argument"), "{unit}: {err}");
    }
    // The agent must see the MPS daemon's pipe directory in /tmp.
    let edge = std::fs::read_to_string(root().join("configs/systemd/gshare-edge.service")).unwrap();
    assert_ne!(
        get(&unit_section(&edge, "Service"), "PrivateTmp"),
        Some("yes")
    );
}

/// The `[package.metadata.deb]` table of a package.
fn deb(package_dir: &str) -> (toml::Table, Vec<String>) {
    let path = root().join(package_dir).join("Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let bins = manifest
        .get("bin")
        .and_then(|b| b.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|b| b.get("name")?.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let deb = manifest["package"]["metadata"]["deb"]
        .as_table()
        .unwrap_or_else(|| panic!("{}: no [package.metadata.deb]", path.display()))
        .clone();
    (deb, bins)
}

/// A binary of `package_dir`: a `[[bin]]`, a file of `src/bin/`, or the
/// package's own (`src/main.rs`).
fn is_binary_of(package_dir: &str, package: &str, bins: &[String], name: &str) -> bool {
    bins.iter().any(|b| b == name)
        || (name == package && root().join(package_dir).join("src/main.rs").exists())
        || root()
            .join(package_dir)
            .join("src/bin")
            .join(format!("{name}.rs"))
            .exists()
}

#[test]
fn the_deb_metadata_names_files_that_exist_and_the_two_packages_do_not_collide() {
    let mut installed: Vec<BTreeSet<String>> = Vec::new();
    for (dir, package) in [("region", "gshare-region"), ("edge", "gshare-edge")] {
        let (deb, bins) = deb(dir);
        let base = root().join(dir);
        let mut files = BTreeSet::new();
        for asset in deb["assets"].as_array().expect("assets") {
            let a: Vec<&str> = asset
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let [source, dest, mode] = a[..] else {
                panic!("{package}: asset {asset:?} is not [source, dest, mode]");
            };
            assert!(mode.len() == 3 && mode.chars().all(|c| ('0'..='7').contains(&c)));
            let names: Vec<String> = if let Some(bin) = source.strip_prefix("target/release/") {
                assert!(
                    is_binary_of(dir, package, &bins, bin),
                    "{package}: {bin} is not a binary of the package"
                );
                vec![bin.to_string()]
            } else if let Some(pattern) = source.strip_suffix("*.toml") {
                let found: Vec<String> = std::fs::read_dir(base.join(pattern))
                    .unwrap()
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.ends_with(".toml"))
                    .collect();
                assert!(!found.is_empty(), "{package}: {source} matches nothing");
                found
            } else {
                assert!(
                    base.join(source).is_file(),
                    "{package}: {source} does not exist"
                );
                vec![Path::new(source)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into()]
            };
            for n in names {
                let file = if dest.ends_with('/') {
                    format!("{dest}{n}")
                } else {
                    dest.to_string()
                };
                assert!(files.insert(file.clone()), "{package}: {file} twice");
            }
        }
        let scripts = base.join(deb["maintainer-scripts"].as_str().unwrap());
        for e in std::fs::read_dir(&scripts).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            assert!(
                text.contains("#DEBHELPER#"),
                "{package}: a maintainer script without #DEBHELPER#"
            );
        }
        let units = base.join(deb["systemd-units"]["unit-scripts"].as_str().unwrap());
        assert!(
            units.join(format!("{package}.service")).is_file(),
            "{package}: no unit"
        );
        files.insert(format!("lib/systemd/system/{package}.service"));
        installed.push(files);
    }
    let both: Vec<_> = installed[0].intersection(&installed[1]).collect();
    assert!(
        both.is_empty(),
        "files in both packages (dpkg refuses the second): {both:?}"
    );
}

/// Names of an ELF64 (little-endian) file's sections.
fn elf_sections(bytes: &[u8]) -> Vec<String> {
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&bytes[..4], b"\x7fELF", "not ELF");
    assert_eq!(bytes[4], 2, "not ELF64");
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    (0..shnum)
        .map(|i| {
            let start = strtab + u32_at(header(i));
            let end = start + bytes[start..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8_lossy(&bytes[start..end]).into_owned()
        })
        .collect()
}

#[test]
fn release_binaries_carry_no_debug_info_but_keep_their_symbols() {
    let dir = gshare_tests::build_binaries();
    if dir.file_name().is_none_or(|n| n != "release") {
        println!(
            "not a release build ({}): the release profile is what ships",
            dir.display()
        );
        return;
    }
    for name in ["gshare-region", "gsharectl", "gshare-edge"] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let sections = elf_sections(&bytes);
        let debug: Vec<_> = sections
            .iter()
            .filter(|s| s.starts_with(".debug_"))
            .collect();
        assert!(
            debug.is_empty(),
            "{name}: {debug:?} ({} bytes)",
            bytes.len()
        );
        // Symbols stay, so a panic's backtrace names its functions.
        assert!(
            sections.iter().any(|s| s == ".symtab"),
            "{name}: {sections:?}"
        );
    }
}

//! A minimal writer of `newc` cpio archives (what the Linux kernel unpacks
//! as an initramfs; concatenated archives are unpacked in order, so a
//! per-function archive appended to the base image adds its files).
//!
//! Deterministic: entries in the order given, owner 0, mtime 0, inode
//! numbers counted from 1.

/// One entry of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir(String),
    /// A regular file: path, contents, executable.
    File(String, Vec<u8>, bool),
}

fn header(out: &mut Vec<u8>, ino: u32, mode: u32, nlink: u32, size: usize, name: &str) {
    // size and name length are bounded by the caller (u32 in the format).
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        u32::try_from(size).unwrap_or(u32::MAX),
        0,
        0,
        0,
        0,
        u32::try_from(name.len() + 1).unwrap_or(u32::MAX),
        0,
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad(out);
}

fn pad(out: &mut Vec<u8>) {
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

/// The archive of `entries` (with its trailer). Paths are written as
/// given (relative, e.g. `fn/run`). `None` if a file is 4 GiB or larger.
pub fn archive(entries: &[Entry]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let ino = u32::try_from(i + 1).ok()?;
        match e {
            Entry::Dir(name) => header(&mut out, ino, 0o040_755, 2, 0, name),
            Entry::File(name, data, exec) => {
                u32::try_from(data.len()).ok()?;
                let mode = if *exec { 0o100_755 } else { 0o100_644 };
                header(&mut out, ino, mode, 1, data.len(), name);
                out.extend_from_slice(data);
                pad(&mut out);
            }
        }
    }
    header(&mut out, 0, 0, 1, 0, "TRAILER!!!");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_newc_records_and_the_bytes_are_reproducible() {
        let entries = [
            Entry::Dir("fn".into()),
            Entry::File("fn/run".into(), b"exec true\n".to_vec(), false),
        ];
        let a = archive(&entries).unwrap();
        assert_eq!(a, archive(&entries).unwrap());
        assert_eq!(a.len() % 4, 0);
        assert!(a.starts_with(b"070701"));
        // Second record: inode 2, a 0644 file of 10 bytes named "fn/run".
        let second = 116; // header (110) + "fn\0", padded to a multiple of 4
        let h = std::str::from_utf8(&a[second..second + 110]).unwrap();
        assert_eq!(&h[6..14], "00000002");
        assert_eq!(&h[14..22], format!("{:08X}", 0o100_644));
        assert_eq!(&h[54..62], "0000000A");
        assert_eq!(&a[second + 110..second + 116], b"fn/run");
        let body = second + 120; // header + "fn/run\0", padded
        assert_eq!(&a[body..body + 10], b"exec true\n");
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}

//! The usage journal's write-ahead log: one preallocated file that a group
//! commit's records reach the disk through, without sled's flush.
//!
//! ```text
//!   append(group) ─▶ entry = header ‖ ops ‖ zeros to the next 4 KiB ─▶ one pwrite (O_DIRECT) at `offset`
//!                ─▶ ops applied to sled (no flush; with `m:wal_applied` = the entry's end) ─▶ durable
//!   log nearly full, or a write failed ─▶ checkpoint: sled flush ─▶ epoch + 1, applied 0 (flushed) ─▶ offset 0
//!   open ─▶ entries of the stored epoch after `m:wal_applied`, up to the first block without one ─▶ applied, flushed
//! ```
//!
//! Why: a sled flush hands its buffer to one of sled's IO threads and waits
//! for it (two thread hand-overs, then `sync_file_range`), and on a loaded
//! node each hand-over costs as much as the write. The group commit's
//! writer thread writes an entry itself, in one `pwrite` on a file opened
//! with `O_DIRECT` (the write returns once the device has the data; no
//! `unsafe` is needed for it, where `sync_file_range` has no safe binding).
//!
//! What is durable: the file is written full of zeros and synced when it is
//! made, so its blocks are allocated and an overwrite changes no metadata;
//! an `O_DIRECT` write then reaches the device before it returns. That is
//! the level sled's flush gives (`sync_file_range`: the data reaches the
//! device; neither flushes a volatile write cache in the device): a
//! returned append survives the agent's crash and the host's. With
//! [`WalSync::Dsync`] each write also flushes the device's cache (FUA), for
//! disks without power-loss protection.
//!
//! An entry (block-aligned): magic `GSJW` (u32), epoch (u64), payload length
//! (u32), CRC-32 of epoch ‖ length ‖ payload (u32), the payload (bincode 2:
//! the [`WalOp`]s of one group's sled batch), zeros to the next block. The
//! epoch changes at every checkpoint, so an older epoch's entries, still
//! in the file, are never read as new; a torn or partly written entry
//! fails its CRC and ends the log there (it had not returned, so nothing
//! was released on it).

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Entries start at multiples of this (the `O_DIRECT` alignment of offsets,
/// lengths and buffers).
pub(crate) const BLOCK: usize = 4096;
/// The log file's size (made at first open, full of zeros).
pub(crate) const CAPACITY: u64 = 16 << 20;
/// A checkpoint is taken before an entry that would end past this.
const CHECKPOINT_AT: u64 = CAPACITY - (CAPACITY >> 2);
const MAGIC: u32 = 0x4753_4a57;
const HEADER: usize = 20;
/// The file's name in the journal's directory.
pub(crate) const FILE_NAME: &str = "usage.wal";

/// One change to the journal's sled tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum WalOp {
    /// Insert `value` under `key`.
    Insert(Vec<u8>, Vec<u8>),
    /// Remove `key`.
    Remove(Vec<u8>),
}

/// How a write is made durable: `Direct` (`O_DIRECT`), `Dsync`
/// (`O_DIRECT | O_DSYNC`); `Sled` means no log (the journal flushes sled).
pub use gshare_core::config::JournalSync as WalSync;

/// Errors of the log.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// The file could not be made, read or written.
    #[error("usage log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// An entry's ops could not be encoded.
    #[error("usage log: cannot encode an entry: {0}")]
    Encode(String),
    /// A checksummed entry did not decode (written by another version?).
    #[error("usage log {path}: entry at {offset} does not decode: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the entry starts.
        offset: u64,
        /// Why.
        reason: String,
    },
}

/// Frames `ops` as an entry of `epoch` into `out` (cleared first): header,
/// payload, zeros to a whole number of blocks.
pub(crate) fn frame(epoch: u64, ops: &[WalOp], out: &mut Vec<u8>) -> Result<(), WalError> {
    out.clear();
    out.resize(HEADER, 0);
    bincode::serde::encode_into_std_write(ops, out, bincode::config::standard())
        .map_err(|e| WalError::Encode(e.to_string()))?;
    let len = u32::try_from(out.len() - HEADER)
        .map_err(|_| WalError::Encode("an entry over 4 GiB".into()))?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&epoch.to_le_bytes());
    crc.update(&len.to_le_bytes());
    crc.update(&out[HEADER..]);
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..12].copy_from_slice(&epoch.to_le_bytes());
    out[12..16].copy_from_slice(&len.to_le_bytes());
    out[16..20].copy_from_slice(&crc.finalize().to_le_bytes());
    out.resize(out.len().next_multiple_of(BLOCK), 0);
    Ok(())
}

/// The entries of `epoch` in `log` from offset `from` (a block boundary),
/// in order, each with the offset it ends at, up to the first block that
/// does not start one (zeros, another epoch, a torn entry, the end).
pub(crate) fn entries(log: &[u8], epoch: u64, from: u64) -> Vec<(u64, &[u8])> {
    let mut found = Vec::new();
    let Ok(mut at) = usize::try_from(from) else {
        return found;
    };
    while let Some(head) = log.get(at..at.saturating_add(HEADER)) {
        let u32_at =
            |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (magic, len_bytes, crc) = (
            u32_at(0),
            [head[12], head[13], head[14], head[15]],
            u32_at(16),
        );
        let mut e = [0u8; 8];
        e.copy_from_slice(&head[4..12]);
        let e = u64::from_le_bytes(e);
        let len = u32::from_le_bytes(len_bytes) as usize;
        if magic != MAGIC || e != epoch {
            break;
        }
        let start = at.saturating_add(HEADER);
        let Some(payload) = log.get(start..start.saturating_add(len)) else {
            break;
        };
        let mut h = crc32fast::Hasher::new();
        h.update(&epoch.to_le_bytes());
        h.update(&len_bytes);
        h.update(payload);
        if h.finalize() != crc {
            break;
        }
        at = start.saturating_add(len).next_multiple_of(BLOCK);
        found.push((at as u64, payload));
    }
    found
}

/// Decodes an entry's payload.
pub(crate) fn decode(payload: &[u8]) -> Result<Vec<WalOp>, String> {
    let config = bincode::config::standard().with_limit::<{ CAPACITY as usize }>();
    let (ops, used) =
        bincode::serde::decode_from_slice(payload, config).map_err(|e| e.to_string())?;
    if used != payload.len() {
        return Err(format!("{} bytes after the ops", payload.len() - used));
    }
    Ok(ops)
}

/// An entry found at open: the offset it ends at, and its ops.
pub(crate) type Replayed = (u64, Vec<WalOp>);

/// Where the next entry goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prepared {
    /// Before the checkpoint mark: [`Wal::write`] it.
    Fits,
    /// Past the mark: checkpoint, [`Wal::restart`], prepare it again.
    CheckpointFirst,
    /// Past the mark even in an empty log: write it another way.
    TooLarge,
}

/// The log: its file, the epoch and the offset of the next entry.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    epoch: u64,
    offset: u64,
    /// The framed entry, with room to start it on a block boundary of
    /// memory (`O_DIRECT` buffers must be aligned).
    buf: Vec<u8>,
    framed: Vec<u8>,
    /// Tests: the next write writes its entry, then fails.
    #[cfg(test)]
    pub(crate) fail_next_write: bool,
    /// Tests: the next write waits for a message (or the sender's drop)
    /// before it starts.
    #[cfg(test)]
    pub(crate) stall_next_write: Option<std::sync::mpsc::Receiver<()>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("path", &self.path)
            .field("epoch", &self.epoch)
            .field("offset", &self.offset)
            .finish()
    }
}

/// Whether an `O_DIRECT` overwrite of the log's blocks is on the device
/// when it returns, with no metadata to commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InPlace {
    /// ext4: blocks written and synced are overwritten in place.
    Yes,
    /// XFS: in place too, unless the file shares extents (a reflink copy,
    /// e.g. a restored backup): the log is made afresh at open.
    Reflink,
    /// Anything else (copy-on-write file systems, tmpfs, unknown): not
    /// known; writes are `O_DSYNC`.
    No,
}

fn direct_is_durable(dir: &Path) -> InPlace {
    const EXT4_SUPER_MAGIC: u64 = 0xEF53;
    const XFS_SUPER_MAGIC: u64 = 0x5846_5342;
    match rustix::fs::statfs(dir).map(|s| s.f_type as u64) {
        Ok(EXT4_SUPER_MAGIC) => InPlace::Yes,
        Ok(XFS_SUPER_MAGIC) => InPlace::Reflink,
        _ => InPlace::No,
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a file of `CAPACITY` zeros at `path` (through a temporary name,
/// synced, then renamed and the directory synced), so its blocks are
/// allocated before any entry is written.
fn make(dir: &Path, path: &Path) -> Result<(), WalError> {
    let tmp = dir.join(format!("{FILE_NAME}.new"));
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..CAPACITY / zeros.len() as u64 {
        f.write_all(&zeros).map_err(io(&tmp))?;
    }
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

impl Wal {
    /// The entries of `epoch` after offset `applied` in the log in `dir`,
    /// decoded, each with the offset it ends at (none when there is no log).
    pub(crate) fn read(dir: &Path, epoch: u64, applied: u64) -> Result<Vec<Replayed>, WalError> {
        let path = dir.join(FILE_NAME);
        let mut log = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut log).map_err(io(&path))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path)(e)),
        }
        let mut found = Vec::new();
        for (end, payload) in entries(&log, epoch, applied) {
            let framed = (HEADER + payload.len()).next_multiple_of(BLOCK) as u64;
            let ops = decode(payload).map_err(|reason| WalError::Corrupt {
                path: path.clone(),
                offset: end.saturating_sub(framed),
                reason,
            })?;
            found.push((end, ops));
        }
        Ok(found)
    }

    /// Opens the log in `dir` for writing at offset 0 of `epoch` (after the
    /// caller applied what [`Wal::read`] found and checkpointed): made, full
    /// of zeros, when there is none or it is not `CAPACITY` long (a crash
    /// while it was made leaves none: it is renamed into place whole; no
    /// version writes another size), and made afresh on a file system
    /// where an overwrite may need metadata (see [`direct_is_durable`]).
    /// `Err` with an `Io` error of kind `InvalidInput` when the file system
    /// does not take `O_DIRECT`: the caller goes without.
    ///
    /// `sync` = `Direct` writes `O_DIRECT` only where the file system
    /// overwrites allocated blocks in place (ext4, XFS); elsewhere (btrfs,
    /// ZFS, tmpfs, …) it writes as `Dsync`, whose writes are durable on any
    /// file system. (`Sled` is the caller's not to open one.)
    pub(crate) fn open(dir: &Path, epoch: u64, sync: WalSync) -> Result<Self, WalError> {
        let path = dir.join(FILE_NAME);
        let in_place = direct_is_durable(dir);
        match std::fs::metadata(&path) {
            // Whole and allocated (a copy made sparse, e.g. by a restore,
            // has holes, whose first write needs metadata).
            Ok(m)
                if m.len() == CAPACITY
                    && std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512)
                        >= CAPACITY
                    && in_place != InPlace::Reflink => {}
            Ok(_) => make(dir, &path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => make(dir, &path)?,
            Err(e) => return Err(io(&path)(e)),
        }
        let dsync = match (sync, in_place) {
            (WalSync::Dsync, _) | (_, InPlace::No) => true,
            (WalSync::Direct | WalSync::Sled, InPlace::Yes | InPlace::Reflink) => false,
        };
        if dsync && sync != WalSync::Dsync {
            tracing::warn!(
                "usage journal: {} is not on ext4 or XFS: its log is written O_DSYNC (journal_sync = \"dsync\")",
                dir.display()
            );
        }
        let mut options = OpenOptions::new();
        options.write(true).custom_flags(if dsync {
            libc::O_DIRECT | libc::O_DSYNC
        } else {
            libc::O_DIRECT
        });
        let file = options.open(&path).map_err(io(&path))?;
        Ok(Self {
            file,
            path,
            epoch,
            offset: 0,
            buf: Vec::new(),
            framed: Vec::new(),
            #[cfg(test)]
            fail_next_write: false,
            #[cfg(test)]
            stall_next_write: None,
        })
    }

    /// The epoch entries are written in.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Frames `ops` as the next entry, in the current epoch.
    pub(crate) fn prepare(&mut self, ops: &[WalOp]) -> Result<Prepared, WalError> {
        frame(self.epoch, ops, &mut self.framed)?;
        let len = self.framed.len() as u64;
        Ok(if len > CHECKPOINT_AT {
            Prepared::TooLarge
        } else if self.offset.saturating_add(len) > CHECKPOINT_AT {
            Prepared::CheckpointFirst
        } else {
            Prepared::Fits
        })
    }

    /// Writes the entry [`Wal::prepare`] framed (and found to fit) at the
    /// next offset; returns the offset it ends at. When this returns the
    /// entry is on the device.
    pub(crate) fn write(&mut self) -> Result<u64, WalError> {
        #[cfg(test)]
        if let Some(gate) = self.stall_next_write.take() {
            let _ = gate.recv();
        }
        let len = self.framed.len();
        let fits = self.offset.saturating_add(len as u64) <= CHECKPOINT_AT;
        if len < HEADER || self.framed[4..12] != self.epoch.to_le_bytes() || !fits {
            return Err(WalError::Encode(
                "no entry prepared for this epoch and offset".into(),
            ));
        }
        self.buf.resize(len + BLOCK, 0);
        let skew = self.buf.as_ptr() as usize % BLOCK;
        let at = (BLOCK - skew) % BLOCK;
        self.buf[at..at + len].copy_from_slice(&self.framed);
        self.file
            .write_all_at(&self.buf[at..at + len], self.offset)
            .map_err(io(&self.path))?;
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_write) {
            return Err(io(&self.path)(std::io::Error::other("injected")));
        }
        self.offset = self.offset.saturating_add(len as u64);
        Ok(self.offset)
    }

    /// Starts over at offset 0 in `epoch` (after a checkpoint made every
    /// entry so far durable elsewhere and stored `epoch`).
    pub(crate) fn restart(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.offset = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(n: usize) -> Vec<WalOp> {
        (0..n)
            .map(|i| WalOp::Insert(vec![b'r', i as u8], vec![7; 100]))
            .chain([WalOp::Remove(b"x1".to_vec())])
            .collect()
    }

    #[test]
    fn entries_are_read_back_in_order_until_a_block_without_one() {
        let mut log = vec![0u8; 8 * BLOCK];
        let mut framed = Vec::new();
        let mut at = 0;
        for n in [1, 3, 60] {
            frame(5, &ops(n), &mut framed).unwrap();
            assert_eq!(framed.len() % BLOCK, 0);
            log[at..at + framed.len()].copy_from_slice(&framed);
            at += framed.len();
        }
        // 60 × ~104 bytes spans two blocks.
        assert_eq!(at, 4 * BLOCK);
        let found = entries(&log, 5, 0);
        let ends: Vec<u64> = found.iter().map(|(e, _)| *e).collect();
        assert_eq!(ends, vec![BLOCK as u64, 2 * BLOCK as u64, 4 * BLOCK as u64]);
        assert_eq!(decode(found[1].1).unwrap(), ops(3));
        // From an entry's end: the rest.
        assert_eq!(entries(&log, 5, BLOCK as u64).len(), 2);
        // Another epoch's entries are not this one's.
        assert!(entries(&log, 6, 0).is_empty());
        // A torn entry (a byte of its payload lost) ends the log there.
        log[2 * BLOCK + HEADER + 10] ^= 1;
        assert_eq!(entries(&log, 5, 0).len(), 2);
        // An older epoch's entry after the current one's end is not read.
        let mut log = vec![0u8; 4 * BLOCK];
        frame(4, &ops(1), &mut framed).unwrap();
        log[BLOCK..2 * BLOCK].copy_from_slice(&framed);
        frame(5, &ops(1), &mut framed).unwrap();
        log[..BLOCK].copy_from_slice(&framed);
        assert_eq!(entries(&log, 5, 0).len(), 1);
    }

    #[test]
    fn a_log_is_made_full_of_zeros_and_written_through_o_direct() {
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap();
        let found = Wal::read(dir.path(), 1, 0).unwrap();
        let mut wal = match Wal::open(dir.path(), 1, WalSync::Direct) {
            Ok(w) => w,
            // A file system without O_DIRECT: nothing to test here.
            Err(WalError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::InvalidInput =>
            {
                return
            }
            Err(e) => panic!("{e}"),
        };
        assert!(found.is_empty());
        assert_eq!(
            std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len(),
            CAPACITY
        );
        assert_eq!(wal.prepare(&ops(2)).unwrap(), Prepared::Fits);
        assert_eq!(wal.write().unwrap(), BLOCK as u64);
        assert_eq!(wal.prepare(&ops(50)).unwrap(), Prepared::Fits);
        assert_eq!(wal.write().unwrap(), 3 * BLOCK as u64);
        drop(wal);
        let found = Wal::read(dir.path(), 1, 0).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[1], (3 * BLOCK as u64, ops(50)));
        // From the first's end, only the second; another epoch, none.
        assert_eq!(Wal::read(dir.path(), 1, BLOCK as u64).unwrap().len(), 1);
        assert!(Wal::read(dir.path(), 2, 0).unwrap().is_empty());
        let mut wal = Wal::open(dir.path(), 2, WalSync::Direct).unwrap();
        // An entry framed in one epoch is not written after a restart.
        assert_eq!(wal.prepare(&ops(1)).unwrap(), Prepared::Fits);
        wal.restart(3);
        assert!(wal.write().is_err());
        assert_eq!(wal.prepare(&ops(1)).unwrap(), Prepared::Fits);
        wal.write().unwrap();
        drop(wal);
        assert_eq!(Wal::read(dir.path(), 3, 0).unwrap().len(), 1);
        // Near the mark: a checkpoint first; too large for any log:
        // written another way.
        let mut wal = Wal::open(dir.path(), 4, WalSync::Direct).unwrap();
        let big = vec![WalOp::Insert(
            vec![1],
            vec![0; (CHECKPOINT_AT / 2) as usize],
        )];
        assert_eq!(wal.prepare(&big).unwrap(), Prepared::Fits);
        wal.write().unwrap();
        assert_eq!(wal.prepare(&big).unwrap(), Prepared::CheckpointFirst);
        let huge = vec![WalOp::Insert(vec![1], vec![0; CAPACITY as usize])];
        assert_eq!(wal.prepare(&huge).unwrap(), Prepared::TooLarge);
    }
}

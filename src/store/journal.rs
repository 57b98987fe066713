//! The write-ahead journal of the embedded store: segment files of framed
//! entries, made durable with one `fdatasync` per group commit.
//!
//! A segment is `journal-<generation>.log` in the data directory: an 8-byte
//! magic, then entries. An entry is its payload's length (u32, little
//! endian), the CRC-32 of the payload (u32, little endian), the segment's
//! generation (u64, little endian), then the payload (one activity record,
//! encoded by `store::codec`). A crash can leave a torn last entry; the
//! reader stops at the first entry that is short, fails its checksum or
//! names another generation, and says how many bytes it ignored. Nothing
//! after a torn entry was ever acknowledged, because a group is acknowledged
//! only after the `fdatasync` that covers all of it.
//!
//! # Recycled segments
//! A checkpointed segment is not deleted but renamed to [`SPARE`], and the
//! next segment is that file under its new name, written over from the
//! start. Writing over blocks the file already has leaves its size and
//! extents alone, so each group's `fdatasync` writes the data and nothing
//! else; appending to a growing file makes every `fdatasync` commit the
//! file system's journal as well (on ext4, about twice the latency of a
//! group commit). Past the last entry written since, a recycled file still
//! holds the entries of its earlier generation, each intact and in place:
//! the generation in every entry is what stops the reader there. A spare is
//! only ever one this process made: one left by an earlier run is deleted
//! at open ([`discard_spare`]).

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The first bytes of every segment.
const MAGIC: &[u8; 8] = b"rbjrnl02";
/// Bytes before an entry's payload in memory: length, then checksum. The
/// generation is added when the entry is written to a segment.
const FRAME: usize = 8;
/// Bytes before an entry's payload in a segment: length, checksum, then the
/// segment's generation.
const DISK_FRAME: usize = FRAME + 8;
/// The name of the checkpointed segment kept for the next one.
pub const SPARE: &str = "journal.spare";
/// No record comes near this; a larger length is a torn or corrupt frame.
const MAX_PAYLOAD: usize = 64 << 20;

/// The file name of segment `generation`.
pub fn segment_name(generation: u64) -> String {
    format!("journal-{generation:020}.log")
}

/// The segments in `dir`, oldest first, with their generations.
pub fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(generation) = name
            .to_str()
            .and_then(|n| n.strip_prefix("journal-"))
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        found.push((generation, entry.path()));
    }
    found.sort_unstable_by_key(|(generation, _)| *generation);
    Ok(found)
}

/// A buffer for one entry: room for the frame, then write the payload after
/// it and [`seal`] it.
pub fn open_frame(capacity: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(FRAME + capacity);
    buf.extend_from_slice(&[0; FRAME]);
    buf
}

/// Fills in the frame of a buffer from [`open_frame`] once its payload is
/// written: the buffer is then one entry, ready to append.
pub fn seal(entry: &mut [u8]) {
    let (header, payload) = entry.split_at_mut(FRAME);
    let len = u32::try_from(payload.len()).expect("a record is far below 4 GiB");
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
}

/// One sealed entry: `write` appends the payload to a buffer the calling
/// thread reuses, and the entry is copied out at its exact size. An entry is
/// held in memory until its checkpoint, so it should carry no spare room
/// (a buffer sized by guess, 1 KiB, held about twice the 0.58 KiB that
/// entries of a durable load average).
pub fn entry(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        buf.extend_from_slice(&[0; FRAME]);
        write(buf);
        seal(buf);
        let entry = buf.as_slice().to_vec();
        if buf.capacity() > SCRATCH_KEPT {
            // One unusually large record does not keep its buffer.
            *buf = Vec::new();
        }
        entry
    })
}

thread_local! {
    /// The buffer [`entry`] encodes into, one a thread.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The largest buffer [`entry`] keeps between calls.
const SCRATCH_KEPT: usize = 64 << 10;

/// The payload of a sealed entry.
pub fn payload(entry: &[u8]) -> &[u8] {
    &entry[FRAME..]
}

/// What a segment held.
#[derive(Debug, Default)]
pub struct Contents {
    /// The payloads of its intact entries, in order.
    pub payloads: Vec<Vec<u8>>,
    /// Bytes after the last intact entry, ignored.
    pub ignored_bytes: usize,
    /// Whether those bytes begin with an entry of this segment that is short
    /// or fails its checksum: a torn write, from a group whose `fdatasync`
    /// never returned. Otherwise they are what a recycled file held before,
    /// or nothing.
    pub torn: bool,
}

/// Reads segment `generation`. A file shorter than the magic (created, then
/// the crash came before its first write was synced) holds nothing.
///
/// # Errors
/// An I/O error, or `InvalidData` when the file is not a journal segment.
pub fn read(path: &Path, generation: u64) -> io::Result<Contents> {
    let bytes = std::fs::read(path)?;
    if bytes.len() < MAGIC.len() {
        return Ok(Contents {
            payloads: Vec::new(),
            ignored_bytes: bytes.len(),
            torn: false,
        });
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a retry-budget journal segment", path.display()),
        ));
    }
    let mut contents = Contents::default();
    let mut at = MAGIC.len();
    loop {
        let Some(header) = bytes.get(at..at + DISK_FRAME) else {
            contents.torn = at < bytes.len();
            break;
        };
        if header[FRAME..] != generation.to_le_bytes() {
            // An entry of the generation this file held before it was
            // recycled (or zeros): the end of this one.
            break;
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let payload = bytes
            .get(at + DISK_FRAME..at + DISK_FRAME + len)
            .filter(|p| !p.is_empty() && len <= MAX_PAYLOAD && crc32fast::hash(p) == crc);
        let Some(payload) = payload else {
            contents.torn = true;
            break;
        };
        contents.payloads.push(payload.to_vec());
        at += DISK_FRAME + len;
    }
    contents.ignored_bytes = bytes.len() - at;
    Ok(contents)
}

/// Deletes a [`SPARE`] left in `dir` by an earlier run. Generations start
/// again at 1 when no segment is left, so an earlier run's spare may hold
/// entries of the very generation it would be recycled as; only a spare
/// made by this run, whose entries are all of older generations, is safe to
/// write over.
///
/// # Errors
/// An I/O error other than the spare being missing.
pub fn discard_spare(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(SPARE)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        removed => removed.and_then(|()| sync_dir(dir)),
    }
}

/// The segment being written.
#[derive(Debug)]
pub struct Segment {
    file: File,
    generation: u64,
    path: PathBuf,
    bytes: u64,
}

impl Segment {
    /// Creates segment `generation` in `dir`, writes its magic, and makes the
    /// file and its name durable (the data directory is synced).
    ///
    /// # Errors
    /// An I/O error; the segment may then exist but holds nothing.
    pub fn create(dir: &Path, generation: u64) -> io::Result<Self> {
        let path = dir.join(segment_name(generation));
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)?;
        file.write_all(MAGIC)?;
        file.sync_all()?;
        sync_dir(dir)?;
        Ok(Self::empty(file, generation, path))
    }

    /// Makes the [`SPARE`] in `dir` segment `generation`: renames it (never
    /// over an existing segment) and makes the new name durable. Its old
    /// entries stay until written over; the reader stops at the first, which
    /// names an older generation.
    ///
    /// # Errors
    /// An I/O error. When opening or renaming the spare fails, nothing
    /// changed.
    pub fn recycle(dir: &Path, generation: u64) -> io::Result<Self> {
        let spare = dir.join(SPARE);
        let path = dir.join(segment_name(generation));
        let file = OpenOptions::new().write(true).open(&spare)?;
        rename_no_replace(&spare, &path)?;
        sync_dir(dir)?;
        Ok(Self::empty(file, generation, path))
    }

    /// A segment whose file holds the magic and no entry of `generation`.
    fn empty(file: File, generation: u64, path: PathBuf) -> Self {
        Self {
            file,
            generation,
            path,
            bytes: MAGIC.len() as u64,
        }
    }

    /// Appends sealed entries (from [`entry`] or [`seal`]), framed with the
    /// segment's generation in `framed` (a buffer the caller reuses), and
    /// returns once they are durable.
    ///
    /// # Errors
    /// An I/O error. After a failed `fdatasync` the file's state is unknown:
    /// the caller must stop writing to it.
    pub fn append<'a>(
        &mut self,
        entries: impl IntoIterator<Item = &'a [u8]>,
        framed: &mut Vec<u8>,
    ) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        framed.clear();
        let generation = self.generation.to_le_bytes();
        for entry in entries {
            let (header, payload) = entry.split_at(FRAME);
            framed.extend_from_slice(header);
            framed.extend_from_slice(&generation);
            framed.extend_from_slice(payload);
        }
        self.file.write_all_at(framed, self.bytes)?;
        self.file.sync_data()?;
        self.bytes += framed.len() as u64;
        Ok(())
    }

    /// The segment's generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The segment's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far, magic included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether no entry was appended yet.
    pub fn is_empty(&self) -> bool {
        self.bytes <= MAGIC.len() as u64
    }
}

/// Renames `from` to `to`, failing with `AlreadyExists` if `to` exists.
#[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    Ok(renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE)?)
}

/// Renames `from` to `to`, failing with `AlreadyExists` if `to` exists: a
/// new link (which never replaces), then the old name removed.
#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)
}

/// Makes the creation or removal of files in `dir` durable.
///
/// # Errors
/// An I/O error.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_segment(dir: &Path, generation: u64, payloads: &[&[u8]]) -> Segment {
        let mut segment = Segment::create(dir, generation).unwrap();
        append(&mut segment, payloads);
        segment
    }

    fn append(segment: &mut Segment, payloads: &[&[u8]]) {
        let entries: Vec<Vec<u8>> = payloads
            .iter()
            .map(|p| {
                let mut entry = open_frame(p.len());
                entry.extend_from_slice(p);
                seal(&mut entry);
                assert_eq!(payload(&entry), *p);
                entry
            })
            .collect();
        segment
            .append(entries.iter().map(Vec::as_slice), &mut Vec::new())
            .unwrap();
    }

    #[test]
    fn built_entries_are_sealed_at_their_exact_size() {
        let sealed = |payload: &[u8]| {
            let mut entry = open_frame(payload.len());
            entry.extend_from_slice(payload);
            seal(&mut entry);
            entry
        };
        let small = entry(|buf| buf.extend_from_slice(b"small"));
        assert_eq!(small, sealed(b"small"));
        assert_eq!(small.capacity(), small.len(), "no spare room is held");

        // An entry larger than the kept buffer leaves nothing behind for
        // the next one.
        let big = vec![7u8; SCRATCH_KEPT + 1];
        let large = entry(|buf| buf.extend_from_slice(&big));
        assert_eq!(large, sealed(&big));
        let after = entry(|buf| buf.extend_from_slice(b"after"));
        assert_eq!(after, sealed(b"after"));
        let kept = SCRATCH.with_borrow(Vec::capacity);
        assert!(kept <= SCRATCH_KEPT, "the large buffer was let go: {kept}");
    }

    #[test]
    fn entries_round_trip_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let segment = write_segment(dir.path(), 7, &[b"one", b"two", b"{\"x\":3}"]);
        assert_eq!(segment.bytes(), 8 + 3 * 16 + 3 + 3 + 7);
        let contents = read(segment.path(), 7).unwrap();
        assert_eq!(
            contents.payloads,
            vec![b"one".to_vec(), b"two".to_vec(), b"{\"x\":3}".to_vec()]
        );
        assert_eq!(contents.ignored_bytes, 0);
        assert!(!contents.torn);
    }

    /// A recycled file still holds its earlier generation's entries, intact
    /// and in place: the reader must stop at them. The new entry is the same
    /// size as the old first one, so the old second entry sits exactly where
    /// a new one would, its checksum good.
    #[test]
    fn a_recycled_segment_ends_where_its_new_entries_end() {
        let dir = tempfile::tempdir().unwrap();
        let old = write_segment(dir.path(), 1, &[b"first", b"second", b"third"]);
        let old_bytes = old.bytes();
        std::fs::rename(old.path(), dir.path().join(SPARE)).unwrap();

        let mut segment = Segment::recycle(dir.path(), 2).unwrap();
        assert!(segment.is_empty());
        assert!(!dir.path().join(SPARE).exists());
        let contents = read(segment.path(), 2).unwrap();
        assert!(contents.payloads.is_empty());
        assert_eq!(contents.ignored_bytes as u64, old_bytes - 8);
        assert!(!contents.torn, "old entries are not a torn write");

        append(&mut segment, &[b"FIRST"]);
        let contents = read(segment.path(), 2).unwrap();
        assert_eq!(contents.payloads, vec![b"FIRST".to_vec()]);
        assert!(!contents.torn);
        assert_eq!(
            std::fs::metadata(segment.path()).unwrap().len(),
            old_bytes,
            "written over, not grown"
        );
    }

    #[test]
    fn a_spare_never_replaces_a_segment() {
        let dir = tempfile::tempdir().unwrap();
        let kept = write_segment(dir.path(), 2, &[b"kept"]);
        let spare = write_segment(dir.path(), 1, &[b"spare"]);
        std::fs::rename(spare.path(), dir.path().join(SPARE)).unwrap();
        let refused = Segment::recycle(dir.path(), 2).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::AlreadyExists);
        assert!(
            dir.path().join(SPARE).exists(),
            "the spare is left as it was"
        );
        assert_eq!(
            read(kept.path(), 2).unwrap().payloads,
            vec![b"kept".to_vec()]
        );
    }

    #[test]
    fn an_earlier_runs_spare_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        discard_spare(dir.path()).expect("none there is fine");
        std::fs::write(dir.path().join(SPARE), MAGIC).unwrap();
        discard_spare(dir.path()).unwrap();
        assert!(!dir.path().join(SPARE).exists());
    }

    #[test]
    fn a_torn_tail_is_ignored_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let segment = write_segment(dir.path(), 1, &[b"kept", b"torn-entry"]);
        let full = std::fs::read(segment.path()).unwrap();
        for cut in 1..(16 + 10) {
            std::fs::write(segment.path(), &full[..full.len() - cut]).unwrap();
            let contents = read(segment.path(), 1).unwrap();
            assert_eq!(contents.payloads, vec![b"kept".to_vec()], "cut {cut}");
            assert_eq!(contents.ignored_bytes, 16 + 10 - cut, "cut {cut}");
            assert!(contents.torn, "cut {cut}");
        }
    }

    #[test]
    fn a_corrupt_entry_ends_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let segment = write_segment(dir.path(), 1, &[b"kept", b"flipped", b"after"]);
        let mut bytes = std::fs::read(segment.path()).unwrap();
        let flipped = 8 + 16 + 4 + 16; // the first payload byte of "flipped"
        bytes[flipped] ^= 0x20;
        std::fs::write(segment.path(), &bytes).unwrap();
        let contents = read(segment.path(), 1).unwrap();
        assert_eq!(contents.payloads, vec![b"kept".to_vec()]);
        assert_eq!(contents.ignored_bytes, 16 + 7 + 16 + 5);
        assert!(contents.torn);
    }

    #[test]
    fn an_empty_or_foreign_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join(segment_name(3));
        std::fs::write(&empty, b"rbj").unwrap();
        let contents = read(&empty, 3).unwrap();
        assert!(contents.payloads.is_empty());
        assert_eq!((contents.ignored_bytes, contents.torn), (3, false));
        std::fs::write(&empty, b"not a journal at all").unwrap();
        assert_eq!(
            read(&empty, 3).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn segments_are_listed_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        for generation in [12, 3, 100] {
            Segment::create(dir.path(), generation).unwrap();
        }
        std::fs::write(dir.path().join("journal-x.log"), b"").unwrap();
        std::fs::write(dir.path().join("retry-budget.redb"), b"").unwrap();
        let found: Vec<u64> = segments(dir.path())
            .unwrap()
            .into_iter()
            .map(|(g, _)| g)
            .collect();
        assert_eq!(found, vec![3, 12, 100]);
        assert!(
            Segment::create(dir.path(), 12).is_err(),
            "never reuses a segment"
        );
    }
}

//! The write-ahead log that makes a group commit durable: one record per commit, appended
//! to a segment file and made durable with one `fdatasync`, on the writer's own thread.
//!
//! sled makes a batch durable with `flush`, which hands the write to sled's IO threadpool
//! and wakes all seven of its threads for every flush: under load that was a third of the
//! server's CPU and most of an append's latency. So the writer applies each commit to sled
//! without flushing it, and makes it durable here instead; sled is flushed only at a
//! checkpoint, once a segment is full, after which that segment is deleted. Opening the
//! log applies what the segments hold to sled again first (the same keys and bytes, so a
//! commit that sled had already stored is written over with itself).
//!
//! A segment is `wal/<number>.wal`, a run of records: the payload's length and a CRC-32 of
//! the segment's number and the payload (both little endian `u32`), then the payload: each
//! event's 32-byte key, its value's length (`u32`) and the value. A record is one commit,
//! so a commit is recovered whole or not at all; reading stops at the first record that is
//! short or does not match its checksum (the tail of a write a crash cut), and that tail is
//! cut off before anything is appended after it.
//!
//! A segment is filled with zeros ahead of its records, [`FILL`] bytes at a time, and each
//! record is written over them in place. `fdatasync` after a write that grows a file must
//! also write the inode (its new length); after one inside the file's length it writes the
//! record alone. Measured on this machine's ext4 (5 KB records): 150 µs a sync when
//! appending, 95 µs when writing in place, the fill included. Zeros after the last record
//! read as the end of the segment: a record's length is never zero.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A segment this long is checkpointed (sled flushed) and a new one started, by default.
pub(super) const SEGMENT_BYTES: u64 = 64 << 20;
/// A segment is filled with zeros this far ahead of its records at a time.
const FILL: u64 = 1 << 20;
const HEADER: usize = 8;
const KEY: usize = 32;

/// The log's directory inside the data dir.
pub(super) fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("wal")
}

/// Why a record was not appended.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failed {
    /// Not written, and the log is as it was: a later record may succeed.
    #[error("the write-ahead log could not take the commit: {0}")]
    Refused(io::Error),
    /// The log may hold part of the record: nothing may be appended after it.
    #[error("the write-ahead log failed and could not be mended: {0}")]
    Broken(io::Error),
}

/// The segment being appended to.
pub(super) struct Wal {
    dir: PathBuf,
    file: File,
    segment: u64,
    /// Where the next record goes: the end of the last one.
    written: u64,
    /// How far the segment is filled with zeros (its length).
    filled: u64,
    /// How long a segment grows before it is full.
    limit: u64,
    record: Vec<u8>,
}

/// A recovered commit: each event's key and stored value.
pub(super) type Commit = Vec<([u8; KEY], Vec<u8>)>;

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.wal"))
}

/// The segments in `dir`, oldest first.
pub(super) fn segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let name = entry?.file_name();
                let number = name.to_str().and_then(|n| n.strip_suffix(".wal")).and_then(|n| n.parse::<u64>().ok());
                if let Some(number) = number {
                    found.push(number);
                }
            }
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    found.sort_unstable();
    Ok(found)
}

fn checksum(segment: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&segment.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// What a segment holds.
struct Contents {
    commits: Vec<Commit>,
    /// The length of the valid prefix: the end of the last whole record.
    valid: u64,
    /// Whether anything but the fill's zeros follows it: the end of a write a crash cut
    /// short, or damage.
    torn: bool,
    /// The file's length, fill included.
    len: u64,
}

fn read_segment(path: &Path, segment: u64) -> io::Result<Contents> {
    let bytes = fs::read(path)?;
    let (commits, valid) = parse(&bytes, segment);
    let torn = bytes[valid as usize..].iter().any(|&byte| byte != 0);
    Ok(Contents { commits, valid, torn, len: bytes.len() as u64 })
}

/// Appends one commit's record to `record`.
fn encode<'a>(record: &mut Vec<u8>, segment: u64, events: impl Iterator<Item = (&'a [u8; KEY], &'a [u8])>) {
    let start = record.len();
    record.extend_from_slice(&[0; HEADER]);
    for (key, value) in events {
        record.extend_from_slice(key);
        record.extend_from_slice(&(value.len() as u32).to_le_bytes());
        record.extend_from_slice(value);
    }
    let len = (record.len() - start - HEADER) as u32;
    let crc = checksum(segment, &record[start + HEADER..]);
    record[start..start + 4].copy_from_slice(&len.to_le_bytes());
    record[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// The commits a segment's bytes hold, and the length of their valid prefix.
fn parse(bytes: &[u8], segment: u64) -> (Vec<Commit>, u64) {
    let mut commits = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else { break };
        if len == 0 || checksum(segment, payload) != crc {
            break;
        }
        let Some(commit) = decode(payload) else { break };
        commits.push(commit);
        at += HEADER + len;
    }
    (commits, at as u64)
}

fn decode(mut payload: &[u8]) -> Option<Commit> {
    let mut commit = Vec::new();
    while !payload.is_empty() {
        let key: [u8; KEY] = payload.get(..KEY)?.try_into().ok()?;
        let len = u32::from_le_bytes(payload.get(KEY..KEY + 4)?.try_into().ok()?) as usize;
        let value = payload.get(KEY + 4..KEY + 4 + len)?.to_vec();
        commit.push((key, value));
        payload = &payload[KEY + 4 + len..];
    }
    Some(commit)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Every commit the segments in `dir` hold, oldest first, without changing them (for a log
/// opened to read).
pub(super) fn read_all(dir: &Path) -> io::Result<Vec<Commit>> {
    let mut all = Vec::new();
    for segment in segments(dir)? {
        all.extend(read_segment(&segment_path(dir, segment), segment)?.commits);
    }
    Ok(all)
}

impl Wal {
    /// Opens the log in `dir` for appending: hands every commit its segments hold to
    /// `replay`, oldest first, then starts a new segment after them. The old segments stay
    /// until [`remove_through`] is called for them (once `replay`'s writes are durable).
    ///
    /// Only the end of the last write can be torn (a segment is synced before the next one
    /// is made): a damaged record followed by commits in a later segment is damage, not a
    /// crash, and opening fails rather than skip what it cannot read.
    pub fn open(
        dir: &Path,
        limit: u64,
        mut replay: impl FnMut(Commit) -> io::Result<()>,
    ) -> io::Result<(Wal, Option<u64>)> {
        if !dir.exists() {
            fs::create_dir_all(dir)?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let existing = segments(dir)?;
        for (i, &segment) in existing.iter().enumerate() {
            let path = segment_path(dir, segment);
            let Contents { commits, valid, torn, len } = read_segment(&path, segment)?;
            if torn {
                for &later in &existing[i + 1..] {
                    if !read_segment(&segment_path(dir, later), later)?.commits.is_empty() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "the write-ahead log {} is damaged at byte {valid} of {len}, and later segments \
                                 hold commits: refusing to replay past the damage",
                                path.display()
                            ),
                        ));
                    }
                }
                // The end of a write a crash cut short: cut off, so nothing is read past it.
                tracing::warn!(segment, bytes = len - valid, "cutting off the torn end of the write-ahead log");
                let file = OpenOptions::new().write(true).open(&path)?;
                file.set_len(valid)?;
                file.sync_all()?;
            }
            for commit in commits {
                replay(commit)?;
            }
        }
        let last = existing.last().copied();
        let wal = Wal::create(dir, last.map_or(1, |n| n + 1), limit)?;
        Ok((wal, last))
    }

    fn create(dir: &Path, segment: u64, limit: u64) -> io::Result<Wal> {
        let file = OpenOptions::new().create_new(true).write(true).open(segment_path(dir, segment))?;
        sync_dir(dir)?;
        Ok(Wal { dir: dir.to_path_buf(), file, segment, written: 0, filled: 0, limit, record: Vec::new() })
    }

    /// Appends one commit (of at least one event: an empty record would read as the end)
    /// and makes it durable. A record that cannot be written or synced (a full disk, a
    /// failing device) is cut off again, so that the log ends where it did and later
    /// records follow the last good one: [`Failed::Refused`]. If even that fails, the log
    /// can take nothing more: [`Failed::Broken`].
    pub fn append<'a>(&mut self, events: impl Iterator<Item = (&'a [u8; KEY], &'a [u8])>) -> Result<(), Failed> {
        self.record.clear();
        encode(&mut self.record, self.segment, events);
        let end = self.written + self.record.len() as u64;
        if end > self.filled {
            let to = end.next_multiple_of(FILL);
            if let Err(error) = self.fill(to) {
                return Err(self.cut(error));
            }
        }
        if let Err(error) = self.file.write_all_at(&self.record, self.written).and_then(|()| self.file.sync_data()) {
            return Err(self.cut(error));
        }
        self.written = end;
        Ok(())
    }

    /// Fills the segment with zeros up to `to`, from a static buffer: a megabyte allocated
    /// and freed would raise glibc's threshold for serving allocations from fresh mappings,
    /// and the server would keep more memory after large requests (the hostile-subscriber
    /// test's server grew by 53-57 MB instead of 32).
    fn fill(&mut self, to: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while self.filled < to {
            let len = (to - self.filled).min(ZEROS.len() as u64);
            self.file.write_all_at(&ZEROS[..len as usize], self.filled)?;
            self.filled += len;
        }
        Ok(())
    }

    /// After a failed append: cuts the segment off at the end of its last record, fill and
    /// all (which frees what a full disk needs), so that it ends where it did.
    fn cut(&mut self, error: io::Error) -> Failed {
        self.filled = self.written;
        match self.file.set_len(self.written).and_then(|()| self.file.sync_all()) {
            Ok(()) => Failed::Refused(error),
            Err(undo) => Failed::Broken(io::Error::other(format!("{error}; cutting it off again: {undo}"))),
        }
    }

    /// The bytes free for an unprivileged writer on the log's file system.
    pub fn free_bytes(&self) -> io::Result<u64> {
        let stat = rustix::fs::fstatvfs(&self.file)?;
        Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    /// Whether the segment is long enough to be checkpointed.
    pub fn full(&self) -> bool {
        self.written >= self.limit
    }

    /// Starts the next segment; answers the one just ended, which may be removed once
    /// everything applied so far is durable in sled.
    pub fn rotate(&mut self) -> io::Result<u64> {
        let ended = self.segment;
        *self = Wal::create(&self.dir, ended + 1, self.limit)?;
        Ok(ended)
    }

    /// Ends the log once everything it holds is durable elsewhere (a clean close): the older
    /// segments go and the current one is emptied but kept, so that the next open numbers
    /// its segments after it and a number is never used twice.
    pub fn retire(self) -> io::Result<()> {
        if let Some(before) = self.segment.checked_sub(1) {
            remove_through(&self.dir, before)?;
        }
        self.file.set_len(0)?;
        self.file.sync_all()
    }
}

/// The bytes the segments in `dir` take on disk: their records, and the zeros filled ahead
/// of them.
pub(super) fn len(dir: &Path) -> io::Result<u64> {
    segments(dir)?.into_iter().map(|s| fs::metadata(segment_path(dir, s)).map(|m| m.len())).sum()
}

/// Removes the segments numbered up to `last` in `dir`: what they hold is durable in sled.
pub(super) fn remove_through(dir: &Path, last: u64) -> io::Result<()> {
    for segment in segments(dir)?.into_iter().filter(|&s| s <= last) {
        fs::remove_file(segment_path(dir, segment))?;
    }
    sync_dir(dir)
}

/// The fuzz target's property (`fuzz/fuzz_targets/wal.rs`): commits made from `data` are
/// written as records, the bytes are then cut short or have one bit flipped where `data`
/// says, and reading them back gives exactly the commits wholly before the damage, never
/// part of one or one that was not written.
pub fn recovers_the_commits_before_any_damage(data: &[u8]) {
    let Some((&[segment, damage, at_low, at_high], mut data)) = data.split_first_chunk::<4>() else { return };
    let segment = u64::from(segment);
    // Commits of 1 to 4 events; each event a length byte and that many bytes of value.
    let mut commits: Commit = Vec::new();
    let mut written: Vec<Commit> = Vec::new();
    while let Some((&count, rest)) = data.split_first() {
        data = rest;
        for _ in 0..=(count % 4) {
            let Some((&len, rest)) = data.split_first() else { break };
            let value = &rest[..rest.len().min(usize::from(len))];
            commits.push(([len; KEY], value.to_vec()));
            data = &rest[value.len()..];
        }
        if !commits.is_empty() {
            written.push(std::mem::take(&mut commits));
        }
    }
    let mut bytes = Vec::new();
    let mut ends = Vec::new();
    for commit in &written {
        encode(&mut bytes, segment, commit.iter().map(|(key, value)| (key, value.as_slice())));
        ends.push(bytes.len());
    }
    let at = usize::from(u16::from_le_bytes([at_low, at_high])) % (bytes.len() + 1);
    let kept = match damage % 3 {
        0 => {
            bytes.truncate(at);
            at
        }
        1 if at < bytes.len() => {
            bytes[at] ^= 1 << (damage % 8);
            at
        }
        _ => bytes.len(),
    };
    let whole = ends.iter().take_while(|end| **end <= kept).count();
    let (read, valid) = parse(&bytes, segment);
    assert_eq!(read, written[..whole], "reading back after damage at byte {kept}");
    assert_eq!(valid, ends[..whole].last().map_or(0, |end| *end as u64));
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Wal {
        fn segment(&self) -> u64 {
            self.segment
        }
    }

    fn key(n: u8) -> [u8; KEY] {
        [n; KEY]
    }

    fn replayed(dir: &Path) -> Vec<Commit> {
        let mut seen = Vec::new();
        let (_, _) = Wal::open(dir, SEGMENT_BYTES, |commit| {
            seen.push(commit);
            Ok(())
        })
        .unwrap();
        seen
    }

    #[test]
    fn commits_come_back_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, last) = Wal::open(dir.path(), SEGMENT_BYTES, |_| panic!("nothing to replay")).unwrap();
        assert_eq!(last, None);
        wal.append([(&key(1), &b"one"[..]), (&key(2), &b"two"[..])].into_iter()).unwrap();
        wal.append([(&key(3), &b""[..])].into_iter()).unwrap();
        // Written over zeros filled ahead of them, which read as the segment's end.
        let path = segment_path(dir.path(), wal.segment());
        assert_eq!((wal.written, fs::metadata(&path).unwrap().len()), ((2 * HEADER + 3 * (KEY + 4) + 6) as u64, FILL));
        let seen = replayed(dir.path());
        assert_eq!(seen, vec![vec![(key(1), b"one".to_vec()), (key(2), b"two".to_vec())], vec![(key(3), Vec::new())]]);
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_never_read_past() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), SEGMENT_BYTES, |_| Ok(())).unwrap();
        wal.append([(&key(1), &b"kept"[..])].into_iter()).unwrap();
        wal.append([(&key(2), &b"torn"[..])].into_iter()).unwrap();
        let path = segment_path(dir.path(), wal.segment());
        // The last record's last three bytes never reached the disk (the fill's zeros are
        // there instead).
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0; 3], wal.written - 3).unwrap();
        assert_eq!(replayed(dir.path()), vec![vec![(key(1), b"kept".to_vec())]]);
        // The cut is permanent: a record appended later in a new segment is not mistaken
        // for the torn one's continuation.
        assert_eq!(fs::metadata(&path).unwrap().len(), wal.written - (HEADER + KEY + 4 + 4) as u64);
    }

    #[test]
    fn a_flipped_byte_ends_the_segment_there() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), SEGMENT_BYTES, |_| Ok(())).unwrap();
        wal.append([(&key(1), &b"first"[..])].into_iter()).unwrap();
        wal.append([(&key(2), &b"second"[..])].into_iter()).unwrap();
        let path = segment_path(dir.path(), wal.segment());
        let mut bytes = fs::read(&path).unwrap();
        let last = wal.written as usize - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert_eq!(replayed(dir.path()), vec![vec![(key(1), b"first".to_vec())]]);
    }

    #[test]
    fn rotated_segments_replay_in_order_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), SEGMENT_BYTES, |_| Ok(())).unwrap();
        wal.append([(&key(1), &b"a"[..])].into_iter()).unwrap();
        let ended = wal.rotate().unwrap();
        wal.append([(&key(2), &b"b"[..])].into_iter()).unwrap();
        // The first segment's fill after its record is not damage before the second's.
        assert_eq!(replayed(dir.path()).len(), 2);
        remove_through(dir.path(), ended).unwrap();
        assert_eq!(replayed(dir.path()), vec![vec![(key(2), b"b".to_vec())]]);
        assert_eq!(read_all(dir.path()).unwrap(), vec![vec![(key(2), b"b".to_vec())]]);
    }

    #[test]
    fn damage_before_later_commits_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), SEGMENT_BYTES, |_| Ok(())).unwrap();
        wal.append([(&key(1), &b"first"[..])].into_iter()).unwrap();
        let damaged = segment_path(dir.path(), wal.segment());
        wal.rotate().unwrap();
        wal.append([(&key(2), &b"second"[..])].into_iter()).unwrap();
        let mut bytes = fs::read(&damaged).unwrap();
        bytes[HEADER + 1] ^= 1;
        fs::write(&damaged, bytes).unwrap();
        let error = Wal::open(dir.path(), SEGMENT_BYTES, |_| Ok(())).err().expect("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("damaged at byte 0"), "{error}");
    }

    #[test]
    fn a_retired_log_replays_nothing_and_never_reuses_a_number() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), SEGMENT_BYTES, |_| Ok(())).unwrap();
        wal.append([(&key(1), &b"a"[..])].into_iter()).unwrap();
        wal.rotate().unwrap();
        wal.append([(&key(2), &b"b"[..])].into_iter()).unwrap();
        let last = wal.segment();
        wal.retire().unwrap();
        assert_eq!(len(dir.path()).unwrap(), 0);
        let (wal, ended) = Wal::open(dir.path(), SEGMENT_BYTES, |_| panic!("nothing to replay")).unwrap();
        assert_eq!((ended, wal.segment()), (Some(last), last + 1));
    }
}

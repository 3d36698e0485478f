//! The prefix cache's second tier: KV blocks kept on disk, so a prompt's prefix outlives
//! its eviction from the pool, and the process.
//!
//! - **Layout.** `DIR/<model>/<kv dtype>-<block size>/<key>.kvb`, one file per block, named
//!   by its chain key ([`crate::blocks::chain_key`]: the whole token prefix up to the
//!   block's end). `<model>` is the model's identity (a hash of its graph and weights, made
//!   by the caller), so another model's or version's blocks are never read. A file repeats
//!   the block layout, holds the whole token prefix and a checksum: it is used only when its
//!   tokens are the prompt's and its bytes are whole; one that fails the check is removed.
//! - **Writes** go through a writer thread: the step copies a settled block into a reused
//!   buffer (the file's image) and goes on. The thread writes a temporary file and renames
//!   it, so a crash leaves no half block under a block's name, and replicas sharing the
//!   directory never read one. When the thread falls behind, blocks are dropped, not queued
//!   without bound.
//! - **Reads** happen on the caller's thread, into one reused buffer, checked whole first.
//! - **Budget.** The directory is kept under its budget by removing the least recently used
//!   files, unmarked before marked ones ([`DiskCache::store`]'s `kept`); use is the file's
//!   modification time, set on every read, so it survives restarts. Files that other
//!   processes wrote are counted when the directory is scanned: at start, and again (at
//!   most every few seconds) when the budget is crossed.
//! - **Failure.** A directory that cannot be written (read-only, full, removed) prints one
//!   warning and turns writes off; the RAM tier goes on alone.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use crate::{KvDtype, RuntimeError};

const MAGIC: &[u8; 8] = b"oxkvblk1";
/// magic, layout, token count, flags, payload length, checksum.
const HEADER: usize = 8 + 8 + 4 + 4 + 8 + 8;
const FLAG_KEPT: u32 = 1;
/// Bytes of block images waiting for the writer; past this, blocks are not written.
const MAX_IN_FLIGHT: usize = 64 << 20;
/// Written images kept for reuse; more are freed (a burst's buffers do not stay resident).
const MAX_SPARE: usize = 8;
/// A temporary file older than this was left by a writer that died.
const STALE_TMP: Duration = Duration::from_secs(60);
/// The least time between two scans of the directory when the budget is crossed.
const RESCAN_EVERY: Duration = Duration::from_secs(5);

/// Where a model's disk tier lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskTier {
    /// The folder, shared by every model (each has a folder of its own in it).
    pub dir: PathBuf,
    /// The most bytes of blocks this model keeps there.
    pub budget: u64,
    /// The model's name there: made of its graph and weights, so that no other model or
    /// version reads its blocks.
    pub identity: String,
}

/// What a block holds, so files of another layout are never read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFormat {
    pub kv: KvDtype,
    /// Positions per block.
    pub block_size: usize,
    /// Bytes of one block: every layer's keys and values, and their scales.
    pub block_bytes: usize,
}

impl BlockFormat {
    fn fingerprint(&self) -> u64 {
        let mut h = crate::blocks::chain_key(0, &[self.block_size as u32]);
        h = crate::blocks::chain_key(
            h,
            &[self.block_bytes as u32, (self.block_bytes >> 32) as u32],
        );
        crate::blocks::chain_key(h, &[self.kv as u32])
    }
}

/// What the disk tier did since it was opened (and how full its directory is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Blocks read back, and prompt blocks looked for and not found.
    pub hits: u64,
    pub misses: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub written_bytes: u64,
    /// Files removed to stay under the budget.
    pub evictions: u64,
    /// Files removed because they failed the check (truncated, altered, another layout).
    pub rejected: u64,
    /// Blocks not written because the writer was behind.
    pub dropped: u64,
    /// Files and bytes the directory holds, as this process counts them.
    pub files: u64,
    pub bytes: u64,
    pub budget: u64,
    /// False once a write failed (the tier then only reads).
    pub writable: bool,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
    evictions: AtomicU64,
    rejected: AtomicU64,
    dropped: AtomicU64,
    files: AtomicU64,
    bytes: AtomicU64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// State shared by the caller and the writer thread.
struct Shared {
    dir: PathBuf,
    writable: AtomicBool,
    counters: Counters,
    spare: Mutex<Spare>,
}

#[derive(Default)]
struct Spare {
    buffers: Vec<Vec<u8>>,
    in_flight: usize,
    pending: HashSet<u64>,
}

enum Job {
    Write {
        key: u64,
        image: Vec<u8>,
        kept: bool,
    },
    Touch(u64),
    /// Answered once every job before it is done.
    Flush(mpsc::Sender<()>),
}

/// The disk tier of one model's prefix cache.
pub struct DiskCache {
    shared: Arc<Shared>,
    format: BlockFormat,
    fingerprint: u64,
    jobs: Option<mpsc::SyncSender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    read_buf: Vec<u8>,
    budget: u64,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.shared.dir)
            .field("format", &self.format)
            .finish()
    }
}

fn file_name(key: u64) -> String {
    format!("{key:016x}.kvb")
}

fn now_stamp() -> u64 {
    stamp(SystemTime::now())
}

fn stamp(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A 64-bit checksum of `bytes` (four multiply-xor lanes over 8-byte words): catches
/// truncation and altered bytes at memory speed; not a defence against forgery.
fn checksum(bytes: &[u8]) -> u64 {
    const K: [u64; 4] = [
        0x9e37_79b9_7f4a_7c15,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
        0x85eb_ca77_c2b2_ae63,
    ];
    let mut lanes = K;
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (l, (w, k)) in lanes.iter_mut().zip(c.chunks_exact(8).zip(K)) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            *l = (*l ^ w).wrapping_mul(k).rotate_left(29);
        }
    }
    let mut h = bytes.len() as u64;
    for (i, l) in lanes.into_iter().enumerate() {
        h = (h ^ l).wrapping_mul(K[i]).rotate_left(31);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K[0]);
    }
    h ^ (h >> 29)
}

/// A header's fields.
struct Header {
    fingerprint: u64,
    tokens: usize,
    flags: u32,
    payload: usize,
    checksum: u64,
}

impl Header {
    fn read(bytes: &[u8]) -> Option<Header> {
        let (magic, rest) = bytes.get(..HEADER)?.split_at(8);
        let u64_at = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().expect("4 bytes"));
        (magic == MAGIC).then(|| Header {
            fingerprint: u64_at(0),
            tokens: u32_at(8) as usize,
            flags: u32_at(12),
            payload: usize::try_from(u64_at(16)).unwrap_or(usize::MAX),
            checksum: u64_at(24),
        })
    }

    /// The length of the file this header heads.
    fn file_len(&self) -> Option<usize> {
        (self.tokens.checked_mul(4)?)
            .checked_add(self.payload)?
            .checked_add(HEADER)
    }
}

impl DiskCache {
    /// The tier `tier` for blocks of `format`. The directory is created when missing; one
    /// that cannot be created or written is a read-only tier (one warning). Indexing the
    /// files already there happens on the writer thread.
    pub fn open(tier: &DiskTier, format: BlockFormat) -> Result<DiskCache, RuntimeError> {
        let (identity, budget) = (&tier.identity, tier.budget);
        if identity.is_empty() || !identity.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(RuntimeError::Backend(
                format!("a disk cache's model identity is a file name, not '{identity}'").into(),
            ));
        }
        let dir =
            (tier.dir)
                .join(identity)
                .join(format!("{}-{}", format.kv.name(), format.block_size));
        let shared = Arc::new(Shared {
            dir,
            writable: AtomicBool::new(true),
            counters: Counters::default(),
            spare: Mutex::new(Spare::default()),
        });
        if let Err(e) = fs::create_dir_all(&shared.dir) {
            shared.fail(&e);
        }
        let (jobs, rx) = mpsc::sync_channel(1024);
        let writer = {
            let shared = Arc::clone(&shared);
            let fingerprint = format.fingerprint();
            std::thread::Builder::new()
                .name("oxgen-kv-disk".into())
                .spawn(move || Writer::new(shared, fingerprint, budget).run(rx))
                .map_err(|e| RuntimeError::Backend(Box::new(e)))?
        };
        Ok(DiskCache {
            shared,
            format,
            fingerprint: format.fingerprint(),
            jobs: Some(jobs),
            writer: Some(writer),
            read_buf: Vec::new(),
            budget,
        })
    }

    /// The folder the blocks are in.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    pub fn stats(&self) -> DiskStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskStats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            read_bytes: get(&c.read_bytes),
            writes: get(&c.writes),
            written_bytes: get(&c.written_bytes),
            evictions: get(&c.evictions),
            rejected: get(&c.rejected),
            dropped: get(&c.dropped),
            files: get(&c.files),
            bytes: get(&c.bytes),
            budget: self.budget,
            writable: self.shared.writable.load(Ordering::Relaxed),
        }
    }

    /// Queues the block keyed `key`, which ends the token prefix `prefix`, for writing;
    /// `fill` copies its bytes ([`BlockFormat::block_bytes`]) into the file's image. Returns
    /// whether it was queued: not when the file is there already, the tier cannot write, or
    /// the writer is behind. `kept` marks it as evicted after unmarked files.
    pub fn store(
        &self,
        key: u64,
        prefix: &[u32],
        kept: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let Some(jobs) = &self.jobs else {
            return false;
        };
        if !self.shared.writable.load(Ordering::Relaxed)
            || self.shared.dir.join(file_name(key)).exists()
        {
            return false;
        }
        let len = HEADER + 4 * prefix.len() + self.format.block_bytes;
        let mut image = {
            let mut spare = self.shared.spare.lock().expect("no panics while held");
            if spare.pending.contains(&key) {
                return false;
            }
            if spare.in_flight + len > MAX_IN_FLIGHT {
                bump(&self.shared.counters.dropped, 1);
                return false;
            }
            spare.pending.insert(key);
            spare.in_flight += len;
            spare.buffers.pop().unwrap_or_default()
        };
        image.clear();
        // Images grow by a block's ids as a sequence goes on: room for a few more blocks, so
        // a reused buffer is not reallocated for every block.
        if image.capacity() < len {
            image.reserve(len + len / 4);
        }
        image.resize(len, 0);
        let (header, body) = image.split_at_mut(HEADER);
        let (tokens, payload) = body.split_at_mut(4 * prefix.len());
        for (out, t) in tokens.chunks_exact_mut(4).zip(prefix) {
            out.copy_from_slice(&t.to_le_bytes());
        }
        fill(payload);
        let sum = checksum(body);
        let flags = if kept { FLAG_KEPT } else { 0 };
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&self.fingerprint.to_le_bytes());
        header[16..20].copy_from_slice(&(prefix.len() as u32).to_le_bytes());
        header[20..24].copy_from_slice(&flags.to_le_bytes());
        header[24..32].copy_from_slice(&(self.format.block_bytes as u64).to_le_bytes());
        header[32..40].copy_from_slice(&sum.to_le_bytes());
        jobs.send(Job::Write { key, image, kept }).is_ok()
    }

    /// The bytes of the block keyed `key` that ends the token prefix `prefix`, when the
    /// directory holds it whole. A file that fails the check is removed.
    pub fn load(&mut self, key: u64, prefix: &[u32]) -> Option<&[u8]> {
        let c = &self.shared.counters;
        let path = self.shared.dir.join(file_name(key));
        let Ok(mut file) = File::open(&path) else {
            bump(&c.misses, 1);
            return None;
        };
        let want = HEADER + 4 * prefix.len() + self.format.block_bytes;
        let len = file.metadata().map_or(0, |m| m.len());
        self.read_buf.clear();
        let read = len == want as u64 && {
            self.read_buf.resize(want, 0);
            file.read_exact(&mut self.read_buf).is_ok()
        };
        let header = read.then(|| Header::read(&self.read_buf)).flatten();
        let whole = header.as_ref().is_some_and(|h| {
            h.fingerprint == self.fingerprint
                && h.file_len() == Some(want)
                && h.checksum == checksum(&self.read_buf[HEADER..])
        });
        if !whole {
            // Truncated, altered or of another layout: never trusted, and not kept.
            bump(&c.rejected, 1);
            bump(&c.misses, 1);
            if fs::remove_file(&path).is_ok() {
                self.shared.forget(len);
            }
            return None;
        }
        let (tokens, payload) = self.read_buf[HEADER..].split_at(4 * prefix.len());
        let same = (tokens
            .chunks_exact(4)
            .map(|t| u32::from_le_bytes(t.try_into().expect("4"))))
        .eq(prefix.iter().copied());
        if !same {
            // Another prefix with the same key (a hash collision): a miss, the file stays.
            bump(&c.misses, 1);
            return None;
        }
        bump(&c.hits, 1);
        bump(&c.read_bytes, want as u64);
        if let Some(jobs) = &self.jobs {
            // Marks it used; skipped when the writer is busy (its age then errs older).
            let _ = jobs.try_send(Job::Touch(key));
        }
        Some(payload)
    }
}

impl DiskCache {
    /// Waits until the blocks queued so far are written (and the directory, after
    /// [`DiskCache::open`], indexed).
    pub fn flush(&self) {
        let (done, wait) = mpsc::channel();
        if let Some(jobs) = &self.jobs
            && jobs.send(Job::Flush(done)).is_ok()
        {
            let _ = wait.recv();
        }
    }
}

impl Drop for DiskCache {
    /// Waits for the blocks queued to be written.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl Shared {
    /// Turns writes off after `e`, with one warning.
    fn fail(&self, e: &std::io::Error) {
        if self.writable.swap(false, Ordering::Relaxed) {
            eprintln!(
                "warning: the KV disk cache at {} cannot be written ({e}); prefixes are cached \
                 in memory only from now on (free space, or give --kv-disk-cache a writable \
                 folder)",
                self.dir.display()
            );
        }
    }

    /// Counts a file of `len` bytes as gone.
    fn forget(&self, len: u64) {
        let c = &self.counters;
        let _ = (c.files).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        let _ = (c.bytes).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_sub(len))
        });
    }
}

/// The writer thread: writes queued blocks, and keeps the directory under the budget.
struct Writer {
    shared: Arc<Shared>,
    fingerprint: u64,
    budget: u64,
    /// Every file known: its size, when it was last used, whether it is marked.
    files: HashMap<u64, (u64, u64, bool)>,
    /// Eviction order: unmarked first, then least recently used.
    order: BTreeSet<(bool, u64, u64)>,
    total: u64,
    scanned: Option<Instant>,
    tmp_serial: u64,
}

impl Writer {
    fn new(shared: Arc<Shared>, fingerprint: u64, budget: u64) -> Writer {
        Writer {
            shared,
            fingerprint,
            budget,
            files: HashMap::new(),
            order: BTreeSet::new(),
            total: 0,
            scanned: None,
            tmp_serial: 0,
        }
    }

    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        self.scan();
        self.fit();
        for job in jobs {
            match job {
                Job::Write { key, image, kept } => {
                    let len = image.len();
                    self.write(key, &image, kept);
                    let mut spare = self.shared.spare.lock().expect("no panics while held");
                    spare.pending.remove(&key);
                    spare.in_flight -= len;
                    if spare.buffers.len() < MAX_SPARE {
                        spare.buffers.push(image);
                    }
                }
                Job::Touch(key) => self.touch(key),
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Indexes the directory: headers only (bounded work per file); files that fail the
    /// header check, and temporary files a dead writer left, are removed.
    fn scan(&mut self) {
        self.scanned = Some(Instant::now());
        let Ok(entries) = fs::read_dir(&self.shared.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let path = entry.path();
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.ends_with(".tmp") {
                if modified.elapsed().is_ok_and(|age| age > STALE_TMP) {
                    let _ = fs::remove_file(&path);
                }
                continue;
            }
            let Some(key) = name
                .strip_suffix(".kvb")
                .and_then(|k| u64::from_str_radix(k, 16).ok())
            else {
                continue;
            };
            if self.files.contains_key(&key) {
                continue;
            }
            let mut head = [0u8; HEADER];
            let header = File::open(&path)
                .and_then(|mut f| f.read_exact(&mut head))
                .ok()
                .and_then(|()| Header::read(&head));
            match header {
                Some(h)
                    if h.fingerprint == self.fingerprint
                        && h.file_len() == Some(meta.len() as usize) =>
                {
                    self.add(key, meta.len(), stamp(modified), h.flags & FLAG_KEPT != 0);
                }
                _ => {
                    if fs::remove_file(&path).is_ok() {
                        bump(&self.shared.counters.rejected, 1);
                    }
                }
            }
        }
    }

    fn add(&mut self, key: u64, len: u64, used: u64, kept: bool) {
        if let Some((old_len, old_used, old_kept)) = self.files.insert(key, (len, used, kept)) {
            self.order.remove(&(old_kept, old_used, key));
            self.total -= old_len;
        }
        self.order.insert((kept, used, key));
        self.total += len;
        self.publish();
    }

    fn remove(&mut self, key: u64) {
        if let Some((len, used, kept)) = self.files.remove(&key) {
            self.order.remove(&(kept, used, key));
            self.total -= len;
            self.publish();
        }
    }

    fn publish(&self) {
        let c = &self.shared.counters;
        c.files.store(self.files.len() as u64, Ordering::Relaxed);
        c.bytes.store(self.total, Ordering::Relaxed);
    }

    fn write(&mut self, key: u64, image: &[u8], kept: bool) {
        if !self.shared.writable.load(Ordering::Relaxed) {
            return;
        }
        self.tmp_serial += 1;
        let dir = &self.shared.dir;
        let tmp = dir.join(format!(
            ".{key:016x}.{}.{}.tmp",
            std::process::id(),
            self.tmp_serial
        ));
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(image))
            .and_then(|()| fs::rename(&tmp, dir.join(file_name(key))));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            self.shared.fail(&e);
            return;
        }
        let c = &self.shared.counters;
        bump(&c.writes, 1);
        bump(&c.written_bytes, image.len() as u64);
        self.add(key, image.len() as u64, now_stamp(), kept);
        self.fit();
    }

    fn touch(&mut self, key: u64) {
        let path = self.shared.dir.join(file_name(key));
        let now = SystemTime::now();
        if File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(now))
            .is_err()
        {
            return;
        }
        if let Some(&(len, _, kept)) = self.files.get(&key) {
            self.add(key, len, stamp(now), kept);
        }
    }

    /// Removes the least recently used files until the directory fits the budget; counts
    /// the files other processes wrote first, when the directory was not scanned lately.
    fn fit(&mut self) {
        if self.total <= self.budget {
            return;
        }
        if self.scanned.is_none_or(|t| t.elapsed() > RESCAN_EVERY) {
            self.scan();
        }
        while self.total > self.budget {
            let Some(&(_, _, key)) = self.order.first() else {
                break;
            };
            let _ = fs::remove_file(self.shared.dir.join(file_name(key)));
            self.remove(key);
            bump(&self.shared.counters.evictions, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: BlockFormat = BlockFormat {
        kv: KvDtype::F32,
        block_size: 4,
        block_bytes: 64,
    };

    fn open_at(root: &Path, identity: &str, format: BlockFormat, budget: u64) -> DiskCache {
        let tier = DiskTier {
            dir: root.to_path_buf(),
            budget,
            identity: identity.into(),
        };
        DiskCache::open(&tier, format).unwrap()
    }

    fn payload(seed: u8) -> Vec<u8> {
        (0..64u8)
            .map(|i| i.wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn put(cache: &DiskCache, key: u64, prefix: &[u32], seed: u8) -> bool {
        cache.store(key, prefix, false, |out| {
            out.copy_from_slice(&payload(seed))
        })
    }

    /// Waits for the writer: a cache reopened on the directory.
    fn reopen(cache: DiskCache, root: &Path) -> DiskCache {
        let budget = cache.budget;
        drop(cache);
        open_at(root, "model", FORMAT, budget)
    }

    #[test]
    fn a_block_comes_back_whole_after_a_restart() {
        let root = tempfile::tempdir().unwrap();
        let cache = open_at(root.path(), "model", FORMAT, 1 << 20);
        assert!(put(&cache, 7, &[1, 2, 3, 4], 9));
        let mut cache = reopen(cache, root.path());
        assert_eq!(cache.load(7, &[1, 2, 3, 4]), Some(&payload(9)[..]));
        // Another prefix under the same key is a miss, and the file stays.
        assert_eq!(cache.load(7, &[1, 2, 3, 5]), None);
        assert!(cache.load(7, &[1, 2, 3, 4]).is_some());
        assert!(cache.load(8, &[1, 2, 3, 4]).is_none());
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.rejected), (2, 2, 0));
        // Already on disk: not written again.
        assert!(!put(&cache, 7, &[1, 2, 3, 4], 9));
    }

    #[test]
    fn truncated_and_altered_files_are_refused_and_removed() {
        let root = tempfile::tempdir().unwrap();
        let cache = open_at(root.path(), "model", FORMAT, 1 << 20);
        for key in 1..=3 {
            assert!(put(&cache, key, &[key as u32; 4], 1));
        }
        let dir = cache.dir().to_path_buf();
        let mut cache = reopen(cache, root.path());
        // The folder indexed before the files are damaged (not a race with the scan).
        cache.flush();
        let path = |key: u64| dir.join(file_name(key));
        let bytes = fs::read(path(1)).unwrap();
        fs::write(path(1), &bytes[..bytes.len() - 3]).unwrap();
        let mut altered = fs::read(path(2)).unwrap();
        *altered.last_mut().unwrap() ^= 1;
        fs::write(path(2), &altered).unwrap();
        assert!(cache.load(1, &[1; 4]).is_none());
        assert!(cache.load(2, &[2; 4]).is_none());
        assert!(cache.load(3, &[3; 4]).is_some());
        assert!(!path(1).exists() && !path(2).exists() && path(3).exists());
        assert_eq!(cache.stats().rejected, 2);
        // A half-written file under a block's name (a torn copy) is removed by the scan.
        fs::write(path(4), &bytes[..HEADER + 2]).unwrap();
        fs::write(dir.join(".0000000000000005.1.1.tmp"), b"partial").unwrap();
        let cache = reopen(cache, root.path());
        drop(cache);
        assert!(!path(4).exists());
    }

    #[test]
    fn the_budget_evicts_the_least_recently_used_and_unmarked_first() {
        let root = tempfile::tempdir().unwrap();
        let file = (HEADER + 16 + 64) as u64;
        let cache = open_at(root.path(), "model", FORMAT, 3 * file);
        assert!(cache.store(1, &[1; 4], true, |o| o.fill(1)));
        assert!(put(&cache, 2, &[2; 4], 2));
        assert!(put(&cache, 3, &[3; 4], 3));
        let mut cache = reopen(cache, root.path());
        std::thread::sleep(Duration::from_millis(20));
        assert!(cache.load(2, &[2; 4]).is_some(), "2 is used after 3");
        assert!(put(&cache, 4, &[4; 4], 4));
        let mut cache = reopen(cache, root.path());
        cache.flush();
        let s = cache.stats();
        assert_eq!((s.files, s.bytes), (3, 3 * file));
        assert!(cache.load(3, &[3; 4]).is_none(), "3 went first");
        for key in [1, 2, 4] {
            assert!(cache.load(key, &[key as u32; 4]).is_some(), "{key} stays");
        }
    }

    #[test]
    fn another_model_or_layout_never_reads_these_files() {
        let root = tempfile::tempdir().unwrap();
        let cache = open_at(root.path(), "model", FORMAT, 1 << 20);
        assert!(put(&cache, 7, &[1, 2, 3, 4], 9));
        drop(cache);
        let mut other = open_at(root.path(), "other", FORMAT, 1 << 20);
        assert!(other.load(7, &[1, 2, 3, 4]).is_none());
        let int8 = BlockFormat {
            kv: KvDtype::Int8,
            ..FORMAT
        };
        let mut other = open_at(root.path(), "model", int8, 1 << 20);
        assert!(other.load(7, &[1, 2, 3, 4]).is_none());
        assert!(
            DiskCache::open(
                &DiskTier {
                    dir: root.path().into(),
                    budget: 1,
                    identity: "../x".into()
                },
                FORMAT
            )
            .is_err()
        );
    }

    #[test]
    fn concurrent_writers_of_one_directory_leave_only_whole_files() {
        let root = tempfile::tempdir().unwrap();
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let root = root.path().to_path_buf();
                std::thread::spawn(move || {
                    let cache = open_at(&root, "model", FORMAT, 1 << 20);
                    for key in 0..50u64 {
                        put(&cache, key, &[key as u32; 4], key as u8);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let mut cache = open_at(root.path(), "model", FORMAT, 1 << 20);
        for key in 0..50u64 {
            assert_eq!(
                cache.load(key, &[key as u32; 4]),
                Some(&payload(key as u8)[..])
            );
        }
        assert_eq!(cache.stats().rejected, 0);
        let tmp = fs::read_dir(cache.dir())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "tmp")
            })
            .count();
        assert_eq!(tmp, 0);
    }

    #[test]
    fn a_folder_that_cannot_be_written_turns_writes_off_and_keeps_reading() {
        let root = tempfile::tempdir().unwrap();
        let cache = open_at(root.path(), "model", FORMAT, 1 << 20);
        assert!(put(&cache, 1, &[1; 4], 1));
        let cache = reopen(cache, root.path());
        // The folder turns into a file: every write fails (as a full or read-only disk's do).
        let dir = cache.dir().to_path_buf();
        let moved = root.path().join("moved");
        fs::rename(&dir, &moved).unwrap();
        fs::write(&dir, b"not a folder").unwrap();
        assert!(
            put(&cache, 2, &[2; 4], 2),
            "queued before the failure is known"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while cache.stats().writable && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !cache.stats().writable,
            "the failed write turned writes off"
        );
        assert!(!put(&cache, 3, &[3; 4], 3));
        // Opening on a folder that cannot be made reads only, too.
        let cache = reopen(cache, root.path());
        assert!(!cache.stats().writable);
        drop(cache);
        fs::remove_file(&dir).unwrap();
        fs::rename(&moved, &dir).unwrap();
        let mut cache = open_at(root.path(), "model", FORMAT, 1 << 20);
        assert!(cache.load(1, &[1; 4]).is_some());
        assert!(cache.stats().writable);
    }
}

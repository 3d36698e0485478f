//! Paged KV bookkeeping: a pool of fixed-size blocks handed to sequences through block tables,
//! with prefix caching. Backend-free: which block holds which positions, who shares it, and
//! which token prefix it caches. The backend owns the memory and applies the copies this
//! asks for.
//!
//! - **Reservation.** A sequence reserves the blocks its whole context needs when it starts
//!   ([`BlockPool::reserve`]), so a running sequence never finds the pool empty: blocks held by
//!   live sequences never exceed what they reserved, and the rest (free or cached) can always
//!   be handed out. A scheduler admits a request when [`KvUsage::available`] covers it.
//! - **Prefix caching.** A block that fills up is registered under its token prefix: the
//!   block's tokens and the block before it in the sequence (a chain, so equal tokens after
//!   different prefixes never match). A new sequence attaches the cached blocks of its
//!   prompt's longest cached prefix ([`BlockPool::attach_prefix`]) and prefills only the rest.
//!   Matches compare tokens and parents exactly; the hash only finds candidates. A block that
//!   fills with contents already cached (a repeated request's answer) is swapped for the
//!   cached one, so the same prefix is never cached twice.
//! - **Sharing and copy-on-write.** Blocks are reference-counted. Writing into a block that
//!   another sequence also holds copies it first ([`BlockPool::prepare_write`] lists the
//!   copies); writing into a cached block this sequence alone holds unregisters it.
//! - **Eviction.** A cached block nobody holds stays cached until the free list runs dry;
//!   then the least recently released one is reused. Blocks of a sequence marked to be kept
//!   ([`BlockPool::keep`]: a prompt the client asked to cache) go after every unmarked one.
//! - **Keys that outlive the pool.** A block's key chains its tokens onto its parent's key
//!   ([`chain_key`]), not onto the parent's block number, so the key names the whole token
//!   prefix: the disk tier ([`crate::DiskCache`]) files blocks under it, and a pool filled
//!   from disk ([`BlockPool::extend_prefix`]) registers them as if it had computed them.

use std::collections::{BTreeMap, HashMap};

use crate::RuntimeError;

const NONE: u32 = u32::MAX;

/// How full a pool is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvUsage {
    /// Positions per block.
    pub block_size: usize,
    pub total: usize,
    /// Blocks held by sequences.
    pub used: usize,
    /// Blocks holding a cached prefix (held or not).
    pub cached: usize,
    /// Blocks reserved by live sequences (at least `used`).
    pub reserved: usize,
    /// Full prompt blocks that could have come from the prefix cache, and those that did
    /// from this pool and from the disk tier.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub prefix_disk_hits: u64,
    /// Cached blocks reused for other contents.
    pub evictions: u64,
}

impl KvUsage {
    /// Blocks a new sequence may still reserve.
    pub fn available(&self) -> usize {
        self.total.saturating_sub(self.reserved)
    }

    /// Blocks not held by any sequence (free or cached for later).
    pub fn free(&self) -> usize {
        self.total - self.used
    }

    /// Blocks a sequence of `positions` reserves.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size.max(1))
    }
}

/// One sequence's blocks: `blocks[i]` holds positions `i * block_size..(i + 1) * block_size`.
#[derive(Debug, Default)]
pub struct BlockTable {
    pub blocks: Vec<u32>,
    /// Blocks reserved for this sequence.
    reserved: usize,
    /// Leading blocks registered in (or matched from) the prefix cache.
    registered: usize,
    /// Its cached blocks are evicted after unmarked ones.
    keep: bool,
    /// The key its chain starts from ([`CHAIN_ROOT`], or an adapter's: see
    /// [`BlockTable::set_root`]).
    root: u64,
}

impl BlockTable {
    /// Whether its cached blocks are marked to be kept ([`BlockPool::keep`]).
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// Starts its chain of keys from `root` instead of [`CHAIN_ROOT`], before any block is
    /// attached: blocks cached under one root never serve a table under another (a LoRA
    /// adapter's sequences and the base model's compute different KV for the same tokens).
    pub fn set_root(&mut self, root: u64) {
        debug_assert!(
            self.blocks.is_empty(),
            "the root is set before blocks are attached"
        );
        self.root = root;
    }

    /// Leading blocks registered in (or matched from) the prefix cache: after
    /// [`BlockPool::register_full`], the blocks past the count before it are newly settled.
    pub fn registered(&self) -> usize {
        self.registered
    }
}

/// A block copy the backend must make before the next forward: `src`'s contents into `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: u32,
    pub dst: u32,
}

/// The block pool.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    /// Unheld, uncached blocks; the next one handed out is the last.
    free: Vec<u32>,
    /// Cached blocks nobody holds, by release order (oldest first), and each one's key there;
    /// marked blocks apart, evicted once no unmarked one is left.
    idle: BTreeMap<u64, u32>,
    idle_kept: BTreeMap<u64, u32>,
    kept: Vec<bool>,
    idle_key: Vec<u64>,
    tick: u64,
    /// Per block: its cache key when registered, its parent block and its tokens.
    key: Vec<Option<u64>>,
    parent: Vec<u32>,
    tokens: Vec<u32>,
    by_key: HashMap<u64, u32>,
    reserved: usize,
    used: usize,
    queries: u64,
    hits: u64,
    disk_hits: u64,
    evictions: u64,
    copies: Vec<BlockCopy>,
}

/// The key of the first block of a sequence's chain.
pub const CHAIN_ROOT: u64 = 0x6f78_6765_6e6b_7631;

/// The cache key of a block of `tokens` after a block keyed `parent` ([`CHAIN_ROOT`] for the
/// first): FNV-1a over both, then a final mix, so a key names the whole token prefix up to
/// the block's end. Matches still compare tokens; the key only finds candidates.
///
/// For the same tokens, different parents (or roots) always give different keys: each FNV
/// step and the final mix are bijections of the state.
pub fn chain_key(parent: u64, tokens: &[u32]) -> u64 {
    let h = (tokens.iter()).fold(FNV_BASIS ^ parent, |h, v| fnv(h, &v.to_le_bytes()));
    mix(h)
}

/// A key naming the contents `parts` (a LoRA adapter's files): [`chain_key`]'s hash over
/// bytes.
pub fn content_key(parts: &[&[u8]]) -> u64 {
    mix(parts.iter().fold(FNV_BASIS, |h, p| fnv(h, p)))
}

const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes` from state `h`.
fn fnv(h: u64, bytes: &[u8]) -> u64 {
    (bytes.iter()).fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// splitmix64's finalizer: FNV's high bits mix poorly, and keys name files.
fn mix(mut h: u64) -> u64 {
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_size` positions.
    pub fn new(blocks: usize, block_size: usize) -> Result<BlockPool, RuntimeError> {
        if block_size == 0 || blocks == 0 || blocks >= NONE as usize {
            return Err(RuntimeError::Backend(
                format!(
                    "a KV pool needs at least one block of at least one position, and fewer \
                     than {NONE} blocks (asked for {blocks} of {block_size})"
                )
                .into(),
            ));
        }
        Ok(BlockPool {
            block_size,
            refs: vec![0; blocks],
            free: (0..blocks as u32).rev().collect(),
            idle: BTreeMap::new(),
            idle_kept: BTreeMap::new(),
            kept: vec![false; blocks],
            idle_key: vec![0; blocks],
            tick: 0,
            key: vec![None; blocks],
            parent: vec![NONE; blocks],
            tokens: vec![0; blocks * block_size],
            by_key: HashMap::new(),
            reserved: 0,
            used: 0,
            queries: 0,
            hits: 0,
            disk_hits: 0,
            evictions: 0,
            copies: Vec::new(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            block_size: self.block_size,
            total: self.refs.len(),
            used: self.used,
            cached: self.by_key.len(),
            reserved: self.reserved,
            prefix_queries: self.queries,
            prefix_hits: self.hits,
            prefix_disk_hits: self.disk_hits,
            evictions: self.evictions,
        }
    }

    /// Reserves the blocks of a sequence of up to `positions` positions; fails when the pool
    /// cannot promise them.
    pub fn reserve(&mut self, positions: usize) -> Result<BlockTable, RuntimeError> {
        let usage = self.usage();
        let need = usage.blocks_for(positions);
        if need > usage.available() {
            return Err(RuntimeError::Backend(
                format!(
                    "the KV cache cannot hold another {positions} positions: that needs {need} \
                     blocks of {}, and {} of its {} blocks are free to reserve; raise \
                     --kv-blocks, or wait for running sequences to finish",
                    self.block_size,
                    usage.available(),
                    usage.total
                )
                .into(),
            ));
        }
        self.reserved += need;
        Ok(BlockTable {
            blocks: Vec::with_capacity(need),
            reserved: need,
            registered: 0,
            keep: false,
            root: CHAIN_ROOT,
        })
    }

    /// Gives back a sequence's blocks and reservation.
    pub fn release(&mut self, table: BlockTable) {
        for &b in table.blocks.iter().rev() {
            self.unref(b);
        }
        self.reserved -= table.reserved;
    }

    fn unref(&mut self, b: u32) {
        let i = b as usize;
        self.refs[i] -= 1;
        if self.refs[i] > 0 {
            return;
        }
        self.used -= 1;
        if self.key[i].is_some() {
            self.tick += 1;
            let at = self.tick;
            self.idle_mut(b).insert(at, b);
            self.idle_key[i] = at;
        } else {
            self.free.push(b);
        }
    }

    /// Holds block `b` once more.
    fn hold(&mut self, b: u32) {
        let i = b as usize;
        if self.refs[i] == 0 {
            self.used += 1;
            if self.key[i].is_some() {
                let at = self.idle_key[i];
                self.idle_mut(b).remove(&at);
            }
        }
        self.refs[i] += 1;
    }

    /// The idle cached blocks `b` is among when nobody holds it.
    fn idle_mut(&mut self, b: u32) -> &mut BTreeMap<u64, u32> {
        match self.kept[b as usize] {
            true => &mut self.idle_kept,
            false => &mut self.idle,
        }
    }

    /// A block for new contents: a free one, else the longest-idle cached one (unmarked
    /// first).
    fn take_block(&mut self) -> u32 {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = (self.idle.pop_first())
                    .or_else(|| self.idle_kept.pop_first())
                    .expect("reservations leave a free or idle block for every held one");
                self.unregister(b);
                self.evictions += 1;
                b
            }
        };
        self.refs[b as usize] = 1;
        self.used += 1;
        b
    }

    fn unregister(&mut self, b: u32) {
        self.kept[b as usize] = false;
        if let Some(k) = self.key[b as usize].take()
            && self.by_key.get(&k) == Some(&b)
        {
            self.by_key.remove(&k);
        }
    }

    /// The key of the chain ending at `parent` (a registered block, or [`NONE`]: `root`).
    fn key_of(&self, root: u64, parent: u32) -> u64 {
        match parent {
            NONE => root,
            b => self.key[b as usize].expect("a cached block's parent is registered"),
        }
    }

    /// The block caching `tokens` after `parent`, if any.
    fn lookup(&self, root: u64, parent: u32, tokens: &[u32]) -> Option<u32> {
        let b = *self
            .by_key
            .get(&chain_key(self.key_of(root, parent), tokens))?;
        let i = b as usize;
        let bs = self.block_size;
        (self.parent[i] == parent && self.tokens[i * bs..(i + 1) * bs] == *tokens).then_some(b)
    }

    /// Attaches to an empty `table` the cached blocks of `prompt`'s longest cached prefix
    /// (whole blocks, at most `limit` positions); returns the positions they hold.
    pub fn attach_prefix(&mut self, table: &mut BlockTable, prompt: &[u32], limit: usize) -> usize {
        let bs = self.block_size;
        let whole = (prompt.len().min(limit) / bs).min(table.reserved);
        // Every block that could have been cached counts as asked for, the ones past the
        // first miss too (they miss as well): hits / queries is the share of cacheable
        // prompt blocks that were not prefilled.
        self.queries += whole as u64;
        self.attach_cached(table, prompt, whole);
        table.blocks.len() * bs
    }

    /// Appends to `table` (all registered) the cached blocks that go on its prefix of
    /// `prompt`, up to `whole` blocks.
    fn attach_cached(&mut self, table: &mut BlockTable, prompt: &[u32], whole: usize) {
        let bs = self.block_size;
        while table.registered == table.blocks.len() && table.blocks.len() < whole {
            let i = table.blocks.len();
            let parent = table.blocks.last().copied().unwrap_or(NONE);
            let Some(b) = self.lookup(table.root, parent, &prompt[i * bs..(i + 1) * bs]) else {
                break;
            };
            self.hits += 1;
            self.hold(b);
            table.blocks.push(b);
            table.registered += 1;
        }
    }

    /// After [`BlockPool::attach_prefix`], the key and end of the next whole block of
    /// `prompt` (at most `limit` positions) that another tier (the disk) could supply, when
    /// `table` can take one: look it up there, then hand it over with
    /// [`BlockPool::adopt_prefix`]. Blocks this pool caches are attached first.
    pub fn next_prefix(
        &mut self,
        table: &mut BlockTable,
        prompt: &[u32],
        limit: usize,
    ) -> Option<(u64, usize)> {
        let bs = self.block_size;
        let whole = (prompt.len().min(limit) / bs).min(table.reserved);
        // Blocks this pool still holds after one the other tier supplied.
        self.attach_cached(table, prompt, whole);
        let i = table.blocks.len();
        if table.registered != i || i >= whole {
            return None;
        }
        let parent = table.blocks.last().copied().unwrap_or(NONE);
        Some((
            chain_key(
                self.key_of(table.root, parent),
                &prompt[i * bs..(i + 1) * bs],
            ),
            (i + 1) * bs,
        ))
    }

    /// Appends to `table` a block for the prefix [`BlockPool::next_prefix`] named, registered
    /// as if computed; the caller fills it (from the other tier) before the next step.
    pub fn adopt_prefix(&mut self, table: &mut BlockTable, prompt: &[u32]) -> u32 {
        let end = (table.blocks.len() + 1) * self.block_size;
        let b = self.take_block();
        self.disk_hits += 1;
        table.blocks.push(b);
        self.register_full(table, &prompt[..end]);
        b
    }

    /// Marks `table`'s cached blocks, and those it caches from now on, to be evicted after
    /// every unmarked one (a prefix a client asked to keep).
    pub fn keep(&mut self, table: &mut BlockTable) {
        table.keep = true;
        for &b in &table.blocks[..table.registered] {
            if self.key[b as usize].is_some() {
                // Held by `table`, so in neither idle list: the mark moves nothing.
                self.kept[b as usize] = true;
            }
        }
    }

    /// The cache key of registered block `b` (see [`chain_key`]).
    pub fn key(&self, b: u32) -> Option<u64> {
        self.key.get(b as usize).copied().flatten()
    }

    /// Makes positions `pos..end` of `table` writable: new blocks past its end, a private copy
    /// of any shared block in range (the copies to make are in [`BlockPool::copies`]), and
    /// cached blocks in range taken out of the cache. Blocks wholly past `end` are let go (a
    /// rewind). `end` must be within the reservation.
    pub fn prepare_write(
        &mut self,
        table: &mut BlockTable,
        pos: usize,
        end: usize,
    ) -> Result<(), RuntimeError> {
        let bs = self.block_size;
        if pos >= end || end > table.reserved * bs || pos > table.blocks.len() * bs {
            return Err(RuntimeError::Backend(
                format!(
                    "positions {pos}..{end} cannot be written to a sequence of {} blocks \
                     reserved and {} held",
                    table.reserved,
                    table.blocks.len()
                )
                .into(),
            ));
        }
        let (first, last) = (pos / bs, (end - 1) / bs);
        while table.blocks.len() > last + 1 {
            let b = table.blocks.pop().expect("longer than last + 1");
            self.unref(b);
        }
        table.registered = table.registered.min(first);
        for i in first..=last {
            if i == table.blocks.len() {
                let b = self.take_block();
                table.blocks.push(b);
                continue;
            }
            let b = table.blocks[i];
            if self.refs[b as usize] > 1 {
                let copy = self.take_block();
                self.copies.push(BlockCopy { src: b, dst: copy });
                self.unref(b);
                table.blocks[i] = copy;
            } else {
                self.unregister(b);
            }
        }
        Ok(())
    }

    /// Copies [`BlockPool::prepare_write`] asked for since the last call.
    pub fn take_copies(&mut self) -> impl Iterator<Item = BlockCopy> + '_ {
        self.copies.drain(..)
    }

    /// Registers the blocks of `table` that `ids` (the sequence's ids, position 0 on) fills,
    /// so later prompts with the same prefix can share them.
    pub fn register_full(&mut self, table: &mut BlockTable, ids: &[u32]) {
        let bs = self.block_size;
        let full = (ids.len() / bs).min(table.blocks.len());
        while table.registered < full {
            let i = table.registered;
            let b = table.blocks[i];
            let parent = if i == 0 { NONE } else { table.blocks[i - 1] };
            let tokens = &ids[i * bs..(i + 1) * bs];
            if parent != NONE && self.key[parent as usize].is_none() {
                // Its parent was rewritten: the chain is broken, nothing past it is cached.
                break;
            }
            if self.key[b as usize].is_none() {
                match self.lookup(table.root, parent, tokens) {
                    // The same contents after the same blocks are cached already: this
                    // sequence computed them again (a repeated request's answer, past its
                    // prompt). It shares the cached block and lets its own go, so the cache
                    // holds the prefix once and the blocks after it keep matching.
                    Some(c) if self.refs[b as usize] == 1 => {
                        self.hold(c);
                        self.kept[c as usize] |= table.keep;
                        table.blocks[i] = c;
                        self.unref(b);
                    }
                    Some(_) => {}
                    None => {
                        let k = chain_key(self.key_of(table.root, parent), tokens);
                        // A different block already under this key (a hash collision) keeps it.
                        if let std::collections::hash_map::Entry::Vacant(e) = self.by_key.entry(k) {
                            e.insert(b);
                            let j = b as usize;
                            self.key[j] = Some(k);
                            self.kept[j] = table.keep;
                            self.parent[j] = parent;
                            self.tokens[j * bs..(j + 1) * bs].copy_from_slice(tokens);
                        }
                    }
                }
            }
            table.registered += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    /// Writes `ids[pos..]` as a step would and registers the full blocks.
    fn write(pool: &mut BlockPool, t: &mut BlockTable, ids: &[u32], pos: usize) {
        pool.prepare_write(t, pos, ids.len()).unwrap();
        pool.register_full(t, ids);
    }

    #[test]
    fn blocks_come_back_after_release() {
        let mut pool = BlockPool::new(8, 4).unwrap();
        let mut a = pool.reserve(10).unwrap();
        assert_eq!(pool.usage().reserved, 3);
        write(&mut pool, &mut a, &ids(10, 0), 0);
        assert_eq!(a.blocks, [0, 1, 2]);
        assert_eq!(pool.usage().used, 3);
        assert_eq!(pool.usage().cached, 2, "two full blocks registered");
        pool.release(a);
        let u = pool.usage();
        assert_eq!((u.used, u.reserved, u.free()), (0, 0, 8));
    }

    #[test]
    fn reservation_refuses_what_it_cannot_promise() {
        let mut pool = BlockPool::new(4, 4).unwrap();
        let a = pool.reserve(12).unwrap();
        let err = pool.reserve(8).unwrap_err().to_string();
        assert!(
            err.contains("needs 2 blocks") && err.contains("--kv-blocks"),
            "{err}"
        );
        assert!(pool.reserve(4).is_ok());
        pool.release(a);
        assert!(pool.reserve(8).is_ok());
    }

    #[test]
    fn a_shared_prefix_is_found_and_shared() {
        let mut pool = BlockPool::new(16, 4).unwrap();
        let prompt = ids(11, 0);
        let mut a = pool.reserve(16).unwrap();
        write(&mut pool, &mut a, &prompt, 0);
        // Same first 9 ids, then different.
        let mut other = prompt[..9].to_vec();
        other.extend([1000, 1001, 1002]);
        let mut b = pool.reserve(16).unwrap();
        let cached = pool.attach_prefix(&mut b, &other, other.len() - 1);
        assert_eq!(cached, 8);
        assert_eq!(b.blocks, a.blocks[..2]);
        assert_eq!(pool.usage().prefix_hits, 2);
        // A different first block finds nothing, even with the same later blocks.
        let mut shifted = vec![5u32; 4];
        shifted.extend(&prompt[4..]);
        let mut c = pool.reserve(16).unwrap();
        assert_eq!(pool.attach_prefix(&mut c, &shifted, 16), 0);
        // Both of its whole blocks count as asked for, the one after the first miss too: the
        // hit rate is 2 of 4.
        assert_eq!(
            (pool.usage().prefix_hits, pool.usage().prefix_queries),
            (2, 4)
        );
        pool.release(c);
        // Writing the shared second block copies it first.
        pool.prepare_write(&mut b, 6, 9).unwrap();
        let copies: Vec<BlockCopy> = pool.take_copies().collect();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].src, a.blocks[1]);
        assert_eq!(b.blocks[1], copies[0].dst);
        assert_eq!(b.blocks[0], a.blocks[0], "the untouched block stays shared");
        pool.release(a);
        pool.release(b);
        assert_eq!(pool.usage().used, 0);
    }

    /// Blocks cached under one root (a LoRA adapter's) serve tables under that root only.
    #[test]
    fn blocks_cached_under_one_root_serve_only_that_root() {
        let mut pool = BlockPool::new(16, 4).unwrap();
        let prompt = ids(9, 0);
        let mut base = pool.reserve(16).unwrap();
        write(&mut pool, &mut base, &prompt, 0);
        let mut adapted = pool.reserve(16).unwrap();
        adapted.set_root(chain_key(CHAIN_ROOT, &[7]));
        assert_eq!(pool.attach_prefix(&mut adapted, &prompt, 8), 0);
        write(&mut pool, &mut adapted, &prompt, 0);
        assert_ne!(adapted.blocks[..2], base.blocks[..2]);
        let mut again = pool.reserve(16).unwrap();
        again.set_root(chain_key(CHAIN_ROOT, &[7]));
        assert_eq!(pool.attach_prefix(&mut again, &prompt, 8), 8);
        assert_eq!(again.blocks, adapted.blocks[..2]);
        let mut plain = pool.reserve(16).unwrap();
        assert_eq!(pool.attach_prefix(&mut plain, &prompt, 8), 8);
        assert_eq!(plain.blocks, base.blocks[..2]);
    }

    /// A repeated request: its prompt attaches the cached blocks, and the blocks its answer
    /// fills are already cached too (the first run wrote the same ids). They are shared, not
    /// cached a second time, and the pool ends where the first run left it.
    #[test]
    fn a_repeated_sequence_shares_the_blocks_it_fills_instead_of_caching_them_again() {
        let mut pool = BlockPool::new(16, 4).unwrap();
        let run = ids(14, 3);
        let (prompt, answer) = run.split_at(5);
        let mut first = pool.reserve(16).unwrap();
        write(&mut pool, &mut first, &run, 0);
        let blocks = first.blocks.clone();
        pool.release(first);
        let after_first = pool.usage();
        assert_eq!(after_first.cached, 3, "three full blocks of 14 ids");
        for _ in 0..3 {
            let mut again = pool.reserve(16).unwrap();
            let cached = pool.attach_prefix(&mut again, prompt, prompt.len() - 1);
            assert_eq!(cached, 4, "the prompt's one whole block");
            let mut ids = prompt[..cached].to_vec();
            for (pos, &id) in prompt[cached..].iter().chain(answer).enumerate() {
                ids.push(id);
                write(&mut pool, &mut again, &ids, cached + pos);
            }
            assert_eq!(again.blocks[..3], blocks[..3], "the same blocks, shared");
            pool.release(again);
            let usage = pool.usage();
            assert_eq!((usage.cached, usage.used), (after_first.cached, 0));
        }
    }

    #[test]
    fn idle_cached_blocks_are_reused_then_evicted_oldest_first() {
        let mut pool = BlockPool::new(4, 2).unwrap();
        let p = ids(4, 0);
        let mut a = pool.reserve(4).unwrap();
        write(&mut pool, &mut a, &p, 0);
        pool.release(a);
        assert_eq!(pool.usage().cached, 2);
        // Still found after release.
        let mut b = pool.reserve(4).unwrap();
        assert_eq!(pool.attach_prefix(&mut b, &p, 4), 4);
        pool.release(b);
        // Filling the pool with other ids evicts them.
        let mut c = pool.reserve(8).unwrap();
        write(&mut pool, &mut c, &ids(8, 1), 0);
        pool.release(c);
        let mut d = pool.reserve(4).unwrap();
        assert_eq!(pool.attach_prefix(&mut d, &p, 4), 0);
    }

    #[test]
    fn a_rewind_lets_go_of_later_blocks_and_unregisters_rewritten_ones() {
        let mut pool = BlockPool::new(8, 2).unwrap();
        let p = ids(6, 0);
        let mut a = pool.reserve(8).unwrap();
        write(&mut pool, &mut a, &p, 0);
        assert_eq!(pool.usage().cached, 3);
        pool.prepare_write(&mut a, 3, 4).unwrap();
        assert_eq!(a.blocks.len(), 2);
        assert_eq!(pool.usage().used, 2);
        // Block 1 (positions 2, 3) is being rewritten: no longer cached.
        assert_eq!(pool.usage().cached, 2);
        let mut q = p[..3].to_vec();
        q.push(99);
        pool.register_full(&mut a, &q);
        let mut b = pool.reserve(8).unwrap();
        assert_eq!(pool.attach_prefix(&mut b, &q, 8), 4);
        assert_eq!(b.blocks, a.blocks);
    }

    #[test]
    fn bad_writes_are_errors() {
        let mut pool = BlockPool::new(8, 2).unwrap();
        let mut a = pool.reserve(4).unwrap();
        assert!(
            pool.prepare_write(&mut a, 0, 5).is_err(),
            "past the reservation"
        );
        assert!(pool.prepare_write(&mut a, 2, 3).is_err(), "a gap");
        assert!(pool.prepare_write(&mut a, 1, 1).is_err(), "empty");
        assert!(BlockPool::new(0, 2).is_err());
    }

    #[test]
    fn keys_name_token_prefixes_so_another_pool_can_adopt_blocks_by_them() {
        let prompt = ids(10, 3);
        let mut first = BlockPool::new(8, 4).unwrap();
        let mut t = first.reserve(10).unwrap();
        write(&mut first, &mut t, &prompt, 0);
        let keys: Vec<u64> = t.blocks[..2]
            .iter()
            .map(|&b| first.key(b).unwrap())
            .collect();
        assert_eq!(keys[0], chain_key(CHAIN_ROOT, &prompt[..4]));
        assert_eq!(keys[1], chain_key(keys[0], &prompt[4..8]));

        // A fresh pool (a restart) finds nothing in memory and adopts both blocks by key.
        let mut second = BlockPool::new(8, 4).unwrap();
        let mut u = second.reserve(10).unwrap();
        assert_eq!(second.attach_prefix(&mut u, &prompt, 9), 0);
        let mut adopted = Vec::new();
        while let Some((key, end)) = second.next_prefix(&mut u, &prompt, 9) {
            assert_eq!(key, keys[adopted.len()]);
            assert_eq!(end, 4 * (adopted.len() + 1));
            adopted.push(second.adopt_prefix(&mut u, &prompt));
        }
        assert_eq!(u.blocks, adopted);
        assert_eq!(second.usage().prefix_disk_hits, 2);
        second.release(u);
        // Adopted blocks are cached like computed ones.
        let mut v = second.reserve(10).unwrap();
        assert_eq!(second.attach_prefix(&mut v, &prompt, 9), 8);
        assert_eq!(second.usage().prefix_hits, 2);
    }

    #[test]
    fn kept_blocks_are_evicted_after_every_unmarked_one() {
        let mut pool = BlockPool::new(4, 4).unwrap();
        let (kept, other) = (ids(8, 1), ids(8, 2));
        let mut a = pool.reserve(8).unwrap();
        pool.keep(&mut a);
        write(&mut pool, &mut a, &kept, 0);
        pool.release(a);
        let mut b = pool.reserve(8).unwrap();
        write(&mut pool, &mut b, &other, 0);
        pool.release(b);
        // Released after the kept blocks, the unmarked ones still go first.
        let mut c = pool.reserve(8).unwrap();
        write(&mut pool, &mut c, &ids(8, 3), 0);
        pool.release(c);
        let mut t = pool.reserve(9).unwrap();
        assert_eq!(pool.attach_prefix(&mut t, &kept, 8), 8, "kept survived");
        pool.release(t);
        let mut t = pool.reserve(9).unwrap();
        assert_eq!(pool.attach_prefix(&mut t, &other, 8), 0, "unmarked evicted");
    }
}

//! Causal grouped-query attention over a paged KV cache, for a ragged batch: the new tokens of
//! several sequences stacked as one set of rows, each sequence's keys and values kept in
//! fixed-size blocks that its block table names.
//!
//! Cache layout (one per K and V of a layer): `[blocks, kv_heads, block_size, head_size]`, so
//! one block of one KV head is `block_size` contiguous head vectors. Position `p` of a sequence
//! lives in block `table[p / block_size]`, row `p % block_size`. The cache may store another
//! element than the model computes in ([`super::kv`]: f16, bf16, or int8 with one scale per
//! head vector, kept in a parallel array of one value per head vector).
//!
//! Each row's arithmetic is [`super::attention`]'s (`attention/group.rs`: the same dot
//! products, softmax and weighted sum, walked in absolute position order): a sequence's rows
//! get the same bits whatever it is batched with, however its prompt was chunked, and paged
//! or contiguous (tested below). Threads split the (row, head) pairs, in output order, into
//! runs of about equal work; a batch of many rows so splits between whole sequences and KV
//! heads, and each thread streams its own blocks once. A step of a few rows over more than a
//! tile of keys (`group::KV_TILE`: a decode step at depth) splits (row, KV head, tile) units
//! instead, so threads share a KV head's blocks without reading them twice (the default
//! model's 3 KV heads on 2 threads; 2 KV heads on 8), and folds each row's tiles on the
//! calling thread after: the same tiles folded in the same order as a row computed whole,
//! so the same bits (tested below). A decode row prefetches the blocks ahead of the one
//! computing: the blocks lie scattered, so the hardware's stream prefetch starts anew at
//! each.

use std::ops::Range;

mod checks;
mod tiles;

use checks::{check_disjoint_writes, check_pool, check_rope, check_segments};
use tiles::Plan;

use super::group::{MAX_GROUP, MAX_TILE, Piece, RowKeys, attend_rows, head_parts};
use super::kv::{CacheElem, Cached, KvMem};
use super::shape::{Rows, ScoreMod};
use crate::ThreadPool;
use crate::acc::Accum;
use crate::error::{KernelError, check_len};
use crate::par::{Shared, par_cuts2, parts_for};
use crate::pool::Prelude;
use crate::rotary::{Rope, rotate_one};
use smallvec::SmallVec;

/// The shape of one layer's K (or V) block pool, as a view into memory that may hold other
/// data between its blocks (a store that keeps every layer's keys and values of a block
/// together): block `b` starts `b * block_stride` values into the view and holds `kv_heads`
/// runs of `block_size` head vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedLayout {
    pub blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    /// Values from one block's start to the next's; at least [`PagedLayout::block_len`].
    pub block_stride: usize,
}

impl PagedLayout {
    /// A pool of its own: blocks back to back.
    pub fn dense(blocks: usize, block_size: usize, kv_heads: usize, head_size: usize) -> Self {
        let block_stride = kv_heads * block_size * head_size;
        PagedLayout {
            blocks,
            block_size,
            kv_heads,
            head_size,
            block_stride,
        }
    }

    /// Values of one block of this pool.
    pub fn block_len(&self) -> usize {
        self.kv_heads * self.block_size * self.head_size
    }

    /// Values a view of the pool spans: up to the end of its last block.
    pub fn cache_len(&self) -> Option<usize> {
        let block = self
            .kv_heads
            .checked_mul(self.block_size)?
            .checked_mul(self.head_size)?;
        if self.blocks == 0 {
            return Some(0);
        }
        (self.blocks - 1)
            .checked_mul(self.block_stride.max(block))?
            .checked_add(block)
    }

    /// Where KV head `h` of `block` starts in a view.
    fn head_start(&self, block: u32, h: usize) -> usize {
        block as usize * self.block_stride + h * self.block_size * self.head_size
    }
}

/// One sequence's part of a ragged batch: rows `rows` of the batch are its tokens at
/// positions `start..start + rows.len()`, and `tables[table]` is its block table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub rows: Range<usize>,
    pub start: usize,
    pub table: Range<usize>,
}

impl Segment {
    /// Positions its sequence holds once the step is done.
    pub fn end(&self) -> usize {
        self.start + self.rows.len()
    }
}

/// A step's rows over the paged cache: `heads` query heads per row, the pool's `layout`, and
/// each sequence's `segments` of rows with their block `tables`.
#[derive(Clone, Copy)]
pub struct PagedBatch<'a> {
    pub heads: usize,
    pub layout: &'a PagedLayout,
    pub segments: &'a [Segment],
    pub tables: &'a [u32],
}

/// Segments of at most this many rows (decode rows, speculative verification) prefetch the
/// blocks they read; longer ones (prefill chunks) leave it to the cache.
const PREFETCH_ROWS: usize = 8;

/// The longest head vector a paged cache takes (a key is rotated on the stack before it is
/// stored).
pub const MAX_HEAD_SIZE: usize = 512;

/// Writes each segment's new head vectors (`src`, `kv_heads` heads per row) into `cache` at
/// their positions, rotated by `rope` when set.
pub fn paged_append<T: Accum<Acc = f32>, C: CacheElem>(
    src: &Rows<T>,
    layout: &PagedLayout,
    segments: &[Segment],
    tables: &[u32],
    rope: Option<&Rope<T>>,
    cache: KvMem<C>,
) -> Result<(), KernelError> {
    let tokens = segments.last().map_or(0, |s| s.rows.end);
    check_segments(layout, segments, tables, tokens)?;
    check_pool(layout, cache.values.len(), "KV pool")?;
    cache.check(layout.head_size)?;
    src.check(tokens, layout.kv_heads, layout.head_size, "new keys/values")?;
    check_rope(rope, segments, layout.head_size)?;
    // SAFETY: one writer, the whole cache borrowed mutably.
    unsafe {
        append_rows(
            src,
            layout,
            segments,
            tables,
            rope,
            0..tokens,
            (&SharedMem::new(cache), 0),
        )
    };
    Ok(())
}

/// A [`KvMem`] that the tasks of a region write disjoint head vectors of.
struct SharedMem<'a, C> {
    values: Shared<'a, C>,
    scales: Shared<'a, f32>,
}

impl<'a, C: CacheElem> SharedMem<'a, C> {
    fn new(mem: KvMem<'a, C>) -> Self {
        SharedMem {
            values: Shared::new(mem.values),
            scales: Shared::new(mem.scales),
        }
    }

    /// Encodes `x` into the head vector at element `at` (a multiple of its length).
    ///
    /// # Safety
    /// No other live reference covers that head vector or its scale.
    unsafe fn put<T: Accum<Acc = f32>>(&self, at: usize, x: &[T]) {
        let hs = x.len();
        // SAFETY: the caller's contract.
        let scale = C::encode(x, unsafe { self.values.range(at..at + hs) });
        if C::SCALED {
            // SAFETY: the caller's contract.
            let dst = unsafe { self.scales.range(at / hs..at / hs + 1) };
            dst[0] = scale;
        }
    }

    /// The whole memory, for reading from element `at` on.
    ///
    /// # Safety
    /// Every writer has finished.
    unsafe fn read(&self, at: usize, head_size: usize) -> Cached<'_, C> {
        // SAFETY: the caller's contract.
        let (values, scales) = unsafe { (self.values.all(), self.scales.all()) };
        Cached { values, scales }.skip(at / head_size, head_size)
    }
}

/// Batch row `t`'s position and segment.
fn token_at(segments: &[Segment], t: usize) -> (usize, &Segment) {
    let s = &segments[segments.partition_point(|s| s.rows.end <= t)];
    (s.start + t - s.rows.start, s)
}

/// [`paged_append`]'s writes for the batch rows `tokens`, after its checks (the head size at
/// most [`MAX_HEAD_SIZE`]), into the pool starting `base` elements into `cache`.
///
/// # Safety
/// No other live reference covers the cache rows these tokens write.
unsafe fn append_rows<T: Accum<Acc = f32>, C: CacheElem>(
    src: &Rows<T>,
    layout: &PagedLayout,
    segments: &[Segment],
    tables: &[u32],
    rope: Option<&Rope<T>>,
    tokens: Range<usize>,
    (cache, base): (&SharedMem<C>, usize),
) {
    let (bs, hs) = (layout.block_size, layout.head_size);
    let mut rotated = [T::ZERO; MAX_HEAD_SIZE];
    let rotated = &mut rotated[..hs];
    for t in tokens {
        let (p, s) = token_at(segments, t);
        let table = &tables[s.table.clone()];
        let rope = rope.map(|r| r.for_len(s.end()));
        for h in 0..layout.kv_heads {
            let at = base + layout.head_start(table[p / bs], h) + p % bs * hs;
            let mut x = src.head(t, h, hs);
            if let Some(r) = &rope {
                rotate_one(x, p, r, rotated).expect("rope checked by check_rope");
                x = rotated;
            }
            // SAFETY: the caller's contract.
            unsafe { cache.put(at, x) };
        }
    }
}

/// Rotates every query head of `q` at its segment's positions into `out`, laid out
/// `(tokens, heads * head_size)`.
pub fn paged_rotate_query<T: Accum<Acc = f32>>(
    q: &Rows<T>,
    heads: usize,
    head_size: usize,
    segments: &[Segment],
    rope: &Rope<T>,
    out: &mut [T],
) -> Result<(), KernelError> {
    let tokens = segments.last().map_or(0, |s| s.rows.end);
    q.check(tokens, heads, head_size, "query")?;
    check_len("rotated query", out.len(), tokens * heads * head_size)?;
    check_rope(Some(rope), segments, head_size)?;
    // SAFETY: one writer, the whole output borrowed mutably.
    unsafe {
        rotate_rows(
            q,
            heads,
            head_size,
            segments,
            rope,
            0..tokens,
            &Shared::new(out),
        )
    };
    Ok(())
}

/// [`paged_rotate_query`] for the batch rows `tokens`, after its checks.
///
/// # Safety
/// No other live reference covers these tokens' rows of `out`.
unsafe fn rotate_rows<T: Accum<Acc = f32>>(
    q: &Rows<T>,
    heads: usize,
    hs: usize,
    segments: &[Segment],
    rope: &Rope<T>,
    tokens: Range<usize>,
    out: &Shared<T>,
) {
    for t in tokens {
        let (p, s) = token_at(segments, t);
        let rope = rope.for_len(s.end());
        for h in 0..heads {
            let at = (t * heads + h) * hs;
            // SAFETY: the caller's contract.
            let dst = unsafe { out.range(at..at + hs) };
            rotate_one(q.head(t, h, hs), p, &rope, dst).expect("rope checked by check_rope");
        }
    }
}

/// Keys row `r` of segment `s` sees under `score`: `lo..p + 1` for its position `p`.
fn keys_seen(s: &Segment, r: usize, score: &ScoreMod) -> std::ops::Range<usize> {
    let p = s.start + r;
    score.window.map_or(0, |w| (p + 1).saturating_sub(w))..p + 1
}

/// The most positions any row of `segments` may see.
fn max_positions(segments: &[Segment]) -> usize {
    segments.iter().map(Segment::end).max().unwrap_or(0)
}

/// Cuts the `tokens * heads` (row, head) pairs, in output order, into at most `parts`
/// contiguous runs of about equal work (keys seen, plus one per pair for its softmax and
/// output): `cuts[i]..cuts[i + 1]` is run `i`. A step of many short rows (a decode batch) then
/// splits between whole sequences and KV heads, so each thread streams its own blocks, once.
fn cuts(
    heads: usize,
    segments: &[Segment],
    score: &ScoreMod,
    parts: usize,
) -> SmallVec<[usize; 9]> {
    let rows = || {
        segments
            .iter()
            .flat_map(move |s| (0..s.rows.len()).map(move |r| keys_seen(s, r, score).len() + 1))
    };
    let total: usize = rows().map(|w| w * heads).sum();
    let mut cuts: SmallVec<[usize; 9]> = smallvec::smallvec![0];
    let (mut done, mut pair) = (0usize, 0usize);
    for w in rows() {
        for _ in 0..heads {
            done += w;
            pair += 1;
            // Cut after this pair once it reaches the next share of the work.
            if cuts.len() < parts && done * parts >= total * cuts.len() {
                cuts.push(pair);
            }
        }
    }
    if *cuts.last().unwrap_or(&0) != pair {
        cuts.push(pair);
    }
    cuts
}

/// Parts the (row, head) pairs are split into: one per thread unless the whole step is
/// small (work counted as multiply-adds, a dot product and a weighted sum per key).
fn part_count(
    layout: &PagedLayout,
    heads: usize,
    segments: &[Segment],
    pool: &ThreadPool,
) -> usize {
    let tokens = segments.last().map_or(0, |s| s.rows.end).max(1);
    let keys: usize = segments
        .iter()
        .map(|s| s.rows.len().saturating_mul(s.start + s.rows.len()))
        .fold(0usize, usize::saturating_add);
    let per_pair = keys.saturating_mul(2 * layout.head_size) / tokens;
    head_parts(pool, heads * tokens, per_pair)
}

/// The f32 scratch [`paged_attention`] needs on `pool`.
pub fn paged_scratch_len(
    layout: &PagedLayout,
    heads: usize,
    segments: &[Segment],
    pool: &ThreadPool,
) -> usize {
    let plan = Plan::new(layout, heads, segments, pool);
    plan.slots + plan.parts * plan.per_part
}

/// Attention of every row of `q` over its segment's cached keys, causally (the row at
/// position `p` sees positions `..=p`, and only the `window` last of them when set), written
/// to `out` laid out `(tokens, heads * head_size)`.
pub fn paged_attention<T: Accum<Acc = f32>, C: CacheElem>(
    batch: PagedBatch<'_>,
    score: &ScoreMod,
    q: &Rows<T>,
    (k, v): (Cached<C>, Cached<C>),
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    for (x, what) in [(k, "key pool"), (v, "value pool")] {
        check_pool(batch.layout, x.values.len(), what)?;
        x.check(batch.layout.head_size)?;
    }
    Split::run(
        (batch, score, q),
        (out, scratch, pool),
        Prelude::NONE,
        |split, part, target, scratch| split.attend(part, q, k, v, target, scratch),
    )
}

/// A step's attention split over the pool, after the checks every paged attention makes:
/// runs of (row, head) pairs of about equal work (see [`cuts`]), each part computing whole
/// rows; or, for a few rows over long contexts ([`Plan`]), (row, KV head, tile) units, each
/// part computing tiles' [`Partial`]s into slots that the caller folds once every part is
/// done ([`Split::tiles`]). A row gets the same bits either way: the same tiles, folded in
/// the same order.
struct Split<'a> {
    heads: usize,
    layout: PagedLayout,
    score: &'a ScoreMod<'a>,
    segments: &'a [Segment],
    tables: &'a [u32],
    plan: Plan,
    cuts: SmallVec<[usize; 9]>,
    /// `cuts` in output values.
    bounds: SmallVec<[usize; 9]>,
    /// The (row, KV head, tile) units' work in all, when split by tiles.
    tile_work: usize,
}

/// What a part of a [`Split`] writes: its run of the output, or tiles' results into the
/// step's slots.
enum Target<'o, T> {
    Out(&'o mut [T]),
    Slots(&'o Shared<'o, f32>),
}

impl<'a> Split<'a> {
    /// `None` when there is nothing to compute.
    fn new<T>(
        batch: PagedBatch<'a>,
        score: &'a ScoreMod<'a>,
        q: &Rows<T>,
        out: &[T],
        scratch: &[f32],
        pool: &ThreadPool,
    ) -> Result<Option<Split<'a>>, KernelError> {
        let PagedBatch {
            heads,
            layout,
            segments,
            tables,
        } = batch;
        let (kv_heads, hs) = (layout.kv_heads, layout.head_size);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(KernelError::Shape(format!(
                "num_heads {heads} is not a multiple of kv_num_heads {kv_heads}"
            )));
        }
        let tokens = segments.last().map_or(0, |s| s.rows.end);
        check_segments(layout, segments, tables, tokens)?;
        q.check(tokens, heads, hs, "query")?;
        score.check(heads)?;
        check_len("attention output", out.len(), heads * tokens * hs)?;
        if out.is_empty() {
            return Ok(None);
        }
        let plan = Plan::new(layout, heads, segments, pool);
        let needed = plan.slots + plan.parts * plan.per_part;
        if scratch.len() < needed {
            return Err(KernelError::Length {
                what: "attention scratch",
                expected: needed,
                actual: scratch.len(),
            });
        }
        let cuts = cuts(heads, segments, score, plan.parts);
        let bounds = cuts.iter().map(|&c| c * hs).collect();
        let mut split = Split {
            heads,
            layout: *layout,
            score,
            segments,
            tables,
            plan,
            cuts,
            bounds,
            tile_work: 0,
        };
        if split.plan.by_tiles {
            split.tile_work = split.units().map(|u| u.keys.len() + 1).sum();
        }
        Ok(Some(split))
    }

    /// Checks, splits and runs `attend(split, part, target, scratch)` for every part in one
    /// region after `prelude`, each part with its own `scratch`; split by tiles, folds the
    /// tiles' results into `out` after.
    #[allow(clippy::type_complexity)]
    fn run<T: Accum<Acc = f32>>(
        (batch, score, q): (PagedBatch<'a>, &'a ScoreMod<'a>, &Rows<T>),
        (out, scratch, pool): (&mut [T], &mut [f32], &ThreadPool),
        prelude: Prelude<'_>,
        attend: impl Fn(&Split<'a>, usize, Target<'_, T>, &mut [f32]) + Sync,
    ) -> Result<(), KernelError> {
        let Some(split) = Split::new(batch, score, q, out, scratch, pool)? else {
            return Ok(());
        };
        let Plan {
            parts,
            by_tiles,
            slots,
            per_part,
        } = split.plan;
        if !by_tiles {
            par_cuts2(
                pool,
                prelude,
                out,
                &split.bounds,
                scratch,
                per_part,
                |part, out, scratch| attend(&split, part, Target::Out(out), scratch),
            );
            return Ok(());
        }
        let (slot_values, rest) = scratch.split_at_mut(slots);
        {
            let (slot_values, rest) = (Shared::new(slot_values), Shared::new(rest));
            pool.run_after(prelude, parts, &|part| {
                // SAFETY: part `part` alone takes its run of `rest`; its units write their
                // own slots (disjoint ranges of `slot_values`, see `tiles`).
                let scratch = unsafe { rest.range(part * per_part..(part + 1) * per_part) };
                attend(&split, part, Target::Slots(&slot_values), scratch);
            });
        }
        split.fold_slots(slot_values, out, &mut rest[..split.layout.head_size]);
        Ok(())
    }

    /// Part `part` into `target`, with `scratch` its own.
    fn attend<T: Accum<Acc = f32>, C: CacheElem>(
        &self,
        part: usize,
        q: &Rows<T>,
        k: Cached<C>,
        v: Cached<C>,
        target: Target<'_, T>,
        scratch: &mut [f32],
    ) {
        match target {
            Target::Out(out) => self.pairs(part, q, (k, v), out, scratch),
            Target::Slots(slots) => self.tiles(part, q, (k, v), slots, scratch),
        }
    }

    /// Part `part`'s (row, head) pairs into `out` (its run of the output).
    fn pairs<T: Accum<Acc = f32>, C: CacheElem>(
        &self,
        part: usize,
        q: &Rows<T>,
        (k, v): (Cached<C>, Cached<C>),
        out: &mut [T],
        scratch: &mut [f32],
    ) {
        let Split { heads, layout, .. } = *self;
        let group = heads / layout.kv_heads;
        let (first, last) = (self.cuts[part], self.cuts[part + 1]);
        let (t_first, t_last) = (first / heads, (last - 1) / heads);
        // The heads of row `t` inside the part that share KV head `kvh`.
        let heads_of = |t: usize, kvh: usize| {
            let lo = if t == t_first { first % heads } else { 0 };
            let hi = if t == t_last {
                (last - 1) % heads + 1
            } else {
                heads
            };
            lo.max(kvh * group)..hi.min((kvh + 1) * group)
        };
        // KV head by KV head: a prefill chunk's rows then reuse one head's keys and values
        // while they are in cache (all heads' of a long sequence would not fit in L2).
        for kvh in 0..layout.kv_heads {
            let mut t = t_first;
            while t <= t_last {
                let run = heads_of(t, kvh);
                let (_, s) = token_at(self.segments, t);
                // Up to MAX_TILE consecutive rows of the sequence with the same heads here
                // take each block together (each sees the keys of the one before and one
                // more; a window would make their first keys differ).
                let mut rows = 1;
                while self.score.window.is_none()
                    && rows < MAX_TILE
                    && t + rows <= t_last
                    && t + rows < s.rows.end
                    && heads_of(t + rows, kvh) == run
                {
                    rows += 1;
                }
                for n0 in run.clone().step_by(MAX_GROUP) {
                    let heads = n0..run.end.min(n0 + MAX_GROUP);
                    let tile = Tile {
                        rows: t..t + rows,
                        heads,
                        kvh,
                    };
                    self.attend_tile(&tile, q, (k, v), (&mut *out, first), scratch);
                }
                t += rows;
            }
        }
    }

    /// Heads `tile.heads` (sharing KV head `tile.kvh`) of the rows `tile.rows` (of one
    /// sequence) into their places in `out`, the part's output from pair `first` on.
    fn attend_tile<T: Accum<Acc = f32>, C: CacheElem>(
        &self,
        tile: &Tile,
        q: &Rows<T>,
        (k, v): (Cached<C>, Cached<C>),
        (out, first): (&mut [T], usize),
        scratch: &mut [f32],
    ) {
        let layout = self.layout;
        let hs = layout.head_size;
        let (_, s) = token_at(self.segments, tile.rows.start);
        let row_keys = |t: usize| keys_seen(s, t - s.rows.start, self.score);
        // The rows of a tile have no window: they all see keys from the first on.
        let seen = row_keys(tile.rows.end - 1);
        let table = &self.tables[s.table.clone()];
        let keys: SmallVec<[usize; MAX_TILE]> =
            tile.rows.clone().map(|t| row_keys(t).len()).collect();
        let qs: SmallVec<[&[T]; MAX_TILE * MAX_GROUP]> = (tile.rows.clone())
            .flat_map(|t| tile.heads.clone().map(move |n| q.head(t, n, hs)))
            .collect();
        // Each row's heads' outputs: disjoint runs of `out`, in order.
        let mut outs: SmallVec<[&mut [T]; MAX_TILE * MAX_GROUP]> = SmallVec::new();
        let (mut rest, mut base) = (out, 0);
        for t in tile.rows.clone() {
            let at = (t * self.heads + tile.heads.start - first) * hs;
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - base);
            let (mine, tail) = tail.split_at_mut(tile.heads.len() * hs);
            outs.extend(mine.chunks_mut(hs));
            (rest, base) = (tail, at + tile.heads.len() * hs);
        }
        let rows = RowKeys {
            qs: &qs,
            keys: &keys,
            first: seen.start,
            score: self.score,
            sinks: self.score.sinks.map(|s| &s[tile.heads.clone()]),
        };
        // A decode row's blocks come from memory; a prefill chunk's rows find theirs in
        // cache, warmed by the rows before.
        let prefetch = s.rows.len() <= PREFETCH_ROWS;
        let pieces = |keys| blocks(&layout, table, tile.kvh, (k, v), keys);
        attend_rows(&rows, pieces, scratch, &mut outs, true, prefetch);
    }
}

/// The pieces of KV head `kvh`'s keys and values at absolute positions `keys` of a sequence
/// with block table `table`: a block's rows at a time.
fn blocks<'c, C: CacheElem>(
    layout: &PagedLayout,
    table: &'c [u32],
    kvh: usize,
    (k, v): (Cached<'c, C>, Cached<'c, C>),
    keys: Range<usize>,
) -> impl Iterator<Item = Piece<'c, C>> + Clone + 'c {
    let (bs, hs, layout) = (layout.block_size, layout.head_size, *layout);
    (keys.start / bs..keys.end.div_ceil(bs)).map(move |bi| {
        let row = layout.head_start(table[bi], kvh) / hs;
        let rows = keys.start.max(bi * bs) - bi * bs..keys.end.min((bi + 1) * bs) - bi * bs;
        (k.rows(row..row + bs, hs), v.rows(row..row + bs, hs), rows)
    })
}

/// Query rows of one sequence and heads sharing one KV head, attended together.
struct Tile {
    rows: Range<usize>,
    heads: Range<usize>,
    kvh: usize,
}

/// The keys and values a step adds to a layer's cache, and the rotation its keys and queries
/// take (none without a rope).
#[derive(Debug, Clone, Copy)]
pub struct NewKv<'a, T> {
    pub keys: Rows<'a, T>,
    pub values: Rows<'a, T>,
    pub rope: Option<&'a Rope<'a, T>>,
}

/// A layer's step in one parallel region: its prelude writes the new keys (rotated) and values
/// into the layer's pools `store[k_at..]` and `store[v_at..]` as [`paged_append`] does and
/// rotates the queries into `rotated` as [`paged_rotate_query`] does (`rotated` unused
/// without a rope), a share of the tokens per call; its parts then attend as
/// [`paged_attention`] does, over the cache and queries so written. The same bits as those
/// three calls, without the serial writes between two regions (whose inputs the previous
/// region left in both cores' caches).
pub fn paged_step<T: Accum<Acc = f32>, C: CacheElem>(
    batch: PagedBatch<'_>,
    score: &ScoreMod,
    q: &Rows<T>,
    new: &NewKv<T>,
    (store, k_at, v_at): (KvMem<C>, usize, usize),
    rotated: &mut [T],
    (out, scratch, pool): (&mut [T], &mut [f32], &ThreadPool),
) -> Result<(), KernelError> {
    let PagedBatch {
        heads,
        layout,
        segments,
        tables,
    } = batch;
    let (kv_heads, hs) = (layout.kv_heads, layout.head_size);
    let tokens = segments.last().map_or(0, |s| s.rows.end);
    check_segments(layout, segments, tables, tokens)?;
    for (at, what) in [(k_at, "key pool"), (v_at, "value pool")] {
        check_pool(layout, store.values.len().saturating_sub(at), what)?;
        if !at.is_multiple_of(hs.max(1)) {
            return Err(KernelError::Shape(format!(
                "the {what} starts at {at}, not at a multiple of the head size {hs}"
            )));
        }
    }
    store.check(hs)?;
    check_disjoint_writes(layout, (k_at, v_at), segments, tables)?;
    new.keys.check(tokens, kv_heads, hs, "new keys")?;
    new.values.check(tokens, kv_heads, hs, "new values")?;
    check_rope(new.rope, segments, hs)?;
    if new.rope.is_some() {
        check_len("rotated query", rotated.len(), tokens * heads * hs)?;
    }
    let (store, rotated) = (SharedMem::new(store), Shared::new(rotated));
    let per_call = tokens.div_ceil(parts_for(pool, tokens, (heads + 2 * kv_heads) * hs).max(1));
    let write = |call: usize| {
        let rows = call * per_call..((call + 1) * per_call).min(tokens);
        // SAFETY: each call writes its own tokens' rows: distinct positions of one sequence,
        // in blocks no other segment writes (checked above), in key and value pools that do
        // not overlap (checked above); and of `rotated`, its own tokens' rows. Nothing reads
        // the store or `rotated` until every call has finished (the region's prelude).
        unsafe {
            for (src, at, rope) in [(&new.keys, k_at, new.rope), (&new.values, v_at, None)] {
                append_rows(
                    src,
                    layout,
                    segments,
                    tables,
                    rope,
                    rows.clone(),
                    (&store, at),
                );
            }
            if let Some(rope) = new.rope {
                rotate_rows(q, heads, hs, segments, rope, rows, &rotated);
            }
        }
    };
    Split::run(
        (batch, score, q),
        (out, scratch, pool),
        Prelude {
            tasks: tokens.div_ceil(per_call.max(1)),
            run: &write,
        },
        |split, part, target, scratch| {
            // SAFETY: the parts run after the prelude, every writer finished.
            let (k, v, rotated) =
                unsafe { (store.read(k_at, hs), store.read(v_at, hs), rotated.all()) };
            let q = match new.rope {
                Some(_) => Rows {
                    data: rotated,
                    stride: heads * hs,
                    offset: 0,
                },
                None => *q,
            };
            split.attend(part, &q, k, v, target, scratch);
        },
    )
}

#[cfg(test)]
#[path = "paged_tests.rs"]
mod tests;

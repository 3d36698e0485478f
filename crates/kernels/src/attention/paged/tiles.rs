//! A decode step's tiles over the threads: the [`Plan`] that chooses between runs of (row,
//! head) pairs and (row, KV head, tile) units, and the units' work, each tile's
//! [`Partial`]s written to its slot, then folded into each row on the calling thread.

use std::ops::Range;

use smallvec::SmallVec;

use super::{
    PREFETCH_ROWS, PagedLayout, Segment, Split, blocks, keys_seen, max_positions, part_count,
    token_at,
};
use crate::ThreadPool;
use crate::acc::Accum;
use crate::attention::group::{
    KV_TILE, MAX_GROUP, MAX_TILE, Partial, RowKeys, fold_tile, group_len, kv_tiles, row_scratch_len,
};
use crate::attention::kv::{CacheElem, Cached};
use crate::attention::shape::Rows;
use crate::par::Shared;

/// How a step's attention is split over the pool, and the scratch that takes.
pub(super) struct Plan {
    pub parts: usize,
    /// Whether the parts take (row, KV head, tile) units (see [`Split::tiles`]) rather than
    /// runs of (row, head) pairs.
    pub by_tiles: bool,
    /// Scratch values of the tiles' results when `by_tiles` (else 0): one slot of
    /// `head_size + 2` per (row, head, tile).
    pub slots: usize,
    /// Scratch values per part.
    pub per_part: usize,
}

impl Plan {
    pub(super) fn new(
        layout: &PagedLayout,
        heads: usize,
        segments: &[Segment],
        pool: &ThreadPool,
    ) -> Self {
        let parts = part_count(layout, heads, segments, pool);
        let tokens = segments.last().map_or(0, |s| s.rows.end);
        let tiles = max_positions(segments).div_ceil(KV_TILE);
        // A few rows over more than a tile of keys: a row's tiles spread over the threads.
        let by_tiles = parts > 1 && tokens <= PREFETCH_ROWS && tiles > 1;
        let hs = layout.head_size;
        let g_max = group_len(heads, layout.kv_heads);
        Plan {
            parts,
            by_tiles,
            slots: if by_tiles {
                tokens * heads * tiles * (hs + 2)
            } else {
                0
            },
            per_part: row_scratch_len(if by_tiles { 1 } else { MAX_TILE } * g_max, hs),
        }
    }
}

/// A (row, KV head, tile) unit of a step split by tiles.
pub(super) struct Unit<'s> {
    /// The row, and its sequence.
    pub t: usize,
    pub segment: &'s Segment,
    pub kvh: usize,
    /// The tile's keys the row sees.
    pub keys: Range<usize>,
    /// Whether these are the row's first keys (its sinks join them).
    pub first: bool,
}

impl Split<'_> {
    /// The units of a step split by tiles, in order: every row's KV heads, each over the
    /// row's tiles ([`kv_tiles`]).
    pub(super) fn units(&self) -> impl Iterator<Item = Unit<'_>> + '_ {
        let tokens = self.segments.last().map_or(0, |s| s.rows.end);
        (0..tokens).flat_map(move |t| {
            let (p, segment) = token_at(self.segments, t);
            let seen = keys_seen(segment, p - segment.start, self.score);
            (0..self.layout.kv_heads).flat_map(move |kvh| {
                kv_tiles(seen.clone()).map(move |keys| Unit {
                    t,
                    segment,
                    kvh,
                    first: keys.start == seen.start,
                    keys,
                })
            })
        })
    }

    /// Where the tile of keys from `from` of row `t`, head `h` keeps its result in the
    /// step's slots: its [`Partial`]'s shift and sum, then its weighted sum.
    fn slot(&self, t: usize, h: usize, from: usize) -> Range<usize> {
        let (tiles, hs) = (
            max_positions(self.segments).div_ceil(KV_TILE),
            self.layout.head_size,
        );
        let at = ((t * self.heads + h) * tiles + from / KV_TILE) * (hs + 2);
        at..at + hs + 2
    }

    /// Part `part`'s (row, KV head, tile) units: each unit's heads' [`Partial`]s and weighted
    /// sums into their slots ([`Split::slot`]). A unit belongs to the part its work's midpoint falls
    /// in, the step's work cut into equal shares.
    pub(super) fn tiles<T: Accum<Acc = f32>, C: CacheElem>(
        &self,
        part: usize,
        q: &Rows<T>,
        (k, v): (Cached<C>, Cached<C>),
        slots: &Shared<f32>,
        scratch: &mut [f32],
    ) {
        let Split { heads, layout, .. } = *self;
        let (hs, group, parts) = (layout.head_size, heads / layout.kv_heads, self.plan.parts);
        let (scores, acc) = scratch.split_at_mut(group.min(MAX_GROUP) * KV_TILE);
        let mut done = 0;
        for unit in self.units() {
            let Unit {
                t, kvh, ref keys, ..
            } = unit;
            let w = keys.len() + 1;
            let owner = (2 * done + w) * parts / (2 * self.tile_work);
            done += w;
            if owner != part {
                continue;
            }
            let table = &self.tables[unit.segment.table.clone()];
            let all = kvh * group..(kvh + 1) * group;
            for n0 in all.clone().step_by(MAX_GROUP) {
                let run = n0..all.end.min(n0 + MAX_GROUP);
                let qs: SmallVec<[&[T]; MAX_GROUP]> =
                    run.clone().map(|n| q.head(t, n, hs)).collect();
                let rows = RowKeys {
                    qs: &qs,
                    keys: &[keys.len()],
                    first: keys.start,
                    score: self.score,
                    sinks: (self.score.sinks)
                        .filter(|_| unit.first)
                        .map(|s| &s[run.clone()]),
                };
                let pieces = blocks(&layout, table, kvh, (k, v), keys.clone());
                let partials = rows.partials(pieces, scores, acc, true, true);
                for (i, n) in run.enumerate() {
                    // SAFETY: this (row, head, tile)'s slot is written by this unit alone.
                    let dst = unsafe { slots.range(self.slot(t, n, keys.start)) };
                    dst[0] = partials[i].shift;
                    dst[1] = partials[i].sum;
                    dst[2..].copy_from_slice(&acc[i * hs..][..hs]);
                }
            }
        }
    }

    /// Every row's tiles' results in `slots` folded in order ([`fold_tile`]) into `out`,
    /// `folded` (`head_size` values) the fold's weighted sum.
    pub(super) fn fold_slots<T: Accum<Acc = f32>>(
        &self,
        slots: &[f32],
        out: &mut [T],
        folded: &mut [f32],
    ) {
        let (heads, hs) = (self.heads, self.layout.head_size);
        for (t, row) in out.chunks_exact_mut(heads * hs).enumerate() {
            let (p, s) = token_at(self.segments, t);
            let seen = keys_seen(s, p - s.start, self.score);
            for (n, out) in row.chunks_exact_mut(hs).enumerate() {
                let mut state = None;
                for keys in kv_tiles(seen.clone()) {
                    let x = &slots[self.slot(t, n, keys.start)];
                    let partial = Partial {
                        shift: x[0],
                        sum: x[1],
                    };
                    fold_tile(&mut state, folded, partial, &x[2..]);
                }
                if state.is_none() {
                    out.fill(T::ZERO);
                    continue;
                }
                for (o, &a) in out.iter_mut().zip(&*folded) {
                    *o = T::narrow(a);
                }
            }
        }
    }
}

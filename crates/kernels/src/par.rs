//! Hands disjoint parts of output slices to pool tasks.
//!
//! [`ThreadPool::run`] takes `Fn(usize)` tasks, which cannot capture `&mut` slices; these
//! helpers give each task its own disjoint part of one or two outputs. The split never
//! changes what is written: callers compute every output element the same way however the
//! output is divided (the reduction contract, DESIGN.md §6), so the split only has to balance
//! load.

use std::marker::PhantomData;
use std::ops::Range;

use smallvec::SmallVec;

use crate::ThreadPool;
use crate::pool::{Prelude, chunk};

/// Work (multiply-adds or element visits) below which a kernel stays on the calling thread:
/// waking the workers costs a few microseconds, about what 32k simple element operations take.
pub const MIN_PARALLEL_WORK: usize = 1 << 15;

/// Parts per thread when splitting, so an uneven part does not leave threads idle.
const PARTS_PER_THREAD: usize = 4;

/// How many parts to split `units` independent units of `work_per_unit` each into: 1 when the
/// whole job is small or the pool has one thread, otherwise a few per thread (at most `units`).
pub fn parts_for(pool: &ThreadPool, units: usize, work_per_unit: usize) -> usize {
    let threads = pool.threads();
    if threads == 1 || units <= 1 || units.saturating_mul(work_per_unit.max(1)) < MIN_PARALLEL_WORK
    {
        return 1;
    }
    (threads * PARTS_PER_THREAD).min(units)
}

/// A `&mut [T]` that tasks on several threads carve disjoint ranges from (or, once no one
/// writes, read whole).
pub(crate) struct Shared<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: `Shared` only hands out `&mut` to ranges that its users guarantee are disjoint
// (see `range`), so sharing it is like sending disjoint `&mut [T]` to each thread.
unsafe impl<T: Send> Sync for Shared<'_, T> {}

impl<'a, T> Shared<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// The sub-slice `r`, clamped to the slice.
    ///
    /// # Safety
    /// No two live results may overlap: each caller passes ranges disjoint from every other
    /// range handed out while the borrow lasts.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, r: Range<usize>) -> &mut [T] {
        let end = r.end.min(self.len);
        let start = r.start.min(end);
        // SAFETY: `start..end` lies inside the original slice, and the caller guarantees no
        // other live reference covers it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }

    /// The whole slice, shared.
    ///
    /// # Safety
    /// No range handed out by [`Shared::range`] is live (every writer has finished).
    pub(crate) unsafe fn all(&self) -> &[T] {
        // SAFETY: the original slice; no live `&mut` into it by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Runs `f(start, part)` in parallel over consecutive parts of `out` of `part_len` elements
/// (the last may be shorter), where `part = &mut out[start..start + part_len]`.
pub fn par_chunks<T: Send>(
    pool: &ThreadPool,
    out: &mut [T],
    part_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let part_len = part_len.max(1);
    let n = out.len().div_ceil(part_len);
    let shared = Shared::new(out);
    pool.run(n, &|i| {
        let start = i * part_len;
        // SAFETY: task `i` alone gets `i * part_len..(i + 1) * part_len`; these never overlap.
        let part = unsafe { shared.range(start..start + part_len) };
        f(start, part);
    });
}

/// Like [`par_chunks`] over two outputs split in step: part `i` is
/// `a[i * a_len..(i + 1) * a_len]` with `b[i * b_len..(i + 1) * b_len]` (both clamped).
/// The part count follows `a`; `f` gets the part index.
pub fn par_chunks2<A: Send, B: Send>(
    pool: &ThreadPool,
    a: &mut [A],
    a_len: usize,
    b: &mut [B],
    b_len: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    let a_len = a_len.max(1);
    let n = a.len().div_ceil(a_len);
    let (sa, sb) = (Shared::new(a), Shared::new(b));
    pool.run(n, &|i| {
        // SAFETY: task `i` alone gets part `i` of each slice; parts never overlap.
        let (pa, pb) = unsafe {
            (
                sa.range(i * a_len..(i + 1) * a_len),
                sb.range(i * b_len..(i + 1) * b_len),
            )
        };
        f(i, pa, pb);
    });
}

/// Like [`par_chunks2`] with parts of `a` of any length: part `i` is
/// `a[cuts[i]..cuts[i + 1]]` (`cuts` ascending, at most `a.len()`) with
/// `b[i * b_len..(i + 1) * b_len]` (clamped); `prelude` runs in the same region before every
/// part (see [`Prelude`]).
pub fn par_cuts2<A: Send, B: Send>(
    pool: &ThreadPool,
    prelude: Prelude<'_>,
    a: &mut [A],
    cuts: &[usize],
    b: &mut [B],
    b_len: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    assert!(
        cuts.is_sorted() && cuts.last().is_none_or(|&c| c <= a.len()),
        "cuts ascend inside the slice"
    );
    let (sa, sb) = (Shared::new(a), Shared::new(b));
    pool.run_after(prelude, cuts.len().saturating_sub(1), &|i| {
        // SAFETY: task `i` alone gets part `i` of each slice; the cuts ascend, so parts never
        // overlap.
        let (pa, pb) = unsafe {
            (
                sa.range(cuts[i]..cuts[i + 1]),
                sb.range(i * b_len..(i + 1) * b_len),
            )
        };
        f(i, pa, pb);
    });
}

/// Views `out` as rows of `row_len` elements, cuts each row into `col_parts` near-equal
/// column ranges ([`chunk`]), and runs `f(row, cols, &mut out[row * row_len + cols])` for
/// every (row, range) pair. One task takes `rows_per_task` consecutive rows of one column
/// range, so consecutive rows can share what they read.
pub fn par_row_parts<T: Send>(
    pool: &ThreadPool,
    out: &mut [T],
    row_len: usize,
    rows_per_task: usize,
    col_parts: usize,
    f: impl Fn(usize, Range<usize>, &mut [T]) + Sync,
) {
    par_row_tiles(pool, out, row_len, 1, rows_per_task, col_parts, f);
}

/// Like [`par_row_parts`], with column ranges made of whole tiles of `tile` columns (the last
/// tile of a row may be short), for kernels that work `tile` columns at a time.
pub fn par_row_tiles<T: Send>(
    pool: &ThreadPool,
    out: &mut [T],
    row_len: usize,
    tile: usize,
    rows_per_task: usize,
    col_parts: usize,
    f: impl Fn(usize, Range<usize>, &mut [T]) + Sync,
) {
    let shared = Shared::new(out);
    let grid = Grid {
        tile,
        rows_per_task,
        col_parts,
    };
    row_grid(
        (shared.len / row_len.max(1), row_len),
        grid,
        pool,
        Prelude::NONE,
        |rows, cols| {
            for row in rows {
                let start = row * row_len;
                // SAFETY: (row, part) pairs are unique across tasks and `chunk` ranges of one row
                // are disjoint, so no two tasks get overlapping ranges.
                let slice = unsafe { shared.range(start + cols.start..start + cols.end) };
                f(row, cols.clone(), slice);
            }
        },
    );
}

/// How rows of columns are cut into tasks: blocks of `rows_per_task` rows, each row cut into
/// `col_parts` column ranges of whole `tile`s (the last tile of a row may be short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub tile: usize,
    pub rows_per_task: usize,
    pub col_parts: usize,
}

/// Splits `rows` rows of `row_len` columns as `grid` says and runs `task(rows, cols)` for
/// each (row block, column range) pair on `pool`: the grid [`par_row_tiles`] and
/// [`par_row_blocks_spans`] hand out.
pub(crate) fn row_grid(
    (rows, row_len): (usize, usize),
    grid: Grid,
    pool: &ThreadPool,
    prelude: Prelude<'_>,
    task: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    let Grid {
        tile,
        rows_per_task,
        col_parts,
    } = grid;
    if row_len == 0 {
        return;
    }
    let tile = tile.max(1);
    let tiles = row_len.div_ceil(tile);
    let rows_per_task = rows_per_task.max(1);
    let col_parts = col_parts.clamp(1, tiles);
    let row_blocks = rows.div_ceil(rows_per_task);
    pool.run_after(prelude, row_blocks * col_parts, &|t| {
        let (block, part) = (t / col_parts, t % col_parts);
        let tiles = chunk(tiles, col_parts, part);
        let cols = tiles.start * tile..(tiles.end * tile).min(row_len);
        let first = block * rows_per_task;
        task(first..(first + rows_per_task).min(rows), cols);
    });
}

/// The rows the quantized kernels' tasks take (their register blocks' rows).
pub const MAX_ROW_BLOCK: usize = 8;

/// The most rows [`par_row_blocks_spans`] hands one task (also the chunk of rows the f32 and
/// int8 product kernels keep accumulators for).
pub const MAX_TASK_ROWS: usize = 32;

/// Like [`par_row_tiles`], handing each task its `grid.rows_per_task` rows (at most
/// [`MAX_TASK_ROWS`]) of one column range at once, so a kernel can use what it loads for
/// several rows; over several outputs side by side in one column space (one output is one
/// span `0..row_len`). Output `p` holds the columns `spans[p]` (ascending, disjoint, each
/// starting on a whole `grid.tile`) as rows of `spans[p].len()` elements, all outputs with the
/// same number of rows. The column ranges are cut as if the outputs were one, then at the
/// outputs' edges: `f(first_row, p, cols, parts)` gets columns `cols` of the shared space,
/// all inside `spans[p]`, with `parts[i]` their elements in row `first_row + i` of output
/// `p`. `prelude` runs in the same region before every task (see [`Prelude`]).
pub fn par_row_blocks_spans<T: Send>(
    pool: &ThreadPool,
    prelude: Prelude<'_>,
    outs: &mut [&mut [T]],
    spans: &[Range<usize>],
    grid: Grid,
    f: impl Fn(usize, usize, Range<usize>, &mut [&mut [T]]) + Sync,
) {
    assert!(
        outs.len() == spans.len()
            && spans
                .windows(2)
                .all(|w| w[0].start <= w[0].end && w[0].end <= w[1].start),
        "one ascending span per output"
    );
    let Some(first_span) = spans.first() else {
        return;
    };
    let rows = outs[0].len() / first_span.len().max(1);
    let shared: SmallVec<[Shared<T>; 4]> = outs.iter_mut().map(|o| Shared::new(o)).collect();
    let grid = Grid {
        rows_per_task: grid.rows_per_task.clamp(1, MAX_TASK_ROWS),
        ..grid
    };
    let row_len = spans.last().map_or(0, |s| s.end);
    row_grid((rows, row_len), grid, pool, prelude, |rows, cols| {
        for (p, (span, out)) in spans.iter().zip(&shared).enumerate() {
            let sub = cols.start.max(span.start)..cols.end.min(span.end);
            if sub.is_empty() {
                continue;
            }
            let width = span.len();
            let local = sub.start - span.start..sub.end - span.start;
            let mut parts: [&mut [T]; MAX_TASK_ROWS] = Default::default();
            for (part, row) in parts.iter_mut().zip(rows.clone()) {
                let start = row * width;
                // SAFETY: (row, column range) pairs are unique across tasks and `chunk`
                // ranges of one row are disjoint; so are their cuts by the spans.
                *part = unsafe { out.range(start + local.start..start + local.end) };
            }
            f(rows.start, p, sub, &mut parts[..rows.len()]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_element_once() {
        let pool = ThreadPool::new(3);
        let mut out = vec![0u32; 103];
        par_chunks(&pool, &mut out, 10, |start, part| {
            for (j, v) in part.iter_mut().enumerate() {
                *v += (start + j) as u32 + 1;
            }
        });
        assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
    }

    #[test]
    fn paired_chunks_stay_in_step() {
        let pool = ThreadPool::new(2);
        let (mut a, mut b) = (vec![0usize; 12], vec![0usize; 4]);
        par_chunks2(&pool, &mut a, 3, &mut b, 1, |i, pa, pb| {
            pa.fill(i);
            pb[0] = i;
        });
        assert_eq!(b, [0, 1, 2, 3]);
        assert!(a.iter().enumerate().all(|(j, &v)| v == j / 3));
    }

    #[test]
    fn row_tiles_align_ranges_to_the_tile() {
        let pool = ThreadPool::new(3);
        let mut out = vec![0usize; 3 * 37];
        par_row_tiles(&pool, &mut out, 37, 8, 3, 4, |row, cols, part| {
            assert!(cols.start % 8 == 0, "{cols:?}");
            for (j, v) in cols.zip(part.iter_mut()) {
                *v += row * 37 + j + 1;
            }
        });
        assert!(out.iter().enumerate().all(|(i, &v)| v == i + 1));
    }

    #[test]
    fn row_blocks_cover_every_element_once() {
        let pool = ThreadPool::new(3);
        let mut out = vec![0usize; 11 * 19];
        #[allow(clippy::single_range_in_vec_init)]
        let spans = [0..19];
        par_row_blocks_spans(
            &pool,
            Prelude::NONE,
            &mut [&mut out[..]],
            &spans,
            Grid {
                tile: 8,
                rows_per_task: 4,
                col_parts: 2,
            },
            |first, _, cols, parts| {
                assert!(parts.len() <= 4 && cols.start % 8 == 0);
                for (i, part) in parts.iter_mut().enumerate() {
                    for (j, v) in cols.clone().zip(part.iter_mut()) {
                        *v += (first + i) * 19 + j + 1;
                    }
                }
            },
        );
        assert!(out.iter().enumerate().all(|(i, &v)| v == i + 1));
    }

    #[test]
    fn row_block_spans_cover_each_output_once() {
        let pool = ThreadPool::new(3);
        let spans = [0..20, 24..29, 32..48];
        let mut outs: Vec<Vec<usize>> = spans.iter().map(|s| vec![0; 5 * s.len()]).collect();
        let mut views: Vec<&mut [usize]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        par_row_blocks_spans(
            &pool,
            Prelude::NONE,
            &mut views,
            &spans,
            Grid {
                tile: 8,
                rows_per_task: 2,
                col_parts: 5,
            },
            |first, p, cols, parts| {
                assert!(cols.start >= spans[p].start && cols.end <= spans[p].end);
                assert!(cols.start % 8 == 0, "{cols:?}");
                for (i, part) in parts.iter_mut().enumerate() {
                    for (j, v) in cols.clone().zip(part.iter_mut()) {
                        *v += 1000 * (first + i) + j + 1;
                    }
                }
            },
        );
        for (span, out) in spans.iter().zip(&outs) {
            for (e, &v) in out.iter().enumerate() {
                let (row, j) = (e / span.len(), span.start + e % span.len());
                assert_eq!(v, 1000 * row + j + 1);
            }
        }
    }

    #[test]
    fn row_parts_tile_the_output() {
        let pool = ThreadPool::new(3);
        let mut out = vec![0usize; 7 * 5];
        par_row_parts(&pool, &mut out, 5, 2, 3, |row, cols, part| {
            for (j, v) in cols.zip(part.iter_mut()) {
                *v += row * 5 + j + 1;
            }
        });
        assert!(out.iter().enumerate().all(|(i, &v)| v == i + 1));
    }
}

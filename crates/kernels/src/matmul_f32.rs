//! The f32 product of [`crate::matmul`] on AVX-512 or AVX2 with FMA: its reference
//! arithmetic (one accumulator per output, `acc + a·b` fused into one rounding, K in order
//! from 0) with a vector's lanes on consecutive output columns, so every output keeps its own
//! chain and the bits are the reference's. Four vectors of columns go together (four
//! independent chains per row), up to six rows share each load of `B` (four with 256-bit
//! vectors), and the groups of rows of a chunk of 32 take turns over each block of 64 of
//! `B`'s rows while it is in L1 (their accumulators wait on the stack between blocks: each
//! output's chain is unchanged); each pass of columns takes every chunk of rows in turn, so
//! its part of `B` is read from memory once, asked for ahead (the next pass's into L2, the
//! next rows into L1). Columns short of a vector load one vector's first lanes (masked).
//!
//! `B` is read as ONNX stores it (row-major `k × n`: a pass takes a vector's width of each
//! row, `n` apart) or from [`PackedF32`], the same matrix laid out at load in tiles of
//! [`PACKED_TILE`] columns, each tile's rows one after another, so a pass streams
//! contiguous memory.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use crate::cpu;
use crate::error::{KernelError, numel};
#[cfg(target_arch = "x86_64")]
use crate::simd::F32Lanes;

/// Columns of a [`PackedF32`] tile: four 512-bit vectors, a pass's width.
pub const PACKED_TILE: usize = 64;

/// An f32 `B` (`k × n`) laid out in column tiles: tile `t` holds columns `64t..64t + 64` of
/// every row, row after row (`k × 64` values, past `n` zeros). The same values as `B`.
#[derive(Debug, Clone)]
pub struct PackedF32 {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedF32 {
    /// `b` (row-major `k × n`) in tiles.
    pub fn pack(b: &[f32], k: usize, n: usize) -> Result<PackedF32, KernelError> {
        crate::error::check_len("packed B", b.len(), numel(&[k, n])?)?;
        let tiles = n.div_ceil(PACKED_TILE);
        let mut data = vec![0f32; numel(&[tiles, k, PACKED_TILE])?];
        for (t, tile) in data.chunks_exact_mut(k * PACKED_TILE).enumerate() {
            let cols = t * PACKED_TILE..((t + 1) * PACKED_TILE).min(n);
            for (kk, row) in tile.chunks_exact_mut(PACKED_TILE).enumerate() {
                row[..cols.len()].copy_from_slice(&b[kk * n + cols.start..kk * n + cols.end]);
            }
        }
        Ok(PackedF32 { k, n, data })
    }

    /// `(k, n)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Bytes of the packed values.
    pub fn nbytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// Where a product reads `B`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Matrix<'a> {
    /// Row-major `k × n`.
    Rows {
        b: &'a [f32],
        n: usize,
    },
    Tiles(&'a PackedF32),
}

impl Matrix<'_> {
    fn n(&self) -> usize {
        match *self {
            Matrix::Rows { n, .. } => n,
            Matrix::Tiles(p) => p.n,
        }
    }

    /// Column-split granularity: tasks start on a tile so a pass stays inside one.
    pub(crate) fn tile(&self) -> usize {
        match self {
            Matrix::Rows { .. } => 16,
            Matrix::Tiles(_) => PACKED_TILE,
        }
    }

    /// Where column `j`'s value of row 0 lies, and the distance from one row to the next;
    /// the columns from `j` to the end of its tile (or of the row) follow it.
    fn column(&self, j: usize) -> (*const f32, usize) {
        match *self {
            Matrix::Rows { b, n } => (b[j..].as_ptr(), n),
            Matrix::Tiles(p) => {
                let (t, c) = (j / PACKED_TILE, j % PACKED_TILE);
                (p.data[t * p.k * PACKED_TILE + c..].as_ptr(), PACKED_TILE)
            }
        }
    }

    /// `B[kk, j]`.
    fn at(&self, kk: usize, j: usize) -> f32 {
        match *self {
            Matrix::Rows { b, n } => b[kk * n + j],
            Matrix::Tiles(p) => {
                p.data[((j / PACKED_TILE) * p.k + kk) * PACKED_TILE + j % PACKED_TILE]
            }
        }
    }

    /// Whether it holds a `k × n` matrix.
    fn holds(&self, k: usize) -> bool {
        match *self {
            Matrix::Rows { b, n } => b.len() >= k * n,
            Matrix::Tiles(p) => p.k == k,
        }
    }
}

/// What a [`pass`] asks for ahead of its loads.
#[derive(Clone, Copy)]
enum Fetch {
    None,
    /// Each input's row [`L1_AHEAD`] on into L1, and the same row of the next pass's columns
    /// (where there is one: they start here) into L2.
    Ahead(Option<*const f32>),
}

/// Vectors of columns a pass takes.
const VECTORS: usize = 4;
/// Rows a pass takes at most: six with 512-bit vectors (24 accumulators of the 32
/// registers), four with 256-bit ones (16 accumulators of 16).
const ROWS: usize = 6;
/// Rows whose accumulators a column pass keeps (on the stack) between blocks of `k`: [`block`]
/// takes its rows in chunks of this many.
pub(crate) const CHUNK: usize = crate::par::MAX_TASK_ROWS;
/// Inputs (rows of `B`) a pass runs before its accumulators go back to the stack: every row
/// group of a chunk runs over one block of `B`'s rows (at most 64 × 64 values, 16 KiB) while
/// it is in L1, rather than each group streaming all of the column's `k` rows from L2.
const K_BLOCK: usize = 64;
/// Rows of `B` a block's first group of rows asks for ahead of the one it computes: on the
/// Xeon slice an encoder's products (MiniLM's shapes, 70 rows, weights from memory) ran
/// 8-10% faster asking 8 rows ahead than 2 or none.
const L1_AHEAD: usize = 8;
/// Columns a pass holds at most (four 512-bit vectors).
const MAX_COLS: usize = VECTORS * 16;

/// Whether this CPU runs [`block`]'s vector kernel.
pub(crate) fn available() -> bool {
    cfg!(target_arch = "x86_64") && cpu::features().avx2_fma()
}

/// The products of `a`'s `rows` rows (each `k` long, one after another) with columns `cols`
/// of `b` (`k × n`): `store(r, j, values)` with the outputs of row `r` from column `j` on
/// (up to a pass's width at a time). `cols` starts on one
/// of `b`'s tiles ([`Matrix::tile`]). The vector kernel where [`available`], else the
/// reference loop.
pub(crate) fn block(
    a: &[f32],
    rows: usize,
    k: usize,
    b: Matrix,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        a.len() >= rows * k
            && b.holds(k)
            && cols.end <= b.n()
            && cols.start.is_multiple_of(b.tile())
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the CPU level was checked; `a` holds the rows and `b` the matrix (asserted).
        unsafe {
            if cpu::level() >= cpu::Level::Avx512 {
                block_avx512(a, rows, k, b, cols, store)
            } else {
                block_avx2(a, rows, k, b, cols, store)
            }
        }
        return;
    }
    for j in cols {
        for r in 0..rows {
            store(r, j, &[dot(&a[r * k..][..k], b, j)]);
        }
    }
}

/// Column `j` of row `a`'s product, in the reference's order (where the CPU has no vector
/// kernel).
#[inline(always)]
fn dot(a: &[f32], b: Matrix, j: usize) -> f32 {
    (a.iter().enumerate()).fold(0f32, |s, (kk, &x)| x.mul_add(b.at(kk, j), s))
}

/// # Safety
/// AVX-512 F must be available; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn block_avx512(
    a: &[f32],
    rows: usize,
    k: usize,
    b: Matrix,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, &[f32]),
) {
    // SAFETY: the caller's contract; AVX-512 is enabled here for the inlined body.
    unsafe { by_rows::<__m512, 6>(a, rows, k, b, cols, store) }
}

/// # Safety
/// AVX2 must be available; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(
    a: &[f32],
    rows: usize,
    k: usize,
    b: Matrix,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, &[f32]),
) {
    // SAFETY: the caller's contract; AVX2 is enabled here for the inlined body.
    unsafe { by_rows::<__m256, 4>(a, rows, k, b, cols, store) }
}

/// The columns in passes of [`VECTORS`] vectors, then two, then one, then the columns short
/// of a vector as one vector's first lanes; each pass over the rows in chunks of [`CHUNK`], in
/// groups of `G`.
///
/// # Safety
/// The CPU runs `V`; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn by_rows<V: F32Lanes, const G: usize>(
    a: &[f32],
    rows: usize,
    k: usize,
    b: Matrix,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, &[f32]),
) {
    let lanes = V::LANES;
    let wide = cols.start + (cols.len() / (VECTORS * lanes)) * VECTORS * lanes;
    let vectors_end = cols.start + (cols.len() / lanes) * lanes;
    // Each pass's columns for every chunk of rows in turn, so its weights come from memory
    // once and stay in L2 (a chunk's rows are re-read from L2 instead); the first chunk
    // asks for the next pass's columns while it computes. (A loop, not a closure: a closure
    // would not be compiled with this function's vector features.)
    macro_rules! chunks {
        (|$r0:ident, $a:ident, $here:ident, $put:ident| $pass:expr) => {
            for $r0 in (0..rows).step_by(CHUNK) {
                let $here = (rows - $r0).min(CHUNK);
                let $a = &a[$r0 * k..($r0 + $here) * k];
                let mut $put = |r: usize, j: usize, v: &[f32]| store($r0 + r, j, v);
                // SAFETY: the caller's contract; each pass's columns lie inside `cols`.
                unsafe { $pass };
            }
        };
    }
    let mut passes = (cols.start..wide).step_by(VECTORS * lanes).peekable();
    while let Some(j0) = passes.next() {
        let next = passes.peek().map(|&j| b.column(j).0);
        chunks!(|r0, a, here, put| {
            let columns = (b.column(j0), if r0 == 0 { next } else { None });
            let width = VECTORS * lanes;
            chunk_pass::<V, G, VECTORS, false>(a, here, k, columns, (j0, width), &mut put)
        });
    }
    // Two vectors where two are left (an attention head's 32 values on AVX-512): each row's
    // broadcast serves both.
    let pairs_end = wide + (vectors_end - wide) / (2 * lanes) * 2 * lanes;
    for j0 in (wide..pairs_end).step_by(2 * lanes) {
        chunks!(|r0, a, here, put| {
            let columns = (b.column(j0), None);
            chunk_pass::<V, G, 2, false>(a, here, k, columns, (j0, 2 * lanes), &mut put)
        });
    }
    for j0 in (pairs_end..vectors_end).step_by(lanes) {
        chunks!(|r0, a, here, put| {
            let columns = (b.column(j0), None);
            chunk_pass::<V, G, 1, false>(a, here, k, columns, (j0, lanes), &mut put)
        });
    }
    if vectors_end < cols.end {
        let width = cols.end - vectors_end;
        chunks!(|r0, a, here, put| {
            let columns = (b.column(vectors_end), None);
            chunk_pass::<V, G, 1, true>(a, here, k, columns, (vectors_end, width), &mut put)
        });
    }
}

/// Columns `j0..j0 + width` (`C · LANES`, or fewer than `LANES` with `TAIL`: one vector's
/// first lanes) of `rows` (at most [`CHUNK`]) rows: each block of
/// [`K_BLOCK`] inputs runs over every group of `G` rows (at most [`ROWS`]) in turn, the groups'
/// accumulators kept here between blocks; then `store` of each output. Each output's chain
/// is the reference's (its products added in order of `kk`, one rounding each). `b` is where
/// the columns start ([`Matrix::column`]); with `ahead` (where the next pass's columns
/// start), the first group of rows asks for their rows into L2 beside its own loads, one
/// input at a time (a hint: never read). Asked for a block's 64 rows at once, the hints
/// stalled the loads behind them: an encoder's products ran 6% slower.
///
/// # Safety
/// As for [`pass`], with `a` holding `rows` rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn chunk_pass<V: F32Lanes, const G: usize, const C: usize, const TAIL: bool>(
    a: &[f32],
    rows: usize,
    k: usize,
    (b, ahead): ((*const f32, usize), Option<*const f32>),
    (j0, width): (usize, usize),
    store: &mut impl FnMut(usize, usize, &[f32]),
) {
    let lanes = V::LANES;
    // As few groups as `G` rows allow, of near-equal rows: a chunk of 13 rows runs as 5, 4
    // and 4 (each row's load of `b` shared four or five ways), not 6, 6 and 1.
    let groups = rows.div_ceil(G);
    // SAFETY: the CPU runs `V` (the caller's contract); the passes as for `pass`.
    unsafe {
        // Room for the most groups a chunk has (groups of four rows: 256-bit vectors), only
        // the groups' own zeroed: clearing all of it (12 KiB) took as long as an attention
        // head's small products.
        let mut room =
            [const { std::mem::MaybeUninit::<[[V; C]; ROWS]>::uninit() }; CHUNK.div_ceil(4)];
        let accs: &mut [[[V; C]; ROWS]] = {
            for acc in &mut room[..groups] {
                acc.write([[V::zero(); C]; ROWS]);
            }
            // SAFETY: the first `groups` entries were written just above.
            std::slice::from_raw_parts_mut(room.as_mut_ptr().cast(), groups)
        };
        for k0 in (0..k).step_by(K_BLOCK) {
            let inputs = k0..(k0 + K_BLOCK).min(k);
            for (g, acc) in accs.iter_mut().enumerate() {
                let group = crate::pool::chunk(rows, groups, g);
                let (here, a) = (group.len(), &a[group.start * k..]);
                // The block's first group meets its rows of `b` first: it asks for them
                // ahead, and for the next pass's.
                let fetch = match g {
                    0 => Fetch::Ahead(ahead),
                    _ => Fetch::None,
                };
                let inputs = inputs.clone();
                match here {
                    1 => pass::<V, 1, C, TAIL>(a, k, b, inputs, (width, fetch), acc),
                    2 => pass::<V, 2, C, TAIL>(a, k, b, inputs, (width, fetch), acc),
                    3 => pass::<V, 3, C, TAIL>(a, k, b, inputs, (width, fetch), acc),
                    4 => pass::<V, 4, C, TAIL>(a, k, b, inputs, (width, fetch), acc),
                    5 => pass::<V, 5, C, TAIL>(a, k, b, inputs, (width, fetch), acc),
                    _ => pass::<V, 6, C, TAIL>(a, k, b, inputs, (width, fetch), acc),
                }
            }
        }
        let mut out = [0f32; MAX_COLS];
        for (g, acc) in accs.iter().enumerate() {
            let group = crate::pool::chunk(rows, groups, g);
            for (r, acc) in group.zip(&acc[..]) {
                for (c, acc) in acc.iter().enumerate() {
                    acc.store(out.as_mut_ptr().add(c * lanes));
                }
                store(r, j0, &out[..width]);
            }
        }
    }
}

/// Inputs `inputs` of `C` vectors of columns (with `TAIL`, one vector's first `width`, the
/// other lanes zero) for `R` rows, added to `accs`' first `R` rows: per input `kk`, the `C`
/// vectors of `b`'s row `kk` loaded once, each row's
/// `a[r][kk]` times them added to its accumulators. `b` is where column `j0` of row 0 lies
/// and the distance between rows ([`Matrix::column`]). With `fetch` (a block's first group
/// of rows, which meets its rows of `b` first), each input asks for the one [`L1_AHEAD`]
/// rows on into L1.
///
/// # Safety
/// The CPU runs `V`; `a` holds `R` rows of `k`; `b`'s rows `inputs` hold the `C · LANES`
/// columns from its pointer on.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<V: F32Lanes, const R: usize, const C: usize, const TAIL: bool>(
    a: &[f32],
    k: usize,
    (b, stride): (*const f32, usize),
    inputs: Range<usize>,
    (width, fetch): (usize, Fetch),
    accs: &mut [[V; C]; ROWS],
) {
    let lanes = V::LANES;
    let a = a.as_ptr();
    // SAFETY: the CPU runs `V` (the caller's contract), for every `V` method below; every
    // pointer stays inside `a` (R rows of k) and `b` (row `kk < k`, the pass's columns).
    unsafe {
        let mut acc = [[V::zero(); C]; R];
        acc.copy_from_slice(&accs[..R]);
        // Each row's own pointer, indexed by `kk`: a broadcast addresses its row as base
        // plus index, with no address arithmetic per row in the loop.
        let rows: [*const f32; R] = std::hint::black_box(std::array::from_fn(|r| a.add(r * k)));
        for kk in inputs {
            let row = b.add(kk * stride);
            if let Fetch::Ahead(next) = fetch {
                let ahead = row.wrapping_add(L1_AHEAD * stride);
                for c in 0..C {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c * lanes).cast());
                }
                if let Some(next) = next {
                    crate::mem::prefetch_lines(
                        next.wrapping_add(kk * stride).cast(),
                        C * lanes * 4,
                    );
                }
            }
            let mut w = [V::zero(); C];
            for (c, w) in w.iter_mut().enumerate() {
                *w = match TAIL {
                    true => V::load_first(row.add(c * lanes), width),
                    false => V::load(row.add(c * lanes)),
                };
            }
            for (acc, row) in acc.iter_mut().zip(&rows) {
                let x = V::splat(*row.add(kk));
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = V::fma(*acc, x, w);
                }
            }
        }
        accs[..R].copy_from_slice(&acc);
    }
}

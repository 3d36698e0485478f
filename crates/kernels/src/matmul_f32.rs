//! The f32 product of [`crate::matmul`] on AVX-512 or AVX2 with FMA: its reference
//! arithmetic (one accumulator per output, `acc + a·b` fused into one rounding, K in order
//! from 0) with a vector's lanes on consecutive output columns, so every output keeps its own
//! chain and the bits are the reference's. Four vectors of columns go together (four
//! independent chains per row), and up to four rows share each load of `B`.
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

/// Vectors of columns a pass takes.
const VECTORS: usize = 4;
/// Rows a pass takes.
const ROWS: usize = 4;
/// Columns a pass holds at most (four 512-bit vectors).
const MAX_COLS: usize = VECTORS * 16;

/// Whether this CPU runs [`block`]'s vector kernel.
pub(crate) fn available() -> bool {
    cfg!(target_arch = "x86_64") && cpu::features().avx2_fma()
}

/// The products of `a`'s `rows` rows (each `k` long, one after another) with columns `cols`
/// of `b` (`k × n`): `store(r, j, acc)` for each row `r` and column `j`. `cols` starts on one
/// of `b`'s tiles ([`Matrix::tile`]). The vector kernel where [`available`], else the
/// reference loop.
pub(crate) fn block(
    a: &[f32],
    rows: usize,
    k: usize,
    b: Matrix,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, f32),
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
            store(r, j, dot(&a[r * k..][..k], b, j));
        }
    }
}

/// Column `j` of row `a`'s product, in the reference's order. Inlined, so that inside the
/// vector kernels `mul_add` is the FMA instruction rather than a call to libm's `fmaf`.
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
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the caller's contract; AVX-512 is enabled here for the inlined body.
    unsafe { by_rows::<__m512>(a, rows, k, b, cols, store) }
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
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the caller's contract; AVX2 is enabled here for the inlined body.
    unsafe { by_rows::<__m256>(a, rows, k, b, cols, store) }
}

/// The rows four at a time, each group over the columns in passes of [`VECTORS`] vectors,
/// then one vector, then the columns short of a vector one at a time.
///
/// # Safety
/// The CPU runs `V`; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn by_rows<V: F32Lanes>(
    a: &[f32],
    rows: usize,
    k: usize,
    b: Matrix,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, f32),
) {
    let lanes = V::LANES;
    let wide = cols.start + (cols.len() / (VECTORS * lanes)) * VECTORS * lanes;
    let vectors_end = cols.start + (cols.len() / lanes) * lanes;
    for r0 in (0..rows).step_by(ROWS) {
        let here = (rows - r0).min(ROWS);
        let a = &a[r0 * k..(r0 + here) * k];
        let mut put = |r: usize, j: usize, v: f32| store(r0 + r, j, v);
        // SAFETY: the caller's contract; each pass's columns lie inside `cols`.
        unsafe {
            for j0 in (cols.start..wide).step_by(VECTORS * lanes) {
                pass_rows::<V, VECTORS>(a, here, k, b.column(j0), j0, &mut put);
            }
            for j0 in (wide..vectors_end).step_by(lanes) {
                pass_rows::<V, 1>(a, here, k, b.column(j0), j0, &mut put);
            }
        }
        for j in vectors_end..cols.end {
            for r in 0..here {
                put(r, j, dot(&a[r * k..][..k], b, j));
            }
        }
    }
}

/// [`pass`] for `rows` (1 to 4) rows.
///
/// # Safety
/// As for [`pass`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass_rows<V: F32Lanes, const C: usize>(
    a: &[f32],
    rows: usize,
    k: usize,
    b: (*const f32, usize),
    j0: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the caller's contract, for each arm.
    unsafe {
        match rows {
            1 => pass::<V, 1, C>(a, k, b, j0, store),
            2 => pass::<V, 2, C>(a, k, b, j0, store),
            3 => pass::<V, 3, C>(a, k, b, j0, store),
            _ => pass::<V, 4, C>(a, k, b, j0, store),
        }
    }
}

/// Columns `j0..j0 + C · LANES` of `R` rows: per input `kk`, the `C` vectors of `b`'s row
/// `kk` loaded once, each row's `a[r][kk]` times them added to its accumulators. `b` is
/// where column `j0` of row 0 lies and the distance between rows ([`Matrix::column`]).
///
/// # Safety
/// The CPU runs `V`; `a` holds `R` rows of `k`; `b`'s `k` rows hold the `C · LANES` columns
/// from its pointer on.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<V: F32Lanes, const R: usize, const C: usize>(
    a: &[f32],
    k: usize,
    (b, stride): (*const f32, usize),
    j0: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    let lanes = V::LANES;
    let a = a.as_ptr();
    // SAFETY: the CPU runs `V` (the caller's contract), for every `V` method below; every
    // pointer stays inside `a` (R rows of k) and `b` (row `kk < k`, the pass's columns).
    unsafe {
        let mut acc = [[V::zero(); C]; R];
        for kk in 0..k {
            let row = b.add(kk * stride);
            let mut w = [V::zero(); C];
            for (c, w) in w.iter_mut().enumerate() {
                *w = V::load(row.add(c * lanes));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = V::splat(*a.add(r * k + kk));
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = V::fma(*acc, x, w);
                }
            }
        }
        let mut out = [0f32; MAX_COLS];
        for (r, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                acc.store(out.as_mut_ptr().add(c * lanes));
            }
            for (i, &v) in out[..C * lanes].iter().enumerate() {
                store(r, j0 + i, v);
            }
        }
    }
}

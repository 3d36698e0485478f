//! The f32 product of [`crate::matmul`] on AVX-512 or AVX2: its reference arithmetic (one
//! accumulator per output, `acc + a·b` rounded after the product and after the sum, K in
//! order from 0) with a vector's lanes on consecutive output columns, so every output keeps
//! its own chain and the bits are the reference's. Four vectors of columns go together (four
//! independent chains per row), and up to four rows share each load of `B`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use crate::cpu;
#[cfg(target_arch = "x86_64")]
use crate::simd::F32Lanes;

/// Vectors of columns a pass takes.
const VECTORS: usize = 4;
/// Rows a pass takes.
const ROWS: usize = 4;
/// Columns a pass holds at most (four 512-bit vectors).
const MAX_COLS: usize = VECTORS * 16;

/// Whether this CPU runs [`block`]'s vector kernel.
pub(crate) fn available() -> bool {
    cfg!(target_arch = "x86_64") && cpu::isa() >= cpu::Isa::Avx2
}

/// The products of `a`'s `rows` rows (each `k` long, one after another) with columns `cols`
/// of `b` (`k × n`, row-major): `store(r, j, acc)` for each row `r` and column `j`. Only
/// where [`available`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    a: &[f32],
    rows: usize,
    k: usize,
    b: &[f32],
    n: usize,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, f32),
) {
    assert!(available() && a.len() >= rows * k && b.len() >= k * n && cols.end <= n);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU level was checked; `a` holds the rows and `b` the matrix (asserted).
    unsafe {
        if cpu::isa() >= cpu::Isa::Avx512 {
            block_avx512(a, rows, k, b, n, cols, store)
        } else {
            block_avx2(a, rows, k, b, n, cols, store)
        }
    }
}

/// # Safety
/// AVX-512 F must be available; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn block_avx512(
    a: &[f32],
    rows: usize,
    k: usize,
    b: &[f32],
    n: usize,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the caller's contract; AVX-512 is enabled here for the inlined body.
    unsafe { by_rows::<__m512>(a, rows, k, b, n, cols, store) }
}

/// # Safety
/// AVX2 must be available; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(
    a: &[f32],
    rows: usize,
    k: usize,
    b: &[f32],
    n: usize,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the caller's contract; AVX2 is enabled here for the inlined body.
    unsafe { by_rows::<__m256>(a, rows, k, b, n, cols, store) }
}

/// The rows four at a time, each group over the columns in passes of [`VECTORS`] vectors,
/// then one vector, then the columns short of a vector one at a time.
///
/// # Safety
/// The CPU runs `V`; the arguments as [`block`] asserts.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn by_rows<V: F32Lanes>(
    a: &[f32],
    rows: usize,
    k: usize,
    b: &[f32],
    n: usize,
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
                pass_rows::<V, VECTORS>(a, here, k, b, n, j0, &mut put);
            }
            for j0 in (wide..vectors_end).step_by(lanes) {
                pass_rows::<V, 1>(a, here, k, b, n, j0, &mut put);
            }
        }
        for j in vectors_end..cols.end {
            for r in 0..here {
                let a = &a[r * k..][..k];
                let acc = (a.iter().enumerate()).fold(0f32, |s, (kk, &x)| s + x * b[kk * n + j]);
                put(r, j, acc);
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
#[allow(clippy::too_many_arguments)]
unsafe fn pass_rows<V: F32Lanes, const C: usize>(
    a: &[f32],
    rows: usize,
    k: usize,
    b: &[f32],
    n: usize,
    j0: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    // SAFETY: the caller's contract, for each arm.
    unsafe {
        match rows {
            1 => pass::<V, 1, C>(a, k, b, n, j0, store),
            2 => pass::<V, 2, C>(a, k, b, n, j0, store),
            3 => pass::<V, 3, C>(a, k, b, n, j0, store),
            _ => pass::<V, 4, C>(a, k, b, n, j0, store),
        }
    }
}

/// Columns `j0..j0 + C · LANES` of `R` rows: per input `kk`, the `C` vectors of `b`'s row
/// `kk` loaded once, each row's `a[r][kk]` times them added to its accumulators.
///
/// # Safety
/// The CPU runs `V`; `a` holds `R` rows of `k`, `b` the `k × n` matrix, and the columns lie
/// inside `n`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<V: F32Lanes, const R: usize, const C: usize>(
    a: &[f32],
    k: usize,
    b: &[f32],
    n: usize,
    j0: usize,
    store: &mut impl FnMut(usize, usize, f32),
) {
    let lanes = V::LANES;
    let (a, b) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the CPU runs `V` (the caller's contract), for every `V` method below; every
    // pointer stays inside `a` (R rows of k) and `b` (row `kk < k`, columns inside `n`).
    unsafe {
        let mut acc = [[V::zero(); C]; R];
        for kk in 0..k {
            let row = b.add(kk * n + j0);
            let mut w = [V::zero(); C];
            for (c, w) in w.iter_mut().enumerate() {
                *w = V::load(row.add(c * lanes));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = V::splat(*a.add(r * k + kk));
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = V::mul_add(*acc, x, w);
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

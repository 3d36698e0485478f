//! The integer arithmetic of onnxruntime's dynamic int8 exports (`quantize_dynamic`):
//! activations quantized to uint8 per tensor ([`dynamic_quantize`], ONNX
//! `DynamicQuantizeLinear`), then `MatMulInteger`'s exact int32 products
//! ([`matmul_integer`]). Both are exact in their types (the products and sums are integers;
//! the quantization's scale and rounding are onnxruntime's, in f32), so every path and thread
//! count gives the same bits.

use crate::ThreadPool;
#[cfg(target_arch = "x86_64")]
use crate::cpu;
use crate::error::{KernelError, check_len};
use crate::par::{par_chunks, parts_for};

/// `x` quantized to uint8 as ONNX's `DynamicQuantizeLinear` (and onnxruntime) does: the range
/// `[min(0, min x), max(0, max x)]` over 255 steps (`scale` 1 when the range is empty), the
/// zero point `round(0 - min / scale)` clamped to `0..=255`, each code
/// `clamp(round(x / scale) + zero_point)`, rounding half to even. Returns `(scale,
/// zero_point)`; a NaN in `x` gives NaN arithmetic as onnxruntime's would, clamped codes.
pub fn dynamic_quantize(x: &[f32], codes: &mut [u8]) -> Result<(f32, u8), KernelError> {
    check_len("codes", codes.len(), x.len())?;
    let (lo, hi) = x
        .iter()
        .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let scale = if hi == lo { 1.0 } else { (hi - lo) / 255.0 };
    let zero = round_even((0.0 - lo / scale).clamp(0.0, 255.0));
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = (round_even((v / scale).clamp(-512.0, 512.0)) + zero).clamp(0.0, 255.0) as u8;
    }
    Ok((scale, zero as u8))
}

/// The lengths a product's `a` (of `a_len` values), zero points and output must have.
fn check_operands(
    a_len: usize,
    a_zero: &[i32],
    b_zero: &[i32],
    out: &[i32],
    (m, k, n): (usize, usize, usize),
) -> Result<(), KernelError> {
    check_len("A", a_len, m * k)?;
    check_len("output", out.len(), m * n)?;
    check_len("B's zero points", b_zero.len(), n)?;
    if a_zero.len() != 1 {
        check_len("A's zero points", a_zero.len(), m)?;
    }
    Ok(())
}

/// `x` rounded to the nearest integer, ties to even, for `|x| <= 2^22` (callers clamp: the
/// quotients here are within ±255, and past ±512 every code saturates anyway), by adding and
/// subtracting 1.5·2^23, which rounds in the default mode; branch-free, so the loop
/// vectorizes without a call into libm per element. NaN stays NaN.
#[inline(always)]
fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// `out (m × n) = (a - a_zero) (m × k) · (b - b_zero) (k × n)` in int32, for (u)int8
/// operands as stored: `a_zero` one value or one per row of `a`, `b_zero` one per column of
/// `b` (a per-tensor zero point repeated). Sums wrap on overflow (possible only past
/// `k = 33025`), as onnxruntime's int32 accumulators do. Rows are split over the pool.
pub fn matmul_integer<A: Copy + Into<i32> + Sync, B: Copy + Into<i32> + Sync>(
    a: &[A],
    a_zero: &[i32],
    b: &[B],
    b_zero: &[i32],
    out: &mut [i32],
    (m, k, n): (usize, usize, usize),
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    check_len("B", b.len(), k * n)?;
    check_operands(a.len(), a_zero, b_zero, out, (m, k, n))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let parts = parts_for(pool, m, k * n);
    let rows = m.div_ceil(parts);
    par_chunks(pool, out, rows * n, |first, part| {
        for (r, row) in part.chunks_exact_mut(n).enumerate() {
            let i = first / n + r;
            let za = a_zero[if a_zero.len() == 1 { 0 } else { i }];
            let a_row = &a[i * k..(i + 1) * k];
            #[cfg(target_arch = "x86_64")]
            if cpu::level() >= cpu::Level::Avx512 && cpu::features().avx512bw {
                // SAFETY: AVX-512 F and BW are available (checked above).
                unsafe { row_avx512(a_row, za, b, b_zero, row) };
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if cpu::level() >= cpu::Level::Avx2 {
                // SAFETY: AVX2 is available (checked above).
                unsafe { row_avx2(a_row, za, b, b_zero, row) };
                continue;
            }
            product_row(a_row, za, b, b_zero, row);
        }
    });
    Ok(())
}

/// An int8 `b` (`k × n`) laid out for [`matmul_integer_packed`]: tile `t` of 64 columns, group
/// `g` of four rows, holds 64 columns of four bytes
/// (`data[((t * groups + g) * 64 + c) * 4 + r] = b[4g + r, 64t + c]`, zero past `k` and `n`:
/// `vpdpbusd`'s four bytes per lane), with `b`'s column sums for the zero-point correction.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    k: usize,
    n: usize,
    data: Vec<i8>,
    col_sums: Vec<i32>,
}

impl PackedI8 {
    /// `b` (row-major `k × n`) in tiles.
    pub fn pack(b: &[i8], k: usize, n: usize) -> Result<PackedI8, KernelError> {
        check_len("B", b.len(), k * n)?;
        let groups = k.div_ceil(4);
        let mut data = vec![0i8; n.div_ceil(TILE) * groups * TILE * 4];
        let mut col_sums = vec![0i32; n];
        for kk in 0..k {
            let (g, r) = (kk / 4, kk % 4);
            for (j, &w) in b[kk * n..(kk + 1) * n].iter().enumerate() {
                let (t, c) = (j / TILE, j % TILE);
                data[((t * groups + g) * TILE + c) * 4 + r] = w;
                col_sums[j] = col_sums[j].wrapping_add(i32::from(w));
            }
        }
        Ok(PackedI8 {
            k,
            n,
            data,
            col_sums,
        })
    }

    /// `(k, n)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Whether this CPU runs the packed kernel (AVX-512 with VNNI).
    pub fn available() -> bool {
        cfg!(target_arch = "x86_64")
            && cpu::level() >= cpu::Level::Avx512
            && cpu::features().avx512vnni
    }
}

/// [`matmul_integer`] for uint8 `a` against a [`PackedI8`] `b` (onnxruntime's dynamic int8
/// exports' form) with AVX-512 VNNI: each row's `Σ a·b` in 16-column lanes, the zero points
/// folded in after (`Σ (a - za)(b - zb) = Σ ab - zb Σa - za Σb + k·za·zb`, exact in wrapping
/// i32 arithmetic, so the same bits as the loop). Call only where [`PackedI8::available`].
pub fn matmul_integer_packed(
    a: &[u8],
    a_zero: &[i32],
    b: &PackedI8,
    b_zero: &[i32],
    out: &mut [i32],
    m: usize,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let (k, n) = (b.k, b.n);
    check_operands(a.len(), a_zero, b_zero, out, (m, k, n))?;
    if !PackedI8::available() {
        return Err(KernelError::Shape(
            "the packed int8 product needs AVX-512 VNNI; check PackedI8::available".into(),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let groups = k.div_ceil(4);
    let parts = parts_for(pool, m, k * n);
    let rows = m.div_ceil(parts);
    par_chunks(pool, out, rows * n, |first, part| {
        let mut quads = vec![0i32; groups];
        for (r, row) in part.chunks_exact_mut(n).enumerate() {
            let i = first / n + r;
            let mut sum_a = 0i32;
            quads.fill(0);
            for (kk, &x) in a[i * k..(i + 1) * k].iter().enumerate() {
                quads[kk / 4] |= i32::from(x) << (8 * (kk % 4));
                sum_a += i32::from(x);
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F, BW and VNNI are available (checked above); `b.data` holds
            // `n.div_ceil(64)` tiles of `groups` groups and `row` is `n` long.
            unsafe {
                dot_rows_vnni(&quads, &b.data, row)
            };
            let za = a_zero[if a_zero.len() == 1 { 0 } else { i }];
            let kz = (k as i32).wrapping_mul(za);
            for (j, o) in row.iter_mut().enumerate() {
                let zb = b_zero[j];
                *o = o
                    .wrapping_sub(zb.wrapping_mul(sum_a))
                    .wrapping_sub(za.wrapping_mul(b.col_sums[j]))
                    .wrapping_add(kz.wrapping_mul(zb));
            }
        }
    });
    Ok(())
}

/// Columns a VNNI tile holds: four 16-lane vectors, four independent `vpdpbusd` chains.
const TILE: usize = 64;

/// `row[j] = Σ_g Σ_r a_quad[g].byte(r) · b[4g + r, j]` from the tiles `packed` holds: each
/// tile's four vectors of columns accumulate over the groups, then the row's columns of the
/// tile are stored.
///
/// # Safety
/// AVX-512 F, BW and VNNI must be available; `packed` holds `row.len().div_ceil(64)` tiles of
/// `quads.len()` groups.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_rows_vnni(quads: &[i32], packed: &[i8], row: &mut [i32]) {
    use std::arch::x86_64::*;
    let groups = quads.len();
    let mut lanes = [0i32; TILE];
    for (t, cols) in row.chunks_mut(TILE).enumerate() {
        let mut acc = [_mm512_setzero_si512(); 4];
        for (g, &q) in quads.iter().enumerate() {
            let x = _mm512_set1_epi32(q);
            let base = packed[(t * groups + g) * TILE * 4..].as_ptr();
            for (v, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the tile's group holds 256 bytes from `base`.
                let w = unsafe { _mm512_loadu_si512(base.add(v * 64).cast()) };
                *acc = _mm512_dpbusd_epi32(*acc, x, w);
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            // SAFETY: `lanes` holds 64 i32.
            unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().add(v * 16).cast(), *acc) };
        }
        cols.copy_from_slice(&lanes[..cols.len()]);
    }
}

/// One output row: `row[j] = Σ_k (a_row[k] - za) · (b[k, j] - b_zero[j])`, an integer loop
/// the compiler vectorizes over `j` for whatever the calling function enables.
#[inline(always)]
fn product_row<A: Copy + Into<i32>, B: Copy + Into<i32>>(
    a_row: &[A],
    za: i32,
    b: &[B],
    b_zero: &[i32],
    row: &mut [i32],
) {
    let n = row.len();
    row.fill(0);
    for (kk, &x) in a_row.iter().enumerate() {
        let x = x.into() - za;
        let weights = &b[kk * n..(kk + 1) * n];
        for ((o, &w), &zb) in row.iter_mut().zip(weights).zip(b_zero) {
            *o = o.wrapping_add(x.wrapping_mul(w.into() - zb));
        }
    }
}

/// [`product_row`] compiled for AVX2 (8 lanes of i32).
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_avx2<A: Copy + Into<i32>, B: Copy + Into<i32>>(
    a_row: &[A],
    za: i32,
    b: &[B],
    b_zero: &[i32],
    row: &mut [i32],
) {
    product_row(a_row, za, b, b_zero, row)
}

/// [`product_row`] compiled for AVX-512 (16 lanes of i32).
///
/// # Safety
/// AVX-512 F and BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn row_avx512<A: Copy + Into<i32>, B: Copy + Into<i32>>(
    a_row: &[A],
    za: i32,
    b: &[B],
    b_zero: &[i32],
    row: &mut [i32],
) {
    product_row(a_row, za, b, b_zero, row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_quantize_follows_the_onnx_example() {
        // ONNX's node test `test_dynamicquantizelinear` (0.5 / scale rounds to 25.5 in f32,
        // then to the even 26).
        let x = [0.0, 2.0, -3.0, -2.5, 1.34, 0.5];
        let mut codes = [0u8; 6];
        let (scale, zero) = dynamic_quantize(&x, &mut codes).unwrap();
        assert_eq!((scale, zero), (0.019_607_844, 153));
        assert_eq!(codes, [153, 255, 0, 26, 221, 179]);
        // Ties go to even, as round_ties_even does.
        for x in [
            0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 254.5, -255.5, 3.2, -3.7, 0.0, -0.0,
        ] {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
        // All zeros: scale 1, zero point 0.
        let (scale, zero) = dynamic_quantize(&[0.0; 3], &mut codes[..3]).unwrap();
        assert_eq!((scale, zero), (1.0, 0));
    }

    #[test]
    fn matmul_integer_is_the_exact_product_at_any_thread_count() {
        let (m, k, n) = (7, 33, 19);
        let a: Vec<u8> = (0..m * k).map(|i| (i * 37 % 256) as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (i * 91 % 256) as u8 as i8).collect();
        let a_zero: Vec<i32> = (0..m as i32).map(|i| 100 + i).collect();
        let b_zero: Vec<i32> = (0..n as i32).map(|j| j - 9).collect();
        let mut want = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k)
                    .map(|kk| {
                        let x = i32::from(a[i * k + kk]) - a_zero[i];
                        x * (i32::from(b[kk * n + j]) - b_zero[j])
                    })
                    .sum();
            }
        }
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let mut out = vec![0i32; m * n];
            matmul_integer(&a, &a_zero, &b, &b_zero, &mut out, (m, k, n), &pool).unwrap();
            assert_eq!(out, want, "{threads} threads");
            if PackedI8::available() {
                out.fill(0);
                let packed = PackedI8::pack(&b, k, n).unwrap();
                matmul_integer_packed(&a, &a_zero, &packed, &b_zero, &mut out, m, &pool).unwrap();
                assert_eq!(out, want, "packed, {threads} threads");
            }
        }
        // A per-tensor A zero point, 40 columns (two vectors and a tail), k not a multiple of 4.
        let (m, k, n) = (3, 13, 40);
        let a: Vec<u8> = (0..m * k).map(|i| (i * 53 % 256) as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (i * 29 % 256) as u8 as i8).collect();
        let b_zero = vec![0i32; n];
        let mut want = vec![0i32; m * n];
        let mut out = vec![0i32; m * n];
        let pool = ThreadPool::new(2);
        matmul_integer(&a, &[128], &b, &b_zero, &mut want, (m, k, n), &pool).unwrap();
        if PackedI8::available() {
            let packed = PackedI8::pack(&b, k, n).unwrap();
            matmul_integer_packed(&a, &[128], &packed, &b_zero, &mut out, m, &pool).unwrap();
            assert_eq!(out, want);
        }
    }
}

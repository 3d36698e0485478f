//! MXFP4 matrices (OCP microscaling FP4): e2m1 codes with one e8m0 scale per 32 values along
//! K, `y = a · Wᵀ (+ bias)` computed on the codes as stored ([`matmul_mxfp4`]), never
//! expanded to f32 weights.
//!
//! A code is `s e e m` (sign, two exponent bits, one mantissa bit): the values
//! `±{0, 0.5, 1, 1.5, 2, 3, 4, 6}` ([`E2M1`]). A scale byte `e` is `2^(e - 127)` (255 is NaN;
//! [`e8m0`]). Every weight `E2M1[c] · 2^(e - 127)` is an exact f32 (short of overflow).
//!
//! Layout (com.microsoft::QMoE's `fp4` form, as onnxruntime-genai's builder writes gpt-oss's
//! experts): codes `[K, N / 2]`, row `k` holding every output column's code for input `k`,
//! two per byte with the even column in the low nibble; scales `[N, K / 32]`.
//!
//! The reduction contract (DESIGN.md §6): output `(i, n)` is `Σ_b s(n, b) · p_b`, where
//! `p_b = Σ_{k in block b} a[i, k] · w(k, n)` is one f32 accumulator over the block's 32
//! inputs in order by fused multiply-add, and the blocks add in order as `fma(p_b, s, total)`
//! from 0; the bias after. Columns are independent (vectors and threads split them, never
//! K), and a row's result does not depend on the other rows: any thread count, batch or
//! ISA gives the same bits. The AVX2 path ([`crate::cpu`] permitting) is tested against the
//! scalar reference bit for bit.
//!
//! That is the exact path. The int8-activation one (`accuracy_level` 4) is split like
//! `nbits/`: `int8` (the arithmetic in its module doc, [`matmul_mxfp4_int8`], and the pass
//! over the tiles), `int8_reference` (its scalar oracle), `packed` (the tiles packed at load,
//! [`Mxfp4Packed`]), `tile_avx2` and `tile_avx512` (the tile kernels); activations are
//! quantized by [`crate::int8`], which `nbits` uses too.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use crate::ThreadPool;
use crate::cpu;
use crate::error::{KernelError, check_len, numel};
use crate::par::{par_row_tiles, parts_for};

mod int8;
mod int8_reference;
mod packed;
#[cfg(target_arch = "x86_64")]
mod tile_avx2;
#[cfg(target_arch = "x86_64")]
mod tile_avx512;

pub use int8::{matmul_mxfp4_int8, matmul_mxfp4_int8_variant};
pub use int8_reference::matmul_mxfp4_int8_reference;
pub use packed::Mxfp4Packed;

/// Values per scale.
pub const BLOCK: usize = 32;

/// The e2m1 values by code (bit 3 the sign).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// An e8m0 scale byte's value, `2^(e - 127)` (exact; 255 is NaN).
pub fn e8m0(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        // 2^-127 is subnormal.
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits((e as u32) << 23),
    }
}

/// An MXFP4 matrix of `n` outputs by `k` inputs (see the module doc for the layout).
#[derive(Debug, Clone, Copy)]
pub struct Mxfp4Weights<'a> {
    pub n: usize,
    pub k: usize,
    /// `k × n / 2` bytes.
    pub codes: &'a [u8],
    /// `n × k / 32` e8m0 bytes.
    pub scales: &'a [u8],
}

impl Mxfp4Weights<'_> {
    pub fn check(&self) -> Result<(), KernelError> {
        if !self.n.is_multiple_of(2) || !self.k.is_multiple_of(BLOCK) {
            return Err(KernelError::Shape(format!(
                "an MXFP4 matrix needs an even number of outputs and inputs in whole blocks of \
                 {BLOCK}, got {} x {}",
                self.n, self.k
            )));
        }
        check_len(
            "MXFP4 codes",
            self.codes.len(),
            numel(&[self.k, self.n / 2])?,
        )?;
        check_len(
            "MXFP4 scales",
            self.scales.len(),
            numel(&[self.n, self.k / BLOCK])?,
        )
    }

    /// Bytes a pass over the matrix reads.
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len()
    }

    /// The code of weight `(k, col)`.
    fn code(&self, k: usize, col: usize) -> usize {
        let byte = self.codes[k * (self.n / 2) + col / 2];
        ((byte >> ((col % 2) * 4)) & 0xF) as usize
    }
}

/// Output columns the vector path takes at a time.
const COLS: usize = 8;

/// `out (m × n) = a (m × k) · Wᵀ + bias`, on the AVX2 path where [`crate::cpu`] allows it,
/// else the scalar reference; the same bits either way (see the module doc).
pub fn matmul_mxfp4(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let simd =
        cfg!(target_arch = "x86_64") && cpu::level() >= cpu::Level::Avx2 && cpu::features().fma;
    run(a, m, w, bias, out, pool, simd)
}

/// [`matmul_mxfp4`] on the scalar reference alone: the oracle of the vector path.
pub fn matmul_mxfp4_reference(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    run(a, m, w, bias, out, pool, false)
}

fn run(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    simd: bool,
) -> Result<(), KernelError> {
    w.check()?;
    let (n, k) = (w.n, w.k);
    check_len("MXFP4 activations", a.len(), numel(&[m, k])?)?;
    check_len("MXFP4 output", out.len(), numel(&[m, n])?)?;
    if let Some(b) = bias {
        check_len("MXFP4 bias", b.len(), n)?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Rows split over tasks when there are enough of them, else columns in whole vectors.
    let parts = parts_for(pool, m * n, k);
    let (rows_per_task, col_parts) = if parts <= m {
        (m.div_ceil(parts), 1)
    } else {
        (1, parts.div_ceil(m).min(n.div_ceil(COLS)))
    };
    // Column ranges of whole vectors: a vector's first column is even, its codes whole bytes.
    par_row_tiles(
        pool,
        out,
        n,
        COLS,
        rows_per_task,
        col_parts,
        |i, cols, row| {
            let x = &a[i * k..][..k];
            #[cfg(target_arch = "x86_64")]
            if simd {
                // Whole vectors from the part's first column; the reference takes the rest.
                let wide = cols.start..cols.start + (cols.len() / COLS) * COLS;
                // SAFETY: AVX2 and FMA were checked by the caller (`simd`); `w` was checked.
                unsafe { columns_avx2(x, w, wide.clone(), &mut row[..wide.len()]) };
                columns(x, w, wide.end..cols.end, &mut row[wide.len()..]);
                add_bias(bias, cols, row);
                return;
            }
            let _ = simd;
            columns(x, w, cols.clone(), row);
            add_bias(bias, cols, row);
        },
    );
    Ok(())
}

fn add_bias(bias: Option<&[f32]>, cols: Range<usize>, row: &mut [f32]) {
    if let Some(b) = bias {
        for (o, &b) in row.iter_mut().zip(&b[cols]) {
            *o += b;
        }
    }
}

/// The scalar reference: columns `cols` of one output row into `out`.
fn columns(x: &[f32], w: &Mxfp4Weights, cols: Range<usize>, out: &mut [f32]) {
    let blocks = w.k / BLOCK;
    for (o, col) in out.iter_mut().zip(cols) {
        let mut total = 0f32;
        for b in 0..blocks {
            let mut p = 0f32;
            for kk in b * BLOCK..(b + 1) * BLOCK {
                p = x[kk].mul_add(E2M1[w.code(kk, col)], p);
            }
            total = p.mul_add(e8m0(w.scales[col * blocks + b]), total);
        }
        *o = total;
    }
}

/// [`columns`] eight columns at a time: each lane is one column's reference arithmetic.
/// Whole tiles of `TILE_VECTORS` vectors go together (each input's codes for the tile are
/// then one contiguous run of bytes), the rest a vector at a time.
///
/// # Safety
/// AVX2 and FMA must be available; `w` checked; `cols` a whole number of vectors inside `n`,
/// starting at an even column; `out.len() == cols.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns_avx2(x: &[f32], w: &Mxfp4Weights, cols: Range<usize>, out: &mut [f32]) {
    let tiles = cols.len() / (TILE_VECTORS * COLS);
    let split = cols.start + tiles * TILE_VECTORS * COLS;
    let (head, tail) = out.split_at_mut(split - cols.start);
    for (c, out) in (cols.start..split)
        .step_by(TILE_VECTORS * COLS)
        .zip(head.chunks_exact_mut(TILE_VECTORS * COLS))
    {
        // SAFETY: the caller's contract.
        unsafe { tile_avx2::<TILE_VECTORS>(x, w, c, out) };
    }
    for (c, out) in (split..cols.end)
        .step_by(COLS)
        .zip(tail.chunks_exact_mut(COLS))
    {
        // SAFETY: the caller's contract.
        unsafe { tile_avx2::<1>(x, w, c, out) };
    }
}

/// Vectors a full tile of [`columns_avx2`] takes: 64 columns, 32 bytes of codes per input.
const TILE_VECTORS: usize = 8;

/// `V` vectors of columns from column `c`: per block, each vector's partial sum over the
/// block's inputs by fused multiply-add, then `total = fma(p, scale, total)`.
///
/// # Safety
/// As [`columns_avx2`], for columns `c..c + 8 V`; `out.len() == 8 V`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const V: usize>(x: &[f32], w: &Mxfp4Weights, c: usize, out: &mut [f32]) {
    let blocks = w.k / BLOCK;
    let row_bytes = w.n / 2;
    // SAFETY: E2M1 holds 16 values; the first 8 are read.
    let magnitudes = unsafe { _mm256_loadu_ps(E2M1.as_ptr()) };
    // Lane j takes the nibble `j % 2` of byte `j / 2` of a 4-byte load.
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let (low3, sign) = (_mm256_set1_epi32(7), _mm256_set1_epi32(8));
    let mut total = [_mm256_setzero_ps(); V];
    let mut scale_bits = [0u32; COLS];
    for b in 0..blocks {
        let mut p = [_mm256_setzero_ps(); V];
        for (kk, &xk) in x.iter().enumerate().skip(b * BLOCK).take(BLOCK) {
            let xv = _mm256_set1_ps(xk);
            let row = &w.codes[kk * row_bytes + c / 2..][..4 * V];
            for (v, p) in p.iter_mut().enumerate() {
                let word = u32::from_le_bytes([
                    row[4 * v],
                    row[4 * v + 1],
                    row[4 * v + 2],
                    row[4 * v + 3],
                ]);
                let codes = _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts);
                let magnitude = _mm256_permutevar8x32_ps(magnitudes, _mm256_and_si256(codes, low3));
                let signs = _mm256_slli_epi32::<28>(_mm256_and_si256(codes, sign));
                let value = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(signs));
                *p = _mm256_fmadd_ps(xv, value, *p);
            }
        }
        for (v, (total, p)) in total.iter_mut().zip(p).enumerate() {
            for (j, bits) in scale_bits.iter_mut().enumerate() {
                *bits = e8m0(w.scales[(c + COLS * v + j) * blocks + b]).to_bits();
            }
            // SAFETY: `scale_bits` holds one vector.
            let s = _mm256_castsi256_ps(unsafe { _mm256_loadu_si256(scale_bits.as_ptr().cast()) });
            *total = _mm256_fmadd_ps(p, s, *total);
        }
    }
    for (total, out) in total.iter().zip(out.chunks_exact_mut(COLS)) {
        // SAFETY: `out` is one vector's chunk.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), *total) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// A random matrix: codes of every value, scales 2^-8 ..= 2^0 (plus 0 and 255 on request).
    fn matrix(n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let mut rng = Rng::new(seed);
        let codes = rng.bytes(k * n / 2);
        let scales = (0..n * k / BLOCK)
            .map(|_| 119 + rng.below(9) as u8)
            .collect();
        (codes, scales)
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        Rng::new(seed).values(len, 1.0)
    }

    #[test]
    fn scales_and_codes_decode_exactly() {
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(128), 2.0);
        assert_eq!(e8m0(120), 1.0 / 128.0);
        assert_eq!(e8m0(1), f32::MIN_POSITIVE);
        assert_eq!(e8m0(0), f32::MIN_POSITIVE / 2.0);
        assert!(e8m0(255).is_nan());
        // Code 9 is -0.5, 7 is 6.
        assert_eq!((E2M1[9], E2M1[7]), (-0.5, 6.0));
    }

    /// The straightforward sum in f64 over weights decoded one by one.
    #[test]
    fn matches_an_f64_reference() {
        let (n, k, m) = (24, 96, 3);
        let (codes, scales) = matrix(n, k, 7);
        let w = Mxfp4Weights {
            n,
            k,
            codes: &codes,
            scales: &scales,
        };
        let a = values(m * k, 8);
        let bias = values(n, 9);
        let mut out = vec![f32::NAN; m * n];
        matmul_mxfp4(&a, m, &w, Some(&bias), &mut out, &ThreadPool::new(2)).unwrap();
        for i in 0..m {
            for col in 0..n {
                let want: f64 = (0..k)
                    .map(|kk| {
                        a[i * k + kk] as f64
                            * E2M1[w.code(kk, col)] as f64
                            * e8m0(scales[col * (k / BLOCK) + kk / BLOCK]) as f64
                    })
                    .sum::<f64>()
                    + bias[col] as f64;
                let got = out[i * n + col] as f64;
                assert!((got - want).abs() < 1e-5, "({i}, {col}): {got} vs {want}");
            }
        }
    }

    #[test]
    fn vector_columns_threads_and_batches_give_the_reference_bits() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // Widths with and without a tail past the last whole vector.
        for (n, k, m) in [(64, 64, 1), (38, 32, 5), (130, 128, 2), (6, 32, 1)] {
            let (codes, scales) = matrix(n, k, n as u64);
            let w = Mxfp4Weights {
                n,
                k,
                codes: &codes,
                scales: &scales,
            };
            let a = values(m * k, k as u64);
            let mut want = vec![0f32; m * n];
            matmul_mxfp4_reference(&a, m, &w, None, &mut want, &ThreadPool::new(1)).unwrap();
            for threads in [1, 3] {
                let mut got = vec![f32::NAN; m * n];
                matmul_mxfp4(&a, m, &w, None, &mut got, &ThreadPool::new(threads)).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{n}x{k}, {m} rows, {threads} threads"
                );
            }
            // Each row alone.
            for i in 0..m {
                let mut one = vec![0f32; n];
                matmul_mxfp4(&a[i * k..][..k], 1, &w, None, &mut one, &ThreadPool::new(2)).unwrap();
                assert_eq!(bits(&one), bits(&want[i * n..][..n]), "{n}x{k} row {i}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = ThreadPool::new(1);
        let (codes, scales) = matrix(4, 32, 1);
        let mut out = [0f32; 4];
        for (n, k, c, s, a) in [
            (3, 32, 48, 3, 32),
            (4, 30, 60, 4, 30),
            (4, 32, 63, 4, 32),
            (4, 32, 64, 4, 31),
        ] {
            let w = Mxfp4Weights {
                n,
                k,
                codes: &codes[..c.min(codes.len())],
                scales: &scales[..s],
            };
            assert!(
                matmul_mxfp4(&vec![0.0; a], 1, &w, None, &mut out[..n], &pool).is_err(),
                "{n}x{k}"
            );
        }
    }
}

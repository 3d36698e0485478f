//! `MatMulNBits`: `Y = A · dequant(B)ᵀ (+ bias)` with B block-quantized along K — the scalar
//! reference that optimized kernels (packed SIMD GEMV, int8 activations) are tested against.
//! The weight layout is [`super::layout`]'s.
//!
//! # Reduction contract (DESIGN.md §6)
//!
//! Each output `Y[i, n]` is one f32 accumulator that adds `A[i, k] · W[k, n]` for
//! `k = 0, 1, .., K-1` in order (blocks in order, codes in order within a block), where
//! `W[k, n] = (q - zp) * scale` is rounded to f32 once; the bias is added after the last `k`,
//! then the sum rounds once to the output type. Tasks split output rows and columns (N),
//! never K, so the result is bit-identical for any thread count, and row `i` of an M-row
//! product equals the 1-row product of row `i` (decode row = prefill row).

use std::ops::Range;

use super::layout::{NBitsLayout, QuantWeights, ZeroPoints, check_args, par_output_rows};
use super::stored_f32;
use crate::ThreadPool;
use crate::acc::Accum;
use crate::error::KernelError;
use crate::par::{Grid, MAX_ROW_BLOCK, par_row_blocks_spans, parts_for};
use crate::pool::Prelude;
use crate::quant::{code, default_zero_point};

/// `out = a · dequant(w)ᵀ + bias` for `a` of `m × K` (row-major), `bias` of `N` values and
/// `out` of `m × N`. See `nbits/layout.rs` for the layout and `nbits/reference.rs` for the
/// reduction order.
pub fn matmul_nbits<T: Accum<Acc = f32>>(
    a: &[T],
    m: usize,
    w: &QuantWeights<'_, T>,
    bias: Option<&[T]>,
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    check_args(a.len(), m, w, bias.map(<[T]>::len), out.len())?;
    let k = w.layout.k;
    par_output_rows(pool, m, w.layout, out, |i, cols, out_row| {
        row_part(&a[i * k..][..k], w, bias, cols, out_row);
    });
    Ok(())
}

/// [`matmul_nbits`] for f32: vectors of 16 or 8 columns where the CPU and layout allow
/// (`nbits/stored_f32.rs`), the reference for the rest; the same bits.
pub fn matmul_nbits_f32(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    if !stored_f32::supported(w) {
        return matmul_nbits(a, m, w, bias, out, pool);
    }
    check_args(a.len(), m, w, bias.map(<[f32]>::len), out.len())?;
    #[cfg(target_arch = "x86_64")]
    vector_columns(a, m, w, bias, out, pool);
    Ok(())
}

/// `out = a · dequant(w)ᵀ + bias` on the vector columns of `nbits/stored_f32.rs` (the rest of a
/// row's columns by the reference), after the caller's checks: a task's rows, up to
/// [`MAX_ROW_BLOCK`], share each block's dequantized weights.
#[cfg(target_arch = "x86_64")]
pub(super) fn vector_columns<B: stored_f32::Blocks>(
    a: &[f32],
    m: usize,
    w: &B,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let NBitsLayout { n, k, .. } = *w.layout();
    if m == 0 || n == 0 {
        return;
    }
    // Dequantizing is most of the work: tasks take as many rows as they can share it among,
    // and split the columns for the parts the rows do not fill.
    let rows_per_task = m.min(MAX_ROW_BLOCK);
    let row_blocks = m.div_ceil(rows_per_task);
    let col_parts = parts_for(pool, m * n, k).div_ceil(row_blocks);
    // One output: one span of all its columns.
    #[allow(clippy::single_range_in_vec_init)]
    let spans = [0..n];
    let task = |first: usize, _: usize, cols: Range<usize>, outs: &mut [&mut [f32]]| {
        let wide = cols.len() / stored_f32::COLS * stored_f32::COLS;
        let mut heads: [&mut [f32]; MAX_ROW_BLOCK] = Default::default();
        let mut tails: [&mut [f32]; MAX_ROW_BLOCK] = Default::default();
        for ((head, tail), out) in heads.iter_mut().zip(tails.iter_mut()).zip(outs.iter_mut()) {
            (*head, *tail) = std::mem::take(out).split_at_mut(wide);
        }
        let rows = outs.len();
        let a = &a[first * k..][..rows * k];
        // SAFETY: the caller checked AVX2 and the layout; the columns lie inside `n`, each
        // head holds them, `a` holds the rows.
        unsafe {
            stored_f32::columns(
                a,
                w,
                bias,
                cols.start..cols.start + wide,
                &mut heads[..rows],
            )
        };
        for (r, tail) in tails[..rows].iter_mut().enumerate() {
            w.rest(&a[r * k..][..k], bias, cols.start + wide..cols.end, tail);
        }
    };
    par_row_blocks_spans(
        pool,
        Prelude::NONE,
        &mut [out],
        &spans,
        Grid {
            tile: stored_f32::COLS,
            rows_per_task,
            col_parts,
        },
        task,
    );
}

/// Columns `cols` of one output row.
pub(super) fn row_part<T: Accum<Acc = f32>>(
    a_row: &[T],
    w: &QuantWeights<'_, T>,
    bias: Option<&[T]>,
    cols: Range<usize>,
    out: &mut [T],
) {
    let l = &w.layout;
    let bits = l.bits;
    let default_zp = default_zero_point(bits) as f32;
    let row_bytes = l.k_blocks * l.blob_size;
    for (o, j) in out.iter_mut().zip(cols) {
        let codes = &w.data[j * row_bytes..][..row_bytes];
        let scales = &w.scales[j * l.k_blocks..][..l.k_blocks];
        let mut acc = 0f32;
        for (b, a_block) in a_row.chunks(l.block_size).enumerate() {
            let scale = scales[b].widen();
            let zp = match w.zero_points {
                ZeroPoints::Default => default_zp,
                ZeroPoints::Packed(z) => code(&z[j * l.zp_row_bytes..], bits, b) as f32,
                ZeroPoints::Float(z) => z[j * l.k_blocks + b].widen(),
            };
            let blob = &codes[b * l.blob_size..][..l.blob_size];
            for (e, &av) in a_block.iter().enumerate() {
                let weight = (code(blob, bits, e) as f32 - zp) * scale;
                acc += av.widen() * weight;
            }
        }
        if let Some(b) = bias {
            acc += b[j].widen();
        }
        *o = T::narrow(acc);
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::nbits::{Interleaved, NBitsLayout, matmul_interleaved_f32};
    use crate::rng::Rng;

    /// Owned test weights for one zero-point kind.
    struct Case {
        layout: NBitsLayout,
        data: Vec<u8>,
        scales: Vec<f32>,
        packed_zp: Vec<u8>,
        float_zp: Vec<f32>,
    }

    impl Case {
        fn new(n: usize, k: usize, bits: u32, block_size: usize, seed: u64) -> Case {
            let layout = NBitsLayout::new(n, k, bits, block_size).unwrap();
            let mut rng = Rng::new(seed);
            Case {
                data: rng.bytes(n * layout.k_blocks * layout.blob_size),
                scales: rng.floats(n * layout.k_blocks, 0.01, 0.1),
                packed_zp: rng.bytes(n * layout.zp_row_bytes),
                float_zp: rng.floats(n * layout.k_blocks, 0.0, (1 << bits) as f32),
                layout,
            }
        }
        fn weights(&self, zp: usize) -> QuantWeights<'_, f32> {
            QuantWeights {
                layout: self.layout,
                data: &self.data,
                scales: &self.scales,
                zero_points: match zp {
                    0 => ZeroPoints::Default,
                    1 => ZeroPoints::Packed(&self.packed_zp),
                    _ => ZeroPoints::Float(&self.float_zp),
                },
            }
        }
    }

    /// 16 4-bit codes 0..15 in one block, scale 0.5, default zero point 8: the weights are
    /// -4.0, -3.5, .., 3.5, all exact.
    #[test]
    fn a_hand_packed_4_bit_block_dequantizes_low_nibble_first() {
        let layout = NBitsLayout::new(1, 16, 4, 16).unwrap();
        let data: Vec<u8> = (0..8u8).map(|j| (2 * j) | ((2 * j + 1) << 4)).collect();
        let w = QuantWeights {
            layout,
            data: &data,
            scales: &[0.5f32],
            zero_points: ZeroPoints::Default,
        };
        let pool = ThreadPool::new(1);
        for e in 0..16 {
            let mut a = [0f32; 16];
            a[e] = 1.0;
            let mut out = [0f32];
            matmul_nbits(&a, 1, &w, Some(&[0.25]), &mut out, &pool).unwrap();
            assert_eq!(out[0], (e as f32 - 8.0) * 0.5 + 0.25, "code {e}");
        }
    }

    /// Dequantizes the whole matrix with an independent loop (unpacking by shifts on the
    /// flat byte index) and multiplies in f64: the kernel must agree to f32 rounding.
    #[test]
    fn matches_dequantize_then_multiply() {
        for (bits, block_size, k) in [(4, 16, 40), (8, 32, 80), (2, 64, 64), (4, 128, 200)] {
            let (m, n) = (3, 5);
            let case = Case::new(n, k, bits, block_size, 7 + k as u64);
            let a = Rng::new(99).floats(m * k, -1.0, 1.0);
            for zp_kind in 0..3 {
                let w = case.weights(zp_kind);
                let l = case.layout;
                let mut out = vec![0f32; m * n];
                matmul_nbits(&a, m, &w, None, &mut out, &ThreadPool::new(1)).unwrap();
                let mask = ((1u16 << bits) - 1) as u8;
                for j in 0..n {
                    let dequant: Vec<f64> = (0..k)
                        .map(|kk| {
                            let b = kk / block_size;
                            let bit = (j * l.k_blocks * l.blob_size * 8)
                                + b * l.blob_size * 8
                                + (kk % block_size) * bits as usize;
                            let q = (case.data[bit / 8] >> (bit % 8)) & mask;
                            let zbit = j * l.zp_row_bytes * 8 + b * bits as usize;
                            let zp = match zp_kind {
                                0 => (1 << (bits - 1)) as f64,
                                1 => ((case.packed_zp[zbit / 8] >> (zbit % 8)) & mask) as f64,
                                _ => case.float_zp[j * l.k_blocks + b] as f64,
                            };
                            (q as f64 - zp) * case.scales[j * l.k_blocks + b] as f64
                        })
                        .collect();
                    for i in 0..m {
                        let want: f64 = (0..k).map(|kk| a[i * k + kk] as f64 * dequant[kk]).sum();
                        let got = out[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "bits {bits} block {block_size} zp {zp_kind} ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The f32 vector columns give the reference's bits: widths with and without a tail of
    /// columns, bit widths, zero-point kinds (float ones fall back), a padded last block, bias,
    /// several rows and threads.
    /// The vector columns over the stored layout and over the same weights interleaved at
    /// load give the reference's bits.
    #[test]
    fn f32_vector_columns_give_the_reference_bits() {
        let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (bits, block_size, k, n) in [
            (4, 32, 80, 61),
            (8, 16, 48, 16),
            (4, 64, 256, 8),
            (8, 32, 64, 5),
            // Passes of four, three, two and one vectors of eight columns.
            (4, 32, 96, 200),
            (4, 16, 48, 72),
            (8, 32, 64, 88),
        ] {
            let m = 3;
            let case = Case::new(n, k, bits, block_size, 21);
            let a = Rng::new(6).floats(m * k, -2.0, 2.0);
            let bias = Rng::new(12).floats(n, -1.0, 1.0);
            for zp_kind in 0..3 {
                let w = case.weights(zp_kind);
                let mut want = vec![0f32; m * n];
                matmul_nbits(&a, m, &w, Some(&bias), &mut want, &ThreadPool::new(1)).unwrap();
                let interleaved = Interleaved::pack(&w).unwrap();
                // Interleaved where the vector kernel runs and the rows make groups of eight.
                let expected = stored_f32::supported(&w) && n % 8 == 0;
                assert_eq!(interleaved.is_some(), expected, "n {n} zp {zp_kind}");
                for threads in [1, 3] {
                    let mut got = vec![f32::NAN; m * n];
                    let pool = ThreadPool::new(threads);
                    matmul_nbits_f32(&a, m, &w, Some(&bias), &mut got, &pool).unwrap();
                    assert_eq!(
                        bits_of(&got),
                        bits_of(&want),
                        "bits {bits} zp {zp_kind} n {n} threads {threads}"
                    );
                    if let Some(packed) = &interleaved {
                        got.fill(f32::NAN);
                        matmul_interleaved_f32(&a, m, packed, Some(&bias), &mut got, &pool)
                            .unwrap();
                        assert_eq!(
                            bits_of(&got),
                            bits_of(&want),
                            "interleaved: bits {bits} zp {zp_kind} n {n} threads {threads}"
                        );
                    }
                }
            }
        }
    }

    /// The reduction contract: 1 vs 3 threads, and each row of an M-row product vs the same
    /// row alone, bit for bit, over bit widths, zero-point kinds and a padded last block.
    #[test]
    fn bitwise_independent_of_threads_and_m() {
        let (m, n) = (7, 61);
        for (bits, block_size, k) in [(4, 32, 80), (8, 16, 48), (4, 64, 256)] {
            let case = Case::new(n, k, bits, block_size, 3);
            let a = Rng::new(5).floats(m * k, -2.0, 2.0);
            let bias = Rng::new(11).floats(n, -1.0, 1.0);
            for zp_kind in 0..3 {
                let w = case.weights(zp_kind);
                let mut one = vec![0f32; m * n];
                let mut three = vec![0f32; m * n];
                matmul_nbits(&a, m, &w, Some(&bias), &mut one, &ThreadPool::new(1)).unwrap();
                let pool3 = ThreadPool::new(3);
                matmul_nbits(&a, m, &w, Some(&bias), &mut three, &pool3).unwrap();
                let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits_of(&one),
                    bits_of(&three),
                    "threads, bits {bits} zp {zp_kind}"
                );
                for i in 0..m {
                    let mut row = vec![0f32; n];
                    matmul_nbits(&a[i * k..][..k], 1, &w, Some(&bias), &mut row, &pool3).unwrap();
                    assert_eq!(bits_of(&row), bits_of(&one[i * n..][..n]), "row {i}");
                }
            }
        }
    }

    #[test]
    fn half_precision_accumulates_in_f32_and_rounds_once() {
        let case = Case::new(3, 48, 4, 16, 21);
        let a32 = Rng::new(4).floats(2 * 48, -1.0, 1.0);
        let a16: Vec<f16> = a32.iter().map(|&v| f16::from_f32(v)).collect();
        let s16: Vec<f16> = case.scales.iter().map(|&v| f16::from_f32(v)).collect();
        let w16 = QuantWeights {
            layout: case.layout,
            data: &case.data,
            scales: &s16,
            zero_points: ZeroPoints::Packed(&case.packed_zp),
        };
        let mut out16 = vec![f16::ZERO; 6];
        matmul_nbits(&a16, 2, &w16, None, &mut out16, &ThreadPool::new(2)).unwrap();
        // The same computation in f32 on the f16-rounded inputs, rounded once at the end.
        let a_r: Vec<f32> = a16.iter().map(|v| v.to_f32()).collect();
        let s_r: Vec<f32> = s16.iter().map(|v| v.to_f32()).collect();
        let w32 = QuantWeights {
            scales: &s_r,
            zero_points: ZeroPoints::Packed(&case.packed_zp),
            ..case.weights(0)
        };
        let mut out32 = vec![0f32; 6];
        matmul_nbits(&a_r, 2, &w32, None, &mut out32, &ThreadPool::new(1)).unwrap();
        let want: Vec<f16> = out32.iter().map(|&v| f16::from_f32(v)).collect();
        assert_eq!(out16, want);
    }

    #[test]
    fn bad_geometry_and_lengths_are_errors() {
        assert!(
            NBitsLayout::new(4, 64, 4, 24).is_err(),
            "not a power of two"
        );
        assert!(NBitsLayout::new(4, 64, 4, 8).is_err(), "below 16");
        assert!(NBitsLayout::new(4, 64, 3, 16).is_err(), "3 bits");
        let case = Case::new(4, 40, 4, 16, 1);
        let pool = ThreadPool::new(1);
        let mut out = vec![0f32; 4];
        let a = vec![0f32; 40];
        assert!(matmul_nbits(&a[..39], 1, &case.weights(0), None, &mut out, &pool).is_err());
        assert!(matmul_nbits(&a, 1, &case.weights(0), Some(&[0.0; 3]), &mut out, &pool).is_err());
        let short = QuantWeights {
            data: &case.data[1..],
            ..case.weights(1)
        };
        assert!(matmul_nbits(&a, 1, &short, None, &mut out, &pool).is_err());
        let short_zp = QuantWeights {
            zero_points: ZeroPoints::Packed(&case.packed_zp[1..]),
            ..case.weights(1)
        };
        assert!(matmul_nbits(&a, 1, &short_zp, None, &mut out, &pool).is_err());
    }
}

//! `MatMulNBits` with int8 activations: the reference for `accuracy_level` 4, the arithmetic
//! onnxruntime's MLAS and llama.cpp use on CPU (activations quantized per block, integer dot
//! products with the weight codes, one f32 multiply-add per block).
//!
//! For each row of `A` and each block of `block_size` values along K:
//! `scale_a = max|a| / 127`, `q_a = round(a / scale_a)` (ties away from zero) in `[-127, 127]`.
//! For output column `n` and block `b` with weight codes `q_w`, zero point `z` and scale `s`:
//!
//! ```text
//! y[n] += s * scale_a * (Σ q_w·q_a − z · Σ q_a)      (integer sums, exact)
//! ```
//!
//! Blocks accumulate into one f32 in K order and the bias comes last, so the result is
//! independent of thread count and of how many rows share the call (DESIGN.md §6); a row's
//! activations are quantized from that row alone. The weight layout is [`crate::matmul_nbits`]'s.

use std::ops::Range;

use crate::ThreadPool;
use crate::layout::LayoutError;
use crate::matmul_nbits::{NBitsLayout, QuantWeights, ZeroPoints, check_args, par_output_rows};
use crate::nbits_avx2;
use crate::par::{par_row_tiles, parts_for};
use crate::quant::{code, default_zero_point};

/// The largest int8 magnitude used: symmetric, so `-128` never appears.
const Q_MAX: f32 = 127.0;

/// Quantizes `a` (one row, `k` values) in blocks of `block_size`: codes into `q`, one scale
/// per block into `scales`. A block of zeros gets scale 0 and zero codes.
pub fn quantize_row(a: &[f32], block_size: usize, q: &mut [i8], scales: &mut [f32]) {
    for ((block, q_block), scale) in a
        .chunks(block_size)
        .zip(q.chunks_mut(block_size))
        .zip(scales.iter_mut())
    {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        *scale = amax / Q_MAX;
        let inv = if amax > 0.0 { Q_MAX / amax } else { 0.0 };
        for (qv, &v) in q_block.iter_mut().zip(block) {
            *qv = (v * inv).round().clamp(-Q_MAX, Q_MAX) as i8;
        }
    }
}

/// `out = a · dequant(w)ᵀ + bias` with `a` (`m × K`, f32) quantized to int8 per block: the
/// AVX2 kernel ([`crate::nbits_avx2`], with AVX-VNNI where present) where the CPU and layout
/// allow, else the reference. Every path gives the same bits.
pub fn matmul_nbits_int8(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), LayoutError> {
    if !nbits_avx2::supported(&w.layout) {
        return matmul_nbits_int8_reference(a, m, w, bias, out, pool);
    }
    matmul_nbits_int8_isa(a, m, w, bias, out, pool, nbits_avx2::Isa::best())
}

/// [`matmul_nbits_int8`] on one kernel variant (`isa` from [`nbits_avx2::Isa::available`],
/// and a layout [`nbits_avx2::supported`] accepts), to test each against the reference.
pub fn matmul_nbits_int8_isa(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: nbits_avx2::Isa,
) -> Result<(), LayoutError> {
    check_args(a.len(), m, w, bias.map(<[f32]>::len), out.len())?;
    if !nbits_avx2::supported(&w.layout) || !nbits_avx2::Isa::available().contains(&isa) {
        return Err(LayoutError::Shape(format!(
            "the {isa:?} kernel does not run {}-bit blocks of {} on this CPU",
            w.layout.bits, w.layout.block_size
        )));
    }
    let k = w.layout.k;
    nbits_avx2::with_rows(m, |rows| {
        for (i, row) in rows.iter_mut().enumerate() {
            row.quantize(&a[i * k..][..k], &w.layout);
        }
        let rows = &*rows;
        if m == 1 {
            par_output_rows(pool, m, w.layout, out, |i, cols, out_row| {
                nbits_avx2::row_part(&rows[i], w, bias, cols, out_row, isa);
            });
        } else {
            // Tasks take column blocks in whole tiles and walk every row over their block, so
            // its weights (64 columns: 18 KiB at K = 576) stay in cache across the rows.
            let n = w.layout.n;
            let tiles = n.div_ceil(nbits_avx2::TILE);
            let parts = parts_for(pool, tiles, m * k).max(n.div_ceil(64));
            par_row_tiles(
                pool,
                out,
                n,
                nbits_avx2::TILE,
                m,
                parts,
                |i, cols, out_row| {
                    nbits_avx2::row_part(&rows[i], w, bias, cols, out_row, isa);
                },
            );
        }
    });
    Ok(())
}

/// The reference: scalar loops over the module doc's arithmetic, the oracle of the fast
/// kernels.
pub fn matmul_nbits_int8_reference(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), LayoutError> {
    check_args(a.len(), m, w, bias.map(<[f32]>::len), out.len())?;
    let NBitsLayout {
        k,
        block_size,
        k_blocks,
        ..
    } = w.layout;
    let mut qa = vec![0i8; m * k];
    let mut sa = vec![0f32; m * k_blocks];
    for i in 0..m {
        quantize_row(
            &a[i * k..][..k],
            block_size,
            &mut qa[i * k..][..k],
            &mut sa[i * k_blocks..][..k_blocks],
        );
    }
    par_output_rows(pool, m, w.layout, out, |i, cols, out_row| {
        row_part(
            &qa[i * k..][..k],
            &sa[i * k_blocks..][..k_blocks],
            w,
            bias,
            cols,
            out_row,
        );
    });
    Ok(())
}

/// Columns `cols` of one output row from its int8 codes `qa` (whole blocks; padding codes are
/// zero) and block scales `sa`: the reference arithmetic.
pub(crate) fn row_part(
    qa: &[i8],
    sa: &[f32],
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let l = &w.layout;
    let bits = l.bits;
    let row_bytes = l.k_blocks * l.blob_size;
    for (o, j) in out.iter_mut().zip(cols) {
        let codes = &w.data[j * row_bytes..][..row_bytes];
        let mut acc = 0f32;
        for (b, qa_block) in qa.chunks(l.block_size).enumerate() {
            let blob = &codes[b * l.blob_size..][..l.blob_size];
            let (mut dot, mut sum_a) = (0i32, 0i32);
            for (e, &q) in qa_block.iter().enumerate() {
                dot += code(blob, bits, e) as i32 * q as i32;
                sum_a += q as i32;
            }
            let scale = w.scales[j * l.k_blocks + b] * sa[b];
            let centered = match w.zero_points {
                ZeroPoints::Default => (dot - default_zero_point(bits) as i32 * sum_a) as f32,
                ZeroPoints::Packed(z) => {
                    (dot - code(&z[j * l.zp_row_bytes..], bits, b) as i32 * sum_a) as f32
                }
                ZeroPoints::Float(z) => dot as f32 - z[j * l.k_blocks + b] * sum_a as f32,
            };
            acc += scale * centered;
        }
        if let Some(b) = bias {
            acc += b[j];
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    struct Case {
        layout: NBitsLayout,
        data: Vec<u8>,
        scales: Vec<f32>,
        zp_packed: Vec<u8>,
        zp_float: Vec<f32>,
        a: Vec<f32>,
        m: usize,
    }

    fn case(m: usize, n: usize, k: usize, bits: u32, block: usize) -> Case {
        let layout = NBitsLayout::new(n, k, bits, block).unwrap();
        let mut s = 11u64;
        let data = (0..n * layout.k_blocks * layout.blob_size)
            .map(|_| (lcg(&mut s).to_bits() >> 7) as u8)
            .collect();
        let scales = (0..n * layout.k_blocks)
            .map(|_| 0.01 + 0.02 * lcg(&mut s).abs())
            .collect();
        let zp_packed = (0..n * layout.zp_row_bytes)
            .map(|_| (lcg(&mut s).to_bits() >> 9) as u8)
            .collect();
        let zp_float = (0..n * layout.k_blocks)
            .map(|_| 7.0 + lcg(&mut s))
            .collect();
        let a = (0..m * k).map(|_| 3.0 * lcg(&mut s)).collect();
        Case {
            layout,
            data,
            scales,
            zp_packed,
            zp_float,
            a,
            m,
        }
    }

    fn weights<'a>(c: &'a Case, zp: usize) -> QuantWeights<'a, f32> {
        let zero_points = match zp {
            0 => ZeroPoints::Default,
            1 => ZeroPoints::Packed(&c.zp_packed),
            _ => ZeroPoints::Float(&c.zp_float),
        };
        QuantWeights {
            layout: c.layout,
            data: &c.data,
            scales: &c.scales,
            zero_points,
        }
    }

    #[test]
    fn quantization_is_symmetric_and_exact_at_the_block_maximum() {
        let a = [0.5f32, -1.0, 0.25, 0.0, 0.0, 0.0];
        let (mut q, mut s) = ([0i8; 6], [0f32; 2]);
        quantize_row(&a, 4, &mut q, &mut s);
        assert_eq!(q[..4], [64, -127, 32, 0]);
        assert_eq!(s, [1.0 / 127.0, 0.0]);
        assert_eq!(q[4..], [0, 0]);
    }

    #[test]
    fn close_to_the_f32_path_for_every_zero_point_kind() {
        let pool = ThreadPool::new(1);
        for (bits, block) in [(4, 32), (8, 16), (4, 128)] {
            let c = case(3, 13, 160, bits, block);
            for zp in 0..3 {
                let w = weights(&c, zp);
                let (mut exact, mut int8) = (vec![0f32; c.m * 13], vec![0f32; c.m * 13]);
                crate::matmul_nbits::matmul_nbits(&c.a, c.m, &w, None, &mut exact, &pool).unwrap();
                matmul_nbits_int8(&c.a, c.m, &w, None, &mut int8, &pool).unwrap();
                let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (x, y) in exact.iter().zip(&int8) {
                    // int8 rounding of activations: relative error ~ 1/254 per term.
                    assert!(
                        (x - y).abs() <= 0.02 * scale,
                        "bits {bits} zp {zp}: {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn bitwise_independent_of_threads_and_rows() {
        let c = case(5, 37, 96, 4, 32);
        let w = weights(&c, 2);
        let run = |threads: usize, m: usize, a: &[f32]| {
            let mut out = vec![0f32; m * 37];
            matmul_nbits_int8(a, m, &w, None, &mut out, &ThreadPool::new(threads)).unwrap();
            out
        };
        let all = run(1, 5, &c.a);
        assert_eq!(all, run(3, 5, &c.a));
        for i in 0..5 {
            assert_eq!(&all[i * 37..][..37], &run(1, 1, &c.a[i * 96..][..96])[..]);
        }
    }
}

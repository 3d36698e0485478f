//! `MatMulNBits` with int8 activations: the reference for `accuracy_level` 4, the arithmetic
//! onnxruntime's MLAS and llama.cpp use on CPU (activations quantized per block, integer dot
//! products with the weight codes, one f32 multiply-add per block).
//!
//! For each row of `A` and each block of `block_size` values along K:
//! `scale_a = max|a| / 127`, `q_a = round(a / scale_a)` (ties away from zero) in `[-127, 127]`.
//! For output column `n` and block `b` with weight codes `q_w`, zero point `z` and scale `s`,
//! with `dot = Σ q_w·q_a` and `sum_a = Σ q_a` (integer sums, exact) and `fma` one rounding:
//!
//! ```text
//! integer z (the default or a packed code):
//!     y[n] = fma(s·scale_a, (dot − z·sum_a) as f32, y[n])
//! float z, through the block's offset o = snap(−(z·s)):
//!     y[n] = fma(s·scale_a, dot as f32, y[n])
//!     y[n] = fma(o, scale_a·(sum_a as f32), y[n])
//! ```
//!
//! This is llama.cpp's Q4_1 arithmetic (`d·d_a·Σ q·q_a + m·s_a`): the weight is `q·s + o`.
//! `snap` rounds an offset within one f32 ulp of an f16 to that f16 and leaves any other
//! alone: a GGUF Q4_1 import's zero point is `fl(−m / d)` of an f16 minimum `m`, and
//! `fl(−z·d)` lands on `m` or a neighbour, so every offset of such a matrix is `m` again and
//! the packed kernel stores them as f16 (two bytes a block instead of four).
//!
//! Blocks accumulate into one f32 in K order and the bias comes last, so the result is
//! independent of thread count and of how many rows share the call (DESIGN.md §6); a row's
//! activations are quantized from that row alone ([`super::quantize`]). The weight layout is
//! [`super::layout`]'s.

use std::ops::Range;

use super::layout::{NBitsLayout, QuantWeights, ZeroPoints, check_args, par_output_rows};
use crate::ThreadPool;
use crate::error::KernelError;
use crate::int8::quantize_row_reference;
use crate::quant::{code, default_zero_point};

/// The reference: scalar loops over the module doc's arithmetic, the oracle of the fast
/// kernels.
pub fn matmul_nbits_int8_reference(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
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
        quantize_row_reference(
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

/// A block's offset `o = snap(−(z·s))` for float zero point `z` and scale `s` (see the module
/// doc): the f16 within one f32 ulp of `−(z·s)` where there is one, else `−(z·s)`.
pub fn block_offset(z: f32, s: f32) -> f32 {
    let o = -(z * s);
    let h = half::f16::from_f32(o).to_f32();
    if h == o || h == o.next_up() || h == o.next_down() {
        h
    } else {
        o
    }
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
            let s = w.scales[j * l.k_blocks + b];
            let scale = s * sa[b];
            acc = match w.zero_points {
                ZeroPoints::Default => {
                    let z = default_zero_point(bits) as i32;
                    scale.mul_add((dot - z * sum_a) as f32, acc)
                }
                ZeroPoints::Packed(z) => {
                    let z = code(&z[j * l.zp_row_bytes..], bits, b) as i32;
                    scale.mul_add((dot - z * sum_a) as f32, acc)
                }
                ZeroPoints::Float(z) => {
                    let offset = block_offset(z[j * l.k_blocks + b], s);
                    let acc = scale.mul_add(dot as f32, acc);
                    offset.mul_add(sa[b] * sum_a as f32, acc)
                }
            };
        }
        if let Some(b) = bias {
            acc += b[j];
        }
        *o = acc;
    }
}

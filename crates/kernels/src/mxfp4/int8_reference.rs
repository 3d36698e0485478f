//! The scalar reference of the int8-activation arithmetic (`int8`'s module doc): the oracle
//! every vector path is tested against, bit for bit.

use super::int8::check_args;
use super::{BLOCK, E2M1, Mxfp4Weights, e8m0};
use crate::ThreadPool;
use crate::error::KernelError;
use crate::int8::quantize_row_reference;

/// The scalar reference of the module doc's arithmetic, on the stored layout: the oracle of
/// the vector kernels.
pub fn matmul_mxfp4_int8_reference(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    _pool: &ThreadPool,
) -> Result<(), KernelError> {
    check_args(a, m, w, bias, out)?;
    let (n, k) = (w.n, w.k);
    let blocks = k / BLOCK;
    let mut q = vec![0i8; k];
    let mut scale_a = vec![0f32; blocks];
    for i in 0..m {
        quantize_row_reference(&a[i * k..][..k], BLOCK, &mut q, &mut scale_a);
        for (col, o) in out[i * n..][..n].iter_mut().enumerate() {
            let mut y = 0f32;
            for (b, &sa) in scale_a.iter().enumerate() {
                let dot: i32 = (b * BLOCK..(b + 1) * BLOCK)
                    .map(|kk| (2.0 * E2M1[w.code(kk, col)]) as i32 * i32::from(q[kk]))
                    .sum();
                let s = e8m0(w.scales[col * blocks + b]) * 0.5;
                y = (s * sa).mul_add(dot as f32, y);
            }
            *o = bias.map_or(y, |bias| y + bias[col]);
        }
    }
    Ok(())
}

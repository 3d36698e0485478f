//! The shared vocabulary of the `MatMulNBits` family: the validated geometry of a
//! block-quantized weight matrix ([`NBitsLayout`]), the weights as the kernels take them
//! ([`QuantWeights`], [`ZeroPoints`]), the argument checks and the split of output rows over
//! the pool that every kernel of the family uses.
//!
//! # Quantized block layout
//!
//! As specified for `com.microsoft.MatMulNBits` in onnxruntime's `docs/ContribOperators.md`
//! (and built by `onnxruntime/test/contrib_ops/matmul_4bits_test.cc`):
//!
//! - `B` is uint8 of shape `[N, k_blocks, blob_size]`: row `n` holds column `n` of the
//!   logical `K × N` weight matrix, cut into `k_blocks = ceil(K / block_size)` blocks of
//!   `block_size` codes along K. `blob_size = block_size * bits / 8` bytes per block.
//! - Inside a blob, codes are packed low bits first ([`crate::quant`]): for 4 bits, code
//!   `2j` is the low nibble of byte `j` and code `2j + 1` the high nibble; for 8 bits one
//!   byte per code. When `K` is not a multiple of `block_size`, the last blob is padded and
//!   its codes past `K` are never read.
//! - `scales` has `N × k_blocks` values (row-major `[N, k_blocks]`), in A's type.
//! - Zero points are absent (every block uses `2^(bits - 1)`), packed uint8 of
//!   `N × ceil(k_blocks * bits / 8)` bytes (each row packed like B's codes and padded to a
//!   whole byte), or unpacked floats of `N × k_blocks` in the scales' type.
//! - Weight `(k, n) = (q - zero_point) * scale`, for the code `q` of block `k / block_size`.
//!
//! No `#[repr(C)]` block struct describes a blob: its size follows the `block_size`
//! attribute (16..=256 bytes of codes in practice), so the layout is the validated
//! [`NBitsLayout`] instead.

use std::ops::Range;

use crate::ThreadPool;
use crate::error::{KernelError, check_len, numel};
use crate::par::{par_row_parts, parts_for};
use crate::quant::{check_bits, packed_bytes};

/// Output columns one fast kernel call computes together: eight f32 lanes of a 256-bit
/// vector, and the tile width of the packed layout.
pub const TILE: usize = 8;

/// The validated geometry of a quantized weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NBitsLayout {
    pub n: usize,
    pub k: usize,
    pub bits: u32,
    pub block_size: usize,
    /// `ceil(k / block_size)`.
    pub k_blocks: usize,
    /// Bytes per block: `block_size * bits / 8`.
    pub blob_size: usize,
    /// Bytes of packed zero points per row: `ceil(k_blocks * bits / 8)`.
    pub zp_row_bytes: usize,
}

impl NBitsLayout {
    /// The layout of an `n × k` matrix of `bits`-bit codes in blocks of `block_size`.
    /// `block_size` must be a power of two and at least 16 (the spec's rule).
    pub fn new(n: usize, k: usize, bits: u32, block_size: usize) -> Result<Self, KernelError> {
        check_bits(bits)?;
        if block_size < 16 || !block_size.is_power_of_two() {
            return Err(KernelError::Shape(format!(
                "block_size must be a power of two >= 16, got {block_size}"
            )));
        }
        let k_blocks = k.div_ceil(block_size);
        let blob_size = block_size * bits as usize / 8;
        numel(&[n, k_blocks, blob_size])?;
        Ok(NBitsLayout {
            n,
            k,
            bits,
            block_size,
            k_blocks,
            blob_size,
            zp_row_bytes: packed_bytes(k_blocks, bits)?,
        })
    }
}

/// The zero points of a quantized matrix.
#[derive(Debug, Clone, Copy)]
pub enum ZeroPoints<'a, S> {
    /// Every block uses `2^(bits - 1)`.
    Default,
    /// uint8 codes packed like B, `zp_row_bytes` per row.
    Packed(&'a [u8]),
    /// One value per block in the scales' type.
    Float(&'a [S]),
}

/// A block-quantized weight matrix (`B`, its scales and zero points).
#[derive(Debug, Clone, Copy)]
pub struct QuantWeights<'a, S> {
    pub layout: NBitsLayout,
    /// `n × k_blocks × blob_size` bytes.
    pub data: &'a [u8],
    /// `n × k_blocks` scales.
    pub scales: &'a [S],
    pub zero_points: ZeroPoints<'a, S>,
}

impl<S> QuantWeights<'_, S> {
    pub(crate) fn check(&self) -> Result<(), KernelError> {
        let l = &self.layout;
        check_len(
            "B",
            self.data.len(),
            numel(&[l.n, l.k_blocks, l.blob_size])?,
        )?;
        let per_block = numel(&[l.n, l.k_blocks])?;
        check_len("scales", self.scales.len(), per_block)?;
        match self.zero_points {
            ZeroPoints::Default => Ok(()),
            ZeroPoints::Packed(z) => {
                check_len("zero points", z.len(), numel(&[l.n, l.zp_row_bytes])?)
            }
            ZeroPoints::Float(z) => check_len("zero points", z.len(), per_block),
        }
    }
}

/// Checks the lengths of `A` (`m × K`), the weights, the bias (`N`) and the output (`m × N`).
pub(crate) fn check_args<S>(
    a_len: usize,
    m: usize,
    w: &QuantWeights<'_, S>,
    bias_len: Option<usize>,
    out_len: usize,
) -> Result<(), KernelError> {
    w.check()?;
    check_io(a_len, m, &w.layout, bias_len, out_len)
}

/// The lengths of `A`, the bias and the output against a layout.
pub(crate) fn check_io(
    a_len: usize,
    m: usize,
    layout: &NBitsLayout,
    bias_len: Option<usize>,
    out_len: usize,
) -> Result<(), KernelError> {
    let NBitsLayout { n, k, .. } = *layout;
    check_len("A", a_len, numel(&[m, k])?)?;
    check_len("output", out_len, numel(&[m, n])?)?;
    if let Some(b) = bias_len {
        check_len("bias", b, n)?;
    }
    Ok(())
}

/// Hands output rows (or, for few rows, column ranges of them) to pool tasks: `f(row, cols,
/// out_row_part)`. Never splits K, so results do not depend on the split.
pub(crate) fn par_output_rows<T: Send>(
    pool: &ThreadPool,
    m: usize,
    layout: NBitsLayout,
    out: &mut [T],
    f: impl Fn(usize, Range<usize>, &mut [T]) + Sync,
) {
    let NBitsLayout { n, k, .. } = layout;
    if m == 0 || n == 0 {
        return;
    }
    let parts = parts_for(pool, m * n, k);
    let (rows_per_task, col_parts) = if parts <= m {
        (m.div_ceil(parts), 1)
    } else {
        (1, parts.div_ceil(m).min(n))
    };
    par_row_parts(pool, out, n, rows_per_task, col_parts, f);
}

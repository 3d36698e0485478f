//! `MatMulNBits` weights repacked at load for the f32-activation kernel
//! (`nbits/stored_f32.rs`): per group of eight rows and block, the rows' codes interleaved
//! (byte `i` of row `r` at `i * 8 + r`), and beside them the eight scales (and zero points).
//! That is what the kernel otherwise gathers and transposes from the stored rows at every
//! block of every run; here a pass reads it as it lies, one stream per group. The same bits
//! as over the stored layout: only where the codes come from changes.

use smallvec::SmallVec;

use super::layout::{NBitsLayout, QuantWeights, ZeroPoints, check_io};
use super::stored_f32;
use crate::ThreadPool;
use crate::error::KernelError;
use crate::mem::f32_bytes;

/// Rows a group interleaves (the kernel's narrowest vector).
const ROWS: usize = stored_f32::COLS;

/// A matrix of [`QuantWeights`] interleaved by groups of eight rows (see the module doc).
#[derive(Debug, Clone)]
pub struct Interleaved {
    layout: NBitsLayout,
    /// Per group of eight rows, per block: `8 * blob_size` bytes.
    codes: Vec<u8>,
    /// Per group, per block: the eight rows' scales.
    scales: Vec<f32>,
    /// Per group, per block: the eight rows' zero points; `None` for the default.
    zero_points: Option<Vec<f32>>,
}

impl Interleaved {
    /// `w` interleaved, where the f32 vector kernel runs it on this CPU and its rows come in
    /// whole groups of eight; `None` otherwise (the stored layout serves).
    pub fn pack(w: &QuantWeights<'_, f32>) -> Result<Option<Interleaved>, KernelError> {
        w.check()?;
        let l = w.layout;
        if !stored_f32::supported(w) || !l.n.is_multiple_of(ROWS) {
            return Ok(None);
        }
        let blob = l.blob_size;
        let mut codes = vec![0u8; l.n * l.k_blocks * blob];
        let mut scales = vec![0f32; l.n * l.k_blocks];
        let mut zero_points =
            matches!(w.zero_points, ZeroPoints::Packed(_)).then(|| vec![0f32; l.n * l.k_blocks]);
        // Each group's blocks as the kernel gathers them from the stored rows (so the bytes
        // are what it would read there, by construction).
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::_mm256_storeu_ps;
            let mut buffer = [0u8; stored_f32::MAX_BLOB * stored_f32::COLS];
            for g in 0..l.n / ROWS {
                for b in 0..l.k_blocks {
                    let at = (g * l.k_blocks + b) * ROWS;
                    // SAFETY: `supported` checked AVX2 and the layout, `check` the lengths; the
                    // group's rows lie inside `n`; each destination holds eight values.
                    unsafe {
                        let (scale, zp) = stored_f32::gather_block(w, g * ROWS, b, &mut buffer);
                        _mm256_storeu_ps(scales[at..at + ROWS].as_mut_ptr(), scale);
                        if let Some(z) = &mut zero_points {
                            _mm256_storeu_ps(z[at..at + ROWS].as_mut_ptr(), zp);
                        }
                    }
                    codes[at * blob..(at + ROWS) * blob].copy_from_slice(&buffer[..ROWS * blob]);
                }
            }
        }
        Ok(Some(Interleaved {
            layout: l,
            codes,
            scales,
            zero_points,
        }))
    }

    pub fn layout(&self) -> &NBitsLayout {
        &self.layout
    }

    /// The bytes it holds: codes, scales, and zero points when it has them.
    pub fn ranges(&self) -> SmallVec<[&[u8]; 3]> {
        let mut r: SmallVec<[&[u8]; 3]> =
            smallvec::smallvec![&self.codes[..], f32_bytes(&self.scales)];
        if let Some(z) = &self.zero_points {
            r.push(f32_bytes(z));
        }
        r
    }
}

/// `out = a · dequant(w)ᵀ + bias` (`a`: `m × K`) over interleaved weights: the bits
/// [`super::matmul_nbits_f32`] gives on the matrix they were packed from.
pub fn matmul_interleaved_f32(
    a: &[f32],
    m: usize,
    w: &Interleaved,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    check_io(a.len(), m, &w.layout, bias.map(<[f32]>::len), out.len())?;
    // Only packed where the vector kernel runs (see `Interleaved::pack`).
    #[cfg(target_arch = "x86_64")]
    super::reference::vector_columns(a, m, w, bias, out, pool);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = pool;
    Ok(())
}

#[cfg(target_arch = "x86_64")]
impl stored_f32::Blocks for Interleaved {
    fn layout(&self) -> &NBitsLayout {
        &self.layout
    }

    #[inline(always)]
    unsafe fn group(
        &self,
        j0: usize,
        b: usize,
        _buffer: &mut [u8; stored_f32::MAX_BLOB * stored_f32::COLS],
    ) -> (
        *const u8,
        std::arch::x86_64::__m256,
        std::arch::x86_64::__m256,
    ) {
        use std::arch::x86_64::*;
        let l = &self.layout;
        let at = (j0 / ROWS * l.k_blocks + b) * ROWS;
        let codes = &self.codes[at * l.blob_size..][..ROWS * l.blob_size];
        let scales = &self.scales[at..at + ROWS];
        // A group's blocks lie in order, a pass's groups apart (streams the hardware prefetcher
        // loses): the block four on is asked for, its codes and scales.
        crate::mem::prefetch_lines(codes.as_ptr().wrapping_add(4 * codes.len()), codes.len());
        crate::mem::prefetch_lines(scales.as_ptr().wrapping_add(4 * ROWS).cast(), 1);
        // SAFETY: AVX2 (the caller's contract); eight values lie at each slice.
        unsafe {
            let zp = match &self.zero_points {
                Some(z) => _mm256_loadu_ps(z[at..at + ROWS].as_ptr()),
                None => _mm256_set1_ps(crate::quant::default_zero_point(l.bits) as f32),
            };
            (codes.as_ptr(), _mm256_loadu_ps(scales.as_ptr()), zp)
        }
    }

    fn rest(&self, _: &[f32], _: Option<&[f32]>, cols: std::ops::Range<usize>, _: &mut [f32]) {
        assert!(
            cols.is_empty(),
            "interleaved rows come in whole groups of eight"
        );
    }
}

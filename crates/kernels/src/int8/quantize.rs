//! Activations quantized to int8 for `MatMulNBits` at `accuracy_level` 4, one row at a time
//! in blocks along K (the arithmetic is [`crate::nbits::matmul_nbits_int8_reference`]'s module doc's): the scalar
//! reference and its AVX2 loop, which gives the same codes and scales bit for bit.

#[cfg(target_arch = "x86_64")]
use crate::cpu;

/// The largest int8 magnitude used: symmetric, so `-128` never appears.
const Q_MAX: f32 = 127.0;

/// Quantizes `a` (one row, `k` values) in blocks of `block_size`: codes into `q`, one scale
/// per block into `scales`. A block of zeros gets scale 0 and zero codes. AVX2 where
/// [`crate::cpu`] allows, with the same bits as [`quantize_row_reference`].
pub fn quantize_row(a: &[f32], block_size: usize, q: &mut [i8], scales: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        // SAFETY: AVX2 is available (checked above).
        unsafe { quantize_row_avx2(a, block_size, q, scales) };
        return;
    }
    quantize_row_reference(a, block_size, q, scales);
}

/// [`quantize_row`]'s AVX2 loop: one call, so each block's quantization inlines.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(a: &[f32], block_size: usize, q: &mut [i8], scales: &mut [f32]) {
    for ((block, q_block), scale) in a
        .chunks(block_size)
        .zip(q.chunks_mut(block_size))
        .zip(scales.iter_mut())
    {
        // SAFETY: AVX2 is available (the caller's contract).
        *scale = unsafe { quantize_block_avx2(block, q_block) };
    }
}

/// [`quantize_row`] in scalar code: the oracle of the AVX2 path.
pub fn quantize_row_reference(a: &[f32], block_size: usize, q: &mut [i8], scales: &mut [f32]) {
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

/// One block of [`quantize_row`]: codes into `q` (as long as `block`), returns the scale.
/// The maximum is exact in any order; `round` (half away from zero) is `trunc(x)` plus the
/// sign when `|x - trunc(x)| >= 0.5`, where the difference is exact; NaN codes are 0 as in
/// `as i8`.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn quantize_block_avx2(block: &[f32], q: &mut [i8]) -> f32 {
    use std::arch::x86_64::*;
    assert!(q.len() >= block.len(), "a code per value");
    let n8 = block.len() / 8 * 8;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m8 = _mm256_setzero_ps();
    for c in (0..n8).step_by(8) {
        // SAFETY: `c + 8 <= n8 <= block.len()`.
        let v = unsafe { _mm256_loadu_ps(block.as_ptr().add(c)) };
        // `max_ps(x, m)` returns `m` when `x` is NaN, as `f32::max` ignores NaN.
        m8 = _mm256_max_ps(_mm256_and_ps(v, abs_mask), m8);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m8) };
    let lanes_max = lanes.iter().fold(0f32, |m, &v| m.max(v));
    let amax = block[n8..].iter().fold(lanes_max, |m, v| m.max(v.abs()));
    let inv = if amax > 0.0 { Q_MAX / amax } else { 0.0 };
    let inv8 = _mm256_set1_ps(inv);
    // SAFETY (every call below): AVX2 is available, and `c + 8 <= n8 <= block.len()`.
    let code8 = |c: usize| unsafe { code8(block, c, inv8) };
    let n32 = block.len() / 32 * 32;
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for c in (0..n32).step_by(32) {
        let ab = _mm256_packs_epi32(code8(c), code8(c + 8));
        let cd = _mm256_packs_epi32(code8(c + 16), code8(c + 24));
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
        // SAFETY: `c + 32 <= n32 <= q.len()`.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(c).cast(), bytes) };
    }
    let mut codes = [0i32; 8];
    for c in (n32..n8).step_by(8) {
        // SAFETY: `codes` holds 8 i32.
        unsafe { _mm256_storeu_si256(codes.as_mut_ptr().cast(), code8(c)) };
        for (dst, &v) in q[c..c + 8].iter_mut().zip(&codes) {
            *dst = v as i8;
        }
    }
    for (qv, &v) in q[n8..block.len()].iter_mut().zip(&block[n8..]) {
        *qv = (v * inv).round().clamp(-Q_MAX, Q_MAX) as i8;
    }
    amax / Q_MAX
}

/// The codes of `block[c..c + 8]` scaled by `inv` (see [`quantize_block_avx2`]).
///
/// # Safety
/// AVX2 must be available and `c + 8 <= block.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn code8(
    block: &[f32],
    c: usize,
    inv: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    // SAFETY: `c + 8 <= block.len()` (the caller's contract).
    let x = _mm256_mul_ps(unsafe { _mm256_loadu_ps(block.as_ptr().add(c)) }, inv);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
    let frac = _mm256_and_ps(_mm256_sub_ps(x, t), abs_mask);
    let away = _mm256_and_ps(
        _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)),
        _mm256_set1_ps(1.0),
    );
    let r = _mm256_add_ps(t, _mm256_or_ps(away, _mm256_and_ps(x, sign_mask)));
    let r = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-Q_MAX)),
        _mm256_set1_ps(Q_MAX),
    );
    // NaN → 0, as `NaN as i8`.
    let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(x, x));
    _mm256_cvttps_epi32(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn fast_quantization_equals_the_reference_bit_for_bit() {
        let mut rng = Rng::new(0x2545_f491);
        let mut next = || rng.next_u64() as u32;
        for (k, block) in [
            (7usize, 32usize),
            (32, 32),
            (100, 32),
            (576, 64),
            (1536, 128),
            (45, 16),
        ] {
            for scale in [1e-30f32, 1e-3, 1.0, 300.0, 3e30] {
                let mut a: Vec<f32> = (0..k)
                    .map(|_| (next() as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale)
                    .collect();
                // Exact ties: with a block maximum of 127, `v * 1.0` lands on .5 values.
                if k > 40 {
                    a[0] = 127.0;
                    for (i, v) in a[1..40].iter_mut().enumerate() {
                        *v = i as f32 - 19.5;
                    }
                    a[40] = f32::NAN;
                }
                let blocks = k.div_ceil(block);
                let (mut q1, mut s1) = (vec![0i8; k], vec![0f32; blocks]);
                let (mut q2, mut s2) = (vec![1i8; k], vec![1f32; blocks]);
                quantize_row_reference(&a, block, &mut q1, &mut s1);
                quantize_row(&a, block, &mut q2, &mut s2);
                assert_eq!(q1, q2, "k {k} block {block} scale {scale}");
                let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&s1), bits(&s2), "k {k} block {block} scale {scale}");
            }
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
}

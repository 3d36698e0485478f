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
/// per block into `scales`. A block of zeros gets scale 0 and zero codes. AVX2 where the CPU
/// has it, with the same bits as [`quantize_row_reference`].
pub fn quantize_row(a: &[f32], block_size: usize, q: &mut [i8], scales: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
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
            row.quantize(&a[i * k..][..k], &w.layout, true);
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
    fn fast_quantization_equals_the_reference_bit_for_bit() {
        let mut x = 0x2545_f491u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
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
    fn offsets_of_gguf_q4_1_zero_points_are_the_f16_minimums() {
        let mut seed = 5u64;
        let f16 = |x: f32| half::f16::from_f32(x).to_f32();
        let mut snapped = 0;
        for _ in 0..100_000 {
            let d = f16(0.05 * lcg(&mut seed));
            let m = f16(0.2 * lcg(&mut seed));
            if d == 0.0 {
                continue;
            }
            // The importer's zero point; `-(z·d)` is `m` or one of its f32 neighbours.
            let z = -m / d;
            snapped += usize::from(-(z * d) != m);
            assert_eq!(block_offset(z, d).to_bits(), m.to_bits(), "d {d} m {m}");
        }
        assert!(snapped > 1000, "the neighbours occur ({snapped})");
        // An offset that is no f16's neighbour stays as computed; NaN stays NaN.
        let (z, s) = (7.3f32, 0.0123f32);
        assert_eq!(block_offset(z, s), -(z * s));
        assert!(block_offset(f32::NAN, 1.0).is_nan());
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

//! Softmax, LogSoftmax and Hardmax along one axis of a tensor viewed as `(outer, n, inner)`.
//!
//! Numerically stable: each lane subtracts its maximum before `exp`, so large inputs do not
//! overflow. Math runs in the accumulator type ([`Accum`]: f32 for f16/bf16); the sum of
//! exponentials folds in lane order and tasks split lanes, never one lane, so results are
//! bit-identical for any thread count.
//! Reference: ONNX `Softmax`, `LogSoftmax`, `Hardmax` (opset 13) and onnxruntime's CPU kernels
//! (`(x - max) - log(Σ exp(x - max))` for LogSoftmax).

use crate::acc::{AccScalar, Accum, max_nan};
use crate::attention::exp_shifted_sum;
#[cfg(target_arch = "x86_64")]
use crate::cpu;
use crate::error::{KernelError, check_len};
use crate::num::{Scale, as_f32, as_f32_mut};
use crate::par::{par_chunks, parts_for};
use crate::{Scalar, ThreadPool};

/// Which normalization to apply to each lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftmaxKind {
    /// `exp(x - max) / Σ exp(x - max)`
    Softmax,
    /// `(x - max) - log(Σ exp(x - max))`
    LogSoftmax,
    /// 1 at the first maximum of the lane, 0 elsewhere.
    Hardmax,
}

/// Applies `kind` to every lane of `x` (shape `(outer, n, inner)`, normalizing over `n`),
/// writing `out` of the same shape.
pub fn softmax<T: Accum>(
    kind: SoftmaxKind,
    x: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let block = n
        .checked_mul(inner)
        .ok_or_else(|| KernelError::Shape(format!("({outer}, {n}, {inner}) overflows")))?;
    let total = outer
        .checked_mul(block)
        .ok_or_else(|| KernelError::Shape(format!("({outer}, {n}, {inner}) overflows")))?;
    check_len("input", x.len(), total)?;
    check_len("output", out.len(), total)?;
    if total == 0 {
        return Ok(());
    }
    let parts = parts_for(pool, outer, block);
    par_chunks(pool, out, block * outer.div_ceil(parts), |first, part| {
        for (b, out_block) in part.chunks_mut(block).enumerate() {
            let x_block = &x[first + b * block..][..block];
            if let (SoftmaxKind::Softmax, 1, Some(x_row), Some(out_row)) =
                (kind, inner, as_f32(x_block), as_f32_mut(out_block))
            {
                softmax_row_f32(x_row, out_row);
                continue;
            }
            for i in 0..inner {
                lane(kind, x_block, out_block, i, n, inner);
            }
        }
    });
    Ok(())
}

/// The softmax of one contiguous f32 row (attention scores, classifier logits) over the
/// attention kernels' vectorized exponential: `e^(x - max)` and their sum in the order
/// [`crate::attention`]'s rows use, then one division per element.
fn softmax_row_f32(x: &[f32], out: &mut [f32]) {
    out.copy_from_slice(x);
    softmax_row_in_place(out);
}

/// [`softmax`] of one contiguous f32 row in place: the same bits as a softmax of the row
/// into another (an attention's scores become their probabilities without a copy).
pub fn softmax_row_in_place(out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let m = row_max(out);
    if m.is_nan() || m == f32::INFINITY {
        // NaN anywhere, or an infinite maximum: the reference's arithmetic says what results.
        for o in out.iter_mut() {
            *o -= m;
        }
        let e: Vec<f32> = out.iter().map(|t| t.exp()).collect();
        let sum = e.iter().fold(0f32, |s, &v| s + v);
        for (o, v) in out.iter_mut().zip(e) {
            *o = v / sum;
        }
        return;
    }
    let sum = exp_shifted_sum(out, m);
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        // SAFETY: AVX-512 or AVX2 is available (checked).
        return unsafe {
            match cpu::level() >= cpu::Level::Avx512 {
                true => divide_avx512(out, sum),
                false => divide_avx2(out, sum),
            }
        };
    }
    divide(out, sum);
}

/// `row[j] = scale(row[j]) + add[j]` (no sum without `add`): attention scores scaled and
/// masked before their softmax, each element's own two roundings, so any vector width gives
/// the same bits.
pub fn scale_and_add(row: &mut [f32], scale: Scale, add: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        // SAFETY: AVX-512 or AVX2 is available (checked).
        return unsafe {
            match cpu::level() >= cpu::Level::Avx512 {
                true => scale_and_add_avx512(row, scale, add),
                false => scale_and_add_avx2(row, scale, add),
            }
        };
    }
    scale_and_add_loop(row, scale, add);
}

/// [`scale_and_add`]'s loops, one per case, written for the compiler to vectorize.
#[inline(always)]
fn scale_and_add_loop(row: &mut [f32], scale: Scale, add: Option<&[f32]>) {
    match scale {
        Scale::Divide(c) => row.iter_mut().for_each(|s| *s /= c),
        Scale::Multiply(c) => row.iter_mut().for_each(|s| *s *= c),
    }
    if let Some(add) = add {
        for (s, &a) in row.iter_mut().zip(add) {
            *s += a;
        }
    }
}

/// [`scale_and_add_loop`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_and_add_avx2(row: &mut [f32], scale: Scale, add: Option<&[f32]>) {
    scale_and_add_loop(row, scale, add);
}

/// [`scale_and_add_loop`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn scale_and_add_avx512(row: &mut [f32], scale: Scale, add: Option<&[f32]>) {
    scale_and_add_loop(row, scale, add);
}

/// `x`'s maximum, NaN where any element is (the first NaN, as [`max_nan`] folds): in eight
/// lanes on AVX2 where no element is NaN (the maximum of numbers does not depend on the
/// order), else folded one at a time.
fn row_max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        // SAFETY: AVX2 is available (checked above).
        if let Some(m) = unsafe { max_avx2(x) } {
            return m;
        }
    }
    x.iter().fold(x[0], |m, &v| max_nan(m, v))
}

/// The maximum of `x` in eight lanes, or `None` where an element is NaN.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_avx2(x: &[f32]) -> Option<f32> {
    use std::arch::x86_64::*;
    let (mut m, mut nan) = (_mm256_set1_ps(f32::NEG_INFINITY), _mm256_setzero_ps());
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        // SAFETY: `chunk` holds eight f32.
        let v = unsafe { _mm256_loadu_ps(chunk.as_ptr()) };
        m = _mm256_max_ps(m, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    if _mm256_movemask_ps(nan) != 0 || rest.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    Some(
        lanes
            .iter()
            .chain(rest)
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v)),
    )
}

/// `out[i] /= sum`: each element's own division, so any width gives the same bits.
#[inline(always)]
fn divide(out: &mut [f32], sum: f32) {
    for o in out.iter_mut() {
        *o /= sum;
    }
}

/// [`divide`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn divide_avx2(out: &mut [f32], sum: f32) {
    divide(out, sum);
}

/// [`divide`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn divide_avx512(out: &mut [f32], sum: f32) {
    divide(out, sum);
}

/// One lane: elements `j * inner + offset` of a block.
fn lane<T: Accum>(
    kind: SoftmaxKind,
    x: &[T],
    out: &mut [T],
    offset: usize,
    n: usize,
    inner: usize,
) {
    let idx = |j: usize| j * inner + offset;
    if kind == SoftmaxKind::Hardmax {
        let mut at = 0;
        for j in 1..n {
            if x[idx(j)] > x[idx(at)] {
                at = j;
            }
        }
        for j in 0..n {
            out[idx(j)] = if j == at { T::ONE } else { T::ZERO };
        }
        return;
    }
    let m = (0..n).fold(x[idx(0)].widen(), |m, j| max_nan(m, x[idx(j)].widen()));
    // Where the element type is the accumulator type, storing exp(x - m) and reading it back
    // is exact, which saves the second exp.
    let stores_exact = std::mem::size_of::<T>() == std::mem::size_of::<T::Acc>();
    let mut sum = <T::Acc as Scalar>::ZERO;
    for j in 0..n {
        let e = x[idx(j)].widen().sub(m).exp();
        sum = sum.add(e);
        if stores_exact && kind == SoftmaxKind::Softmax {
            out[idx(j)] = T::narrow(e);
        }
    }
    match kind {
        SoftmaxKind::Softmax => {
            for j in 0..n {
                let e = if stores_exact {
                    out[idx(j)].widen()
                } else {
                    x[idx(j)].widen().sub(m).exp()
                };
                out[idx(j)] = T::narrow(e.div(sum));
            }
        }
        _ => {
            let log_sum = sum.ln();
            for j in 0..n {
                out[idx(j)] = T::narrow(x[idx(j)].widen().sub(m).sub(log_sum));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    fn run<T: Accum>(
        kind: SoftmaxKind,
        x: &[T],
        outer: usize,
        n: usize,
        inner: usize,
        threads: usize,
    ) -> Vec<T> {
        let mut out = vec![T::ZERO; x.len()];
        softmax(
            kind,
            x,
            outer,
            n,
            inner,
            &mut out,
            &ThreadPool::new(threads),
        )
        .unwrap();
        out
    }

    #[test]
    fn softmax_is_stable_for_large_inputs() {
        let y = run(SoftmaxKind::Softmax, &[1000f32, 1001.0, 1002.0], 1, 3, 1, 1);
        let e = [(-2f64).exp(), (-1f64).exp(), 1.0];
        let s: f64 = e.iter().sum();
        for (got, want) in y.iter().zip(e.iter().map(|v| v / s)) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
        let l = run(
            SoftmaxKind::LogSoftmax,
            &[1000f32, 1001.0, 1002.0],
            1,
            3,
            1,
            1,
        );
        assert!((l[2] as f64 - (1.0 / s).ln()).abs() < 1e-6);
    }

    /// A row's softmax in place has the bits of the softmax into another buffer, for every
    /// length (vector bodies and tails) and for rows with a NaN or an infinity.
    #[test]
    fn a_softmax_in_place_equals_the_softmax_into_another_row() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut rng = crate::rng::Rng::new(5);
        let mut rows: Vec<Vec<f32>> = (0..80).map(|n| rng.floats(n, -30.0, 30.0)).collect();
        rows.push(vec![1.0, f32::NAN, 2.0]);
        rows.push(vec![1.0, f32::INFINITY, 2.0]);
        for row in rows {
            let want = run(SoftmaxKind::Softmax, &row, 1, row.len(), 1, 1);
            let mut got = row.clone();
            softmax_row_in_place(&mut got);
            assert_eq!(bits(&got), bits(&want), "{row:?}");
        }
    }

    #[test]
    fn strided_lanes_and_hardmax() {
        // (1, 2, 2): lanes are columns [0, 3] and [5, 5].
        let x = [0f32, 5.0, 3.0, 5.0];
        assert_eq!(
            run(SoftmaxKind::Hardmax, &x, 1, 2, 2, 1),
            [0.0, 1.0, 1.0, 0.0]
        );
        let y = run(SoftmaxKind::Softmax, &x, 1, 2, 2, 1);
        assert_eq!((y[1], y[3]), (0.5, 0.5));
        assert!((y[0] + y[2] - 1.0).abs() < 1e-7);
    }

    #[test]
    fn a_rows_maximum_is_the_folds_on_every_path() {
        let mut rng = crate::rng::Rng::new(11);
        for len in [1, 7, 8, 9, 16, 31, 70] {
            for special in [
                None,
                Some(f32::NAN),
                Some(f32::INFINITY),
                Some(f32::NEG_INFINITY),
            ] {
                for at in [0, len / 2, len - 1] {
                    let mut x = rng.floats(len, -30.0, 30.0);
                    if let Some(v) = special {
                        x[at] = v;
                    }
                    let want = x.iter().fold(x[0], |m, &v| max_nan(m, v));
                    let got = row_max(&x);
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "{x:?}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn scaled_and_masked_rows_equal_the_elementwise_ops() {
        let mut rng = crate::rng::Rng::new(12);
        for len in [1, 7, 8, 13, 70] {
            let x = rng.floats(len, -30.0, 30.0);
            let mask = rng.floats(len, -5.0, 5.0);
            for (scale, f) in [
                (
                    Scale::Divide(5.656_854),
                    (|s: f32| s / 5.656_854) as fn(f32) -> f32,
                ),
                (Scale::Multiply(0.125), |s: f32| s * 0.125),
            ] {
                for add in [None, Some(&mask[..])] {
                    let mut row = x.clone();
                    scale_and_add(&mut row, scale, add);
                    for (j, (&got, &v)) in row.iter().zip(&x).enumerate() {
                        let want = add.map_or(f(v), |m| f(v) + m[j]);
                        assert_eq!(got.to_bits(), want.to_bits(), "{scale:?} {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn halves_and_threads() {
        let x: Vec<f32> = (0..300 * 257)
            .map(|i| ((i * 31) % 97) as f32 * 0.1)
            .collect();
        let a = run(SoftmaxKind::Softmax, &x, 300, 257, 1, 1);
        let b = run(SoftmaxKind::Softmax, &x, 300, 257, 1, 3);
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
        let h: Vec<bf16> = x[..257].iter().map(|&v| bf16::from_f32(v)).collect();
        let y = run(SoftmaxKind::Softmax, &h, 1, 257, 1, 1);
        let total: f32 = y.iter().map(|v| v.to_f32()).sum();
        assert!((total - 1.0).abs() < 2e-2, "{total}");
    }
}

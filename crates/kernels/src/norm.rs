//! Row normalizations over a tensor viewed as `(rows, n)`: LayerNormalization,
//! RMSNormalization (= SimplifiedLayerNormalization), SkipSimplifiedLayerNormalization and
//! SkipLayerNormalization.
//!
//! Statistics are computed in the accumulator type ([`Accum`]: f32 for f16/bf16/f32, f64 for
//! f64), each as one sequential fold over the row, two-pass for the variance (mean first,
//! then the mean of squared deviations). Tasks split rows, never one row, so results are
//! bit-identical for any thread count and a row's result does not depend on the other rows.
//! Reference: ONNX `LayerNormalization` (opset 17) and `RMSNormalization` (opset 23), and
//! `onnx/reference/ops/op_layer_normalization.py`; onnxruntime's `SimplifiedLayerNormalization`
//! and `com.microsoft.SkipSimplifiedLayerNormalization` (`docs/ContribOperators.md`,
//! `onnxruntime/contrib_ops/cpu/skip_layer_norm.cc`).

use crate::acc::{AccScalar, Accum};
use crate::error::{KernelError, check_len};
use crate::par::{par_chunks, par_chunks2, parts_for};
use crate::{Scalar, ThreadPool};

/// Work per element of a normalized row, in [`parts_for`]'s simple operations: a row runs its
/// sum of squares as one dependent chain and then passes over the row twice more (576 f32
/// take about 1 µs), so a few rows are worth waking the workers for (a batch's eight).
const ROW_WORK: usize = 16;

/// Rows whose statistics a skip norm sums together (independent chains that overlap).
const ROW_GROUP: usize = 4;
/// Rows whose mean and variance LayerNormalization sums together: an f32 add waits four
/// cycles for the one before and two can start each cycle, so eight chains keep the adder
/// busy. all-MiniLM's LayerNormalizations (384 values a row) took 20% less time than one row
/// at a time (the pass that applies the statistics is the rest).
const STATS_ROWS: usize = 8;
/// What a normalization reads: `rows` rows of `n` values of `x`, normalized with `epsilon`.
#[derive(Clone, Copy)]
pub struct NormRows<'a, T> {
    pub x: &'a [T],
    pub rows: usize,
    pub n: usize,
    pub epsilon: f32,
}

/// A normalization's elementwise affine step: `* scale (+ bias)`, `n` values each (`gamma`
/// and `beta` in the skip ops' names).
#[derive(Clone, Copy)]
pub struct Affine<'a, T> {
    pub scale: &'a [T],
    pub bias: Option<&'a [T]>,
}

/// Per-row outputs of LayerNormalization: the mean and `1 / sqrt(variance + epsilon)`, one
/// value per row each.
pub struct LayerNormStats<'a, A> {
    pub mean: &'a mut [A],
    pub inv_std_dev: &'a mut [A],
}

fn rows_len(rows: usize, n: usize) -> Result<usize, KernelError> {
    rows.checked_mul(n)
        .ok_or_else(|| KernelError::Shape(format!("({rows}, {n}) overflows")))
}

/// Checks a norm's input and output (`rows × n`), its weight and optional bias (`n` each,
/// named as the op names them); returns `rows × n`.
fn check_rows<T>(
    (x, out): (&[T], &[T]),
    (weight_name, weight): (&'static str, &[T]),
    bias: Option<(&'static str, &[T])>,
    rows: usize,
    n: usize,
) -> Result<usize, KernelError> {
    let total = rows_len(rows, n)?;
    check_len("input", x.len(), total)?;
    check_len("output", out.len(), total)?;
    check_len(weight_name, weight.len(), n)?;
    if let Some((name, b)) = bias {
        check_len(name, b.len(), n)?;
    }
    Ok(total)
}

/// `(mean, 1 / sqrt(var + eps))` of one row.
fn layer_stats<T: Accum>(row: &[T], eps: T::Acc) -> (T::Acc, T::Acc) {
    layer_stats_of(row.len(), |j| row[j].widen(), eps)
}

/// [`layer_stats`] of a row of `n` values given one by one (in order, each pass).
fn layer_stats_of<A: AccScalar>(n: usize, value: impl Fn(usize) -> A, eps: A) -> (A, A) {
    let count = A::from_f64(n as f64);
    let mean = (0..n).fold(A::ZERO, |a, j| a.add(value(j))).div(count);
    let var = (0..n)
        .fold(A::ZERO, |a, j| {
            let d = value(j).sub(mean);
            a.add(d.mul(d))
        })
        .div(count);
    (mean, A::ONE.div(var.add(eps).sqrt()))
}

/// [`layer_stats`] of `R` rows of `n` values at once: each row's sums are its own chains in
/// [`layer_stats_of`]'s order (so its bits), the rows' chains interleaved so they overlap
/// instead of each add waiting for the one before.
fn layer_stats_group<T: Accum, const R: usize>(
    rows: [&[T]; R],
    n: usize,
    eps: T::Acc,
) -> [(T::Acc, T::Acc); R] {
    let count = <T::Acc as Scalar>::from_f64(n as f64);
    let mut sums = [<T::Acc as Scalar>::ZERO; R];
    for j in 0..n {
        for (s, row) in sums.iter_mut().zip(&rows) {
            *s = s.add(row[j].widen());
        }
    }
    let means = sums.map(|s| s.div(count));
    let mut squares = [<T::Acc as Scalar>::ZERO; R];
    for j in 0..n {
        for ((s, row), &mean) in squares.iter_mut().zip(&rows).zip(&means) {
            let d = row[j].widen().sub(mean);
            *s = s.add(d.mul(d));
        }
    }
    std::array::from_fn(|r| {
        let var = squares[r].div(count);
        (means[r], <T::Acc as Scalar>::ONE.div(var.add(eps).sqrt()))
    })
}

fn layer_apply<T: Accum>(
    row: &[T],
    scale: &[T],
    bias: Option<&[T]>,
    mean: T::Acc,
    inv: T::Acc,
    out: &mut [T],
) {
    layer_apply_of(|j| row[j].widen(), scale, bias, mean, inv, out);
}

/// [`layer_apply`] to a row given value by value.
fn layer_apply_of<T: Accum>(
    value: impl Fn(usize) -> T::Acc,
    scale: &[T],
    bias: Option<&[T]>,
    mean: T::Acc,
    inv: T::Acc,
    out: &mut [T],
) {
    for (j, o) in out.iter_mut().enumerate() {
        let y = value(j).sub(mean).mul(inv).mul(scale[j].widen());
        *o = T::narrow(match bias {
            Some(b) => y.add(b[j].widen()),
            None => y,
        });
    }
}

/// LayerNormalization of each row of `x` (`rows × n`): `(x - mean) / sqrt(var + epsilon) *
/// scale + bias`, with `scale` and `bias` of `n` elements. Fills `stats` when given.
pub fn layer_norm<T: Accum>(
    input: NormRows<'_, T>,
    affine: Affine<'_, T>,
    out: &mut [T],
    stats: Option<LayerNormStats<'_, T::Acc>>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let NormRows {
        x,
        rows,
        n,
        epsilon,
    } = input;
    let Affine { scale, bias } = affine;
    check_rows(
        (x, out),
        ("scale", scale),
        bias.map(|b| ("bias", b)),
        rows,
        n,
    )?;
    let eps = <T::Acc as Scalar>::from_f64(epsilon as f64);
    let parts = parts_for(pool, rows, n.saturating_mul(ROW_WORK));
    let rows_per_part = rows.div_ceil(parts).max(1);
    match stats {
        None => {
            if n == 0 {
                return Ok(());
            }
            par_chunks(pool, out, n * rows_per_part, |first, part| {
                for (g, outs) in part.chunks_mut(n * STATS_ROWS).enumerate() {
                    let at = first + g * STATS_ROWS * n;
                    let row = |q: usize| &x[at + q * n..][..n];
                    // A whole group's chains together; a short group's rows one at a time
                    // (a decode step's single row sums only itself).
                    let stats = match outs.len() / n {
                        STATS_ROWS => {
                            layer_stats_group::<T, STATS_ROWS>(std::array::from_fn(row), n, eps)
                        }
                        here => std::array::from_fn(|q| match q < here {
                            true => layer_stats(row(q), eps),
                            false => Default::default(),
                        }),
                    };
                    for (q, out_row) in outs.chunks_mut(n).enumerate() {
                        let (mean, inv) = stats[q];
                        layer_apply(row(q), scale, bias, mean, inv, out_row);
                    }
                }
            });
        }
        Some(LayerNormStats { mean, inv_std_dev }) => {
            check_len("mean", mean.len(), rows)?;
            check_len("inv_std_dev", inv_std_dev.len(), rows)?;
            par_chunks2(
                pool,
                &mut *mean,
                rows_per_part,
                &mut *inv_std_dev,
                rows_per_part,
                |p, means, invs| {
                    for (q, (m, s)) in means.iter_mut().zip(invs.iter_mut()).enumerate() {
                        (*m, *s) = layer_stats(&x[(p * rows_per_part + q) * n..][..n], eps);
                    }
                },
            );
            if n == 0 {
                return Ok(());
            }
            let (mean, inv_std_dev) = (&*mean, &*inv_std_dev);
            par_chunks(pool, out, n * rows_per_part, |first, part| {
                for (q, out_row) in part.chunks_mut(n).enumerate() {
                    let r = first / n + q;
                    layer_apply(
                        &x[r * n..][..n],
                        scale,
                        bias,
                        mean[r],
                        inv_std_dev[r],
                        out_row,
                    );
                }
            });
        }
    }
    Ok(())
}

/// `1 / sqrt(mean(v²) + eps)` over a row's values, summed in order.
fn inv_rms<A: AccScalar>(values: impl Iterator<Item = A>, count: A, eps: A) -> A {
    inv_of_squares(values.fold(A::ZERO, |a, v| a.add(v.mul(v))), count, eps)
}

/// `1 / sqrt(squares / count + eps)`: [`inv_rms`] from its sum of squares.
fn inv_of_squares<A: AccScalar>(squares: A, count: A, eps: A) -> A {
    A::ONE.div(squares.div(count).add(eps).sqrt())
}

/// RMSNormalization of each row of `x` (`rows × n`): `x / sqrt(mean(x²) + epsilon) * scale`,
/// with `scale` of `n` elements.
pub fn rms_norm<T: Accum>(
    input: NormRows<'_, T>,
    scale: &[T],
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    rms_norm_stats(input, scale, out, None, pool)
}

/// [`rms_norm`] that also stores each row's `1 / sqrt(mean(x²) + epsilon)` in `inv_rms`
/// (`rows` values) when given — SimplifiedLayerNormalization's `inv_std_var`.
pub fn rms_norm_stats<T: Accum>(
    input: NormRows<'_, T>,
    scale: &[T],
    out: &mut [T],
    inv_rms_out: Option<&mut [T::Acc]>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let NormRows {
        x,
        rows,
        n,
        epsilon,
    } = input;
    let total = check_rows((x, out), ("scale", scale), None, rows, n)?;
    let eps = <T::Acc as Scalar>::from_f64(epsilon as f64);
    let count = <T::Acc as Scalar>::from_f64(n as f64);
    let parts = parts_for(pool, rows, n.saturating_mul(ROW_WORK));
    let rows_per_part = rows.div_ceil(parts).max(1);
    let row_inv = |r: usize| inv_rms(x[r * n..][..n].iter().map(|v| v.widen()), count, eps);
    if let Some(inv) = inv_rms_out {
        check_len("inv_rms", inv.len(), rows)?;
        par_chunks(pool, inv, rows_per_part, |first, part| {
            for (q, v) in part.iter_mut().enumerate() {
                *v = row_inv(first + q);
            }
        });
    }
    if total == 0 {
        return Ok(());
    }
    par_chunks(pool, out, n * rows_per_part, |first, part| {
        for (q, out_row) in part.chunks_mut(n).enumerate() {
            let r = first / n + q;
            let inv = row_inv(r);
            for ((o, &v), &s) in out_row.iter_mut().zip(&x[r * n..][..n]).zip(scale) {
                *o = T::narrow(v.widen().mul(inv).mul(s.widen()));
            }
        }
    });
    Ok(())
}

/// The residual added before a skip norm: `skip` repeats every `skip.len()` elements of the
/// input (a suffix of its shape, e.g. `[seq, hidden]` under `[batch, seq, hidden]`), `bias`
/// (`n` values) is added to every row.
#[derive(Debug, Clone, Copy)]
pub struct Residual<'a, T> {
    pub skip: &'a [T],
    pub bias: Option<&'a [T]>,
}

/// Checks that `residual` fits an input of `total` elements in rows of `n`.
fn check_residual<T>(
    residual: &Residual<'_, T>,
    total: usize,
    n: usize,
) -> Result<(), KernelError> {
    if let Some(b) = residual.bias {
        check_len("bias", b.len(), n)?;
    }
    let period = residual.skip.len();
    if total > 0 && (period == 0 || !period.is_multiple_of(n) || !total.is_multiple_of(period)) {
        return Err(KernelError::Shape(format!(
            "skip of {period} elements does not repeat over rows of {n} in an input of {total}"
        )));
    }
    Ok(())
}

/// SkipLayerNormalization of each row of `x` (`rows × n`): with `v = x + skip (+ bias)`
/// (summed left to right in the accumulator type), `out = (v - mean(v)) / sqrt(var(v) +
/// epsilon) * gamma (+ beta)`, the variance two-pass as [`layer_norm`]'s. Fills `sum` with
/// `v` rounded to `T` (the residual stream for the next layer) and `stats` with each row's
/// mean and `1 / sqrt(var + epsilon)` when given. Rows are split between tasks, never one
/// row, so the bits do not depend on the thread count.
pub fn skip_layer_norm<T: Accum>(
    input: NormRows<'_, T>,
    residual: Residual<'_, T>,
    affine: Affine<'_, T>,
    out: &mut [T],
    sum: Option<&mut [T]>,
    stats: Option<LayerNormStats<'_, T::Acc>>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let NormRows {
        x,
        rows,
        n,
        epsilon,
    } = input;
    let Affine {
        scale: gamma,
        bias: beta,
    } = affine;
    let total = check_rows(
        (x, out),
        ("gamma", gamma),
        beta.map(|b| ("beta", b)),
        rows,
        n,
    )?;
    check_residual(&residual, total, n)?;
    if total == 0 {
        return Ok(());
    }
    let Residual { skip, bias } = residual;
    let period = skip.len();
    let eps = <T::Acc as Scalar>::from_f64(epsilon as f64);
    // Element j of row r's v.
    let v = |r: usize, j: usize| {
        let at = r * n + j;
        let s = x[at].widen().add(skip[at % period].widen());
        match bias {
            Some(b) => s.add(b[j].widen()),
            None => s,
        }
    };
    let row_stats = |r: usize| layer_stats_of(n, |j| v(r, j), eps);
    let row = |r: usize, o: &mut [T], s: Option<&mut [T]>| {
        let (mean, inv) = row_stats(r);
        layer_apply_of(|j| v(r, j), gamma, beta, mean, inv, o);
        if let Some(s) = s {
            for (j, s) in s.iter_mut().enumerate() {
                *s = T::narrow(v(r, j));
            }
        }
    };
    let parts = parts_for(pool, rows, n.saturating_mul(ROW_WORK));
    let part_len = rows.div_ceil(parts).max(1) * n;
    match sum {
        Some(sum) => {
            check_len("sum", sum.len(), total)?;
            par_chunks2(pool, out, part_len, sum, part_len, |p, outs, sums| {
                for (i, (o, s)) in outs.chunks_mut(n).zip(sums.chunks_mut(n)).enumerate() {
                    row(p * part_len / n + i, o, Some(s));
                }
            });
        }
        None => par_chunks(pool, out, part_len, |first, part| {
            for (i, o) in part.chunks_mut(n).enumerate() {
                row(first / n + i, o, None);
            }
        }),
    }
    if let Some(LayerNormStats { mean, inv_std_dev }) = stats {
        check_len("mean", mean.len(), rows)?;
        check_len("inv_std_dev", inv_std_dev.len(), rows)?;
        for (r, (m, s)) in mean.iter_mut().zip(inv_std_dev.iter_mut()).enumerate() {
            (*m, *s) = row_stats(r);
        }
    }
    Ok(())
}

/// SkipSimplifiedLayerNormalization of each row of `x` (`rows × n`): with
/// `v = x + skip (+ bias)` (summed left to right in the accumulator type), `out = v /
/// sqrt(mean(v²) + epsilon) * gamma`. Fills `sum` with `v` rounded to `T` (the residual
/// stream for the next layer) and `inv_rms` with each row's `1 / sqrt(mean(v²) + epsilon)`
/// when given. The normalization uses the unrounded `v`, as onnxruntime's CPU kernel does.
pub fn skip_rms_norm<T: Accum>(
    input: NormRows<'_, T>,
    residual: Residual<'_, T>,
    gamma: &[T],
    out: &mut [T],
    sum: Option<&mut [T]>,
    inv_rms_out: Option<&mut [T::Acc]>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let NormRows {
        x,
        rows,
        n,
        epsilon,
    } = input;
    let total = check_rows((x, out), ("gamma", gamma), None, rows, n)?;
    check_residual(&residual, total, n)?;
    let Residual { skip, bias } = residual;
    let period = skip.len();
    let eps = <T::Acc as Scalar>::from_f64(epsilon as f64);
    let count = <T::Acc as Scalar>::from_f64(n as f64);
    let parts = parts_for(pool, rows, n.saturating_mul(ROW_WORK));
    // Whole groups of rows per part where there are enough rows (see `group_inv`).
    let rows_per_part = rows
        .div_ceil(parts)
        .next_multiple_of(ROW_GROUP)
        .min(rows)
        .max(1);
    // Row r's input and skip rows (the modulo once per row, not per element).
    let rows_of = |r: usize| (&x[r * n..][..n], &skip[(r * n) % period..][..n]);
    let value = |(xr, sr): (&[T], &[T]), h: usize| {
        let v = xr[h].widen().add(sr[h].widen());
        match bias {
            Some(b) => v.add(b[h].widen()),
            None => v,
        }
    };
    let row_inv = |r: usize| {
        let rows = rows_of(r);
        inv_rms((0..n).map(|h| value(rows, h)), count, eps)
    };
    let stats = match inv_rms_out {
        Some(inv) => {
            check_len("inv_rms", inv.len(), rows)?;
            par_chunks(pool, &mut *inv, rows_per_part, |first, part| {
                for (q, v) in part.iter_mut().enumerate() {
                    *v = row_inv(first + q);
                }
            });
            Some(&*inv)
        }
        None => None,
    };
    if total == 0 {
        return Ok(());
    }
    // Rows `first..first + R` at once: each row's sum of squares in its own order, the R
    // chains interleaved so their additions overlap (one chain is an add's latency per
    // element: ~0.7 µs a row of 576).
    fn group_inv<'r, T: Accum, const R: usize>(
        rows: [(&'r [T], &'r [T]); R],
        n: usize,
        value: impl Fn((&'r [T], &'r [T]), usize) -> T::Acc,
        count: T::Acc,
        eps: T::Acc,
    ) -> [T::Acc; R] {
        let mut acc = [<T::Acc as Scalar>::ZERO; R];
        for h in 0..n {
            for (a, &row) in acc.iter_mut().zip(&rows) {
                let v = value(row, h);
                *a = a.add(v.mul(v));
            }
        }
        acc.map(|a| inv_of_squares(a, count, eps))
    }
    // The inverse RMS of each row of `rows` (at most ROW_GROUP) into `inv`.
    let invs = |rows: std::ops::Range<usize>, inv: &mut [T::Acc; ROW_GROUP]| match stats {
        Some(s) => inv[..rows.len()].copy_from_slice(&s[rows]),
        None if rows.len() == ROW_GROUP => {
            let group = std::array::from_fn(|i| rows_of(rows.start + i));
            *inv = group_inv::<T, ROW_GROUP>(group, n, value, count, eps);
        }
        None => {
            for (i, v) in inv[..rows.len()].iter_mut().enumerate() {
                *v = row_inv(rows.start + i);
            }
        }
    };
    let row = |r: usize, inv: T::Acc, out_row: &mut [T], sum_row: Option<&mut [T]>| {
        let rows = rows_of(r);
        for (h, o) in out_row.iter_mut().enumerate() {
            *o = T::narrow(value(rows, h).mul(inv).mul(gamma[h].widen()));
        }
        if let Some(sum_row) = sum_row {
            for (h, s) in sum_row.iter_mut().enumerate() {
                *s = T::narrow(value(rows, h));
            }
        }
    };
    let part_len = n * rows_per_part;
    // Rows `first..` of a part (`outs` and `sums` theirs), ROW_GROUP at a time.
    let rows_of_part = |first: usize, outs: &mut [T], mut sums: Option<&mut [T]>| {
        let mut inv = [<T::Acc as Scalar>::ZERO; ROW_GROUP];
        for (g, outs) in outs.chunks_mut(n * ROW_GROUP).enumerate() {
            let r0 = first + g * ROW_GROUP;
            invs(r0..r0 + outs.len() / n, &mut inv);
            for (i, o) in outs.chunks_mut(n).enumerate() {
                let at = (g * ROW_GROUP + i) * n;
                let s = sums.as_deref_mut().map(|s| &mut s[at..at + n]);
                row(r0 + i, inv[i], o, s);
            }
        }
    };
    match sum {
        Some(sum) => {
            check_len("sum", sum.len(), total)?;
            par_chunks2(pool, out, part_len, sum, part_len, |p, outs, sums| {
                rows_of_part(p * rows_per_part, outs, Some(sums));
            });
        }
        None => par_chunks(pool, out, part_len, |first, part| {
            rows_of_part(first / n, part, None);
        }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    fn rows_of<T>(x: &[T], rows: usize, n: usize, epsilon: f32) -> NormRows<'_, T> {
        NormRows {
            x,
            rows,
            n,
            epsilon,
        }
    }

    #[test]
    fn layer_norm_matches_the_formula_and_reports_stats() {
        let pool = ThreadPool::new(1);
        let x = [1f32, 2.0, 3.0, 4.0, -1.0, 1.0];
        let (scale, bias) = ([1f32, 2.0, 0.5], [0f32, 1.0, -1.0]);
        let mut out = [0f32; 6];
        let (mut mean, mut inv) = ([0f32; 2], [0f32; 2]);
        layer_norm(
            rows_of(&x, 2, 3, 0.0),
            Affine {
                scale: &scale,
                bias: Some(&bias),
            },
            &mut out,
            Some(LayerNormStats {
                mean: &mut mean,
                inv_std_dev: &mut inv,
            }),
            &pool,
        )
        .unwrap();
        let inv0 = 1.0 / (2f32 / 3.0).sqrt();
        assert_eq!(mean, [2.0, 4.0 / 3.0]);
        assert!((inv[0] - inv0).abs() < 1e-6);
        let want0 = [-inv0, 1.0, 0.5 * inv0 - 1.0];
        assert!(
            out[..3]
                .iter()
                .zip(want0)
                .all(|(g, w)| (g - w).abs() < 1e-6),
            "{out:?}"
        );
        let mut again = [0f32; 6];
        layer_norm(
            rows_of(&x, 2, 3, 0.0),
            Affine {
                scale: &scale,
                bias: Some(&bias),
            },
            &mut again,
            None,
            &pool,
        )
        .unwrap();
        assert_eq!(out, again, "stats or not, the outputs agree");
    }

    /// Rows summed eight together (a whole group and a short one) give each row's own
    /// bits: the statistics path, which sums one row at a time, agrees bit for bit.
    #[test]
    fn grouped_layer_norm_statistics_keep_each_rows_bits() {
        let (rows, n) = (13, 384);
        let x = crate::rng::Rng::new(9).values(rows * n, 40.0);
        let (scale, bias) = (vec![0.75f32; n], vec![0.25f32; n]);
        let affine = Affine {
            scale: &scale,
            bias: Some(&bias),
        };
        let pool = ThreadPool::new(1);
        let (mut grouped, mut single) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        layer_norm(
            rows_of(&x, rows, n, 1e-5),
            affine,
            &mut grouped,
            None,
            &pool,
        )
        .unwrap();
        let (mut mean, mut inv) = (vec![0f32; rows], vec![0f32; rows]);
        let stats = LayerNormStats {
            mean: &mut mean,
            inv_std_dev: &mut inv,
        };
        layer_norm(
            rows_of(&x, rows, n, 1e-5),
            affine,
            &mut single,
            Some(stats),
            &pool,
        )
        .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&grouped), bits(&single));
    }

    #[test]
    fn rms_norm_of_constant_rows_is_the_scale() {
        let pool = ThreadPool::new(1);
        let x = [f16::from_f32(-3.0); 4];
        let scale = [f16::from_f32(2.0); 4];
        let mut out = [f16::ZERO; 4];
        rms_norm(rows_of(&x, 1, 4, 0.0), &scale, &mut out, &pool).unwrap();
        assert!(out.iter().all(|v| v.to_f32() == -2.0));
    }

    #[test]
    fn rows_are_independent_of_threads_and_neighbours() {
        let (rows, n) = (96, 700);
        let x: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 37) % 101) as f32 * 0.03)
            .collect();
        let scale = vec![1.5f32; n];
        let (mut a, mut b, mut one) = (vec![0f32; rows * n], vec![0f32; rows * n], vec![0f32; n]);
        layer_norm(
            rows_of(&x, rows, n, 1e-5),
            Affine {
                scale: &scale,
                bias: None,
            },
            &mut a,
            None,
            &ThreadPool::new(1),
        )
        .unwrap();
        layer_norm(
            rows_of(&x, rows, n, 1e-5),
            Affine {
                scale: &scale,
                bias: None,
            },
            &mut b,
            None,
            &ThreadPool::new(3),
        )
        .unwrap();
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
        layer_norm(
            rows_of(&x[5 * n..6 * n], 1, n, 1e-5),
            Affine {
                scale: &scale,
                bias: None,
            },
            &mut one,
            None,
            &ThreadPool::new(1),
        )
        .unwrap();
        assert!(
            one.iter()
                .zip(&a[5 * n..6 * n])
                .all(|(p, q)| p.to_bits() == q.to_bits())
        );
    }

    #[test]
    fn wrong_scale_length_is_an_error() {
        let mut out = [0f32; 4];
        assert!(
            rms_norm(
                rows_of(&[1f32; 4], 2, 2, 1e-5),
                &[1f32; 3],
                &mut out,
                &ThreadPool::new(1)
            )
            .is_err()
        );
    }

    #[test]
    fn rms_norm_reports_the_inverse_rms() {
        let x = [3f32, 4.0, 0.0, 0.0, 1.0, 1.0];
        let mut out = [0f32; 6];
        let mut inv = [0f32; 2];
        let pool = ThreadPool::new(1);
        rms_norm_stats(
            rows_of(&x, 2, 3, 0.0),
            &[1.0; 3],
            &mut out,
            Some(&mut inv),
            &pool,
        )
        .unwrap();
        assert_eq!(inv[0], 1.0 / (25f32 / 3.0).sqrt());
        assert_eq!(inv[1], 1.0 / (2f32 / 3.0).sqrt());
        let mut plain = [0f32; 6];
        rms_norm(rows_of(&x, 2, 3, 0.0), &[1.0; 3], &mut plain, &pool).unwrap();
        assert_eq!(out, plain);
    }

    /// Two rows of 2 with a one-row skip repeated and a bias: the sum output is `x + skip +
    /// bias`, and the normalized output is that sum over its RMS times gamma.
    #[test]
    fn skip_rms_norm_adds_the_residual_first() {
        let x = [1f32, 2.0, 3.0, -4.0];
        let (skip, bias, gamma) = ([1f32, 0.0], [1f32, 2.0], [2f32, 0.5]);
        let (mut out, mut sum, mut inv) = ([0f32; 4], [0f32; 4], [0f32; 2]);
        skip_rms_norm(
            rows_of(&x, 2, 2, 0.0),
            Residual {
                skip: &skip,
                bias: Some(&bias),
            },
            &gamma,
            &mut out,
            Some(&mut sum),
            Some(&mut inv),
            &ThreadPool::new(1),
        )
        .unwrap();
        assert_eq!(sum, [3.0, 4.0, 5.0, -2.0]);
        let inv0 = 1.0 / (25f32 / 2.0).sqrt();
        assert_eq!(inv[0], inv0);
        assert_eq!(out[..2], [3.0 * inv0 * 2.0, 4.0 * inv0 * 0.5]);
        let mut alone = [0f32; 4];
        skip_rms_norm(
            rows_of(&x, 2, 2, 0.0),
            Residual {
                skip: &skip,
                bias: Some(&bias),
            },
            &gamma,
            &mut alone,
            None,
            None,
            &ThreadPool::new(1),
        )
        .unwrap();
        assert_eq!(alone, out, "optional outputs do not change the result");
    }

    #[test]
    fn skip_rms_norm_rows_are_independent_of_threads_and_neighbours() {
        let (rows, n) = (64, 600);
        let x: Vec<f16> = (0..rows * n)
            .map(|i| f16::from_f32(((i * 31) % 97) as f32 * 0.02 - 1.0))
            .collect();
        let skip: Vec<f16> = (0..8 * n)
            .map(|i| f16::from_f32(((i * 7) % 13) as f32 * 0.1))
            .collect();
        let gamma = vec![f16::from_f32(0.75); n];
        let run = |x: &[f16], first_row: usize, rows: usize, threads: usize| {
            let mut out = vec![f16::ZERO; rows * n];
            let mut sum = vec![f16::ZERO; rows * n];
            // A lone row must see the skip row it sees inside the batch.
            let skip =
                &skip[(first_row * n) % skip.len()..][..if rows == 1 { n } else { skip.len() }];
            skip_rms_norm(
                rows_of(x, rows, n, 1e-6),
                Residual { skip, bias: None },
                &gamma,
                &mut out,
                Some(&mut sum),
                None,
                &ThreadPool::new(threads),
            )
            .unwrap();
            (out, sum)
        };
        let one = run(&x, 0, rows, 1);
        assert_eq!(one, run(&x, 0, rows, 3));
        let r = 13;
        let lone = run(&x[r * n..][..n], r, 1, 1);
        assert_eq!(lone.0, one.0[r * n..][..n]);
        assert_eq!(lone.1, one.1[r * n..][..n]);
    }

    #[test]
    fn skip_that_does_not_tile_the_input_is_an_error() {
        let mut out = [0f32; 6];
        let res = Residual {
            skip: &[1f32; 4],
            bias: None,
        };
        let pool = ThreadPool::new(1);
        let err = skip_rms_norm(
            rows_of(&[1f32; 6], 3, 2, 1e-5),
            res,
            &[1.0; 2],
            &mut out,
            None,
            None,
            &pool,
        );
        assert!(err.is_err());
    }
}

//! Row normalizations over a tensor viewed as `(rows, n)`: LayerNormalization and
//! RMSNormalization.
//!
//! Statistics are computed in the accumulator type ([`Accum`]: f32 for f16/bf16/f32, f64 for
//! f64), each as one sequential fold over the row, two-pass for the variance (mean first,
//! then the mean of squared deviations). Tasks split rows, never one row, so results are
//! bit-identical for any thread count and a row's result does not depend on the other rows.
//! Reference: ONNX `LayerNormalization` (opset 17) and `RMSNormalization` (opset 23), and
//! `onnx/reference/ops/op_layer_normalization.py`.

use crate::acc::{AccScalar, Accum};
use crate::layout::{LayoutError, check_len};
use crate::par::{par_chunks, par_chunks2, parts_for};
use crate::{Scalar, ThreadPool};

/// Per-row outputs of LayerNormalization: the mean and `1 / sqrt(variance + epsilon)`, one
/// value per row each.
pub struct LayerNormStats<'a, A> {
    pub mean: &'a mut [A],
    pub inv_std_dev: &'a mut [A],
}

fn rows_len(rows: usize, n: usize) -> Result<usize, LayoutError> {
    rows.checked_mul(n)
        .ok_or_else(|| LayoutError::Shape(format!("({rows}, {n}) overflows")))
}

/// `(mean, 1 / sqrt(var + eps))` of one row.
fn layer_stats<T: Accum>(row: &[T], eps: T::Acc) -> (T::Acc, T::Acc) {
    let zero = <T::Acc as Scalar>::ZERO;
    let count = <T::Acc as Scalar>::from_f64(row.len() as f64);
    let mean = row.iter().fold(zero, |a, &v| a.add(v.widen())).div(count);
    let var = row
        .iter()
        .fold(zero, |a, &v| {
            let d = v.widen().sub(mean);
            a.add(d.mul(d))
        })
        .div(count);
    (mean, <T::Acc as Scalar>::ONE.div(var.add(eps).sqrt()))
}

fn layer_apply<T: Accum>(
    row: &[T],
    scale: &[T],
    bias: Option<&[T]>,
    mean: T::Acc,
    inv: T::Acc,
    out: &mut [T],
) {
    for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
        let y = v.widen().sub(mean).mul(inv).mul(scale[j].widen());
        *o = T::narrow(match bias {
            Some(b) => y.add(b[j].widen()),
            None => y,
        });
    }
}

/// LayerNormalization of each row of `x` (`rows × n`): `(x - mean) / sqrt(var + epsilon) *
/// scale + bias`, with `scale` and `bias` of `n` elements. Fills `stats` when given.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm<T: Accum>(
    x: &[T],
    scale: &[T],
    bias: Option<&[T]>,
    rows: usize,
    n: usize,
    epsilon: f32,
    out: &mut [T],
    stats: Option<LayerNormStats<'_, T::Acc>>,
    pool: &ThreadPool,
) -> Result<(), LayoutError> {
    let total = rows_len(rows, n)?;
    check_len("input", x.len(), total)?;
    check_len("output", out.len(), total)?;
    check_len("scale", scale.len(), n)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), n)?;
    }
    let eps = <T::Acc as Scalar>::from_f64(epsilon as f64);
    let parts = parts_for(pool, rows, n);
    let rows_per_part = rows.div_ceil(parts).max(1);
    match stats {
        None => {
            if n == 0 {
                return Ok(());
            }
            par_chunks(pool, out, n * rows_per_part, |first, part| {
                for (q, out_row) in part.chunks_mut(n).enumerate() {
                    let row = &x[first + q * n..][..n];
                    let (mean, inv) = layer_stats(row, eps);
                    layer_apply(row, scale, bias, mean, inv, out_row);
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

/// RMSNormalization of each row of `x` (`rows × n`): `x / sqrt(mean(x²) + epsilon) * scale`,
/// with `scale` of `n` elements.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm<T: Accum>(
    x: &[T],
    scale: &[T],
    rows: usize,
    n: usize,
    epsilon: f32,
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), LayoutError> {
    let total = rows_len(rows, n)?;
    check_len("input", x.len(), total)?;
    check_len("output", out.len(), total)?;
    check_len("scale", scale.len(), n)?;
    if total == 0 {
        return Ok(());
    }
    let eps = <T::Acc as Scalar>::from_f64(epsilon as f64);
    let count = <T::Acc as Scalar>::from_f64(n as f64);
    let parts = parts_for(pool, rows, n);
    par_chunks(pool, out, n * rows.div_ceil(parts), |first, part| {
        for (q, out_row) in part.chunks_mut(n).enumerate() {
            let row = &x[first + q * n..][..n];
            let ms = row
                .iter()
                .fold(<T::Acc as Scalar>::ZERO, |a, &v| {
                    a.add(v.widen().mul(v.widen()))
                })
                .div(count);
            let inv = <T::Acc as Scalar>::ONE.div(ms.add(eps).sqrt());
            for ((o, &v), &s) in out_row.iter_mut().zip(row).zip(scale) {
                *o = T::narrow(v.widen().mul(inv).mul(s.widen()));
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn layer_norm_matches_the_formula_and_reports_stats() {
        let pool = ThreadPool::new(1);
        let x = [1f32, 2.0, 3.0, 4.0, -1.0, 1.0];
        let (scale, bias) = ([1f32, 2.0, 0.5], [0f32, 1.0, -1.0]);
        let mut out = [0f32; 6];
        let (mut mean, mut inv) = ([0f32; 2], [0f32; 2]);
        layer_norm(
            &x,
            &scale,
            Some(&bias),
            2,
            3,
            0.0,
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
        layer_norm(&x, &scale, Some(&bias), 2, 3, 0.0, &mut again, None, &pool).unwrap();
        assert_eq!(out, again, "stats or not, the outputs agree");
    }

    #[test]
    fn rms_norm_of_constant_rows_is_the_scale() {
        let pool = ThreadPool::new(1);
        let x = [f16::from_f32(-3.0); 4];
        let scale = [f16::from_f32(2.0); 4];
        let mut out = [f16::ZERO; 4];
        rms_norm(&x, &scale, 1, 4, 0.0, &mut out, &pool).unwrap();
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
            &x,
            &scale,
            None,
            rows,
            n,
            1e-5,
            &mut a,
            None,
            &ThreadPool::new(1),
        )
        .unwrap();
        layer_norm(
            &x,
            &scale,
            None,
            rows,
            n,
            1e-5,
            &mut b,
            None,
            &ThreadPool::new(3),
        )
        .unwrap();
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
        layer_norm(
            &x[5 * n..6 * n],
            &scale,
            None,
            1,
            n,
            1e-5,
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
                &[1f32; 4],
                &[1f32; 3],
                2,
                2,
                1e-5,
                &mut out,
                &ThreadPool::new(1)
            )
            .is_err()
        );
    }
}

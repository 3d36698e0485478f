//! Reductions along one axis of a tensor viewed as `(outer, n, inner)`: ReduceX, ArgMax /
//! ArgMin, CumSum and TopK.
//!
//! A lane is the `n` elements `x[(o * n + j) * inner + i]` for `j = 0..n`. Callers turn
//! multi-axis reductions into one axis by merging adjacent reduced axes (and permuting the
//! input when reduced axes are not adjacent), which keeps the reduction order row-major over
//! the reduced indices, as NumPy's is.
//!
//! Contract: each output element folds its lane sequentially in index order in the
//! accumulator type ([`Accum`]), and tasks split output elements, never a lane, so results
//! are bit-identical for any thread count. Empty lanes (`n = 0`) give the ONNX identities:
//! 0 for sums, 1 for products, -inf (or the type's minimum) for Max, +inf (or maximum) for
//! Min, -inf for LogSum and LogSumExp, NaN for Mean.
//! Reference: ONNX operator docs (ReduceSum .. ReduceLogSumExp, ArgMax, CumSum, TopK) and
//! `onnx/reference/ops`.

use std::cmp::Ordering;

use crate::acc::{AccScalar, Accum, max_nan, min_nan};
use crate::error::{KernelError, check_len};
use crate::par::{par_chunks, par_chunks2, parts_for};
use crate::{Scalar, ThreadPool};

/// What a reduction computes over each lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    /// Sum of absolute values.
    L1,
    /// Square root of the sum of squares.
    L2,
    /// Natural log of the sum.
    LogSum,
    /// `log(Σ exp(x))`, computed as `m + log(Σ exp(x - m))` with `m` the largest finite element.
    LogSumExp,
}

/// A tensor viewed as `(outer, n, inner)`: `outer * inner` lanes of `n` elements each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lanes {
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

impl Lanes {
    /// `outer * n * inner`, or an error when it overflows.
    fn numel(self) -> Result<usize, KernelError> {
        let Lanes { outer, n, inner } = self;
        outer
            .checked_mul(n)
            .and_then(|v| v.checked_mul(inner))
            .ok_or_else(|| KernelError::Shape(format!("({outer}, {n}, {inner}) overflows")))
    }
}

/// Folds lane elements `x[start + j * stride]`, `j = 0..n`, in order.
fn fold_lane<T: Copy, A>(
    x: &[T],
    start: usize,
    stride: usize,
    n: usize,
    init: A,
    mut f: impl FnMut(A, T) -> A,
) -> A {
    if stride == 1 {
        x[start..start + n].iter().fold(init, |a, &v| f(a, v))
    } else {
        (0..n).fold(init, |a, j| f(a, x[start + j * stride]))
    }
}

fn sum_lane<T: Accum>(
    x: &[T],
    start: usize,
    stride: usize,
    n: usize,
    g: impl Fn(T::Acc) -> T::Acc,
) -> T::Acc {
    fold_lane(x, start, stride, n, <T::Acc as Scalar>::ZERO, |a, v| {
        a.add(g(v.widen()))
    })
}

/// One lane's reduction.
fn reduce_lane<T: Accum>(op: ReduceOp, x: &[T], start: usize, stride: usize, n: usize) -> T {
    let sq = |v: T::Acc| v.mul(v);
    match op {
        ReduceOp::Sum => T::narrow(sum_lane(x, start, stride, n, |v| v)),
        ReduceOp::Mean => T::narrow(
            sum_lane(x, start, stride, n, |v| v).div(<T::Acc as Scalar>::from_f64(n as f64)),
        ),
        ReduceOp::SumSquare => T::narrow(sum_lane(x, start, stride, n, sq)),
        ReduceOp::L1 => T::narrow(sum_lane(x, start, stride, n, AccScalar::abs)),
        ReduceOp::L2 => T::narrow(sum_lane(x, start, stride, n, sq).sqrt()),
        ReduceOp::LogSum => T::narrow(sum_lane(x, start, stride, n, |v| v).ln()),
        ReduceOp::Prod => T::narrow(fold_lane(
            x,
            start,
            stride,
            n,
            <T::Acc as Scalar>::ONE,
            |a, v| a.mul(v.widen()),
        )),
        ReduceOp::Max => fold_lane(x, start, stride, n, T::min_value(), max_nan),
        ReduceOp::Min => fold_lane(x, start, stride, n, T::max_value(), min_nan),
        ReduceOp::LogSumExp => {
            // Shift by the largest finite element so exp cannot overflow (ONNX's reference
            // does the same); infinities and NaN then propagate through the sum.
            let m = fold_lane(x, start, stride, n, None, |m: Option<T::Acc>, v| {
                let w = v.widen();
                if w.is_finite() {
                    Some(m.map_or(w, |m| max_nan(m, w)))
                } else {
                    m
                }
            })
            .unwrap_or(<T::Acc as Scalar>::ZERO);
            T::narrow(
                sum_lane(x, start, stride, n, |v| v.sub(m).exp())
                    .ln()
                    .add(m),
            )
        }
    }
}

/// `out[o * inner + i] = op(lane (o, i))` for `x` viewed as `(outer, n, inner)`.
pub fn reduce<T: Accum>(
    op: ReduceOp,
    x: &[T],
    lanes: Lanes,
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let Lanes { outer, n, inner } = lanes;
    check_len("input", x.len(), lanes.numel()?)?;
    check_len("output", out.len(), outer * inner)?;
    if out.is_empty() {
        return Ok(());
    }
    let parts = parts_for(pool, out.len(), n);
    par_chunks(pool, out, out.len().div_ceil(parts), |first, part| {
        for (q, o) in part.iter_mut().enumerate() {
            let (oo, i) = ((first + q) / inner, (first + q) % inner);
            *o = reduce_lane(op, x, oo * n * inner + i, inner, n);
        }
    });
    Ok(())
}

/// ArgMax (`max`) or ArgMin: `out[o * inner + i]` is the lane index of the first extreme
/// (the last with `select_last`). A NaN counts as the extreme, as in NumPy. Lanes must not be
/// empty.
pub fn arg_reduce<T: Scalar>(
    x: &[T],
    lanes: Lanes,
    max: bool,
    select_last: bool,
    out: &mut [i64],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let Lanes { outer, n, inner } = lanes;
    check_len("input", x.len(), lanes.numel()?)?;
    check_len("output", out.len(), outer * inner)?;
    if out.is_empty() {
        return Ok(());
    }
    if n == 0 {
        return Err(KernelError::Shape(
            "ArgMax/ArgMin over an axis of size 0 has no answer".into(),
        ));
    }
    let parts = parts_for(pool, out.len(), n);
    par_chunks(pool, out, out.len().div_ceil(parts), |first, part| {
        for (q, o) in part.iter_mut().enumerate() {
            let (oo, i) = ((first + q) / inner, (first + q) % inner);
            let start = oo * n * inner + i;
            let (mut best, mut at) = (x[start], 0usize);
            for j in 1..n {
                let v = x[start + j * inner];
                let wins = if best.is_nan() {
                    select_last && v.is_nan()
                } else if v.is_nan() {
                    true
                } else {
                    let better = if max { v > best } else { v < best };
                    better || (select_last && v == best)
                };
                if wins {
                    (best, at) = (v, j);
                }
            }
            *o = at as i64;
        }
    });
    Ok(())
}

/// Cumulative sum along each lane into `out` (same shape as `x`). `exclusive` leaves out the
/// element itself (the first output is 0); `reverse` runs from the end of the lane.
pub fn cumsum<T: Accum>(
    x: &[T],
    lanes: Lanes,
    exclusive: bool,
    reverse: bool,
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let Lanes { outer, n, inner } = lanes;
    let total = lanes.numel()?;
    check_len("input", x.len(), total)?;
    check_len("output", out.len(), total)?;
    let block = n * inner;
    if total == 0 {
        return Ok(());
    }
    let parts = parts_for(pool, outer, block);
    let blocks_per_part = outer.div_ceil(parts);
    par_chunks(pool, out, block * blocks_per_part, |first, part| {
        for (b, out_block) in part.chunks_mut(block).enumerate() {
            let x_block = &x[first + b * block..][..block];
            for i in 0..inner {
                let mut acc = <T::Acc as Scalar>::ZERO;
                for step in 0..n {
                    let idx = if reverse { n - 1 - step } else { step } * inner + i;
                    let v = x_block[idx].widen();
                    if exclusive {
                        out_block[idx] = T::narrow(acc);
                        acc = acc.add(v);
                    } else {
                        acc = acc.add(v);
                        out_block[idx] = T::narrow(acc);
                    }
                }
            }
        }
    });
    Ok(())
}

/// A total order on element values: NaN sorts above every number and equal to NaN.
fn total<T: Scalar>(a: T, b: T) -> Ordering {
    a.partial_cmp(&b)
        .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
}

/// TopK: the `k` largest (or smallest) elements of each lane, sorted best first, ties broken
/// by the lower index (as onnxruntime does). `values` and `indices` have shape
/// `(outer, k, inner)`. Requires `k <= n`.
pub fn top_k<T: Scalar>(
    x: &[T],
    lanes: Lanes,
    k: usize,
    largest: bool,
    values: &mut [T],
    indices: &mut [i64],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let Lanes { outer, n, inner } = lanes;
    check_len("input", x.len(), lanes.numel()?)?;
    if k > n {
        return Err(KernelError::Shape(format!(
            "k = {k} is larger than the axis ({n} elements)"
        )));
    }
    let out_len = Lanes { outer, n: k, inner }.numel()?;
    check_len("values", values.len(), out_len)?;
    check_len("indices", indices.len(), out_len)?;
    if out_len == 0 {
        return Ok(());
    }
    let block = k * inner;
    let parts = parts_for(pool, outer * inner, n);
    // Parts take whole blocks (one `o`), so each keeps its lanes' outputs together.
    let blocks_per_part = outer.div_ceil(parts.min(outer));
    par_chunks2(
        pool,
        values,
        block * blocks_per_part,
        indices,
        block * blocks_per_part,
        |p, vals, idxs| {
            let mut order: Vec<usize> = Vec::with_capacity(n);
            for (b, (vb, ib)) in vals
                .chunks_mut(block)
                .zip(idxs.chunks_mut(block))
                .enumerate()
            {
                let base = (p * blocks_per_part + b) * n * inner;
                for i in 0..inner {
                    let at = |j: usize| x[base + j * inner + i];
                    let cmp = |&p: &usize, &q: &usize| {
                        if largest {
                            total(at(q), at(p))
                        } else {
                            total(at(p), at(q))
                        }
                        .then(p.cmp(&q))
                    };
                    order.clear();
                    order.extend(0..n);
                    if k < n {
                        order.select_nth_unstable_by(k - 1, cmp);
                        order.truncate(k);
                    }
                    order.sort_unstable_by(cmp);
                    for (r, &j) in order.iter().enumerate() {
                        vb[r * inner + i] = at(j);
                        ib[r * inner + i] = j as i64;
                    }
                }
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    fn lanes(outer: usize, n: usize, inner: usize) -> Lanes {
        Lanes { outer, n, inner }
    }

    fn run(op: ReduceOp, x: &[f32], outer: usize, n: usize, inner: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; outer * inner];
        reduce(
            op,
            x,
            Lanes { outer, n, inner },
            &mut out,
            &ThreadPool::new(1),
        )
        .unwrap();
        out
    }

    #[test]
    fn every_op_over_a_middle_axis() {
        // Shape (1, 3, 2): lanes are columns [1, 3, -5] and [2, 4, 6].
        let x = [1f32, 2.0, 3.0, 4.0, -5.0, 6.0];
        assert_eq!(run(ReduceOp::Sum, &x, 1, 3, 2), [-1.0, 12.0]);
        assert_eq!(run(ReduceOp::Mean, &x, 1, 3, 2), [-1.0 / 3.0, 4.0]);
        assert_eq!(run(ReduceOp::Max, &x, 1, 3, 2), [3.0, 6.0]);
        assert_eq!(run(ReduceOp::Min, &x, 1, 3, 2), [-5.0, 2.0]);
        assert_eq!(run(ReduceOp::Prod, &x, 1, 3, 2), [-15.0, 48.0]);
        assert_eq!(run(ReduceOp::SumSquare, &x, 1, 3, 2), [35.0, 56.0]);
        assert_eq!(run(ReduceOp::L1, &x, 1, 3, 2), [9.0, 12.0]);
        assert_eq!(run(ReduceOp::L2, &x, 1, 3, 2), [35f32.sqrt(), 56f32.sqrt()]);
        assert_eq!(run(ReduceOp::LogSum, &x[1..2], 1, 1, 1), [2f32.ln()]);
        let lse = run(ReduceOp::LogSumExp, &x, 1, 3, 2);
        let want = (1f64.exp() + 3f64.exp() + (-5f64).exp()).ln();
        assert!((lse[0] as f64 - want).abs() < 1e-6);
    }

    #[test]
    fn empty_lanes_give_the_identities() {
        let x: [f32; 0] = [];
        assert_eq!(run(ReduceOp::Sum, &x, 2, 0, 1), [0.0, 0.0]);
        assert_eq!(run(ReduceOp::Prod, &x, 1, 0, 1), [1.0]);
        assert_eq!(run(ReduceOp::Max, &x, 1, 0, 1), [f32::NEG_INFINITY]);
        assert_eq!(run(ReduceOp::Min, &x, 1, 0, 1), [f32::INFINITY]);
        assert_eq!(run(ReduceOp::LogSum, &x, 1, 0, 1), [f32::NEG_INFINITY]);
        assert_eq!(run(ReduceOp::LogSumExp, &x, 1, 0, 1), [f32::NEG_INFINITY]);
        assert_eq!(run(ReduceOp::L2, &x, 1, 0, 1), [0.0]);
    }

    #[test]
    fn log_sum_exp_does_not_overflow_and_half_sums_in_f32() {
        let big = [1000f32, 1000.0];
        assert!((run(ReduceOp::LogSumExp, &big, 1, 2, 1)[0] - (1000.0 + 2f32.ln())).abs() < 1e-3);
        // 2048 + 1 + 1 in f16 steps would lose both ones; the f32 accumulator keeps them.
        let x = [f16::from_f32(2048.0), f16::ONE, f16::ONE];
        let mut out = [f16::ZERO];
        reduce(
            ReduceOp::Sum,
            &x,
            lanes(1, 3, 1),
            &mut out,
            &ThreadPool::new(1),
        )
        .unwrap();
        assert_eq!(out[0].to_f32(), 2050.0);
    }

    #[test]
    fn thread_count_does_not_change_results() {
        let x: Vec<f32> = (0..64 * 1000)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        for (outer, n, inner) in [(64, 1000, 1), (8, 1000, 8)] {
            let (mut a, mut b) = (vec![0f32; outer * inner], vec![0f32; outer * inner]);
            reduce(
                ReduceOp::Mean,
                &x,
                Lanes { outer, n, inner },
                &mut a,
                &ThreadPool::new(1),
            )
            .unwrap();
            reduce(
                ReduceOp::Mean,
                &x,
                Lanes { outer, n, inner },
                &mut b,
                &ThreadPool::new(3),
            )
            .unwrap();
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
        }
    }

    #[test]
    fn arg_reduce_picks_first_or_last_extreme() {
        let pool = ThreadPool::new(1);
        let x = [2i32, 5, 5, 1, 1];
        let mut out = [0i64];
        arg_reduce(&x, lanes(1, 5, 1), true, false, &mut out, &pool).unwrap();
        assert_eq!(out, [1]);
        arg_reduce(&x, lanes(1, 5, 1), true, true, &mut out, &pool).unwrap();
        assert_eq!(out, [2]);
        arg_reduce(&x, lanes(1, 5, 1), false, true, &mut out, &pool).unwrap();
        assert_eq!(out, [4]);
        assert!(arg_reduce::<i32>(&[], lanes(1, 0, 1), true, false, &mut out, &pool).is_err());
    }

    #[test]
    fn cumsum_directions() {
        let pool = ThreadPool::new(1);
        let x = [1f32, 2.0, 3.0, 4.0, 5.0, 6.0]; // (1, 3, 2)
        let mut out = [0f32; 6];
        cumsum(&x, lanes(1, 3, 2), false, false, &mut out, &pool).unwrap();
        assert_eq!(out, [1.0, 2.0, 4.0, 6.0, 9.0, 12.0]);
        cumsum(&x, lanes(1, 3, 2), true, true, &mut out, &pool).unwrap();
        assert_eq!(out, [8.0, 10.0, 5.0, 6.0, 0.0, 0.0]);
    }

    #[test]
    fn top_k_breaks_ties_by_lower_index() {
        let pool = ThreadPool::new(1);
        let x = [3f32, 1.0, 3.0, f32::NAN, 2.0, 1.0];
        let (mut v, mut i) = ([0f32; 3], [0i64; 3]);
        top_k(&x[..3], lanes(1, 3, 1), 3, true, &mut v, &mut i, &pool).unwrap();
        assert_eq!((v, i), ([3.0, 3.0, 1.0], [0, 2, 1]));
        let (mut v, mut i) = ([0f32; 2], [0i64; 2]);
        top_k(&x[3..], lanes(1, 3, 1), 2, false, &mut v, &mut i, &pool).unwrap();
        assert_eq!((v, i), ([1.0, 2.0], [2, 1]));
        assert!(
            top_k(
                &x,
                lanes(1, 6, 1),
                7,
                true,
                &mut [0f32; 7],
                &mut [0i64; 7],
                &pool
            )
            .is_err()
        );
    }
}

//! Reference matrix multiplication over row-major slices: `C = A·B`, batched, and Gemm's
//! `C = alpha·A·B + beta·bias`.
//!
//! The reduction contract (DESIGN.md §6): every output element `C[i, j]` is one accumulator
//! that adds `A[i, k]·B[k, j]` for `k = 0, 1, .., K-1` in order, in the element type's
//! accumulator ([`Accum`]: f32 for f16/bf16; each step a fused multiply-add in f32 and f64,
//! as the CPU's FMA computes it), then rounds once. Tasks split output rows and
//! columns, never K. So the result is bit-identical for any thread count, and row `i` of an
//! M-row product equals the 1-row product of row `i` (decode row = prefill row).
//!
//! Loop order is i, k, j over a stack tile of [`TILE`] output columns: each `j` lane is an
//! independent accumulator, so the inner loop vectorizes without reassociating any sum.
//! f32 products run the same arithmetic in explicit AVX-512 or AVX2 vectors where the CPU has
//! them (`matmul_f32`: several vectors of columns at a time, up to eight rows a task sharing
//! each load of `B`); tests hold it to this reference bit for bit.
//! Reference: ONNX `MatMul` (NumPy `matmul`) and `Gemm` operator docs.

use std::ops::Range;

use crate::acc::Accum;
use crate::error::{KernelError, check_len};
use crate::matmul_f32::{self, Matrix};
pub use crate::matmul_f32::{PACKED_TILE, PackedF32};
use crate::num::{as_f32, as_f32_mut};
use crate::par::{Grid, Shared, par_row_parts, parts_for, row_grid};
use crate::pool::Prelude;
use crate::{Scalar, ThreadPool};

/// Output columns accumulated together on the stack while K streams past (64 f32 lanes are
/// 256 bytes: a few cache lines, and a multiple of every SIMD width).
pub const TILE: usize = 64;

/// A matrix added to the product (Gemm's `C` input), broadcast to `(M, N)` by strides:
/// element `(i, j)` is `data[i * row_stride + j * col_stride]` (a stride of 0 repeats).
#[derive(Debug, Clone, Copy)]
pub struct Bias<'a, T> {
    pub data: &'a [T],
    pub row_stride: usize,
    pub col_stride: usize,
}

fn mul(a: usize, b: usize, what: &str) -> Result<usize, KernelError> {
    a.checked_mul(b)
        .ok_or_else(|| KernelError::Shape(format!("{what} {a} x {b} overflows")))
}

/// `c = a·b` for row-major `a` (m, k), `b` (k, n) and `c` (m, n).
pub fn matmul<T: Accum>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    m: usize,
    k: usize,
    n: usize,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_batched(a, b, c, &[0], &[0], (m, k, n), pool)
}

/// A batch of products sharing one shape: `c[t] = a[a_offsets[t]..]·b[b_offsets[t]..]`, each
/// operand row-major (m, k) and (k, n), with `c` holding the `(m, n)` results one after another.
/// Offsets let broadcast batches reuse one operand without copying it.
pub fn matmul_batched<T: Accum>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    a_offsets: &[usize],
    b_offsets: &[usize],
    (m, k, n): (usize, usize, usize),
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    product(
        a,
        b,
        c,
        (a_offsets, b_offsets),
        (m, k, n),
        pool,
        Finish::plain(&|_, _, acc| T::narrow(acc)),
    )
}

/// Gemm: `c = alpha·(a·b) + beta·bias` for row-major `a` (m, k), `b` (k, n), `c` (m, n). The
/// bias is skipped (not read) when absent or when `beta` is 0. Scaling happens in the
/// accumulator type, before the single rounding.
pub fn gemm<T: Accum>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    (m, k, n): (usize, usize, usize),
    (alpha, beta): (f64, f64),
    bias: Option<Bias<'_, T>>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let alpha_acc = <T::Acc as Scalar>::from_f64(alpha);
    let beta_acc = <T::Acc as Scalar>::from_f64(beta);
    let scale = |acc: T::Acc| {
        if alpha == 1.0 {
            acc
        } else {
            alpha_acc.mul(acc)
        }
    };
    match bias.filter(|_| beta != 0.0) {
        None => {
            let each = |_: usize, _: usize, acc: T::Acc| T::narrow(scale(acc));
            let finish = Finish {
                each: &each,
                plain: alpha == 1.0,
            };
            product(a, b, c, (&[0], &[0]), (m, k, n), pool, finish)
        }
        Some(bias) => {
            if m > 0 && n > 0 {
                let last = (m - 1).checked_mul(bias.row_stride).and_then(|r| {
                    (n - 1)
                        .checked_mul(bias.col_stride)
                        .and_then(|c| r.checked_add(c))
                });
                if last.is_none_or(|l| l >= bias.data.len()) {
                    return Err(KernelError::Shape(format!(
                        "bias of {} elements cannot broadcast to ({m}, {n}) with strides ({}, {})",
                        bias.data.len(),
                        bias.row_stride,
                        bias.col_stride
                    )));
                }
            }
            let each = |i: usize, j: usize, acc: T::Acc| {
                let add = bias.data[i * bias.row_stride + j * bias.col_stride].widen();
                T::narrow(scale(acc).add(if beta == 1.0 { add } else { beta_acc.mul(add) }))
            };
            let finish = Finish {
                each: &each,
                plain: false,
            };
            product(a, b, c, (&[0], &[0]), (m, k, n), pool, finish)
        }
    }
}

/// How a product's accumulators become its outputs: `each(i, j, accumulator)` for output
/// `(i, j)`, which is the accumulator as it is (narrowed to the output type) where `plain`,
/// so f32 outputs are then copied a row of values at a time.
#[derive(Clone, Copy)]
struct Finish<'e, F> {
    each: &'e F,
    plain: bool,
}

impl<'e, F> Finish<'e, F> {
    fn plain(each: &'e F) -> Self {
        Finish { each, plain: true }
    }

    /// Row `i`'s accumulators `values` of columns `j..` into `out`.
    #[inline]
    fn store<T: Accum>(&self, i: usize, j: usize, values: &[f32], out: &mut [T])
    where
        F: Fn(usize, usize, T::Acc) -> T,
    {
        if self.plain
            && let Some(out) = as_f32_mut(out)
        {
            out.copy_from_slice(&values[..out.len()]);
            return;
        }
        for (x, (o, &acc)) in out.iter_mut().zip(values).enumerate() {
            *o = (self.each)(i, j + x, <T::Acc as Scalar>::from_f64(acc as f64));
        }
    }
}

/// Shared driver: validates, splits output rows (or columns when rows are few) across the
/// pool, and stores each output element `(i, j)` as `finish` says.
fn product<T: Accum>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    (a_offsets, b_offsets): (&[usize], &[usize]),
    (m, k, n): (usize, usize, usize),
    pool: &ThreadPool,
    finish: Finish<impl Fn(usize, usize, T::Acc) -> T + Sync>,
) -> Result<(), KernelError> {
    let batch = a_offsets.len();
    check_len("b offsets", b_offsets.len(), batch)?;
    let (a_size, b_size, c_size) = (mul(m, k, "A")?, mul(k, n, "B")?, mul(m, n, "C")?);
    check_len("output", c.len(), mul(batch, c_size, "batched C")?)?;
    for (what, offsets, size, len) in [
        ("A", a_offsets, a_size, a.len()),
        ("B", b_offsets, b_size, b.len()),
    ] {
        if let Some(&off) = offsets
            .iter()
            .find(|&&off| off.checked_add(size).is_none_or(|end| end > len))
        {
            return Err(KernelError::Shape(format!(
                "{what} matrix at offset {off} of {size} elements overruns its {len}-element buffer"
            )));
        }
    }
    let rows = batch * m;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    if let (Some(a), Some(b)) = (as_f32(a), as_f32(b))
        && matmul_f32::available()
    {
        if batch == 1 {
            let (a, b) = (&a[a_offsets[0]..][..a_size], &b[b_offsets[0]..][..b_size]);
            vector_product(a, Matrix::Rows { b, n }, c, (m, k), pool, finish);
        } else {
            vector_batch(a, b, c, (a_offsets, b_offsets), (m, k, n), pool, finish);
        }
        return Ok(());
    }
    let col_tiles = n.div_ceil(TILE);
    let parts = parts_for(pool, rows * col_tiles, k.max(1) * n.min(TILE));
    let (rows_per_task, col_parts) = if parts <= rows {
        (rows.div_ceil(parts), 1)
    } else {
        (1, parts.div_ceil(rows).min(col_tiles))
    };
    par_row_parts(pool, c, n, rows_per_task, col_parts, |row, cols, out| {
        let (t, i) = (row / m, row % m);
        let a_row = &a[a_offsets[t] + i * k..][..k];
        let b_mat = &b[b_offsets[t]..][..b_size];
        row_part(a_row, b_mat, n, cols, out, |j, acc| {
            (finish.each)(i, j, acc)
        });
    });
    Ok(())
}

/// Whether f32 products run in vectors here, where [`PackedF32`] pays.
pub fn f32_kernel_available() -> bool {
    matmul_f32::available()
}

/// `out (m × n) = a (m × k) · b` for f32 `b` packed at load ([`PackedF32`]): the same bits
/// as [`matmul`] on `b` as it was.
pub fn matmul_packed_f32(
    a: &[f32],
    m: usize,
    b: &PackedF32,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let (k, n) = b.dims();
    check_len("A", a.len(), mul(m, k, "A")?)?;
    check_len("output", out.len(), mul(m, n, "C")?)?;
    if m > 0 && n > 0 {
        let finish = Finish::plain(&|_, _, acc| acc);
        vector_product(a, Matrix::Tiles(b), out, (m, k), pool, finish);
    }
    Ok(())
}

/// One f32 product `out = epilogue(a · b)` (`a` is `m × k`) on [`matmul_f32::block`]: tasks
/// take up to [`matmul_f32::CHUNK`] rows (sharing each block of `b` while it is in L1) and
/// split the columns, in `b`'s tiles, for the parts the rows do not fill.
fn vector_product<T: Accum>(
    a: &[f32],
    b: Matrix,
    out: &mut [T],
    (m, k): (usize, usize),
    pool: &ThreadPool,
    finish: Finish<impl Fn(usize, usize, T::Acc) -> T + Sync>,
) {
    let n = out.len() / m;
    let tile = b.tile();
    let (row_blocks, col_parts) = match parts_for(pool, m * n.div_ceil(tile), k * tile) {
        1 => (m.div_ceil(TASK_ROWS), 1),
        _ => {
            // One task per thread (a multiple of the threads when the rows need several
            // blocks), of equal rows: more, smaller tasks left a core idle at the end of the
            // region and moved columns between the cores' caches from one product to the next.
            let threads = pool.threads();
            match m.div_ceil(TASK_ROWS) {
                1 => (1, threads),
                blocks => (blocks.next_multiple_of(threads).min(m), 1),
            }
        }
    };
    let rows_per_task = m.div_ceil(row_blocks);
    let grid = Grid {
        tile,
        rows_per_task,
        col_parts,
    };
    let out = Shared::new(out);
    row_grid((m, n), grid, pool, Prelude::NONE, |rows, cols| {
        let first = rows.start;
        let a = &a[first * k..][..rows.len() * k];
        matmul_f32::block(a, rows.len(), k, b, cols, &mut |r, j, values| {
            let at = (first + r) * n + j;
            // SAFETY: (row block, column range) pairs are unique across tasks, and `block`
            // stores inside the task's rows and columns.
            let row = unsafe { out.range(at..at + values.len()) };
            finish.store(first + r, j, values, row);
        });
    });
}

/// Rows an f32 product's task takes (its kernel walks them [`matmul_f32::CHUNK`] at a time
/// over the task's columns): a sentence's rows in one task read each weight column once
/// from memory and again from L2, where tasks of one chunk each read it from memory (or from
/// the other core) again. An encoder's six layers of products (MiniLM's shapes, weights from
/// memory, 2 threads, Xeon slice): 7-10% faster at 150 and 256 rows than with tasks of 32.
const TASK_ROWS: usize = 128;

/// A batch of f32 products (`c[t] = a[a_offsets[t]..]·b[b_offsets[t]..]`, offsets checked)
/// in one parallel region: each task one product's block of up to [`matmul_f32::CHUNK`]
/// rows over all its columns. An encoder's attention multiplies one small matrix per head
/// (12 heads of 32 values over a sentence's tokens): a region per product spent more on
/// waking and joining the threads than on the product. Each output is [`matmul_f32::block`]'s,
/// so the bits do not depend on the split.
fn vector_batch<T: Accum>(
    a: &[f32],
    b: &[f32],
    c: &mut [T],
    (a_offsets, b_offsets): (&[usize], &[usize]),
    (m, k, n): (usize, usize, usize),
    pool: &ThreadPool,
    finish: Finish<impl Fn(usize, usize, T::Acc) -> T + Sync>,
) {
    let rows_per_task = m.min(matmul_f32::CHUNK);
    let row_blocks = m.div_ceil(rows_per_task);
    let tasks = a_offsets.len() * row_blocks;
    let out = Shared::new(c);
    let task = |i: usize| {
        let (t, first) = (i / row_blocks, (i % row_blocks) * rows_per_task);
        let rows = rows_per_task.min(m - first);
        // SAFETY: task `i` alone writes rows `first..first + rows` of product `t`.
        let out = unsafe { out.range((t * m + first) * n..(t * m + first + rows) * n) };
        let a = &a[a_offsets[t] + first * k..][..rows * k];
        let b = Matrix::Rows {
            b: &b[b_offsets[t]..][..k * n],
            n,
        };
        matmul_f32::block(a, rows, k, b, 0..n, &mut |r, j, values| {
            finish.store(first + r, j, values, &mut out[r * n + j..][..values.len()]);
        });
    };
    if parts_for(pool, tasks, rows_per_task * k * n) == 1 {
        (0..tasks).for_each(task);
    } else {
        pool.run(tasks, &task);
    }
}

/// One output row's columns `cols`: `out[j - cols.start] = epilogue(j, Σ_k a_row[k]·b[k, j])`.
fn row_part<T: Accum>(
    a_row: &[T],
    b: &[T],
    n: usize,
    cols: Range<usize>,
    out: &mut [T],
    epilogue: impl Fn(usize, T::Acc) -> T,
) {
    let mut tile = [<T::Acc as Scalar>::ZERO; TILE];
    let mut j0 = cols.start;
    for out_tile in out.chunks_mut(TILE) {
        let acc = &mut tile[..out_tile.len()];
        acc.fill(<T::Acc as Scalar>::ZERO);
        for (kk, &av) in a_row.iter().enumerate() {
            let av = av.widen();
            let b_row = &b[kk * n + j0..][..acc.len()];
            for (s, &bv) in acc.iter_mut().zip(b_row) {
                *s = av.mul_add(bv.widen(), *s);
            }
        }
        for (j, (o, &s)) in out_tile.iter_mut().zip(acc.iter()).enumerate() {
            *o = epilogue(j0 + j, s);
        }
        j0 += out_tile.len();
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::rng::Rng;

    /// Deterministic values in [-1, 1).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        Rng::new(seed).values(len, 1.0)
    }

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum();
            }
        }
        c
    }

    /// The f32 vector kernel (where the CPU has one) against the generic reference loop, bit
    /// for bit: rows short of and past a pass, columns short of and past a vector, threads.
    #[test]
    fn f32_products_give_the_reference_bits() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (m, k, n) in [
            (1, 64, 257),
            (3, 7, 16),
            (5, 33, 17),
            (9, 64, 100),
            (17, 1, 15),
            (2, 40, 128),
            (7, 32, 32),
            (13, 70, 48),
        ] {
            let (a, b) = (values(m * k, 3), values(k * n, 4));
            let mut want = vec![0f32; m * n];
            for (a_row, out) in a.chunks_exact(k).zip(want.chunks_exact_mut(n)) {
                row_part(a_row, &b, n, 0..n, out, |_, acc| acc);
            }
            for threads in [1, 3] {
                let pool = ThreadPool::new(threads);
                let mut got = vec![f32::NAN; m * n];
                matmul(&a, &b, &mut got, m, k, n, &pool).unwrap();
                assert_eq!(bits(&got), bits(&want), "{m}x{k}x{n}, {threads} threads");
                // Gemm's epilogue sees each element's row and column.
                let bias = values(n, 5);
                let bias = Bias {
                    data: &bias,
                    row_stride: 0,
                    col_stride: 1,
                };
                gemm(&a, &b, &mut got, (m, k, n), (0.5, 2.0), Some(bias), &pool).unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let expect = 0.5 * w + 2.0 * bias.data[i % n];
                    assert_eq!(g.to_bits(), expect.to_bits(), "gemm {m}x{k}x{n} [{i}]");
                }
            }
            // Each row alone, and `b` packed in column tiles, in a batch and alone.
            let packed = PackedF32::pack(&b, k, n).unwrap();
            for i in 0..m {
                let mut one = vec![0f32; n];
                let pool = ThreadPool::new(2);
                matmul(&a[i * k..][..k], &b, &mut one, 1, k, n, &pool).unwrap();
                assert_eq!(bits(&one), bits(&want[i * n..][..n]), "{m}x{k}x{n} row {i}");
                matmul_packed_f32(&a[i * k..][..k], 1, &packed, &mut one, &pool).unwrap();
                assert_eq!(bits(&one), bits(&want[i * n..][..n]), "packed row {i}");
            }
            for threads in [1, 3] {
                let mut got = vec![f32::NAN; m * n];
                matmul_packed_f32(&a, m, &packed, &mut got, &ThreadPool::new(threads)).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "packed {m}x{k}x{n}, {threads} threads"
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 48,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Any shape, not only the ones above: the f32 kernel (where the CPU has one), with
        /// `b` as it is and packed in column tiles, gives the reference loop's bits (rows
        /// past one chunk of 32, inputs past one block of 64, columns past whole vectors).
        #[test]
        fn any_f32_shape_gives_the_reference_bits(
            m in 1usize..80,
            k in 1usize..150,
            n in 1usize..150,
            threads in 1usize..4,
            seed in proptest::num::u64::ANY,
        ) {
            let mut rng = Rng::new(seed);
            let (a, b) = (rng.values(m * k, 1.0), rng.values(k * n, 1.0));
            let mut want = vec![0f32; m * n];
            for (a_row, out) in a.chunks_exact(k).zip(want.chunks_exact_mut(n)) {
                row_part(a_row, &b, n, 0..n, out, |_, acc| acc);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let pool = ThreadPool::new(threads);
            let mut got = vec![f32::NAN; m * n];
            matmul(&a, &b, &mut got, m, k, n, &pool).unwrap();
            proptest::prop_assert_eq!(bits(&got), bits(&want));
            let packed = PackedF32::pack(&b, k, n).unwrap();
            got.fill(f32::NAN);
            matmul_packed_f32(&a, m, &packed, &mut got, &pool).unwrap();
            proptest::prop_assert_eq!(bits(&got), bits(&want));
        }

        /// A batch of f32 products (one region, a task per product and block of rows) gives
        /// each product the reference loop's bits, with `b` shared by every product or one
        /// each, at any thread count.
        #[test]
        fn batched_f32_products_give_the_reference_bits(
            batch in 2usize..6,
            m in 1usize..70,
            k in 1usize..40,
            n in 1usize..90,
            threads in 1usize..4,
            shared_b in proptest::bool::ANY,
            seed in proptest::num::u64::ANY,
        ) {
            let mut rng = Rng::new(seed);
            let (a, b) = (rng.values(batch * m * k, 1.0), rng.values(batch * k * n, 1.0));
            let a_offsets: Vec<usize> = (0..batch).map(|t| t * m * k).collect();
            let b_offsets: Vec<usize> =
                (0..batch).map(|t| if shared_b { 0 } else { t * k * n }).collect();
            let mut want = vec![0f32; batch * m * n];
            for (t, out) in want.chunks_exact_mut(m * n).enumerate() {
                let (a, b) = (&a[a_offsets[t]..][..m * k], &b[b_offsets[t]..][..k * n]);
                for (a_row, out) in a.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
                    row_part(a_row, b, n, 0..n, out, |_, acc| acc);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut got = vec![f32::NAN; batch * m * n];
            let pool = ThreadPool::new(threads);
            matmul_batched(&a, &b, &mut got, &a_offsets, &b_offsets, (m, k, n), &pool).unwrap();
            proptest::prop_assert_eq!(bits(&got), bits(&want));
        }
    }

    fn check_close<T: Accum>(m: usize, k: usize, n: usize, tol: f64) {
        let pool = ThreadPool::new(2);
        let (a32, b32) = (values(m * k, 1), values(k * n, 2));
        let a: Vec<T> = a32.iter().map(|&v| T::from_f32(v)).collect();
        let b: Vec<T> = b32.iter().map(|&v| T::from_f32(v)).collect();
        let mut c = vec![T::ZERO; m * n];
        matmul(&a, &b, &mut c, m, k, n, &pool).unwrap();
        let want = naive(
            &a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
            &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
            m,
            k,
            n,
        );
        for (idx, (got, want)) in c.iter().zip(&want).enumerate() {
            let got = got.to_f64();
            assert!(
                (got - want).abs() <= tol * (1.0 + want.abs()),
                "{m}x{k}x{n} element {idx}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn small_product_is_exact() {
        let pool = ThreadPool::new(1);
        let a = [1i32, 2, 3, 4, 5, 6]; // 2x3
        let b = [7i32, 8, 9, 10, 11, 12]; // 3x2
        let mut c = [0i32; 4];
        matmul(&a, &b, &mut c, 2, 3, 2, &pool).unwrap();
        assert_eq!(c, [58, 64, 139, 154]);
    }

    #[test]
    fn matches_a_naive_product_for_odd_sizes_and_every_float_type() {
        for (m, k, n) in [(1, 1, 1), (3, 7, 5), (2, 65, 63), (5, 33, 130), (1, 0, 4)] {
            check_close::<f32>(m, k, n, 1e-5);
            check_close::<f64>(m, k, n, 1e-12);
            // Half inputs are exact in f32; only the final rounding differs from f64.
            check_close::<f16>(m, k, n, 2e-3);
            check_close::<bf16>(m, k, n, 1e-2);
        }
    }

    #[test]
    fn thread_count_does_not_change_a_single_bit() {
        let (p1, p3) = (ThreadPool::new(1), ThreadPool::new(3));
        // Shapes that split rows (m = 37) and, with one row, columns (m = 1).
        for (m, k, n) in [(37, 300, 200), (1, 1000, 700), (4, 513, 129)] {
            let (a, b) = (values(m * k, 3), values(k * n, 4));
            let (mut c1, mut c3) = (vec![0f32; m * n], vec![0f32; m * n]);
            matmul(&a, &b, &mut c1, m, k, n, &p1).unwrap();
            matmul(&a, &b, &mut c3, m, k, n, &p3).unwrap();
            assert!(
                c1.iter().zip(&c3).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{m}x{k}x{n}"
            );
            let (ah, bh): (Vec<bf16>, Vec<bf16>) = (
                a.iter().map(|&v| bf16::from_f32(v)).collect(),
                b.iter().map(|&v| bf16::from_f32(v)).collect(),
            );
            let (mut h1, mut h3) = (vec![bf16::ZERO; m * n], vec![bf16::ZERO; m * n]);
            matmul(&ah, &bh, &mut h1, m, k, n, &p1).unwrap();
            matmul(&ah, &bh, &mut h3, m, k, n, &p3).unwrap();
            assert!(
                h1.iter().zip(&h3).all(|(x, y)| x.to_bits() == y.to_bits()),
                "bf16 {m}x{k}x{n}"
            );
        }
    }

    #[test]
    fn each_row_of_a_batch_equals_its_one_row_product() {
        let pool = ThreadPool::new(3);
        let (m, k, n) = (33, 257, 150);
        let (a, b) = (values(m * k, 5), values(k * n, 6));
        let mut full = vec![0f32; m * n];
        matmul(&a, &b, &mut full, m, k, n, &pool).unwrap();
        for i in 0..m {
            let mut row = vec![0f32; n];
            matmul(&a[i * k..(i + 1) * k], &b, &mut row, 1, k, n, &pool).unwrap();
            assert!(
                row.iter()
                    .zip(&full[i * n..(i + 1) * n])
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "row {i}"
            );
        }
    }

    #[test]
    fn batches_use_their_offsets() {
        let pool = ThreadPool::new(2);
        // Two A matrices (1x2) times one shared B (2x2).
        let a = [1f32, 2.0, 3.0, 4.0];
        let b = [1f32, 0.0, 0.0, 10.0];
        let mut c = [0f32; 4];
        matmul_batched(&a, &b, &mut c, &[0, 2], &[0, 0], (1, 2, 2), &pool).unwrap();
        assert_eq!(c, [1.0, 20.0, 3.0, 40.0]);
    }

    #[test]
    fn gemm_scales_and_broadcasts_the_bias() {
        let pool = ThreadPool::new(1);
        let a = [1f32, 2.0, 3.0, 4.0]; // 2x2
        let b = [1f32, 0.0, 0.0, 1.0]; // identity
        let bias = [10f32, 20.0]; // a row vector, broadcast down the rows
        let mut c = [0f32; 4];
        gemm(
            &a,
            &b,
            &mut c,
            (2, 2, 2),
            (2.0, 0.5),
            Some(Bias {
                data: &bias,
                row_stride: 0,
                col_stride: 1,
            }),
            &pool,
        )
        .unwrap();
        assert_eq!(c, [7.0, 14.0, 11.0, 18.0]);
        // beta = 0 ignores the bias, even a NaN one.
        let nan = [f32::NAN];
        gemm(
            &a,
            &b,
            &mut c,
            (2, 2, 2),
            (1.0, 0.0),
            Some(Bias {
                data: &nan,
                row_stride: 0,
                col_stride: 0,
            }),
            &pool,
        )
        .unwrap();
        assert_eq!(c, a);
    }

    #[test]
    fn bad_lengths_are_errors_not_panics() {
        let pool = ThreadPool::new(1);
        let mut c = [0f32; 4];
        assert!(matmul(&[1f32; 3], &[1f32; 4], &mut c, 2, 2, 2, &pool).is_err());
        assert!(matmul(&[1f32; 4], &[1f32; 4], &mut c[..3], 2, 2, 2, &pool).is_err());
        assert!(
            matmul_batched(
                &[1f32; 4],
                &[1f32; 4],
                &mut c,
                &[0, 3],
                &[0, 0],
                (1, 2, 2),
                &pool
            )
            .is_err()
        );
        let short = Bias {
            data: &[1f32; 3],
            row_stride: 2,
            col_stride: 1,
        };
        assert!(
            gemm(
                &[1f32; 4],
                &[1f32; 4],
                &mut c,
                (2, 2, 2),
                (1.0, 1.0),
                Some(short),
                &pool
            )
            .is_err()
        );
    }
}

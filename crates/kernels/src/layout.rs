//! Data-movement kernels: strided copies (the engine behind Slice, Expand and Tile), Concat,
//! Split, Trilu and Range, all over plain row-major slices.
//!
//! Contract: callers pass dimensions they have validated against the ONNX spec; the kernels
//! still check every length and every offset they touch and return a [`KernelError`] instead
//! of panicking, so a wrong caller cannot read or write out of bounds.
//!
//! References: ONNX operator docs for Slice, Expand, Tile, Concat, Split, Trilu and Range
//! (`docs/Operators.md`); NumPy's strided array model.

use crate::Scalar;
use crate::error::{KernelError, check_len, numel};

/// Row-major element strides of `dims`.
pub fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// Copies the strided view `src[offset + Σ index[d] * strides[d]]` over `out_dims` into `out`
/// in row-major order. Strides may be negative (reversed slices) or zero (broadcast).
///
/// Fails, touching nothing, when `out` does not hold `Π out_dims` elements or when some
/// element of the view falls outside `src`.
pub fn strided_copy<T: Copy>(
    src: &[T],
    offset: usize,
    strides: &[isize],
    out_dims: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    if strides.len() != out_dims.len() {
        return Err(KernelError::Shape(format!(
            "{} strides for {} output dimensions",
            strides.len(),
            out_dims.len()
        )));
    }
    let n = numel(out_dims)?;
    check_len("output", out.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    // The view's lowest and highest offsets bound every access.
    let (mut lo, mut hi) = (offset as i128, offset as i128);
    for (&d, &s) in out_dims.iter().zip(strides) {
        let reach = (d as i128 - 1) * s as i128;
        if reach < 0 { lo += reach } else { hi += reach }
    }
    if lo < 0 || hi >= src.len() as i128 {
        return Err(KernelError::Shape(format!(
            "strided view (offset {offset}, strides {strides:?}, dims {out_dims:?}) reaches outside a source of {} elements",
            src.len()
        )));
    }
    let rank = out_dims.len();
    if rank == 0 {
        out[0] = src[offset];
        return Ok(());
    }
    let inner = out_dims[rank - 1];
    let inner_stride = strides[rank - 1];
    let mut index = vec![0usize; rank - 1];
    // In bounds by the lo/hi check above, so the arithmetic stays within 0..src.len().
    let mut base = offset as isize;
    for row in out.chunks_exact_mut(inner) {
        if inner_stride == 1 {
            let start = base as usize;
            row.copy_from_slice(&src[start..start + inner]);
        } else if inner_stride == 0 {
            row.fill(src[base as usize]);
        } else {
            let mut at = base;
            for o in row.iter_mut() {
                *o = src[at as usize];
                at += inner_stride;
            }
        }
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            base += strides[d];
            if index[d] < out_dims[d] {
                break;
            }
            base -= strides[d] * out_dims[d] as isize;
            index[d] = 0;
        }
    }
    Ok(())
}

/// Slices `src` (shape `dims`): along each axis `d`, element `i` of the output is element
/// `starts[d] + i * steps[d]` of the input. `starts` are already clamped into range.
pub fn slice<T: Copy>(
    src: &[T],
    dims: &[usize],
    starts: &[usize],
    steps: &[isize],
    out_dims: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    check_len("input", src.len(), numel(dims)?)?;
    if starts.len() != dims.len() || steps.len() != dims.len() || out_dims.len() != dims.len() {
        return Err(KernelError::Shape(format!(
            "slice of rank {} got {} starts, {} steps, {} output dims",
            dims.len(),
            starts.len(),
            steps.len(),
            out_dims.len()
        )));
    }
    let base = contiguous_strides(dims);
    let mut offset = 0usize;
    let mut strides = Vec::with_capacity(dims.len());
    for d in 0..dims.len() {
        if out_dims[d] > 0 {
            offset += starts[d] * base[d];
        }
        let stride = isize::try_from(base[d])
            .ok()
            .and_then(|b| steps[d].checked_mul(b));
        strides.push(stride.ok_or_else(|| {
            KernelError::Shape(format!("slice step {} overflows on axis {d}", steps[d]))
        })?);
    }
    strided_copy(src, offset, &strides, out_dims, out)
}

/// Broadcasts `src` (shape `src_dims`) to `out_dims` (NumPy rules; `out_dims` must already be
/// the broadcast shape).
pub fn expand<T: Copy>(
    src: &[T],
    src_dims: &[usize],
    out_dims: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    check_len("input", src.len(), numel(src_dims)?)?;
    if src_dims.len() > out_dims.len() {
        return Err(KernelError::Shape(format!(
            "cannot expand rank {} to rank {}",
            src_dims.len(),
            out_dims.len()
        )));
    }
    let pad = out_dims.len() - src_dims.len();
    for (i, &d) in src_dims.iter().enumerate() {
        if d != 1 && d != out_dims[pad + i] {
            return Err(KernelError::Shape(format!(
                "shape {src_dims:?} does not broadcast to {out_dims:?}"
            )));
        }
    }
    let strides: Vec<isize> = crate::broadcast::broadcast_strides(src_dims, out_dims)
        .iter()
        .map(|&s| s as isize)
        .collect();
    strided_copy(src, 0, &strides, out_dims, out)
}

/// Tiles `src` (shape `dims`) `repeats[d]` times along each axis; `out` has shape
/// `dims[d] * repeats[d]`.
pub fn tile<T: Copy>(
    src: &[T],
    dims: &[usize],
    repeats: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    check_len("input", src.len(), numel(dims)?)?;
    if repeats.len() != dims.len() {
        return Err(KernelError::Shape(format!(
            "{} repeats for rank {}",
            repeats.len(),
            dims.len()
        )));
    }
    // Output index (r_0, i_0, r_1, i_1, ...) reads input (i_0, i_1, ...): a doubled-rank view
    // with stride 0 along each repeat axis.
    let base = contiguous_strides(dims);
    let mut view_dims = Vec::with_capacity(2 * dims.len());
    let mut strides = Vec::with_capacity(2 * dims.len());
    for d in 0..dims.len() {
        view_dims.extend([repeats[d], dims[d]]);
        strides.extend([0, base[d] as isize]);
    }
    strided_copy(src, 0, &strides, &view_dims, out)
}

/// Concatenates `parts` along one axis. Every part is viewed as `[outer, part_inner]` where
/// `part_inner` is its size along the axis times the product of the trailing dimensions;
/// `out` is `[outer, Σ part_inner]`.
pub fn concat<T: Copy>(
    parts: &[&[T]],
    outer: usize,
    part_inner: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    if parts.len() != part_inner.len() {
        return Err(KernelError::Shape(format!(
            "{} parts but {} inner sizes",
            parts.len(),
            part_inner.len()
        )));
    }
    for (p, &inner) in parts.iter().zip(part_inner) {
        check_len(
            "concat input",
            p.len(),
            outer
                .checked_mul(inner)
                .ok_or_else(|| KernelError::Shape("concat size overflows".into()))?,
        )?;
    }
    let row: usize = part_inner.iter().sum();
    check_len("output", out.len(), outer * row)?;
    if row == 0 {
        return Ok(());
    }
    for (o, out_row) in out.chunks_exact_mut(row).enumerate() {
        let mut at = 0;
        for (p, &inner) in parts.iter().zip(part_inner) {
            out_row[at..at + inner].copy_from_slice(&p[o * inner..(o + 1) * inner]);
            at += inner;
        }
    }
    Ok(())
}

/// The inverse of [`concat`]: splits `src` (`[outer, Σ part_inner]`) into `outs`, each
/// `[outer, part_inner[k]]`.
pub fn split<T: Copy>(
    src: &[T],
    outer: usize,
    part_inner: &[usize],
    outs: &mut [&mut [T]],
) -> Result<(), KernelError> {
    if outs.len() != part_inner.len() {
        return Err(KernelError::Shape(format!(
            "{} outputs but {} inner sizes",
            outs.len(),
            part_inner.len()
        )));
    }
    let row: usize = part_inner.iter().sum();
    check_len(
        "input",
        src.len(),
        outer
            .checked_mul(row)
            .ok_or_else(|| KernelError::Shape("split size overflows".into()))?,
    )?;
    for (p, &inner) in outs.iter().zip(part_inner) {
        check_len("split output", p.len(), outer * inner)?;
    }
    if row == 0 {
        return Ok(());
    }
    for (o, src_row) in src.chunks_exact(row).enumerate() {
        let mut at = 0;
        for (p, &inner) in outs.iter_mut().zip(part_inner) {
            p[o * inner..(o + 1) * inner].copy_from_slice(&src_row[at..at + inner]);
            at += inner;
        }
    }
    Ok(())
}

/// Trilu over a batch of `rows x cols` matrices: keeps element `(i, j)` when `j - i >= k`
/// (`upper`) or `j - i <= k` (lower) and writes `zero` elsewhere.
pub fn trilu<T: Copy>(
    src: &[T],
    rows: usize,
    cols: usize,
    k: i64,
    upper: bool,
    zero: T,
    out: &mut [T],
) -> Result<(), KernelError> {
    check_len("output", out.len(), src.len())?;
    let mat = rows
        .checked_mul(cols)
        .ok_or_else(|| KernelError::Shape("trilu matrix size overflows".into()))?;
    if mat == 0 {
        return Ok(());
    }
    if !src.len().is_multiple_of(mat) {
        return Err(KernelError::Shape(format!(
            "{} elements are not a whole number of {rows}x{cols} matrices",
            src.len()
        )));
    }
    let k = k as i128;
    for (s, o) in src.chunks_exact(mat).zip(out.chunks_exact_mut(mat)) {
        for i in 0..rows {
            for j in 0..cols {
                let diag = j as i128 - i as i128;
                let keep = if upper { diag >= k } else { diag <= k };
                o[i * cols + j] = if keep { s[i * cols + j] } else { zero };
            }
        }
    }
    Ok(())
}

/// Range: `out[i] = start + i * delta`, as the ONNX spec and `numpy.arange` define it. Floats
/// compute each element from `start` (no accumulated rounding); integers accumulate with
/// wrapping adds, which equals `start + i * delta` modulo 2^bits for any length.
pub fn range<T: Scalar>(start: T, delta: T, out: &mut [T]) {
    if T::IS_FLOAT {
        for (i, o) in out.iter_mut().enumerate() {
            *o = start.add(T::from_f64(i as f64).mul(delta));
        }
    } else {
        let mut v = start;
        for o in out.iter_mut() {
            *o = v;
            v = v.add(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_copy_handles_negative_and_zero_strides() {
        let src: Vec<i32> = (0..6).collect(); // [2, 3]
        let mut out = [0; 6];
        // Reverse both axes: offset of (1, 2) = 5, strides -3, -1.
        strided_copy(&src, 5, &[-3, -1], &[2, 3], &mut out).unwrap();
        assert_eq!(out, [5, 4, 3, 2, 1, 0]);
        strided_copy(&src, 3, &[0, 1], &[2, 3], &mut out).unwrap();
        assert_eq!(out, [3, 4, 5, 3, 4, 5]);
        let mut one = [0];
        strided_copy(&src, 4, &[], &[], &mut one).unwrap();
        assert_eq!(one, [4]);
    }

    #[test]
    fn strided_copy_rejects_views_outside_the_source() {
        let src = [1, 2, 3];
        let mut out = [0; 2];
        assert!(strided_copy(&src, 2, &[1], &[2], &mut out).is_err());
        assert!(strided_copy(&src, 0, &[-1], &[2], &mut out).is_err());
        assert!(
            strided_copy(&src, 0, &[1], &[3], &mut out).is_err(),
            "wrong output length"
        );
        let mut empty: [i32; 0] = [];
        assert!(
            strided_copy(&src, 99, &[5], &[0], &mut empty).is_ok(),
            "an empty view touches nothing"
        );
    }

    #[test]
    fn slice_with_steps_matches_numpy() {
        let src: Vec<i32> = (0..20).collect(); // [4, 5]
        // x[3:0:-2, 1:5:2]
        let mut out = [0; 4];
        slice(&src, &[4, 5], &[3, 1], &[-2, 2], &[2, 2], &mut out).unwrap();
        assert_eq!(out, [16, 18, 6, 8]);
    }

    #[test]
    fn expand_and_tile() {
        let mut out = [0; 6];
        expand(&[1, 2, 3], &[3], &[2, 3], &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 1, 2, 3]);
        expand(&[1, 2], &[2, 1], &[2, 3], &mut out).unwrap();
        assert_eq!(out, [1, 1, 1, 2, 2, 2]);
        assert!(expand(&[1, 2], &[2], &[2, 3], &mut out).is_err());
        let mut t = [0; 8];
        tile(&[1, 2], &[1, 2], &[2, 2], &mut t).unwrap();
        assert_eq!(t, [1, 2, 1, 2, 1, 2, 1, 2]);
        tile(&[1, 2, 3, 4], &[2, 2], &[1, 2], &mut t).unwrap();
        assert_eq!(t, [1, 2, 1, 2, 3, 4, 3, 4]);
    }

    #[test]
    fn concat_then_split_round_trips() {
        // a: [2, 1], b: [2, 2] along axis 1.
        let (a, b) = ([1, 2], [10, 11, 20, 21]);
        let mut out = [0; 6];
        concat(&[&a, &b], 2, &[1, 2], &mut out).unwrap();
        assert_eq!(out, [1, 10, 11, 2, 20, 21]);
        let (mut x, mut y) = ([0; 2], [0; 4]);
        split(&out, 2, &[1, 2], &mut [&mut x, &mut y]).unwrap();
        assert_eq!((x, y), (a, b));
        assert!(concat(&[&a[..1], &b], 2, &[1, 2], &mut out).is_err());
    }

    #[test]
    fn trilu_keeps_the_requested_triangle() {
        let src: Vec<i32> = (1..=9).collect();
        let mut out = [0; 9];
        trilu(&src, 3, 3, 0, true, 0, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 0, 5, 6, 0, 0, 9]);
        trilu(&src, 3, 3, -1, false, 0, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 4, 0, 0, 7, 8, 0]);
        trilu(&src, 3, 3, i64::MIN, true, 0, &mut out).unwrap();
        assert_eq!(out.to_vec(), src);
    }

    #[test]
    fn range_steps_from_start() {
        let mut out = [0.0f32; 3];
        range(1.0, 0.5, &mut out);
        assert_eq!(out, [1.0, 1.5, 2.0]);
        let mut ints = [0i32; 3];
        range(10, -3, &mut ints);
        assert_eq!(ints, [10, 7, 4]);
    }
}

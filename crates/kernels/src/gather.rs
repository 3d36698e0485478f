//! Index-driven data movement: Gather, GatherElements and ScatterND.
//!
//! Indices come from tensor data, so every one is range-checked (negative values count from
//! the end, as ONNX allows) and a bad one is reported as [`KernelError::Index`], never used.
//!
//! References: ONNX operator docs for Gather (opset 13), GatherElements (opset 13) and
//! ScatterND (opset 18); the ONNX reference implementation in `onnx/reference/ops`.

use crate::error::{KernelError, check_len, numel};
use crate::layout::contiguous_strides;

/// Resolves a possibly negative `index` into `0..dim`.
#[inline]
pub fn resolve_index(index: i64, axis: usize, dim: usize) -> Result<usize, KernelError> {
    let d = dim as i64;
    let i = if index < 0 {
        index.wrapping_add(d)
    } else {
        index
    };
    if (0..d).contains(&i) {
        Ok(i as usize)
    } else {
        Err(KernelError::Index { index, axis, dim })
    }
}

/// Gather along `axis`: with `data` of shape `[outer.., n, inner..]` (n = `data_dims[axis]`),
/// `out[o, q, i] = data[o, indices[q], i]` where `q` walks the flattened indices. The output
/// shape is `data_dims[..axis] ++ indices_shape ++ data_dims[axis + 1..]`.
pub fn gather<T: Copy>(
    data: &[T],
    data_dims: &[usize],
    axis: usize,
    indices: &[i64],
    out: &mut [T],
) -> Result<(), KernelError> {
    let n = *data_dims.get(axis).ok_or_else(|| {
        KernelError::Shape(format!(
            "axis {axis} is out of range for rank {}",
            data_dims.len()
        ))
    })?;
    check_len("data", data.len(), numel(data_dims)?)?;
    let outer: usize = data_dims[..axis].iter().product();
    let inner: usize = data_dims[axis + 1..].iter().product();
    let out_len = numel(&[outer, indices.len(), inner])?;
    check_len("output", out.len(), out_len)?;
    // Every index is checked before anything is written (and nothing is allocated).
    for &i in indices {
        resolve_index(i, axis, n)?;
    }
    if out_len == 0 {
        return Ok(());
    }
    let mut chunks = out.chunks_exact_mut(inner);
    for o in 0..outer {
        let block = &data[o * n * inner..(o + 1) * n * inner];
        for (&i, dst) in indices.iter().zip(&mut chunks) {
            let r = resolve_index(i, axis, n)?;
            dst.copy_from_slice(&block[r * inner..(r + 1) * inner]);
        }
    }
    Ok(())
}

/// GatherElements along `axis`: `out[idx] = data[idx with idx[axis] = indices[idx]]`, where
/// `out` and `indices` have shape `index_dims` (same rank as `data_dims`, each dimension other
/// than `axis` no larger than the data's).
pub fn gather_elements<T: Copy>(
    data: &[T],
    data_dims: &[usize],
    axis: usize,
    indices: &[i64],
    index_dims: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    check_index_shape(data_dims, axis, index_dims, "GatherElements")?;
    check_len("data", data.len(), numel(data_dims)?)?;
    let n = numel(index_dims)?;
    check_len("indices", indices.len(), n)?;
    check_len("output", out.len(), n)?;
    for_each_element_offset(data_dims, axis, indices, index_dims, |q, off| {
        out[q] = data[off]
    })
}

/// ScatterND in place: `out` starts as a copy of the data (shape `data_dims`); `indices` has
/// shape `index_dims = [.., k]` and each k-tuple addresses the slice
/// `data[i_0, .., i_{k-1}, :, ..]`, which receives the matching slice of `updates` (shape
/// `index_dims[..-1] ++ data_dims[k..]`) as `combine(current, update)`. Tuples apply in order,
/// so with repeated indices and no reduction the last update wins.
pub fn scatter_nd<T: Copy>(
    out: &mut [T],
    data_dims: &[usize],
    indices: &[i64],
    index_dims: &[usize],
    updates: &[T],
    combine: impl Fn(T, T) -> T,
) -> Result<(), KernelError> {
    let (&k, batch) = index_dims
        .split_last()
        .ok_or_else(|| KernelError::Shape("ScatterND indices must have rank >= 1".into()))?;
    if k > data_dims.len() {
        return Err(KernelError::Shape(format!(
            "index tuples of length {k} are longer than the data rank {}",
            data_dims.len()
        )));
    }
    check_len("data", out.len(), numel(data_dims)?)?;
    check_len("indices", indices.len(), numel(index_dims)?)?;
    let tuples = numel(batch)?;
    let slice = numel(&data_dims[k..])?;
    check_len("updates", updates.len(), numel(&[tuples, slice])?)?;
    let strides = contiguous_strides(data_dims);
    for t in 0..tuples {
        let mut off = 0;
        for d in 0..k {
            off += resolve_index(indices[t * k + d], d, data_dims[d])? * strides[d];
        }
        let src = &updates[t * slice..(t + 1) * slice];
        for (o, &u) in out[off..off + slice].iter_mut().zip(src) {
            *o = combine(*o, u);
        }
    }
    Ok(())
}

/// Checks ranks and sizes shared by GatherElements and ScatterElements.
fn check_index_shape(
    data_dims: &[usize],
    axis: usize,
    index_dims: &[usize],
    op: &str,
) -> Result<(), KernelError> {
    if index_dims.len() != data_dims.len() {
        return Err(KernelError::Shape(format!(
            "{op}: indices have rank {} but data has rank {}",
            index_dims.len(),
            data_dims.len()
        )));
    }
    if axis >= data_dims.len() {
        return Err(KernelError::Shape(format!(
            "{op}: axis {axis} is out of range for rank {}",
            data_dims.len()
        )));
    }
    for (d, (&i, &x)) in index_dims.iter().zip(data_dims).enumerate() {
        if d != axis && i > x {
            return Err(KernelError::Shape(format!(
                "{op}: indices shape {index_dims:?} exceeds data shape {data_dims:?} at axis {d}"
            )));
        }
    }
    Ok(())
}

/// Calls `f(q, offset)` for every element `q` of `index_dims` (row-major), where `offset` is
/// the data element it addresses: `q`'s multi-index with the `axis` coordinate replaced by
/// `indices[q]`.
fn for_each_element_offset(
    data_dims: &[usize],
    axis: usize,
    indices: &[i64],
    index_dims: &[usize],
    mut f: impl FnMut(usize, usize),
) -> Result<(), KernelError> {
    if indices.is_empty() {
        return Ok(());
    }
    let strides = contiguous_strides(data_dims);
    let rank = index_dims.len();
    let mut pos = vec![0usize; rank];
    // Offset of `pos` in the data, without the axis coordinate.
    let mut base = 0usize;
    for (q, &i) in indices.iter().enumerate() {
        let r = resolve_index(i, axis, data_dims[axis])?;
        f(q, base + r * strides[axis]);
        for d in (0..rank).rev() {
            pos[d] += 1;
            if d != axis {
                base += strides[d];
            }
            if pos[d] < index_dims[d] {
                break;
            }
            if d != axis {
                base -= strides[d] * index_dims[d];
            }
            pos[d] = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_takes_rows_and_counts_negative_indices_from_the_end() {
        let data: Vec<i32> = (0..6).collect(); // [3, 2]
        let mut out = [0; 4];
        gather(&data, &[3, 2], 0, &[2, -3], &mut out).unwrap();
        assert_eq!(out, [4, 5, 0, 1]);
        let mut cols = [0; 3];
        gather(&data, &[3, 2], 1, &[-1], &mut cols).unwrap();
        assert_eq!(cols, [1, 3, 5]);
    }

    #[test]
    fn gather_rejects_out_of_range_indices() {
        let mut out = [0; 2];
        let e = gather(&[1, 2, 3], &[3], 0, &[3], &mut out[..1]).unwrap_err();
        assert_eq!(
            e,
            KernelError::Index {
                index: 3,
                axis: 0,
                dim: 3
            }
        );
        assert!(gather(&[1, 2, 3], &[3], 0, &[-4], &mut out[..1]).is_err());
        assert!(gather(&[1, 2, 3], &[3], 0, &[i64::MIN], &mut out[..1]).is_err());
        assert!(
            gather(&[1, 2, 3], &[3], 1, &[0], &mut out[..1]).is_err(),
            "axis past the rank"
        );
        assert!(
            gather(&[1, 2, 3], &[3], 0, &[0], &mut out).is_err(),
            "wrong output length"
        );
    }

    #[test]
    fn gather_elements_follows_the_spec_example() {
        // data [[1, 2], [3, 4]], indices [[0, 0], [1, 0]], axis 1 -> [[1, 1], [4, 3]]
        let mut out = [0; 4];
        gather_elements(&[1, 2, 3, 4], &[2, 2], 1, &[0, 0, 1, 0], &[2, 2], &mut out).unwrap();
        assert_eq!(out, [1, 1, 4, 3]);
        // axis 0 with a smaller index shape and a negative index.
        let data: Vec<i32> = (1..=9).collect(); // [3, 3]
        let mut out = [0; 4];
        gather_elements(&data, &[3, 3], 0, &[1, 2, -3, 0], &[2, 2], &mut out).unwrap();
        assert_eq!(out, [4, 8, 1, 2]);
        assert!(gather_elements(&data, &[3, 3], 0, &[3, 0, 0, 0], &[2, 2], &mut out).is_err());
        assert!(gather_elements(&data, &[3, 3], 0, &[0; 4], &[1, 4], &mut out).is_err());
    }

    #[test]
    fn scatter_nd_replaces_and_reduces() {
        // data [8], indices [[4], [3], [1], [7]], updates [9, 10, 11, 12] (spec example 1)
        let mut out = [1, 2, 3, 4, 5, 6, 7, 8];
        scatter_nd(
            &mut out,
            &[8],
            &[4, 3, 1, 7],
            &[4, 1],
            &[9, 10, 11, 12],
            |_, u| u,
        )
        .unwrap();
        assert_eq!(out, [1, 11, 3, 10, 9, 6, 7, 12]);
        // Row slices with an add reduction and a repeated, negative index.
        let mut out = [1, 1, 2, 2];
        scatter_nd(
            &mut out,
            &[2, 2],
            &[0, -2],
            &[2, 1],
            &[10, 20, 30, 40],
            |a, b| a + b,
        )
        .unwrap();
        assert_eq!(out, [41, 61, 2, 2]);
        assert!(scatter_nd(&mut out, &[2, 2], &[2], &[1, 1], &[0, 0], |_, u| u).is_err());
        assert!(
            scatter_nd(&mut out, &[2, 2], &[0], &[1, 1], &[0], |_, u| u).is_err(),
            "updates too short"
        );
        // k = 0: every (empty) tuple addresses the whole tensor.
        let mut out = [1, 2];
        scatter_nd(&mut out, &[2], &[], &[2, 0], &[5, 6, 7, 8], |a, b| a + b).unwrap();
        assert_eq!(out, [13, 16]);
    }
}

//! Transpose: permutes the axes of a row-major tensor (ONNX `Transpose`, NumPy
//! `np.transpose`).
//!
//! Axes that stay adjacent and in order under the permutation are merged first, so
//! `[B, S, H, D] -> [B, H, S, D]` walks rows of `D` contiguous elements and a batched matrix
//! transpose becomes `[batch, M, N] -> [batch, N, M]`, which is copied in square tiles to keep
//! both the reads and the writes within a few cache lines.

use crate::error::{KernelError, check_len, numel};
use crate::layout::{contiguous_strides, strided_copy};

/// Tile edge for the blocked matrix transpose: 16 x 16 elements of up to 8 bytes fit in
/// 2 KiB, well inside L1.
const TILE: usize = 16;

/// The output shape of transposing `dims` by `perm`: `out[i] = dims[perm[i]]`.
pub fn transposed_dims(dims: &[usize], perm: &[usize]) -> Vec<usize> {
    perm.iter().map(|&p| dims[p]).collect()
}

/// Checks that `perm` is a permutation of `0..rank`.
pub fn check_perm(perm: &[usize], rank: usize) -> Result<(), KernelError> {
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return Err(KernelError::Shape(format!(
            "perm {perm:?} has {} entries for rank {rank}",
            perm.len()
        )));
    }
    for &p in perm {
        match seen.get_mut(p) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(KernelError::Shape(format!(
                    "perm {perm:?} is not a permutation of 0..{rank}"
                )));
            }
        }
    }
    Ok(())
}

/// Merges input axes that stay adjacent and in order; returns the merged input dims and the
/// permutation over them. Size-1 axes are dropped (they never move data).
fn coalesce(dims: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let kept: Vec<usize> = perm.iter().copied().filter(|&p| dims[p] != 1).collect();
    // Runs of consecutive input axes in output order become one axis.
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (first input axis, merged size)
    let mut last: Option<usize> = None;
    for &p in &kept {
        match (last, runs.last_mut()) {
            (Some(l), Some(run)) if p == l + 1 => run.1 *= dims[p],
            _ => runs.push((p, dims[p])),
        }
        last = Some(p);
    }
    // Input order of the runs gives the merged input dims; output order gives the perm.
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&r| runs[r].0);
    let in_dims = order.iter().map(|&r| runs[r].1).collect();
    let mut rank_of = vec![0; runs.len()];
    for (pos, &r) in order.iter().enumerate() {
        rank_of[r] = pos;
    }
    (in_dims, rank_of)
}

/// Writes `src` (shape `dims`) transposed by `perm` into `out` (shape
/// [`transposed_dims`]`(dims, perm)`).
pub fn transpose<T: Copy>(
    src: &[T],
    dims: &[usize],
    perm: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    check_perm(perm, dims.len())?;
    let n = numel(dims)?;
    check_len("input", src.len(), n)?;
    check_len("output", out.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let (in_dims, perm) = coalesce(dims, perm);
    let r = in_dims.len();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        out.copy_from_slice(src);
        return Ok(());
    }
    if r >= 2
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
    {
        let (m, k) = (in_dims[r - 2], in_dims[r - 1]);
        for (s, o) in src.chunks_exact(m * k).zip(out.chunks_exact_mut(m * k)) {
            transpose_2d(s, m, k, o);
        }
        return Ok(());
    }
    let base = contiguous_strides(&in_dims);
    let strides: Vec<isize> = perm.iter().map(|&p| base[p] as isize).collect();
    let out_dims = transposed_dims(&in_dims, &perm);
    strided_copy(src, 0, &strides, &out_dims, out)
}

/// `out[j * m + i] = src[i * k + j]` for an `m x k` matrix, in `TILE`-square blocks.
fn transpose_2d<T: Copy>(src: &[T], m: usize, k: usize, out: &mut [T]) {
    for i0 in (0..m).step_by(TILE) {
        for j0 in (0..k).step_by(TILE) {
            for i in i0..(i0 + TILE).min(m) {
                for j in j0..(j0 + TILE).min(k) {
                    out[j * m + i] = src[i * k + j];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Index-by-index reference: out[idx] = src[idx permuted back].
    fn reference(src: &[i32], dims: &[usize], perm: &[usize]) -> Vec<i32> {
        let out_dims = transposed_dims(dims, perm);
        let in_strides = contiguous_strides(dims);
        let n: usize = dims.iter().product();
        (0..n)
            .map(|mut flat| {
                let mut off = 0;
                for d in (0..out_dims.len()).rev() {
                    off += (flat % out_dims[d]) * in_strides[perm[d]];
                    flat /= out_dims[d];
                }
                src[off]
            })
            .collect()
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut all = Vec::new();
        for p in permutations(n - 1) {
            for at in 0..=p.len() {
                let mut q = p.clone();
                q.insert(at, n - 1);
                all.push(q);
            }
        }
        all
    }

    #[test]
    fn every_permutation_matches_the_reference() {
        for dims in [
            vec![2, 3, 4, 5],
            vec![1, 3, 1, 17],
            vec![19, 1, 33, 2],
            vec![0, 3, 2, 1],
        ] {
            let n: usize = dims.iter().product();
            let src: Vec<i32> = (0..n as i32).collect();
            for perm in permutations(dims.len()) {
                let mut out = vec![-1; n];
                transpose(&src, &dims, &perm, &mut out).unwrap();
                assert_eq!(
                    out,
                    reference(&src, &dims, &perm),
                    "dims {dims:?} perm {perm:?}"
                );
            }
        }
    }

    #[test]
    fn blocked_matrix_path_handles_sizes_around_the_tile() {
        for (m, k) in [(1, 1), (15, 17), (16, 16), (33, 5)] {
            let src: Vec<i32> = (0..(m * k) as i32).collect();
            let mut out = vec![-1; m * k];
            transpose(&src, &[m, k], &[1, 0], &mut out).unwrap();
            assert_eq!(out, reference(&src, &[m, k], &[1, 0]));
        }
    }

    #[test]
    fn bad_permutations_are_rejected() {
        let mut out = [0; 6];
        assert!(transpose(&[0; 6], &[2, 3], &[0, 0], &mut out).is_err());
        assert!(transpose(&[0; 6], &[2, 3], &[0, 2], &mut out).is_err());
        assert!(transpose(&[0; 6], &[2, 3], &[0], &mut out).is_err());
        assert!(transpose(&[0; 5], &[2, 3], &[1, 0], &mut out).is_err());
    }
}

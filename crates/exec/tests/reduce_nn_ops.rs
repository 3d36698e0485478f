//! Reductions, softmax, MatMul, Gemm and the norms through a real session: paths the ONNX node
//! tests do not reach (non-adjacent reduced axes, batch broadcasting, half types, several
//! threads) and bad inputs that must come back as errors naming the node, never panics.

use half::f16;
use oxgen_onnx::writer::attr;
use oxgen_tensor::{DType, Tensor};

mod common;
use common::*;

/// `0, 1, 2, ..` scaled by `step`, as f32.
fn ramp(dims: &[usize], step: f32) -> Option<Tensor> {
    let n: usize = dims.iter().product();
    t(dims, &(0..n).map(|i| i as f32 * step).collect::<Vec<_>>())
}

#[test]
fn reduce_over_non_adjacent_axes_permutes_first() {
    // x[i, j, k] = 12i + 4j + k over (2, 3, 4); sum over axes 0 and 2 keeps j.
    let y = run(
        "ReduceSum",
        13,
        &[ramp(&[2, 3, 4], 1.0), t(&[2], &[0i64, -1])],
        vec![attr::int("keepdims", 0)],
        1,
    )
    .unwrap();
    let want: Vec<f32> = (0..3)
        .map(|j| {
            (0..2)
                .flat_map(|i| (0..4).map(move |k| (12 * i + 4 * j + k) as f32))
                .sum()
        })
        .collect();
    assert_eq!((y[0].dims(), vals::<f32>(&y[0])), (&[3usize][..], want));
    // The attribute form (ReduceMax before opset 18), keeping dims.
    let y = run(
        "ReduceMax",
        13,
        &[ramp(&[2, 3, 4], 1.0)],
        vec![attr::ints("axes", &[0, 2])],
        1,
    )
    .unwrap();
    assert_eq!(
        (y[0].dims(), vals::<f32>(&y[0])),
        (&[1usize, 3, 1][..], vec![15.0, 19.0, 23.0])
    );
}

#[test]
fn reduce_on_integers_bools_and_halves() {
    let y = run(
        "ReduceProd",
        18,
        &[t(&[2, 2], &[3i64, -2, 5, 7]), t(&[1], &[1i64])],
        vec![],
        1,
    )
    .unwrap();
    assert_eq!(vals::<i64>(&y[0]), [-6, 35]);
    let b = Some(Tensor::from_bools([2, 2], &[true, false, false, false]).unwrap());
    let y = run(
        "ReduceMin",
        20,
        &[b.clone(), t(&[1], &[1i64])],
        vec![attr::int("keepdims", 0)],
        1,
    )
    .unwrap();
    assert_eq!(vals::<u8>(&y[0]), [0, 0]);
    let y = run(
        "ReduceMax",
        20,
        &[b, t(&[1], &[1i64])],
        vec![attr::int("keepdims", 0)],
        1,
    )
    .unwrap();
    assert_eq!(vals::<u8>(&y[0]), [1, 0]);
    let e = Some(Tensor::from_bools([2, 0], &[]).unwrap());
    let y = run(
        "ReduceMin",
        20,
        &[e, t(&[1], &[1i64])],
        vec![attr::int("keepdims", 0)],
        1,
    )
    .unwrap();
    assert_eq!(vals::<u8>(&y[0]), [1, 1], "the minimum of no bools is true");
    let h: Vec<f16> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let y = run("ReduceMean", 18, &[t(&[4], &h)], vec![], 1).unwrap();
    assert_eq!(vals::<f16>(&y[0]), [f16::from_f32(2.5)]);
}

#[test]
fn bad_reduce_axes_are_errors() {
    assert!(
        err(run(
            "ReduceSum",
            13,
            &[ramp(&[2, 3], 1.0), t(&[1], &[2i64])],
            vec![],
            1
        ))
        .contains("out of range")
    );
    assert!(
        err(run(
            "ReduceSum",
            13,
            &[ramp(&[2, 3], 1.0), t(&[2], &[1i64, -1])],
            vec![],
            1
        ))
        .contains("twice")
    );
    assert!(
        err(run(
            "ArgMax",
            13,
            &[ramp(&[2, 0], 1.0)],
            vec![attr::int("axis", 1)],
            1
        ))
        .contains("size 0")
    );
}

#[test]
fn top_k_checks_k_and_handles_inner_axes() {
    // (2, 3, 2): TopK over the middle axis with k = 2.
    let x = t(
        &[2, 3, 2],
        &[1f32, 6.0, 3.0, 5.0, 2.0, 4.0, 0.0, 0.0, 9.0, 0.0, 9.0, 1.0],
    );
    let y = run(
        "TopK",
        11,
        &[x.clone(), t(&[1], &[2i64])],
        vec![attr::int("axis", 1)],
        2,
    )
    .unwrap();
    assert_eq!(vals::<f32>(&y[0]), [3.0, 6.0, 2.0, 5.0, 9.0, 1.0, 9.0, 0.0]);
    assert_eq!(vals::<i64>(&y[1]), [1, 0, 2, 1, 1, 2, 2, 0]);
    let y = run(
        "TopK",
        1,
        std::slice::from_ref(&x),
        vec![attr::int("axis", 1), attr::int("k", 1)],
        2,
    )
    .unwrap();
    assert_eq!(y[0].dims(), &[2, 1, 2]);
    assert!(
        err(run(
            "TopK",
            11,
            &[x.clone(), t(&[1], &[4i64])],
            vec![attr::int("axis", 1)],
            2
        ))
        .contains("K = 4")
    );
    assert!(err(run("TopK", 11, &[x.clone(), t(&[1], &[-1i64])], vec![], 2)).contains("K = -1"));
    assert!(err(run("TopK", 11, &[x, t(&[2], &[1i64, 1])], vec![], 2)).contains("exactly one"));
}

#[test]
fn cumsum_takes_an_int32_axis() {
    let y = run(
        "CumSum",
        14,
        &[t(&[2, 2], &[1i32, 2, 3, 4]), t(&[], &[0i32])],
        vec![attr::int("reverse", 1)],
        1,
    )
    .unwrap();
    assert_eq!(vals::<i32>(&y[0]), [4, 6, 3, 4]);
}

#[test]
fn softmax_flattens_before_opset_13() {
    let x = ramp(&[2, 2, 2], 0.5);
    let old = run(
        "Softmax",
        11,
        std::slice::from_ref(&x),
        vec![attr::int("axis", 1)],
        1,
    )
    .unwrap();
    let new = run("Softmax", 13, &[x], vec![attr::int("axis", 1)], 1).unwrap();
    let (old, new) = (vals::<f32>(&old[0]), vals::<f32>(&new[0]));
    // Opset 11 normalizes each row of 4; opset 13 each pair along axis 1.
    assert!((old[..4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!((new[0] + new[2] - 1.0).abs() < 1e-6 && (new[1] + new[3] - 1.0).abs() < 1e-6);
    assert!((old[0] - new[0]).abs() > 0.05);
}

#[test]
fn matmul_broadcasts_batches_and_promotes_vectors() {
    // A (2, 1, 2, 3) x B (3, 3, 2) -> (2, 3, 2, 2).
    let (a, b) = (ramp(&[2, 1, 2, 3], 1.0), ramp(&[3, 3, 2], 0.5));
    let y = run("MatMul", 13, &[a.clone(), b.clone()], vec![], 1).unwrap();
    assert_eq!(y[0].dims(), &[2, 3, 2, 2]);
    let (av, bv, yv) = (
        vals::<f32>(a.as_ref().unwrap()),
        vals::<f32>(b.as_ref().unwrap()),
        vals::<f32>(&y[0]),
    );
    for (p, q, i, j) in [(1usize, 2usize, 1usize, 0usize), (0, 1, 0, 1)] {
        let want: f32 = (0..3)
            .map(|k| av[p * 6 + i * 3 + k] * bv[q * 6 + k * 2 + j])
            .sum();
        assert_eq!(yv[((p * 3 + q) * 2 + i) * 2 + j], want);
    }
    let y = run(
        "MatMul",
        13,
        &[
            t(&[3], &[1i32, 2, 3]),
            t(&[2, 3, 1], &[1i32, 1, 1, 0, 1, 0]),
        ],
        vec![],
        1,
    )
    .unwrap();
    assert_eq!(
        (y[0].dims(), vals::<i32>(&y[0])),
        (&[2usize, 1][..], vec![6, 2])
    );
    let e = err(run(
        "MatMul",
        13,
        &[ramp(&[2, 3], 1.0), ramp(&[2, 3], 1.0)],
        vec![],
        1,
    ));
    assert!(e.contains("inner dimensions"), "{e}");
    err(run(
        "MatMul",
        13,
        &[ramp(&[2, 2, 3], 1.0), ramp(&[3, 3, 1], 1.0)],
        vec![],
        1,
    ));
    err(run(
        "MatMul",
        13,
        &[ramp(&[2, 3], 1.0), t(&[3, 1], &[1i32, 2, 3])],
        vec![],
        1,
    ));
}

#[test]
fn matmul_is_bit_identical_across_thread_counts() {
    let (a, b) = (ramp(&[3, 40, 96], 0.013), ramp(&[96, 300], 0.007));
    let one = run_on(1, "MatMul", 13, &[a.clone(), b.clone()], vec![], 1).unwrap();
    let three = run_on(3, "MatMul", 13, &[a, b], vec![], 1).unwrap();
    assert_eq!(one[0].as_bytes(), three[0].as_bytes());
}

#[test]
fn gemm_transposes_and_broadcasts_c() {
    // A^T with A (3, 2), B^T with B (2, 3): op(A) (2, 3) x op(B) (3, 2).
    let a = t(&[3, 2], &[1f32, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let b = t(&[2, 3], &[1f32, 0.0, 0.0, 0.0, 1.0, 0.0]);
    let c = t(&[2, 1], &[10f32, 20.0]);
    let attrs = || {
        vec![
            attr::int("transA", 1),
            attr::int("transB", 1),
            attr::float("alpha", 2.0),
        ]
    };
    let y = run("Gemm", 13, &[a.clone(), b.clone(), c], attrs(), 1).unwrap();
    assert_eq!(vals::<f32>(&y[0]), [12.0, 14.0, 28.0, 30.0]);
    assert!(
        err(run(
            "Gemm",
            13,
            &[a.clone(), b.clone(), t(&[3], &[1f32, 2.0, 3.0])],
            attrs(),
            1
        ))
        .contains("cannot broadcast")
    );
    assert!(
        err(run("Gemm", 13, &[a, b], vec![attr::int("transB", 1)], 1)).contains("inner dimensions")
    );
}

#[test]
fn layer_norm_broadcasts_scale_and_reports_f32_stats_for_halves() {
    let x: Vec<f16> = (0..12).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
    let scale = t(&[3, 1], &[f16::ONE, f16::from_f32(2.0), f16::ONE]);
    let y = run(
        "LayerNormalization",
        17,
        &[t(&[2, 3, 2], &x), scale],
        vec![attr::int("axis", 1)],
        3,
    )
    .unwrap();
    assert_eq!(
        (y[1].dtype(), y[1].dims()),
        (DType::F32, &[2usize, 1, 1][..])
    );
    assert_eq!(vals::<f32>(&y[1]), [0.625, 2.125]);
    // Row 0 is 0, .25, .., 1.25: element 2 (0.5) sits below the mean and is scaled by 2.
    let inv = vals::<f32>(&y[2])[0];
    assert_eq!(
        vals::<f16>(&y[0])[2],
        f16::from_f32((0.5 - 0.625) * inv * 2.0)
    );
    let e = err(run(
        "LayerNormalization",
        17,
        &[t(&[2, 3, 2], &x), t(&[4], &[f16::ONE; 4])],
        vec![],
        1,
    ));
    assert!(e.contains("cannot broadcast"), "{e}");
}

#[test]
fn rms_norm_normalizes_trailing_axes() {
    let y = run(
        "RMSNormalization",
        23,
        &[t(&[2, 2], &[3f32, 4.0, -6.0, 8.0]), t(&[2], &[1f32, 10.0])],
        vec![attr::float("epsilon", 0.0)],
        1,
    )
    .unwrap();
    let (r0, r1) = ((12.5f32).sqrt(), (50f32).sqrt());
    let want = [3.0 / r0, 40.0 / r0, -6.0 / r1, 80.0 / r1];
    assert!(
        vals::<f32>(&y[0])
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-6 * w.abs()),
        "{:?}",
        vals::<f32>(&y[0])
    );
}

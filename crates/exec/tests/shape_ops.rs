//! Shape and data-movement ops through a real session: the older opsets the ONNX node tests no
//! longer cover (attributes instead of inputs), spec edge cases, non-float dtypes, and bad
//! inputs that must come back as errors naming the node rather than panics.

use oxgen_onnx::writer::attr;
use oxgen_tensor::Tensor;

mod common;
use common::*;

fn ints(v: &[i64]) -> Option<Tensor> {
    t(&[v.len()], v)
}

fn iota(dims: &[usize]) -> Option<Tensor> {
    let n: usize = dims.iter().product();
    t(dims, &(0..n as i32).collect::<Vec<_>>())
}

#[test]
fn attribute_opsets_of_squeeze_unsqueeze_split_and_slice() {
    let y = run(
        "Squeeze",
        11,
        &[iota(&[1, 3, 1])],
        vec![attr::ints("axes", &[-1])],
        1,
    )
    .unwrap();
    assert_eq!(y[0].dims(), &[1, 3]);
    let y = run(
        "Unsqueeze",
        11,
        &[iota(&[3])],
        vec![attr::ints("axes", &[0, -1])],
        1,
    )
    .unwrap();
    assert_eq!(y[0].dims(), &[1, 3, 1]);
    let y = run(
        "Split",
        11,
        &[iota(&[5])],
        vec![attr::ints("split", &[2, 3])],
        2,
    )
    .unwrap();
    assert_eq!(
        (vals::<i32>(&y[0]), vals::<i32>(&y[1])),
        (vec![0, 1], vec![2, 3, 4])
    );
    let y = run(
        "Slice",
        9,
        &[iota(&[3, 4])],
        vec![
            attr::ints("starts", &[1, -3]),
            attr::ints("ends", &[1000, -1]),
            attr::ints("axes", &[0, 1]),
        ],
        1,
    )
    .unwrap();
    assert_eq!(
        (y[0].dims(), vals::<i32>(&y[0])),
        (&[2usize, 2][..], vec![5, 6, 9, 10])
    );
}

#[test]
fn split_num_outputs_gives_a_smaller_last_chunk() {
    let y = run(
        "Split",
        18,
        &[iota(&[7])],
        vec![attr::int("num_outputs", 3)],
        3,
    )
    .unwrap();
    let sizes: Vec<usize> = y.iter().map(|t| t.dims()[0]).collect();
    assert_eq!(sizes, [3, 3, 1]);
    assert!(
        err(run(
            "Split",
            18,
            &[iota(&[5])],
            vec![attr::int("num_outputs", 4)],
            4
        ))
        .contains("negative")
    );
    assert!(err(run("Split", 13, &[iota(&[5]), ints(&[2, 2])], vec![], 2)).contains("add up"));
}

#[test]
fn slice_handles_negative_steps_sentinels_and_axes_inputs() {
    // x[::-1, 3:0:-2] on [2, 5] via the INT64 min/max sentinels and negative axes.
    let y = run(
        "Slice",
        13,
        &[
            iota(&[2, 5]),
            ints(&[i64::MAX, 3]),
            ints(&[i64::MIN, 0]),
            ints(&[-2, -1]),
            ints(&[-1, -2]),
        ],
        vec![],
        1,
    )
    .unwrap();
    assert_eq!(
        (y[0].dims(), vals::<i32>(&y[0])),
        (&[2usize, 2][..], vec![8, 6, 3, 1])
    );
    // Empty result when start is past end.
    let y = run(
        "Slice",
        13,
        &[iota(&[4]), ints(&[3]), ints(&[1])],
        vec![],
        1,
    )
    .unwrap();
    assert_eq!(y[0].dims(), &[0]);
    assert!(
        err(run(
            "Slice",
            13,
            &[iota(&[4]), ints(&[0]), ints(&[2]), ints(&[0]), ints(&[0])],
            vec![],
            1
        ))
        .contains("step")
    );
    assert!(
        err(run(
            "Slice",
            13,
            &[iota(&[4]), ints(&[0]), ints(&[2]), ints(&[1])],
            vec![],
            1
        ))
        .contains("out of range")
    );
}

#[test]
fn reshape_zero_minus_one_and_allowzero() {
    let y = run(
        "Reshape",
        14,
        &[iota(&[2, 3, 4]), ints(&[0, -1])],
        vec![],
        1,
    )
    .unwrap();
    assert_eq!(y[0].dims(), &[2, 12]);
    let y = run(
        "Reshape",
        14,
        &[iota(&[0, 3]), ints(&[3, 0])],
        vec![attr::int("allowzero", 1)],
        1,
    )
    .unwrap();
    assert_eq!(y[0].dims(), &[3, 0]);
    assert!(
        err(run(
            "Reshape",
            14,
            &[iota(&[2, 3]), ints(&[-1, -1])],
            vec![],
            1
        ))
        .contains("more than one -1")
    );
    assert!(
        err(run(
            "Reshape",
            14,
            &[iota(&[2, 3]), ints(&[4, -1])],
            vec![],
            1
        ))
        .contains("cannot be inferred")
    );
    assert!(
        err(run(
            "Reshape",
            14,
            &[iota(&[2, 3]), ints(&[-2, 3])],
            vec![],
            1
        ))
        .contains("only -1")
    );
}

#[test]
fn data_movement_keeps_every_dtype() {
    let b = Some(Tensor::from_bools([2, 3], &[true, false, false, true, true, false]).unwrap());
    let y = run("Transpose", 13, &[b], vec![], 1).unwrap();
    assert_eq!(
        (y[0].dtype(), vals::<u8>(&y[0])),
        (oxgen_tensor::DType::Bool, vec![1, 1, 0, 1, 0, 0])
    );
    let h: Vec<half::f16> = [1.0f32, 2.0, 3.0]
        .iter()
        .map(|&v| half::f16::from_f32(v))
        .collect();
    let y = run("Gather", 13, &[t(&[3], &h), ints(&[-1, 0])], vec![], 1).unwrap();
    assert_eq!(vals::<half::f16>(&y[0]), vec![h[2], h[0]]);
    let y = run("Tile", 13, &[t(&[2], &[1i8, -2]), ints(&[3])], vec![], 1).unwrap();
    assert_eq!(vals::<i8>(&y[0]), vec![1, -2, 1, -2, 1, -2]);
}

#[test]
fn constant_of_shape_range_and_expand() {
    let value = Tensor::from_slice([1], &[7i64]).unwrap();
    let y = run(
        "ConstantOfShape",
        20,
        &[ints(&[2, 2])],
        vec![attr::tensor("value", &value)],
        1,
    )
    .unwrap();
    assert_eq!(vals::<i64>(&y[0]), vec![7; 4]);
    let s = |v: i64| Some(Tensor::scalar(v));
    let y = run("Range", 11, &[s(10), s(-2), s(-4)], vec![], 1).unwrap();
    assert_eq!(vals::<i64>(&y[0]), vec![10, 6, 2]);
    assert!(err(run("Range", 11, &[s(0), s(5), s(0)], vec![], 1)).contains("delta is 0"));
    // Bidirectional: [3, 1] with shape [2, 1, 6] -> [2, 3, 6].
    let y = run("Expand", 13, &[iota(&[3, 1]), ints(&[2, 1, 6])], vec![], 1).unwrap();
    assert_eq!(y[0].dims(), &[2, 3, 6]);
    assert!(err(run("Expand", 13, &[iota(&[3]), ints(&[-1])], vec![], 1)).contains(">= 0"));
    assert!(
        err(run("Expand", 13, &[iota(&[3]), ints(&[2])], vec![], 1)).contains("cannot broadcast")
    );
}

#[test]
fn bad_indices_axes_and_shapes_are_errors() {
    assert!(
        err(run("Gather", 13, &[iota(&[3]), ints(&[3])], vec![], 1))
            .contains("index 3 is out of range")
    );
    assert!(
        err(run(
            "Gather",
            13,
            &[iota(&[3]), ints(&[0])],
            vec![attr::int("axis", 1)],
            1
        ))
        .contains("axis 1")
    );
    assert!(
        err(run(
            "GatherElements",
            13,
            &[iota(&[2, 2]), t(&[2, 2], &[0i64, 0, -3, 0])],
            vec![],
            1
        ))
        .contains("out of range")
    );
    assert!(
        err(run(
            "ScatterND",
            18,
            &[iota(&[4]), t(&[1, 1], &[4i64]), t(&[1], &[9i32])],
            vec![],
            1
        ))
        .contains("out of range")
    );
    assert!(
        err(run(
            "ScatterND",
            18,
            &[iota(&[4]), t(&[1, 1], &[0i64]), t(&[2], &[9i32, 9])],
            vec![],
            1
        ))
        .contains("updates")
    );
    assert!(err(run("Squeeze", 13, &[iota(&[1, 3]), ints(&[1])], vec![], 1)).contains("not 1"));
    assert!(
        err(run(
            "Unsqueeze",
            13,
            &[iota(&[3]), ints(&[0, 0])],
            vec![],
            1
        ))
        .contains("repeats")
    );
    assert!(
        err(run(
            "Transpose",
            13,
            &[iota(&[2, 3])],
            vec![attr::ints("perm", &[0, 0])],
            1
        ))
        .contains("repeats")
    );
    assert!(
        err(run(
            "Concat",
            13,
            &[iota(&[2, 3]), iota(&[3, 2])],
            vec![attr::int("axis", 0)],
            1
        ))
        .contains("only axis 0")
    );
    assert!(err(run("Tile", 13, &[iota(&[2]), ints(&[-1])], vec![], 1)).contains(">= 0"));
    assert!(err(run("Trilu", 14, &[iota(&[3])], vec![], 1)).contains("rank >= 2"));
    assert!(
        err(run(
            "Flatten",
            13,
            &[iota(&[2, 3])],
            vec![attr::int("axis", 3)],
            1
        ))
        .contains("out of range")
    );
}

#[test]
fn trilu_k_input_and_scatter_reductions() {
    let y = run(
        "Trilu",
        14,
        &[iota(&[2, 3]), Some(Tensor::scalar(1i64))],
        vec![attr::int("upper", 0)],
        1,
    )
    .unwrap();
    assert_eq!(vals::<i32>(&y[0]), vec![0, 1, 0, 3, 4, 5]);
    let y = run(
        "ScatterND",
        18,
        &[iota(&[4]), t(&[2, 1], &[1i64, 1]), t(&[2], &[5i32, 7])],
        vec![attr::string("reduction", "mul")],
        1,
    )
    .unwrap();
    assert_eq!(vals::<i32>(&y[0]), vec![0, 35, 2, 3]);
}

#[test]
fn an_output_too_large_to_allocate_is_an_error_not_an_abort() {
    let e = err(run(
        "ConstantOfShape",
        21,
        &[ints(&[1 << 40, 1 << 20])],
        vec![],
        1,
    ));
    assert!(
        e.contains("cannot allocate") && e.contains("out of memory"),
        "{e}"
    );
}

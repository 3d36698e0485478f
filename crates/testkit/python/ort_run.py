"""Runs an ONNX model with onnxruntime (CPU) for oxgen's oracle tests.

Usage: ort_run.py MODEL DIR
Reads DIR/input_K.pb (TensorProto files, named after the model's inputs), runs the model and
writes DIR/output_K.pb in the model's output order. Exit 1 with the error on stderr on failure.
"""
import glob
import os
import sys

import onnx
import onnxruntime as ort
from onnx import numpy_helper


def main() -> None:
    model, folder = sys.argv[1], sys.argv[2]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {}
    for path in sorted(glob.glob(os.path.join(folder, "input_*.pb"))):
        tensor = onnx.load_tensor(path)
        feeds[tensor.name] = numpy_helper.to_array(tensor)
    outputs = session.run(None, feeds)
    for k, (meta, value) in enumerate(zip(session.get_outputs(), outputs)):
        onnx.save_tensor(numpy_helper.from_array(value, meta.name), os.path.join(folder, f"output_{k}.pb"))


if __name__ == "__main__":
    main()

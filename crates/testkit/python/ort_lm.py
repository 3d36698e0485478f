"""Steps a language-model package with onnxruntime (CPU) for oxgen's model-step oracle tests.

Usage: ort_lm.py MODEL DIR
Reads DIR/steps.json: {"steps": [[ids...], [ids...], ...]}: the first span is the prompt,
each later span continues the same sequence. KV is fed back as past inputs of exactly the
grown length (onnxruntime's non-shared layout). Writes DIR/logits.pb: every logits row of
every span, [rows, vocab] float32.
"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def main() -> None:
    model, folder = sys.argv[1], sys.argv[2]
    with open(os.path.join(folder, "steps.json")) as f:
        steps = json.load(f)["steps"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    past = {}
    for name, meta in inputs.items():
        if name.startswith("past_key_values."):
            _, heads, _, head_size = meta.shape
            past[name] = np.zeros((1, heads, 0, head_size), dtype=np.float32)
    length = 0
    rows = []
    for ids in steps:
        end = length + len(ids)
        feeds = {"input_ids": np.array([ids], dtype=np.int64), **past}
        if "attention_mask" in inputs:
            feeds["attention_mask"] = np.ones((1, end), dtype=np.int64)
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(length, end, dtype=np.int64)[None, :]
        names = [o.name for o in session.get_outputs()]
        out = dict(zip(names, session.run(None, feeds)))
        for name in past:
            past[name] = out[name.replace("past_key_values.", "present.")]
        rows.append(out["logits"][0].astype(np.float32))
        length = end
    logits = np.concatenate(rows, axis=0)
    onnx.save_tensor(numpy_helper.from_array(logits, "logits"), os.path.join(folder, "logits.pb"))


if __name__ == "__main__":
    main()

"""ONNX Runtime's embeddings from a decoder package's final hidden states, for oxgen's tests.

    python decoder_reference.py PACKAGE OUT IDS_JSON

Copies PACKAGE to OUT with the graph's output head's input (the final norm's output) put
out as `hidden_states`, as onnxruntime-genai's builder does with `include_hidden_states`,
and `MatMulNBits` at accuracy level 0 (f32 activations, as oxgen embeds). Then runs each
sequence of IDS_JSON (a list of lists of token ids) through ONNX Runtime alone, with an
empty past, and prints {"last": [...], "mean": [...]}: each sequence's last-token and mean
hidden states, normalized to unit length.

The head is found by name only as far as the graph's `logits` output: its producer must be
a product (`MatMul`, `MatMulNBits`), whose first input is the hidden states.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


def main():
    package, out, ids_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    config = json.loads((package / "genai_config.json").read_text())
    graph_file = config["model"]["decoder"]["filename"]
    out.mkdir(parents=True, exist_ok=True)
    for f in package.iterdir():
        if f.is_file() and not f.name.startswith(graph_file):
            shutil.copy(f, out / f.name)

    model = onnx.load(str(package / graph_file))
    graph = model.graph
    head = next(n for n in graph.node if "logits" in n.output)
    assert head.op_type in ("MatMul", "MatMulNBits"), head.op_type
    graph.node.append(helper.make_node("Identity", [head.input[0]], ["hidden_states"]))
    hidden = helper.make_tensor_value_info("hidden_states", onnx.TensorProto.FLOAT, None)
    graph.output.append(hidden)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = 0
    onnx.save(model, str(out / graph_file), save_as_external_data=True,
              location=graph_file + ".data")

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(out / graph_file), options)
    inputs = {i.name: i for i in session.get_inputs()}
    last, mean = [], []
    for ids in json.loads(ids_path.read_text()):
        n = len(ids)
        feeds = {
            "input_ids": np.array([ids], dtype=np.int64),
            "attention_mask": np.ones((1, n), dtype=np.int64),
        }
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(n, dtype=np.int64)[None]
        for name, i in inputs.items():
            if name.startswith("past_key_values"):
                _, heads, _, size = i.shape
                kv_heads = heads if isinstance(heads, int) else config["model"]["decoder"]["num_key_value_heads"]
                head_size = size if isinstance(size, int) else config["model"]["decoder"]["head_size"]
                dtype = np.float16 if "float16" in i.type else np.float32
                feeds[name] = np.zeros((1, kv_heads, 0, head_size), dtype=dtype)
        states = session.run(["hidden_states"], feeds)[0][0].astype(np.float64)
        unit = lambda v: (v / max(np.linalg.norm(v), 1e-12)).tolist()
        last.append(unit(states[-1]))
        mean.append(unit(states.mean(axis=0)))
    print(json.dumps({"last": last, "mean": mean}))


main()

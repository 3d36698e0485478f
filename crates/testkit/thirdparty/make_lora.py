"""Builds LoRA adapter test fixtures for the tiny Llama of families/ (families/llama3-hf/), with
oracle greedy ids from transformers + peft and from onnxruntime-genai's Adapters API, into
lora/ next to this file (see lora/README.md).

Two random LoRA adapters are made for that checkpoint (numpy, seeded) and saved by peft
(`save_pretrained`: `adapter_config.json`, `adapter_model.safetensors`):

  a-peft/  r 4, lora_alpha 8 (scale 2), on q_proj, v_proj, o_proj
  b-peft/  r 8, lora_alpha 16, use_rslora (scale 16 / sqrt(8)), on k_proj, gate, up, down_proj

Each entry of lora_A and lora_B is drawn from N(0, STD^2). STD and the two seeds were picked by
trying a few so that every check below passes with some margin: for each oracle (transformers +
peft, onnxruntime-genai fp32 and int4) each adapter changes the greedy ids within the first
DIVERGE_BY new ids and the two adapters' ids differ, no greedy step of any oracle is a near-tie
(top-1 minus top-2 logit > MIN_GAP; the minimum is printed and kept in lora.json), the ids
without an adapter are families.json's, and onnxruntime-genai fp32 gives transformers + peft's
ids. The script fails if any check does not hold.

onnxruntime-genai's model builder (`-p fp32|int4 -e cpu --extra_options adapter_path=PEFT`)
bakes an adapter into the graph: each adapted projection becomes MatMul(x, W) +
MatMul(MatMul(x, A), B), with `A` = `model.layers.N.<attn|mlp>.<proj>.lora_A.MatMul.weight`
([in, r]) and `B` = `...lora_B.MatMul.weight` ([r, out], pre-scaled) as initializers. The
packages here are built with a throwaway adapter on all seven projections (`union`), then every
`A` and `B` is turned into a graph input of the same name (float32, [in, R] and [R, out], R the
symbolic dim `<module>.lora_rank`, e.g. `model.layers.0.attn.q_proj.lora_rank`, one per module)
with a zero-size initializer ([in, 0], [0, out]) as its overridable default, so that without
an adapter the model is the base model, and an adapter file (onnxruntime's `AdapterFormat`,
what onnxruntime-genai's `Adapters` loads) overrides the inputs it names. (One rank dim shared
by all modules fails in onnxruntime 1.32: its buffer planner takes equally named dims as equal,
while an adapter leaves the modules it does not target at rank 0.) The int4 builder quantizes the LoRA MatMuls too (MatMulNBits); those are
rewritten to plain float MatMuls over the inputs, so adapter weights stay float32.

  llama3-lora-fp32/, llama3-lora-int4/  the two packages (runtime files only)
  a.onnx_adapter, b.onnx_adapter        each adapter in onnxruntime's adapter format: for every
                                        module it targets, A^T ([in, r]) and scale * B^T
                                        ([r, out]), named as the graph's inputs; modules it does
                                        not target are absent (their zero-size defaults apply)
  lora.json                             the prompt, the number of new ids, and the greedy ids of
                                        transformers + peft (PeftModel, not merged) and of
                                        onnxruntime-genai per package, without an adapter and
                                        with each

The prompt and the number of new ids are llama3's in families/families.json (make_families.py's
`prompt(12)`, 24 new ids), so the ids without an adapter must equal that file's.

Tool versions used to make the committed files (Python 3.11.7, CPU only):

  torch 2.15.0   transformers 5.24.0   peft 0.21.2   onnxruntime-genai 0.18.0
  onnxruntime 1.32.0   onnx 1.23.2   onnx_ir 1.1.0   onnxscript 0.7.2   safetensors 0.8.0
  numpy 2.4.6

Rerun (from the repository root; torch is several GB, so CI does not do this):

  python3 -m venv /tmp/peftvenv && /tmp/peftvenv/bin/pip install torch==2.15.0 \\
      transformers==5.24.0 peft==0.21.2 onnxruntime-genai==0.18.0 onnxruntime==1.32.0 \\
      onnx==1.23.2 onnx_ir==1.1.0 onnxscript==0.7.2 safetensors==0.8.0 numpy==2.4.6
  /tmp/peftvenv/bin/python crates/testkit/thirdparty/make_lora.py [--work /tmp/oxgen-lora]

It rewrites lora/ (all but README.md); the throwaway adapter and the builder's raw output stay in
the work folder.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "lora")
FAMILIES_DIR = os.path.join(HERE, "families")
BASE = os.path.join(FAMILIES_DIR, "llama3-hf")
sys.path.insert(0, HERE)
from make_families import BUILDER_SHIM, FAMILIES, prompt  # noqa: E402
from make_packages import keep_runtime_files  # noqa: E402

# llama3's prompt length and number of new ids in families.json.
_, _, _, PROMPT_LEN, NEW_TOKENS, PRECISIONS = FAMILIES["llama3"]

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> LoraConfig settings and the numpy seed of its weights.
ADAPTERS = {
    "a": dict(r=4, lora_alpha=8, use_rslora=False, target_modules=["q_proj", "v_proj", "o_proj"], seed=5),
    "b": dict(r=8, lora_alpha=16, use_rslora=True,
              target_modules=["k_proj", "gate_proj", "up_proj", "down_proj"], seed=6),
}
# Only for building the packages (its weights are replaced by the graph's inputs).
UNION = dict(r=8, lora_alpha=8, use_rslora=False, target_modules=ALL_MODULES, seed=0)
# Standard deviation of every lora_A and lora_B entry.
STD = 0.06
# The smallest top-1 minus top-2 logit gap any greedy step may have.
MIN_GAP = 1e-3
# Each adapter must change the greedy ids at or before this many new ids.
DIVERGE_BY = 4


def rank_dim(module):
    """The symbolic rank of one module's A and B, e.g. `model.layers.0.attn.q_proj.lora_rank`:
    one per module, since onnxruntime plans its buffers assuming that dims of the same name are
    equal, while an adapter leaves the modules it does not target at rank 0."""
    return f"{module}.lora_rank"


def scale(spec):
    return spec["lora_alpha"] / (math.sqrt(spec["r"]) if spec["use_rslora"] else spec["r"])


def load_base():
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()


def make_peft(spec, dest):
    """A peft LoRA folder for the base checkpoint, lora_A ([r, in]) and lora_B ([out, r]) drawn
    from N(0, STD^2) in the order of the modules' names."""
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"], use_rslora=spec["use_rslora"],
                        target_modules=list(spec["target_modules"]), lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    model = get_peft_model(load_base(), config)
    rng = np.random.default_rng(spec["seed"])
    with torch.no_grad():
        for _, module in sorted(model.named_modules(), key=lambda m: m[0]):
            if "default" in getattr(module, "lora_A", {}):
                for w in (module.lora_A["default"].weight, module.lora_B["default"].weight):
                    w.copy_(torch.from_numpy(rng.normal(0.0, STD, tuple(w.shape)).astype(np.float32)))
    # A set inside peft, whose order changes from run to run; the base model's path, relative
    # to the repository root rather than this machine's.
    saved = model.peft_config["default"]
    saved.target_modules = sorted(saved.target_modules)
    saved.base_model_name_or_path = os.path.relpath(BASE, os.path.join(HERE, "..", "..", ".."))
    if os.path.exists(dest):
        shutil.rmtree(dest)
    model.save_pretrained(dest)
    readme = os.path.join(dest, "README.md")  # peft's model-card stub
    if os.path.exists(readme):
        os.remove(readme)
    print(f"{dest}: {sorted(os.listdir(dest))}")


def greedy_transformers(model, ids, new_tokens):
    """Greedy ids and each step's top-1 minus top-2 gap of the raw logits."""
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(ids):].tolist()
    gaps = []
    for token, logits in zip(tokens, out.logits):
        top = torch.topk(logits[0].float(), 2)
        assert int(top.indices[0]) == token, "a greedy id is not its step's top logit"
        gaps.append(float(top.values[0] - top.values[1]))
    return tokens, gaps


def greedy_genai(model, ids, new_tokens, adapters=None, name=None):
    """onnxruntime-genai's greedy ids (as make_families.greedy_genai) with `name` of
    `adapters` active, and each step's top-1 minus top-2 logit gap."""
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens, min_length=0)
    generator = og.Generator(model, params)
    if name is not None:
        generator.set_active_adapter(adapters, name)
    generator.append_tokens(ids)
    out, gaps = [], []
    while not generator.is_done():
        logits = np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1)
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        top = np.sort(logits)[-2:]
        assert int(np.argmax(logits)) == token, "a greedy id is not its step's top logit"
        gaps.append(float(top[1] - top[0]))
        out.append(token)
    return out, gaps


def build(precision, adapter, work):
    """The builder's package for `precision` with `adapter` baked in (raw output)."""
    raw = os.path.join(work, f"raw-{precision}")
    if os.path.exists(raw):
        shutil.rmtree(raw)
    cache = os.path.join(work, f"cache-{precision}")
    cmd = [sys.executable, "-c", BUILDER_SHIM, "-i", BASE, "-o", raw, "-p", precision, "-e", "cpu",
           "-c", cache, "--extra_options", f"adapter_path={adapter}"]
    log = os.path.join(work, f"builder-{precision}.log")
    print("+", " ".join(cmd[:2]), "BUILDER_SHIM", " ".join(cmd[3:]), f"> {log}", flush=True)
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    return raw


def lora_inputs(raw, dest):
    """Writes raw's package to dest with every LoRA weight a graph input (see the docstring);
    returns {input name: [dims]}."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    model = onnx.load(os.path.join(raw, "model.onnx"))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    dropped, inputs, defaults, first_outputs = set(), {}, [], {}
    for node in graph.node:
        parts = node.name.split("/")  # "", "model", "layers.0", "attn", "q_proj", "lora_A", "MatMul"
        if len(parts) < 3 or parts[-2] not in ("lora_A", "lora_B"):
            continue
        which = parts[-2]
        weight = ".".join(parts[1:-1]) + ".MatMul.weight"
        if node.op_type == "MatMul":
            dims = list(numpy_helper.to_array(inits[weight]).shape)
            dropped.add(weight)
        elif node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            dims = [attrs["K"], None] if which == "lora_A" else [None, attrs["N"]]
            dropped.update(node.input[1:])
            del node.attribute[:]
            node.op_type, node.domain = "MatMul", ""
            node.name = "/".join(parts[:-1] + ["MatMul"])
        else:
            raise SystemExit(f"unexpected LoRA node {node.op_type} {node.name}")
        rank = rank_dim(".".join(parts[1:-2]))
        shape = [dims[0], rank] if which == "lora_A" else [rank, dims[1]]
        del node.input[1:]
        node.input.append(weight)
        inputs[weight] = shape
        zero = [0 if d == rank else d for d in shape]
        defaults.append(numpy_helper.from_array(np.zeros(zero, np.float32), weight))
        if which == "lora_A":
            first_outputs[node.output[0]] = rank

    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    kept = [v for v in graph.value_info if v.name not in dropped and v.name not in inputs]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for v in graph.value_info:  # x @ A: [batch, sequence, R]
        if v.name in first_outputs:
            dim = v.type.tensor_type.shape.dim[-1]
            dim.Clear()
            dim.dim_param = first_outputs[v.name]
    for name, shape in inputs.items():
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    used = {i for n in graph.node for i in n.input}
    assert not (dropped - set(inputs)) & used, "a dropped initializer is still used"

    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    for name in os.listdir(raw):
        if name not in ("model.onnx", "model.onnx.data"):
            shutil.copy(os.path.join(raw, name), os.path.join(dest, name))
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="model.onnx.data",
                                   size_threshold=0)
    graph.initializer.extend(defaults)  # zero bytes each: left inline
    onnx.save_model(model, os.path.join(dest, "model.onnx"))
    return inputs


def write_onnx_adapter(spec, peft_dir, path, inputs):
    """peft_dir's weights as an onnxruntime adapter file, named as the graph's inputs."""
    import numpy as np
    import onnxruntime as ort
    from safetensors.numpy import load_file

    tensors = load_file(os.path.join(peft_dir, "adapter_model.safetensors"))
    s = np.float32(scale(spec))
    params, keep = {}, []
    for key in sorted(tensors):
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
        prefix = "base_model.model.model.layers."
        assert key.startswith(prefix) and key.endswith(".weight"), key
        layer, block, proj, which, _ = key[len(prefix):].split(".")
        block = {"self_attn": "attn", "mlp": "mlp"}[block]
        name = f"model.layers.{layer}.{block}.{proj}.{which}.MatMul.weight"
        value = tensors[key].T * (s if which == "lora_B" else np.float32(1))
        value = np.ascontiguousarray(value, dtype=np.float32)
        assert name in inputs, name
        dims = inputs[name]  # one of them the symbolic rank
        assert len(value.shape) == 2 and all(isinstance(d, str) or d == v for d, v in zip(dims, value.shape)), name
        keep.append(value)
        params[name] = ort.OrtValue.ortvalue_from_numpy(value)
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters(params)
    adapter.export_adapter(path)
    print(f"{os.path.relpath(path, HERE)}: {len(params)} parameters")
    return sorted(params)


def first_difference(x, y):
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/oxgen-lora")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)

    import importlib.metadata as md

    versions = {p: md.version(p) for p in ("torch", "transformers", "peft", "onnxruntime-genai", "onnxruntime",
                                           "onnx", "onnx-ir", "onnxscript", "safetensors", "numpy")}
    print(versions)
    families = json.load(open(os.path.join(FAMILIES_DIR, "families.json")))["llama3"]
    ids = prompt(PROMPT_LEN)
    assert ids == families["prompt"], "the prompt is not families.json's"

    # 1. The adapters, as peft saves them.
    peft_dirs = {name: os.path.join(OUT, f"{name}-peft") for name in ADAPTERS}
    for name, spec in ADAPTERS.items():
        make_peft(spec, peft_dirs[name])
    union = os.path.join(args.work, "union-peft")
    make_peft(UNION, union)

    # 2. transformers + peft, the adapters applied (not merged).
    from peft import PeftModel

    results, gaps = {"transformers_peft": {}, "genai": {}}, {}
    for name in ("base", *ADAPTERS):
        model = load_base()
        if name != "base":
            model = PeftModel.from_pretrained(model, peft_dirs[name]).eval()
        out, g = greedy_transformers(model, ids, NEW_TOKENS)
        results["transformers_peft"][name], gaps[("transformers_peft", name)] = out, g

    # 3.-5. The builder's packages with LoRA inputs, the adapter files, onnxruntime-genai.
    import onnxruntime_genai as og

    adapter_files = {name: os.path.join(OUT, f"{name}.onnx_adapter") for name in ADAPTERS}
    graph_inputs = {}
    for precision in PRECISIONS:
        raw = build(precision, union, args.work)
        converted = os.path.join(args.work, f"lora-{precision}")
        graph_inputs[precision] = lora_inputs(raw, converted)
        dest = os.path.join(OUT, f"llama3-lora-{precision}")
        keep_runtime_files(converted, dest)
        if precision == PRECISIONS[0]:
            for name, spec in ADAPTERS.items():
                write_onnx_adapter(spec, peft_dirs[name], adapter_files[name], graph_inputs[precision])
        assert graph_inputs[precision] == graph_inputs[PRECISIONS[0]], "the packages' LoRA inputs differ"
        model = og.Model(dest)
        adapters = og.Adapters(model)
        for name, path in adapter_files.items():
            adapters.load(path, name)
        results["genai"][precision] = {}
        for name in ("base", *ADAPTERS):
            out, g = greedy_genai(model, ids, NEW_TOKENS, adapters, None if name == "base" else name)
            results["genai"][precision][name], gaps[(f"genai {precision}", name)] = out, g
        del adapters, model

    # 6. Checks, lora.json, a summary.
    oracles = [("transformers_peft", results["transformers_peft"])]
    oracles += [(f"genai {p}", results["genai"][p]) for p in PRECISIONS]
    expected_base = {"transformers_peft": families["transformers"]}
    expected_base.update({f"genai {p}": families["packages"][f"llama3-{p}"]["genai"] for p in PRECISIONS})
    print(f"\n{'oracle':<18} {'run':<5} {'first diff vs base':>18} {'min gap':>9}  ids")
    problems = []
    for label, runs in oracles:
        for name, out in runs.items():
            diff = "" if name == "base" else first_difference(out, runs["base"])
            print(f"{label:<18} {name:<5} {str(diff):>18} {min(gaps[(label, name)]):>9.4f}  {out}")
            if len(out) != NEW_TOKENS:
                problems.append(f"{label} {name}: {len(out)} ids")
            if name != "base" and (diff is None or diff >= DIVERGE_BY):
                problems.append(f"{label} {name}: the same as base for its first {DIVERGE_BY} ids")
        if runs["a"] == runs["b"]:
            problems.append(f"{label}: a and b give the same ids")
        if runs["base"] != expected_base[label]:
            problems.append(f"{label} base: not families.json's ids {expected_base[label]}")
    min_gap = min(min(g) for g in gaps.values())
    print(f"\nminimum top-2 logit gap over all greedy steps: {min_gap:.6f}")
    if min_gap <= MIN_GAP:
        problems.append(f"a near-tie: top-2 gap {min_gap} <= {MIN_GAP}")
    for p in PRECISIONS:
        for name in results["genai"][p]:
            same = results["genai"][p][name] == results["transformers_peft"][name]
            agree = sum(x == y for x, y in zip(results["genai"][p][name], results["transformers_peft"][name]))
            print(f"genai {p} {name} == transformers+peft: {same} ({agree}/{NEW_TOKENS})")
    if results["genai"]["fp32"] != results["transformers_peft"]:
        problems.append("genai fp32 and transformers+peft differ")

    manifest = {
        "prompt": ids,
        "new_tokens": NEW_TOKENS,
        "base": os.path.relpath(BASE, OUT),
        "adapters": {
            name: {"peft": f"{name}-peft", "onnx_adapter": f"{name}.onnx_adapter", "r": spec["r"],
                   "lora_alpha": spec["lora_alpha"], "use_rslora": spec["use_rslora"], "scale": scale(spec),
                   "target_modules": sorted(spec["target_modules"])}
            for name, spec in ADAPTERS.items()
        },
        "packages": {p: f"llama3-lora-{p}" for p in PRECISIONS},
        "transformers_peft": results["transformers_peft"],
        "genai": results["genai"],
        "min_top2_gap": round(min_gap, 6),
        "versions": versions,
    }
    with open(os.path.join(OUT, "lora.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.relpath(os.path.join(OUT, 'lora.json'), HERE)}")
    if problems:
        raise SystemExit("checks failed:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main()

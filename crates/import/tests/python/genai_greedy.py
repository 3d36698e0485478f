"""Greedy generation with onnxruntime-genai (PyPI) on a package folder, unchanged, for
crates/import/tests/interop.rs.

usage: genai_greedy.py PACKAGE REQUEST.json OUT.json
  REQUEST.json: {"new_tokens": N, "prompts": [{"ids": [...], "messages": [{"role", "content"}]}]}
  OUT.json: {"version": "...", "results": [{"ids": [N greedy ids], "chat_ids": [...]}]}

For each prompt, `ids` are fed as they are (append_tokens) and N tokens generated with
do_sample false; min_length = max_length masks the end-of-sequence ids of genai_config.json
at every step (onnxruntime-genai's own EOS suppression), so exactly N ids come back.
`chat_ids` is onnxruntime-genai's own encoding of `messages` (its chat template over
tokenizer_config.json, then its tokenizer over tokenizer.json), for comparing tokenizers.
"""

import json
import sys

try:
    import onnxruntime_genai as og
except ImportError as e:
    sys.exit(
        f"cannot import onnxruntime_genai ({e}): run the tests with scripts/test.sh, which "
        "installs onnxruntime-genai into .cache/venv"
    )


def main() -> None:
    package, request, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(request, encoding="utf-8") as f:
        req = json.load(f)
    n = req["new_tokens"]
    model = og.Model(package)
    tokenizer = og.Tokenizer(model)
    results = []
    for prompt in req["prompts"]:
        ids = prompt["ids"]
        length = len(ids) + n
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=length, min_length=length)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        new = []
        while not generator.is_done():
            generator.generate_next_token()
            new.append(int(generator.get_next_tokens()[0]))
        del generator
        text = tokenizer.apply_chat_template(
            json.dumps(prompt["messages"]), add_generation_prompt=True
        )
        chat_ids = [int(t) for t in tokenizer.encode(text)]
        results.append({"ids": new, "chat_ids": chat_ids})
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"version": og.__version__, "results": results}, f)


if __name__ == "__main__":
    main()

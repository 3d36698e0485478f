"""Cross-checks the golden prompts' ids (oxgen's tokenizer and chat template) against an
independent tokenizer of the model: Hugging Face transformers' GGUF tokenizer, built by
transformers from the GGUF's own vocabulary and merges, with its own chat-template renderer.

usage: check_tokenizer.py MODEL.gguf GOLDENS.json

Run once, by hand, in a venv with `transformers tokenizers gguf numpy` (no torch needed; see
README.md for the pinned versions); not part of the test suite. Prints the result; the golden
file's `notes.tokenizer_check` records it.

transformers' GGUF tokenizer uses the plain GPT-2 pre-tokenizer and drops the `smollm`
pre-tokenizer's digit rule (every digit is its own pre-token, before the GPT-2 split). So the
check applies the rule by hand: the rendered chat text is cut before and after every digit
and each piece is encoded by transformers on its own (what a Digits(individual_digits=True)
pre-tokenizer ahead of the GPT-2 split does); the ids must equal oxgen's exactly. transformers'
ids of the whole text without the rule are printed too.
"""

import json
import re
import sys

import tokenizers
import transformers
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from transformers import AutoTokenizer

# transformers 4.57 refuses GGUF files without torch, although reading the metadata and
# building the tokenizer (load_gguf_checkpoint with return_tensors=False, then
# convert_gguf_tokenizer) never touches it. Let that check pass instead of installing torch.
gguf_utils.is_torch_available = lambda: True


def main():
    gguf_path, goldens_path = sys.argv[1], sys.argv[2]
    directory, _, name = gguf_path.rpartition("/")
    tok = AutoTokenizer.from_pretrained(directory or ".", gguf_file=name)
    with open(goldens_path, encoding="utf-8") as f:
        goldens = json.load(f)
    ok = True
    for p in goldens["prompts"]:
        text = tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        pieces = [s for s in re.split(r"(\d)", text) if s]
        by_rule = [i for s in pieces for i in tok.encode(s, add_special_tokens=False)]
        plain = tok.encode(text, add_special_tokens=False)
        oxgen = p["prompt_ids"]
        ok &= by_rule == oxgen
        label = p["messages"][-1]["content"]
        print(
            f"{label!r}: {len(oxgen)} ids; transformers with the digit rule: "
            f"{'equal' if by_rule == oxgen else 'DIFFERENT'}; without it: "
            f"{'equal' if plain == oxgen else 'different'}"
        )
        for what, ids in (("with the rule", by_rule), ("without it", plain)):
            if ids != oxgen:
                print(f"  oxgen:                     {oxgen}\n  transformers {what}: {ids}")
    # Why the plain split agrees here: no token of this vocabulary holds an ASCII digit next
    # to anything else, so BPE cannot merge digits whatever the pre-tokenizer.
    vocab = tok.get_vocab()
    mixed = [t for t in vocab if len(t) > 1 and any(c in "0123456789" for c in t)]
    print(f"vocabulary tokens with an ASCII digit and other characters: {len(mixed)}")
    print(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    print("tokenizer check:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

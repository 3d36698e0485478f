"""Renders the model families' chat templates with transformers, for oxgen's template test.

oxgen renders chat templates with minijinja; Hugging Face renders them with Python's jinja2
through `transformers`' `apply_chat_template`. This script renders every template in
`templates/` on a set of conversations (system and user turns, multi-turn history, tools and
tool results, reasoning, `enable_thinking`, `reasoning_effort`, escapes and non-ASCII text)
with transformers' own renderer (`render_jinja_template`, which `apply_chat_template` calls
with the tokenizer's special tokens) and writes the texts to `expected.json`. The test
`crates/server/src/api.rs` (`chat_templates_render_as_transformers_does`) parses the same
request messages as the server does and must render the same text, byte for byte; where
transformers raises (a template refusing a conversation), oxgen must refuse it too.

The templates are the files llama.cpp keeps under `models/templates/` (copied from each
model's Hugging Face repository), taken from the llama.cpp sources that the llama-cpp-python
0.3.36 sdist vendors (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`).
`SOURCES` below names each file and the model it comes from.

Templates that read `strftime_now` get a frozen clock here (3 February 2031); the test puts
today's date, as oxgen formats it, in its place.

Tool versions: Python 3.11, transformers 5.24.0, jinja2 3.1.6. Rerun from the repository root:

  python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install transformers==5.24.0 jinja2==3.1.6
  /tmp/tfvenv/bin/python crates/testkit/thirdparty/chat_templates/make_expected.py \\
      [--llama-cpp PATH/TO/llama.cpp]   # copies the templates afresh from there
"""

import argparse
import datetime as dt
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))

# fixture name -> (file under llama.cpp's models/templates, model, bos_token, eos_token)
SOURCES = {
    "gemma2": ("google-gemma-2-2b-it.jinja", "google/gemma-2-2b-it", "<bos>", "<eos>"),
    "phi3.5": ("microsoft-Phi-3.5-mini-instruct.jinja", "microsoft/Phi-3.5-mini-instruct", "<s>", "<|endoftext|>"),
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen/Qwen2.5-7B-Instruct", None, "<|im_end|>"),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "Qwen/Qwen3-0.6B", None, "<|im_end|>"),
    "llama3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama/Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama/Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.3": ("meta-llama-Llama-3.3-70B-Instruct.jinja", "meta-llama/Llama-3.3-70B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja", "HuggingFaceTB/SmolLM3-3B", None, "<|im_end|>"),
    "granite3.3": ("ibm-granite-granite-3.3-2B-Instruct.jinja", "ibm-granite/granite-3.3-2b-instruct", "<|end_of_text|>", "<|end_of_text|>"),
    "mistral-nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistralai/Mistral-Nemo-Instruct-2407", "<s>", "</s>"),
    "nemotron-nano2": ("NVIDIA-Nemotron-Nano-v2.jinja", "nvidia/NVIDIA-Nemotron-Nano-9B-v2", "<SPECIAL_10>", "<SPECIAL_12>"),
    "gpt-oss": ("openai-gpt-oss-120b.jinja", "openai/gpt-oss-120b", "<|startoftext|>", "<|return|>"),
}

FROZEN = dt.datetime(2031, 2, 3, 10, 20, 30)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALL = {
    "id": "a1b2c3d4e",  # Mistral's templates want nine alphanumerics
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'},
}

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "Why is the sky blue?"}
ANSWER = {"role": "assistant", "content": "Rayleigh scattering."}
USER2 = {"role": "user", "content": "And at sunset?"}

# name -> request body fields: messages, and optionally tools, chat_template_kwargs and
# add_generation_prompt (default true), as a client sends them to /v1/chat/completions.
CASES = {
    "system-user": {"messages": [SYSTEM, USER]},
    "user": {"messages": [USER]},
    "multi-turn": {"messages": [SYSTEM, USER, ANSWER, USER2]},
    "no-generation-prompt": {"messages": [USER, ANSWER], "add_generation_prompt": False},
    "escapes": {
        "messages": [{"role": "user", "content": "Say <b>\"ünïcødé\" & 'quotes'</b>\n\ttabs  {{ not jinja }} 日本"}]
    },
    "tools": {"messages": [SYSTEM, {"role": "user", "content": "Weather in Zürich?"}], "tools": [WEATHER]},
    "tool-round-trip": {
        "messages": [
            {"role": "user", "content": "Weather in Zürich?"},
            # Content "" rather than null: transformers drops null keys, and the Phi-3.5, Qwen3
            # and Granite templates then fail on the missing content; oxgen's server takes null
            # content of a tool-call message as "".
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": '{"temperature": 21, "sky": "clear"}'},
        ],
        "tools": [WEATHER],
    },
    "reasoning-history": {
        "messages": [
            USER,
            {"role": "assistant", "content": "Rayleigh scattering.", "reasoning_content": "Short light scatters more."},
            USER2,
        ]
    },
    "thinking-off": {"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}},
    "reasoning-effort": {"messages": [SYSTEM, USER], "chat_template_kwargs": {"reasoning_effort": "high"}},
    "date-string": {"messages": [USER], "chat_template_kwargs": {"date_string": "01 Jan 2025"}},
}


def request_messages(messages):
    """The messages transformers gets: as the client sent them (it drops keys set to None)."""
    out = []
    for m in messages:
        m = dict(m)
        for call in m.get("tool_calls") or []:
            # Templates expect the arguments as a mapping, as Hugging Face documents it.
            call["function"] = dict(call["function"], arguments=json.loads(call["function"]["arguments"]))
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", help="llama.cpp source tree to copy the templates from")
    args = ap.parse_args()
    templates = os.path.join(HERE, "templates")
    if args.llama_cpp:
        os.makedirs(templates, exist_ok=True)
        for name, (file, *_rest) in SOURCES.items():
            shutil.copy(os.path.join(args.llama_cpp, "models", "templates", file), os.path.join(templates, name + ".jinja"))

    import copy

    import transformers
    import transformers.utils.chat_template_utils as ctu

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return FROZEN

    ctu.datetime = Frozen

    expected = {
        "transformers": transformers.__version__,
        "frozen_date": FROZEN.isoformat(),
        "cases": CASES,
        "templates": {},
    }
    for name, (file, model, bos, eos) in SOURCES.items():
        with open(os.path.join(templates, name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        rendered = {}
        for case, body in CASES.items():
            body = copy.deepcopy(body)
            messages = [{k: v for k, v in m.items() if v is not None} for m in request_messages(body["messages"])]
            try:
                text, _ = ctu.render_jinja_template(
                    conversations=[messages],
                    tools=body.get("tools"),
                    chat_template=source,
                    add_generation_prompt=body.get("add_generation_prompt", True),
                    **special,
                    **body.get("chat_template_kwargs", {}),
                )
                rendered[case] = {"text": text[0]}
            except Exception as e:  # the template refused the conversation
                rendered[case] = {"error": str(e)}
        expected["templates"][name] = {"source": f"llama.cpp models/templates/{file} ({model})", "bos_token": bos, "eos_token": eos, "rendered": rendered}
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for name, t in expected["templates"].items():
        errors = [c for c, r in t["rendered"].items() if "error" in r]
        print(f"{name}: {len(CASES) - len(errors)} rendered, refused: {', '.join(errors) or '-'}")


if __name__ == "__main__":
    main()

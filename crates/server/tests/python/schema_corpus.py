#!/usr/bin/env python3
"""A corpus of real-world JSON schemas for structured output, read from the wheels the test
command downloads (nothing is installed from them), and its replies checked.

  python schema_corpus.py extract WHEELS_DIR OUT.jsonl
      Writes one {"source", "id", "schema"} line per schema:
      - kubernetes: every schema of kubernetes-validate's newest `-local-strict` set, each
        bundled with the definitions it reaches (its `$ref`s into `_definitions.json` made
        local), as a client sending a Kubernetes object's schema would;
      - schemastore: the SchemaStore schemas check-jsonschema vendors, as they are;
      - functions: the function parameters of the Berkeley Function Calling Leaderboard's
        data (bfcl-eval), deduplicated, their types in JSON Schema's names (BFCL writes
        `dict`, `float`, `tuple`, `any`), as a tool call's arguments.

  python schema_corpus.py run SERVER MODEL CORPUS.jsonl IDS_FILE
      For each id listed in IDS_FILE (one per line), asks the server for a reply under that
      schema (`response_format` json_schema, strict) at max_tokens 256 and 384, and checks
      that every reply parses and validates against the original schema (jsonschema).
      Prints one line per reply and a summary; exits 1 if any does not. With
      OXGEN_CORPUS_OPEN=1 it asks as before closing existed (`close_structured_output` and
      `close_objects` false, not strict) and only reports (for docs/STRUCTURED.md).
"""

import json
import re
import sys
import urllib.request
import zipfile
from pathlib import Path


def wheel(directory, prefix):
    found = sorted(Path(directory).glob(f"{prefix}-*.whl"))
    if not found:
        sys.exit(f"no {prefix} wheel in {directory}")
    return zipfile.ZipFile(found[-1])


def refs(node, out):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out.append(value)
            else:
                refs(value, out)
    elif isinstance(node, list):
        for value in node:
            refs(value, out)


def kubernetes(directory):
    z = wheel(directory, "kubernetes_validate")
    names = z.namelist()
    sets = sorted({n.split("/")[-2] for n in names if n.endswith("-local-strict/_definitions.json")},
                  key=lambda v: [int(x) for x in re.findall(r"\d+", v)])
    newest = sets[-1]
    base = next(n for n in names if n.endswith(f"{newest}/_definitions.json"))[: -len("_definitions.json")]
    defs = json.loads(z.read(base + "_definitions.json"))["$defs"]
    local = re.compile(r"^/api/_definitions\.json#/\$defs/(.+)$")

    def localize(node):
        if isinstance(node, dict):
            return {k: (local.sub(r"#/$defs/\1", v) if k == "$ref" and isinstance(v, str) else localize(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [localize(v) for v in node]
        return node

    for name in sorted(n for n in names if n.startswith(base) and n.endswith(".json")):
        leaf = name[len(base):]
        if leaf in ("_definitions.json", "all.json"):
            continue
        schema = localize(json.loads(z.read(name)))
        needed, queue = {}, []
        refs(schema, queue)
        while queue:
            m = re.match(r"^#/\$defs/(.+)$", queue.pop())
            if m and m.group(1) not in needed and m.group(1) in defs:
                needed[m.group(1)] = localize(defs[m.group(1)])
                refs(needed[m.group(1)], queue)
        if needed:
            schema["$defs"] = needed
        yield f"{newest}/{leaf}", schema


def schemastore(directory):
    z = wheel(directory, "check_jsonschema")
    for name in sorted(z.namelist()):
        if "/builtin_schemas/vendor/" in name and name.endswith(".json"):
            yield name.rsplit("/", 1)[1], json.loads(z.read(name))


BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array",
              "int": "integer", "bool": "boolean", "str": "string", "String": "string"}


def json_schema_types(node):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "type" and isinstance(v, str):
                if v == "any":
                    continue
                out[k] = BFCL_TYPES.get(v, v)
            elif k in ("properties",) and isinstance(v, dict):
                out[k] = {name: json_schema_types(s) for name, s in v.items()}
            else:
                out[k] = json_schema_types(v)
        return out
    if isinstance(node, list):
        return [json_schema_types(v) for v in node]
    return node


def functions(directory):
    z = wheel(directory, "bfcl_eval")
    seen = set()
    for name in sorted(z.namelist()):
        if not (name.startswith("bfcl_eval/data/BFCL_") and name.endswith(".json")):
            continue
        for line in z.read(name).decode().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            for f in entry.get("function") or []:
                if not isinstance(f, dict) or not isinstance(f.get("parameters"), dict):
                    continue
                schema = json_schema_types(f["parameters"])
                key = json.dumps([f.get("name"), schema], sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                yield f"{f.get('name')}#{len(seen)}", schema


def extract(directory, out):
    count = {}
    with open(out, "w") as f:
        for source, schemas in [("kubernetes", kubernetes(directory)),
                                ("schemastore", schemastore(directory)),
                                ("functions", functions(directory))]:
            for id_, schema in schemas:
                f.write(json.dumps({"source": source, "id": id_, "schema": schema}) + "\n")
                count[source] = count.get(source, 0) + 1
    print(json.dumps(count))


def run(server, model, corpus, ids_file):
    import jsonschema

    import os

    open_ = os.environ.get("OXGEN_CORPUS_OPEN") == "1"
    wanted = [l.strip() for l in open(ids_file) if l.strip()]
    schemas = {}
    for line in open(corpus):
        entry = json.loads(line)
        schemas[entry["id"]] = entry["schema"]
    bad = 0
    for id_ in wanted:
        for limit in (256, 384):
            body = {"model": model, "max_tokens": limit, "temperature": 0,
                    "messages": [{"role": "user", "content": "Write an example instance as JSON."}],
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "s", "schema": schemas[id_], "strict": not open_}}}
            if open_:
                body.update(close_structured_output=False, close_objects=False)
            req = urllib.request.Request(f"{server}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                reply = json.load(r)
            choice = reply["choices"][0]
            text = choice["message"]["content"]
            try:
                jsonschema.validate(json.loads(text), schemas[id_])
                verdict = "valid"
            except (json.JSONDecodeError, jsonschema.ValidationError) as e:
                verdict = f"INVALID ({type(e).__name__}: {str(e)[:120]})"
                bad += 1
            print(f"{id_} @{limit}: {verdict}, finish {choice['finish_reason']}, "
                  f"{reply['usage']['completion_tokens']} tokens", flush=True)
    print(f"{len(wanted) * 2 - bad} of {len(wanted) * 2} replies parse and validate")
    sys.exit(1 if bad and not open_ else 0)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "extract":
        extract(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 6 and sys.argv[1] == "run":
        run(*sys.argv[2:])
    else:
        sys.exit(__doc__)

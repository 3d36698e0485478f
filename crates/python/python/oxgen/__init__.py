"""oxgen: fast inference of ONNX language models on CPUs, from Python.

    import oxgen

    model = oxgen.Model()  # the default model; `oxgen pull` fetches it on first use
    print(model.generate("Why is the sky blue?", max_new_tokens=48).text)

`Model(path)` opens an onnxruntime-genai package, an optimum export or an imported GGUF
folder; for an encoder package (`oxgen pull embed`, or `oxgen import` of a
sentence-transformers folder) it gives an `Embedder`, whose `embed(texts)` returns a NumPy
array of shape `(len(texts), dim)` and `rerank(query, documents)` one score per document. Generation releases the GIL, Ctrl-C cancels it, and errors are `oxgen.Error`s. The
wheel also installs the `oxgen` command (`oxgen serve`, `oxgen bench`, ...).
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from ._oxgen import (
    Chat,
    Completion,
    Embedder,
    Error,
    GenerationError,
    InvalidArgument,
    ModelLoadError,
    Token,
    Tokenizer,
    TokenStream,
    __version__,
)
from ._oxgen import Model as _NativeModel
from ._oxgen import is_encoder as _is_encoder

__all__ = [
    "Chat",
    "Completion",
    "Embedder",
    "Error",
    "GenerationError",
    "InvalidArgument",
    "Model",
    "ModelLoadError",
    "Token",
    "TokenStream",
    "Tokenizer",
    "cli",
    "default_model",
    "__version__",
]


def cli() -> str:
    """The path of the `oxgen` command: the one this wheel installed, else one on PATH."""
    exe = os.path.join(sysconfig.get_path("scripts"), "oxgen")
    if os.access(exe, os.X_OK):
        return exe
    found = shutil.which("oxgen")
    if found:
        return found
    raise Error(
        "the oxgen command is not installed beside this package; install the oxgen wheel "
        "(it ships the command) or put oxgen on PATH"
    )


def default_model() -> str:
    """The folder of the default model (SmolLM2-135M-Instruct), pulled into oxgen's cache
    by `oxgen pull` when it is not there yet."""
    done = subprocess.run([cli(), "pull"], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    if done.returncode != 0:
        raise ModelLoadError(f"`oxgen pull` failed with exit code {done.returncode}")
    return done.stdout.strip().splitlines()[-1]


class Model(_NativeModel):
    """A language model. `path` is a package folder; without it, the default model. An
    encoder package's folder gives an `Embedder` (its own keywords: backend, threads,
    ort_lib, pooling, normalize, max_tokens)."""

    def __new__(cls, path=None, **options):
        if path is None:
            path = default_model()
        path = os.fspath(path)
        if _is_encoder(path):
            return Embedder(path, **options)
        return super().__new__(cls, path, **options)

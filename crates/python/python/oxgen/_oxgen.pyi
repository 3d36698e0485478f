"""Type stubs of oxgen's native module (re-exported by `oxgen`)."""

from os import PathLike
from typing import Any, Iterator, Literal, Optional, Sequence, TypedDict, Union

from typing_extensions import Unpack

import numpy as np
import numpy.typing as npt

__version__: str

class Error(Exception): ...
class ModelLoadError(Error): ...
class InvalidArgument(Error): ...
class GenerationError(Error): ...

class Message(TypedDict):
    role: str
    content: str

Prompt = Union[str, Sequence[int], Sequence[Message]]

class Sampling(TypedDict, total=False):
    """The keywords of generate, stream, generate_batch and Chat.send (the CLI's flags)."""

    max_new_tokens: int
    temperature: Optional[float]
    top_k: Optional[int]
    top_p: Optional[float]
    min_p: Optional[float]
    seed: Optional[int]
    repetition_penalty: Optional[float]
    frequency_penalty: Optional[float]
    presence_penalty: Optional[float]
    stop: Union[str, Sequence[str], None]
    ignore_eos: bool
    # A LoRA adapter loaded on the model (Model(lora=...), load_adapter), by name.
    adapter: Optional[str]
    # At most one constraint.
    json_schema: Union[dict[str, Any], str, None]
    json_object: bool
    regex: Optional[str]
    grammar: Optional[str]
    choice: Optional[Sequence[str]]
    # Tools in OpenAI's shape (generate, stream and generate_batch): the calls are enforced
    # by a grammar and parsed into Completion.tool_calls.
    tools: Optional[Sequence[dict[str, Any]]]
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None]
    parallel_tool_calls: Optional[bool]
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]]

class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    prefix_reused: int
    spec_proposed: int
    spec_accepted: int

class Timings(TypedDict):
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    total_s: float

class ToolCallFunction(TypedDict):
    name: str
    arguments: Union[dict[str, Any], str]

class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ToolCallFunction

class Completion:
    text: str
    content: str
    reasoning: Optional[str]
    tool_calls: list[ToolCall]
    token_ids: list[int]
    finish_reason: Literal["stop", "length", "cancelled"]
    usage: Usage
    timings: Timings

class Token:
    id: int
    text: str

class TokenStream(Iterator[Token]):
    def __iter__(self) -> TokenStream: ...
    def __next__(self) -> Token: ...
    @property
    def finish_reason(self) -> Optional[Literal["stop", "length", "cancelled"]]: ...

class Tokenizer:
    def encode(self, text: str, add_special: bool = False) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...
    @property
    def vocab_size(self) -> int: ...

class Chat:
    def send(self, text: str, **sampling: Unpack[Sampling]) -> Completion: ...
    @property
    def messages(self) -> list[Message]: ...

class Model:
    def __new__(
        cls,
        path: Union[str, PathLike[str], None] = None,
        *,
        backend: Literal["native", "ort", "auto"] = "auto",
        threads: int = 0,
        ctx_size: Optional[int] = None,
        exact: bool = False,
        chat_template: Union[str, PathLike[str], None] = None,
        max_batch: int = 8,
        ort_lib: Union[str, PathLike[str], None] = None,
        speculative: Optional[str] = None,
        spec_tokens: int = 6,
        kv_dtype: Optional[Literal["f32", "f16", "bf16", "int8"]] = None,
        weight_budget_mib: Optional[int] = None,
        expert_cache: Literal["lru", "frequency"] = "frequency",
        chat_template_kwargs: Optional[dict[str, Any]] = None,
        kv_disk_cache: Union[str, PathLike[str], None] = None,
        kv_disk_budget_mib: int = 8192,
        lora: Optional[dict[str, Union[str, PathLike[str]]]] = None,
        max_loras: int = 0,
    ) -> Model: ...
    def generate(self, prompt: Prompt, **sampling: Unpack[Sampling]) -> Completion: ...
    def stream(self, prompt: Prompt, **sampling: Unpack[Sampling]) -> TokenStream: ...
    def generate_batch(
        self, prompts: Sequence[Prompt], **sampling: Unpack[Sampling]
    ) -> list[Completion]: ...
    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]: ...
    def chat(self, system: Optional[str] = None) -> Chat: ...
    def load_adapter(self, name: str, path: Union[str, PathLike[str]]) -> dict[str, Any]: ...
    def unload_adapter(self, name: str) -> None: ...
    def adapters(self) -> list[dict[str, Any]]: ...
    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str: ...
    def cancel(self) -> None: ...
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def backend(self) -> Literal["native", "ort"]: ...
    @property
    def threads(self) -> int: ...
    @property
    def kv_dtype(self) -> Literal["f32", "f16", "bf16", "int8"]: ...
    @property
    def path(self) -> str: ...

class Embedder:
    """An encoder package: a sentence encoder (`embed`) or a cross-encoder (`rerank`)."""

    def __new__(
        cls,
        path: Union[str, PathLike[str]],
        *,
        backend: Literal["native", "ort", "auto"] = "auto",
        threads: int = 0,
        ort_lib: Optional[Union[str, PathLike[str]]] = None,
        pooling: Optional[Literal["cls", "mean", "max", "last"]] = None,
        normalize: Optional[bool] = None,
        max_tokens: Optional[int] = None,
    ) -> "Embedder": ...
    def embed(
        self,
        texts: Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]],
        *,
        truncate: bool = False,
    ) -> npt.NDArray[np.float32]: ...
    def rerank(
        self, query: str, documents: Sequence[str], *, truncate: bool = False
    ) -> list[float]: ...
    def tokenize(self, text: str) -> list[int]: ...
    @property
    def dim(self) -> int: ...
    @property
    def kind(self) -> Literal["embedding", "rerank"]: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def path(self) -> str: ...

def is_encoder(path: Union[str, PathLike[str]]) -> bool: ...

"""Models and sessions: the Pythonic face of the C API (include/h2o/h2o.h says what each call
does; the docstrings here say what is particular to Python)."""

import ctypes
import json
import os
import traceback
from ctypes import byref, c_double, c_float, c_int32, c_size_t, c_uint32, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from . import _native
from ._errors import H2oError, Status, check

lib = _native.lib
Text = Union[str, bytes]
PathLike = Union[str, bytes, "os.PathLike[str]"]


def _utf8(text: Text) -> bytes:
    """str as UTF-8; bytes as they are (the library refuses invalid UTF-8 with INVALID_TEXT)."""
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        return text.encode("utf-8")
    raise TypeError(f"expected str or bytes, got {type(text).__name__}")


def _path(path: PathLike) -> bytes:
    return os.fsencode(path)


def _text_out(call: Callable[..., Any], session: Optional[int] = None) -> bytes:
    """The two-call protocol of the text getters: the size first, then the text."""
    n = c_size_t(0)
    code = call(None, 0, n)
    if code not in (Status.OK, Status.BUFFER_TOO_SMALL):
        check(code, session)
    buffer = ctypes.create_string_buffer(n.value + 1)
    check(call(buffer, len(buffer), n), session)
    return buffer.raw[: n.value]


def _enum_value(value: object, from_name: Callable[..., Any], what: str) -> int:
    """A name ("h2o", "k8v4", "vulkan") or the number itself."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"{what} must be a name or a number, not {type(value).__name__}")
    if isinstance(value, int):
        return value
    out = c_uint32(0)
    check(from_name(value.encode("utf-8"), byref(out)))
    return int(out.value)


def _names(name_of: Callable[[int], Optional[bytes]]) -> List[str]:
    names, i = [], 0
    while (name := name_of(i)) is not None:
        names.append(name.decode())
        i += 1
    return names


def version() -> str:
    """The library's version, e.g. "0.7.0"."""
    return str(lib.h2o_version().decode())


def kv_policies() -> List[str]:
    """The eviction policies' names, by value ("full", "h2o", ...)."""
    return _names(lib.h2o_kv_policy_name)


def kv_types() -> List[str]:
    """The KV cache formats' names, by value ("f32", "f16", ...)."""
    return _names(lib.h2o_kv_type_name)


def experimental_names() -> List[str]:
    """The research settings' names (h2o_experimental.h), for Model.session(experimental=...)."""
    return _names(lib.h2o_experimental_name)


def experimental_bounds(name: str) -> Tuple[float, float]:
    """The values a research setting accepts, (min, max), as Model.session checks them
    (h2o_experimental_bounds). Raises H2oError for an unknown name."""
    key, low, high = c_uint32(), c_double(), c_double()
    check(lib.h2o_experimental_from_name(name.encode(), byref(key)))
    check(lib.h2o_experimental_bounds(key, byref(low), byref(high)))
    return (low.value, high.value)


@dataclass(frozen=True)
class BackendInfo:
    kind: str  # "cpu", "vulkan", "cuda"
    device_index: int
    name: str
    device_type: str
    memory_bytes: int

    @staticmethod
    def _from(info: _native.BackendInfo) -> "BackendInfo":
        kind = lib.h2o_backend_kind_name(info.kind)
        return BackendInfo(
            kind.decode() if kind else str(info.kind),
            info.device_index,
            info.name.decode("utf-8", errors="replace"),
            info.device_type.decode(),
            info.memory_bytes,
        )


def backends() -> List[BackendInfo]:
    """The devices sessions can run on: the CPU first, then each Vulkan and CUDA device."""
    count = c_size_t(0)
    check(lib.h2o_backend_count(byref(count)))
    found = []
    for i in range(count.value):
        info = _native.BackendInfo(struct_size=ctypes.sizeof(_native.BackendInfo))
        check(lib.h2o_backend_get_info(i, byref(info)))
        found.append(BackendInfo._from(info))
    return found


@dataclass(frozen=True)
class ModelInfo:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    bos_token: Optional[int]
    eos_token: Optional[int]
    n_params: int
    weight_bytes: int


@dataclass(frozen=True)
class KvLayout:
    budget: int
    policy: str
    recent: int
    sinks: int
    heavy: int
    position_rolling: bool
    type: str
    n_ctx: int
    horizon: int
    min_layer_budget: int
    max_layer_budget: int
    min_head_budget: int


@dataclass(frozen=True)
class KvUsage:
    """Where the stream stands against the cache (h2o_kv_usage)."""

    capacity: int
    n_past: int
    n_held: int
    n_evicted: int
    n_pinned: int
    evicting_since: int  # the stream's length when eviction began; 0: none yet
    evicts: bool


def _kv_usage(usage: "_native.KvUsage") -> KvUsage:
    f = _fields(usage)
    f["evicts"] = bool(f["evicts"])
    return KvUsage(**f)


_EVENTS = {1: "kv_full"}
_OVERFLOWS = {"evict": 0, "error": 1}
_CACHE_POLICIES = {"reuse": 0, "lru": 1}  # h2o_cache_policy


@dataclass(frozen=True)
class MemoryReport:
    weight_bytes: int
    kv_bytes: int
    scratch_bytes: int


@dataclass(frozen=True)
class SpanInfo:
    span_id: int
    min_share: float
    min_tokens: int
    n_tokens: int
    kept_min: int
    kept_max: int
    kept_mean: float
    attention_share: Optional[float]  # None when the policy gathers no statistics


@dataclass(frozen=True)
class GenerateStats:
    n_prompt_tokens: int
    n_generated_tokens: int
    stop_reason: str  # "none", "max_tokens", "eos", "string", "callback"
    n_past: int
    prompt_seconds: float
    generate_seconds: float


_STOP_REASONS = ("none", "max_tokens", "eos", "string", "callback", "grammar")


def _fields(struct: ctypes.Structure) -> Dict[str, Any]:
    return {name: getattr(struct, name) for name, _ in struct._fields_ if name != "struct_size"}


class _Native:
    """Owns one native object: freed by close() (idempotent), at the end of a with block, or when
    collected. `handle` is its pointer, and raises ValueError once it is closed."""

    _handle: Optional[int] = None
    _kind = "object"

    @staticmethod
    def _free(handle: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Frees the native object (idempotent)."""
        if self._handle:
            self._free(self._handle)
            self._handle = None

    def __enter__(self: "_Self") -> "_Self":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def handle(self) -> int:
        """The native pointer (raises ValueError once closed)."""
        if not self._handle:
            raise ValueError(f"the {self._kind} is closed")
        return self._handle


_Self = TypeVar("_Self", bound=_Native)


class Model(_Native):
    """A loaded GGUF model. Use it as a context manager, or call close(); sessions made from it
    keep working after it is closed (they hold the native model alive)."""

    def __init__(
        self,
        path: PathLike,
        *,
        tokenizer_path: Optional[PathLike] = None,
        prefix_cache_bytes: int = 0,
        prefix_cache_policy: str = "reuse",
        progress: Optional[Callable[[float], Optional[bool]]] = None,
    ):
        """Loads the model. progress(fraction) is called as the weights are read; returning False
        cancels the load (Cancelled is raised); an exception it raises cancels and is re-raised.
        prefix_cache_policy: which prompts the prefix cache gives up first when it is full,
        "reuse" (the lowest expected saving, the default) or "lru"."""
        if prefix_cache_policy not in _CACHE_POLICIES:
            raise ValueError(f"prefix_cache_policy must be 'reuse' or 'lru', not {prefix_cache_policy!r}")
        params = _native.ModelParams()
        check(lib.h2o_model_params_init(byref(params), ctypes.sizeof(params)))
        if tokenizer_path is not None:
            params.tokenizer_path = _path(tokenizer_path)
        params.prefix_cache_bytes = prefix_cache_bytes
        params.prefix_cache_policy = _CACHE_POLICIES[prefix_cache_policy]
        raised: List[BaseException] = []
        if progress is not None:
            report_to = progress

            def report(fraction: float, _user_data: Optional[int]) -> int:
                try:
                    return 1 if report_to(fraction) is False else 0
                except BaseException as e:  # re-raised below, once the load has stopped
                    raised.append(e)
                    return 1

            callback = _native.ProgressCallback(report)
            params.progress = ctypes.cast(callback, c_void_p)
        handle = c_void_p()
        code = lib.h2o_model_load(_path(path), byref(params), byref(handle))
        if raised:
            raise raised[0]
        check(code)
        self._handle = handle.value

    _kind = "model"

    @staticmethod
    def _free(handle: int) -> None:
        lib.h2o_model_free(handle)

    @property
    def info(self) -> ModelInfo:
        info = _native.ModelInfo(struct_size=ctypes.sizeof(_native.ModelInfo))
        check(lib.h2o_model_get_info(self.handle, byref(info)))
        f = _fields(info)
        f["bos_token"] = f["bos_token"] if f["bos_token"] >= 0 else None
        f["eos_token"] = f["eos_token"] if f["eos_token"] >= 0 else None
        return ModelInfo(**f)

    def _text(self, what: int) -> str:
        return _text_out(lambda buf, cap, n: lib.h2o_model_get_text(self.handle, what, buf, cap, byref(n))).decode("utf-8", "replace")

    @property
    def name(self) -> str:
        """general.name ("" when the file has none)."""
        return self._text(_native.MODEL_TEXT_NAME)

    @property
    def architecture(self) -> str:
        return self._text(_native.MODEL_TEXT_ARCHITECTURE)

    @property
    def chat_format(self) -> Optional[str]:
        """The chat format the model's template describes, or None when it has none known."""
        try:
            return self._text(_native.MODEL_TEXT_CHAT_FORMAT)
        except H2oError as e:
            if e.status == Status.UNSUPPORTED:
                return None
            raise

    @property
    def prefix_cache_stats(self) -> Dict[str, int]:
        stats = _native.PrefixCacheStats(struct_size=ctypes.sizeof(_native.PrefixCacheStats))
        check(lib.h2o_model_get_prefix_cache_stats(self.handle, byref(stats)))
        return _fields(stats)

    def tokenize(self, text: Text, *, add_bos: bool = False, special: bool = False) -> List[int]:
        """Token ids of the text; special=True turns control tokens' text into those tokens."""
        data = _utf8(text)
        flags = (_native.TOKENIZE_ADD_BOS if add_bos else 0) | (_native.TOKENIZE_SPECIAL if special else 0)
        capacity, n = len(data) + 8, c_size_t(0)
        while True:
            ids = (c_int32 * capacity)()
            code = lib.h2o_tokenize(self.handle, data, len(data), flags, ids, capacity, byref(n))
            if code == Status.BUFFER_TOO_SMALL and n.value > capacity:
                capacity = n.value
                continue
            check(code)
            return list(ids[: n.value])

    def detokenize_bytes(self, tokens: Sequence[int]) -> bytes:
        """The tokens' text as bytes (a character may be split across token boundaries)."""
        ids = (c_int32 * len(tokens))(*tokens)
        return _text_out(lambda buf, cap, n: lib.h2o_detokenize(self.handle, ids, len(tokens), buf, cap, byref(n)))

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The tokens' text; incomplete UTF-8 sequences become U+FFFD."""
        return self.detokenize_bytes(tokens).decode("utf-8", errors="replace")

    def token_to_piece(self, token: int) -> bytes:
        return _text_out(lambda buf, cap, n: lib.h2o_token_to_piece(self.handle, token, buf, cap, byref(n)))

    def is_end_of_generation(self, token: int) -> bool:
        return bool(lib.h2o_token_is_end_of_generation(self.handle, token))

    def format_chat(
        self,
        messages: Iterable[Union[Tuple[str, Text], Mapping[str, Text]]],
        *,
        format: Optional[str] = None,
        add_assistant_prefix: bool = True,
    ) -> str:
        """A conversation as the model's chat format expects it: messages are (role, content)
        pairs or {"role": ..., "content": ...} dicts. format: "chatml", "llama3", ... or None
        for the model's own. Feed the result with Session.add_text(..., special=True)."""
        pairs = [(m["role"], m["content"]) if isinstance(m, Mapping) else m for m in messages]
        encoded = [(_utf8(role), _utf8(content)) for role, content in pairs]
        array = (_native.ChatMessage * max(1, len(encoded)))()
        for i, (role, content) in enumerate(encoded):
            array[i] = _native.ChatMessage(role, len(role), content, len(content))
        name = format.encode() if format is not None else None
        out = _text_out(
            lambda buf, cap, n: lib.h2o_chat_format(self.handle, name, array, len(encoded), int(add_assistant_prefix), buf, cap, byref(n))
        )
        return out.decode("utf-8", errors="replace")

    def format_chat_with_tools(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        format: Optional[str] = None,
        add_assistant_prefix: bool = True,
    ) -> str:
        """A conversation with tools (OpenAI's shapes: "tools", an assistant's "tool_calls",
        role "tool" results with "tool_call_id") as the model's family writes it
        (h2o_chat_format_tools). Feed it with Session.add_text(..., special=True)."""
        data = _utf8(json.dumps(list(messages)))
        tools_data = _utf8(json.dumps(list(tools))) if tools else b""
        name = format.encode() if format is not None else None
        out = _text_out(
            lambda buf, cap, n: lib.h2o_chat_format_tools(
                self.handle, name, data, len(data), tools_data or None, len(tools_data), int(add_assistant_prefix), buf, cap, byref(n)
            )
        )
        return out.decode("utf-8", errors="replace")

    def tool_call_grammar(
        self, tools: Sequence[Mapping[str, Any]], tool_choice: str = "auto", *, parallel: bool = True, format: Optional[str] = None
    ) -> str:
        """The grammar (generate(grammar=...)) of a reply under tool_choice: "auto", "required" or
        a function's name (h2o_tool_call_grammar)."""
        data = _utf8(json.dumps(list(tools)))
        name = format.encode() if format is not None else None
        choice = tool_choice.encode()
        out = _text_out(
            lambda buf, cap, n: lib.h2o_tool_call_grammar(self.handle, name, data, len(data), choice, int(parallel), buf, cap, byref(n))
        )
        return out.decode("utf-8")

    def parse_tool_calls(self, reply: Text, *, id_salt: int = 0, format: Optional[str] = None) -> Dict[str, Any]:
        """A reply read back: {"content": text or None, "tool_calls": [{"id", "type", "function":
        {"name", "arguments"}}]} (h2o_parse_tool_calls)."""
        data = _utf8(reply)
        name = format.encode() if format is not None else None
        out = _text_out(lambda buf, cap, n: lib.h2o_parse_tool_calls(self.handle, name, data, len(data), id_salt, buf, cap, byref(n)))
        parsed: Dict[str, Any] = json.loads(out.decode("utf-8"))
        return parsed

    def session(self, **params: object) -> "Session":
        """A new session. Keyword arguments are h2o_session_params' fields (n_ctx, n_threads,
        n_batch, seed, kv_budget, kv_policy, kv_recent, kv_recent_ratio, kv_sinks,
        position_rolling, backend, device_index, kv_type, max_memory_bytes, kv_horizon, kv_overflow:
        "evict", the default, or "error"), policies,
        formats and backends by name or number, and experimental={name: value}."""
        sp = _session_params(params)
        handle = c_void_p()
        check(lib.h2o_session_create(self.handle, byref(sp), byref(handle)))
        return Session(self, handle.value)

    def load_session(self, state: Union[bytes, bytearray, memoryview], **params: object) -> "Session":
        """A session from Session.save_state()'s bytes, continuing exactly where that one was.
        The snapshot's cache settings win; params may give n_threads, backend, device_index and
        max_memory_bytes."""
        data = bytes(state)
        sp = _session_params(params)
        handle = c_void_p()
        check(lib.h2o_session_load_from_buffer(self.handle, data, len(data), byref(sp), byref(handle)))
        return Session(self, handle.value)

    def load_session_file(self, path: PathLike, **params: object) -> "Session":
        """load_session from a file written by Session.save()."""
        sp = _session_params(params)
        handle = c_void_p()
        check(lib.h2o_session_load(self.handle, _path(path), byref(sp), byref(handle)))
        return Session(self, handle.value)


_INTEGER_FIELDS = (
    "n_ctx",
    "n_threads",
    "n_batch",
    "seed",
    "kv_budget",
    "kv_recent",
    "kv_sinks",
    "device_index",
    "max_memory_bytes",
    "kv_horizon",
)


def _session_params(params: Mapping[str, object]) -> _native.SessionParams:
    sp = _native.SessionParams()
    check(lib.h2o_session_params_init(byref(sp), ctypes.sizeof(sp)))
    for key, value in params.items():
        if key in _INTEGER_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{key} must be an integer")
            if value < 0 and key != "device_index":
                raise ValueError(f"{key} must not be negative")
            setattr(sp, key, value)
        elif key == "kv_recent_ratio":
            sp.kv_recent_ratio = float(value)  # type: ignore[arg-type]
        elif key == "position_rolling":
            sp.position_rolling = int(bool(value))
        elif key == "kv_overflow":
            if value not in _OVERFLOWS:
                raise ValueError(f"kv_overflow must be 'evict' or 'error', not {value!r}")
            sp.kv_overflow = _OVERFLOWS[value]  # type: ignore[index]
        elif key == "kv_policy":
            sp.kv_policy = _enum_value(value, lib.h2o_kv_policy_from_name, key)
        elif key == "kv_type":
            sp.kv_type = _enum_value(value, lib.h2o_kv_type_from_name, key)
        elif key == "backend":
            sp.backend = _enum_value(value, lib.h2o_backend_kind_from_name, key)
        elif key == "experimental":
            for name, setting in dict(value).items():  # type: ignore[call-overload]
                exp_key = c_uint32(0)
                check(lib.h2o_experimental_from_name(str(name).encode(), byref(exp_key)))
                check(lib.h2o_session_params_set_experimental(byref(sp), exp_key.value, float(setting)))
        else:
            raise TypeError(f"unknown session parameter '{key}'")
    return sp


class Session(_Native):
    """A conversation with a fixed-size KV cache. A session runs one call at a time; cancel() may
    be called from any thread while another runs it. Use it as a context manager, or close()."""

    _kind = "session"

    def __init__(self, model: Model, handle: Optional[int]):
        self._model = model  # for tokenizing; the native session keeps the native model alive
        self._n_vocab = model.info.n_vocab
        self._event_callback: Any = None  # the ctypes callback on_event set, kept alive
        self._handle = handle

    @staticmethod
    def _free(handle: int) -> None:
        lib.h2o_session_free(handle)

    @property
    def model(self) -> Model:
        return self._model

    def _check(self, code: int) -> None:
        check(code, self._handle)

    def add_text(self, text: Text, *, pin: bool = False, special: bool = False) -> None:
        """Appends text without generating; pin=True keeps its tokens through every eviction."""
        data = _utf8(text)
        flags = (_native.TEXT_PIN if pin else 0) | (_native.TEXT_SPECIAL if special else 0)
        self._check(lib.h2o_session_add_text(self.handle, data, len(data), flags))

    def add_span_text(self, span_id: int, text: Text, *, min_share: float = 0.0, pin: bool = False, special: bool = False) -> None:
        """Appends text to retention span span_id (nonzero), which keeps at least
        floor(min_share * kv_budget) of its tokens in every (layer, kv head)."""
        data = _utf8(text)
        flags = (_native.TEXT_PIN if pin else 0) | (_native.TEXT_SPECIAL if special else 0)
        self._check(lib.h2o_session_add_span_text(self.handle, span_id, min_share, data, len(data), flags))

    def span_info(self, span_id: int) -> SpanInfo:
        info = _native.SpanInfo(struct_size=ctypes.sizeof(_native.SpanInfo))
        self._check(lib.h2o_session_get_span_info(self.handle, span_id, byref(info)))
        f = _fields(info)
        f["attention_share"] = f["attention_share"] if f["attention_share"] >= 0 else None
        return SpanInfo(**f)

    def stream(
        self,
        prompt: Text = "",
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        stop: Sequence[Text] = (),
        stop_at_eos: Optional[bool] = None,
        grammar: Optional[Text] = None,
        json_schema: Union[None, Text, Mapping[str, Any]] = None,
        logit_bias: Optional[Mapping[int, float]] = None,
    ) -> Iterator[str]:
        """Appends the prompt and yields the generated text piece by piece (whole characters);
        None: the library's default (max_tokens 256, temperature 0.8, top_k 40, top_p 0.95,
        min_p 0.05, no repeat penalty, stopping at end-of-generation tokens). `stop` strings end
        the generation and are not yielded. Leaving the loop early leaves the rest ungenerated.
        `grammar` (GBNF) or `json_schema` (its text or a dict) constrain the reply;
        `logit_bias` adds to tokens' logits (float("-inf") bans one). Session.stats tells why it
        stopped (stop_reason "grammar" when the grammar is complete)."""
        gp = _native.GenerateParams()
        check(lib.h2o_generate_params_init(byref(gp), ctypes.sizeof(gp)))
        for name, value in (
            ("max_tokens", max_tokens),
            ("temperature", temperature),
            ("top_k", top_k),
            ("top_p", top_p),
            ("min_p", min_p),
            ("repeat_penalty", repeat_penalty),
            ("repeat_last_n", repeat_last_n),
        ):
            if value is not None:
                setattr(gp, name, value)
        if stop_at_eos is not None:
            gp.stop_at_eos = int(stop_at_eos)
        stops = [_utf8(s) for s in stop]
        stop_array = (ctypes.c_char_p * max(1, len(stops)))(*stops)  # copied by h2o_generate_begin
        gp.stop_strings = ctypes.cast(stop_array, ctypes.POINTER(ctypes.c_char_p))
        gp.n_stop_strings = len(stops)
        if grammar is not None and json_schema is not None:
            raise ValueError("give grammar or json_schema, not both")
        constraint = b""
        if grammar is not None:
            constraint = _utf8(grammar)
            gp.grammar, gp.grammar_len = constraint, len(constraint)
        elif json_schema is not None:
            constraint = _utf8(json_schema if isinstance(json_schema, (str, bytes)) else json.dumps(json_schema))
            gp.json_schema, gp.json_schema_len = constraint, len(constraint)
        bias = dict(logit_bias or {})
        bias_tokens = (c_int32 * max(1, len(bias)))(*bias.keys())
        bias_values = (c_float * max(1, len(bias)))(*bias.values())
        gp.logit_bias_tokens, gp.logit_bias_values, gp.n_logit_bias = bias_tokens, bias_values, len(bias)
        data = _utf8(prompt)
        self._check(lib.h2o_generate_begin(self.handle, data, len(data), byref(gp)))
        return self._pieces()

    def _pieces(self) -> Iterator[str]:
        text, length, reason = c_void_p(), c_size_t(0), c_uint32(0)
        while True:
            self._check(lib.h2o_generate_next(self.handle, byref(text), byref(length), byref(reason)))
            if length.value:
                yield ctypes.string_at(text.value or 0, length.value).decode("utf-8", errors="replace")
            if reason.value != 0:
                return

    def generate(self, prompt: Text = "", **options: object) -> str:
        """stream(), joined: the whole reply."""
        return "".join(self.stream(prompt, **options))  # type: ignore[arg-type]

    def decode(self, tokens: Sequence[int]) -> None:
        """Runs the model over token ids appended to the session (then read logits())."""
        ids = (c_int32 * len(tokens))(*tokens)
        self._check(lib.h2o_session_decode(self.handle, ids, len(tokens)))

    def logits(self) -> List[float]:
        """The last processed token's logits, one per vocabulary entry."""
        n = self._n_vocab
        out = (c_float * n)()
        self._check(lib.h2o_session_get_logits(self.handle, out, n))
        return list(out)

    def cancel(self) -> None:
        """Makes the call running on this session (from another thread) raise Cancelled at its next
        batch boundary; what it processed stays, and the session stays usable."""
        self._check(lib.h2o_session_cancel(self.handle))

    def set_seed(self, seed: int) -> None:
        """Restarts the sampler's random generator from seed, as a session created with that seed
        starts it, and keeps the conversation (a per-request seed); reset() goes back to the
        session's own seed."""
        self._check(lib.h2o_session_set_seed(self.handle, seed))

    def reset(self) -> None:
        """Forgets the conversation (nothing is allocated or freed)."""
        self._check(lib.h2o_session_reset(self.handle))

    def save_state(self) -> bytes:
        """The whole conversation as bytes (a snapshot: Model.load_session continues it)."""
        bound = c_size_t(0)
        self._check(lib.h2o_session_state_size(self.handle, byref(bound)))
        buffer = ctypes.create_string_buffer(bound.value)
        size = c_size_t(0)
        self._check(lib.h2o_session_save_to_buffer(self.handle, buffer, bound.value, byref(size)))
        return buffer.raw[: size.value]

    def save(self, path: PathLike) -> None:
        """Writes the snapshot to a file, atomically (the file is the old one or the whole new one)."""
        self._check(lib.h2o_session_save(self.handle, _path(path)))

    def fork(self) -> "Session":
        """An independent copy of this session in its current state."""
        handle = c_void_p()
        self._check(lib.h2o_session_fork(self.handle, byref(handle)))
        return Session(self._model, handle.value)

    @property
    def kv_layout(self) -> KvLayout:
        layout = _native.KvLayout(struct_size=ctypes.sizeof(_native.KvLayout))
        self._check(lib.h2o_session_get_kv_layout(self.handle, byref(layout)))
        f = _fields(layout)
        f["policy"] = lib.h2o_kv_policy_name(f["policy"]).decode()
        f["type"] = lib.h2o_kv_type_name(f["type"]).decode()
        f["position_rolling"] = bool(f["position_rolling"])
        return KvLayout(**f)

    @property
    def kv_usage(self) -> KvUsage:
        """How many tokens the stream has had, the cache holds and has evicted, and since when."""
        usage = _native.KvUsage(struct_size=ctypes.sizeof(_native.KvUsage))
        self._check(lib.h2o_session_get_kv_usage(self.handle, byref(usage)))
        return _kv_usage(usage)

    def on_event(self, callback: Optional[Callable[[str, KvUsage], None]]) -> None:
        """Calls callback(event, usage) when the session reports an event: "kv_full" once per
        conversation, when its cache fills and starts to evict. It runs inside the call that
        caused it and must not use this session; an exception it raises is printed and dropped
        (it cannot cross the library). None removes it."""
        if callback is None:
            no_callback = _native.EventCallback(0)  # the NULL function pointer
            self._check(lib.h2o_session_set_event_callback(self.handle, no_callback, None))
            self._event_callback = None
            return

        handler = callback  # not None from here on (a closure does not keep the narrowing)

        def trampoline(event: int, usage: Any, _user: Any) -> None:
            try:
                handler(_EVENTS.get(event, str(event)), _kv_usage(usage.contents))
            except Exception:  # noqa: BLE001 - it must not unwind into C
                traceback.print_exc()

        native = _native.EventCallback(trampoline)
        self._check(lib.h2o_session_set_event_callback(self.handle, native, None))
        self._event_callback = native  # kept alive as long as the session may call it

    @property
    def memory(self) -> MemoryReport:
        report = _native.MemoryReport(struct_size=ctypes.sizeof(_native.MemoryReport))
        self._check(lib.h2o_session_memory(self.handle, byref(report)))
        return MemoryReport(**_fields(report))

    @property
    def stats(self) -> GenerateStats:
        """Of the last generation."""
        stats = _native.GenerateStats(struct_size=ctypes.sizeof(_native.GenerateStats))
        self._check(lib.h2o_session_get_stats(self.handle, byref(stats)))
        f = _fields(stats)
        f["stop_reason"] = _STOP_REASONS[f["stop_reason"]] if f["stop_reason"] < len(_STOP_REASONS) else str(f["stop_reason"])
        return GenerateStats(**f)

    @property
    def backend(self) -> BackendInfo:
        info = _native.BackendInfo(struct_size=ctypes.sizeof(_native.BackendInfo))
        self._check(lib.h2o_session_get_backend(self.handle, byref(info)))
        return BackendInfo._from(info)

    def experimental(self, name: str) -> float:
        """The value a research setting (h2o_experimental.h) resolved to in this session."""
        key = c_uint32(0)
        check(lib.h2o_experimental_from_name(name.encode(), byref(key)))
        value = c_double(0)
        self._check(lib.h2o_session_get_experimental(self.handle, key.value, byref(value)))
        return value.value


def json_schema_to_grammar(schema: Union[Text, Mapping[str, Any]]) -> str:
    """The GBNF grammar the library makes of a JSON schema (the subset h2o.h documents)."""
    data = _utf8(schema if isinstance(schema, (str, bytes)) else json.dumps(schema))
    return _text_out(lambda buf, cap, n: lib.h2o_json_schema_to_grammar(data, len(data), buf, cap, byref(n))).decode("utf-8")

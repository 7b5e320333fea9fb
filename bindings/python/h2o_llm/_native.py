"""The C API as ctypes sees it: the library, the structs of include/h2o/h2o.h and every function's
signature. Nothing here is public; the classes of the package wrap it.

The library is libh2o-llm.so.1 (the soname of ABI 1, the ABI these declarations describe), found
in this order: the folder $H2O_LIB_DIR, the system's loader (a Debian package or an install into
a folder the loader searches), and, when this package is used from a checkout, its build/ folder.
"""

import ctypes
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, List

ABI_VERSION = 1
LIBRARY_NAME = f"libh2o-llm.so.{ABI_VERSION}"
EXPERIMENTAL_CAPACITY = 16
MAX_SPANS = 32

TOKENIZE_ADD_BOS = 1
TOKENIZE_SPECIAL = 2
TOKENIZE_VOCAB_BOS = 4
TEXT_PIN = 1
TEXT_SPECIAL = 2
MODEL_TEXT_NAME = 0
MODEL_TEXT_CHAT_FORMAT = 1
MODEL_TEXT_ARCHITECTURE = 2
KV_HORIZON_NONE = 0xFFFFFFFF


def _candidates() -> List[str]:
    found = []
    lib_dir = os.environ.get("H2O_LIB_DIR")
    if lib_dir:
        found.append(str(Path(lib_dir) / LIBRARY_NAME))
    found.append(LIBRARY_NAME)  # the loader's search: packages, ldconfig'd prefixes, LD_LIBRARY_PATH
    checkout = Path(__file__).resolve().parents[3]  # bindings/python/h2o_llm -> the checkout
    if (checkout / "include" / "h2o" / "h2o.h").is_file():
        found.append(str(checkout / "build" / LIBRARY_NAME))
    return found


def _load() -> ctypes.CDLL:
    errors = []
    for candidate in _candidates():
        try:
            return ctypes.CDLL(candidate)
        except OSError as e:
            errors.append(f"{candidate}: {e}")
    raise ImportError(
        f"h2o_llm: cannot load {LIBRARY_NAME} (install the libh2o-llm{ABI_VERSION} package, or set H2O_LIB_DIR "
        "to the folder that holds it); tried:\n  " + "\n  ".join(errors)
    )


lib = _load()


class ModelParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("tokenizer_path", c_char_p),
        ("progress", c_void_p),
        ("progress_user_data", c_void_p),
        ("prefix_cache_bytes", c_uint64),
        ("prefix_cache_policy", c_uint32),
    ]


class ModelInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_vocab", c_uint32),
        ("n_ctx_train", c_uint32),
        ("n_embd", c_uint32),
        ("n_layer", c_uint32),
        ("n_head", c_uint32),
        ("n_head_kv", c_uint32),
        ("n_ff", c_uint32),
        ("head_dim", c_uint32),
        ("bos_token", c_int32),
        ("eos_token", c_int32),
        ("n_params", c_uint64),
        ("weight_bytes", c_uint64),
    ]


class PrefixCacheStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("entries", c_uint32),
        ("bytes", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
    ]


class ChatMessage(Structure):
    _fields_ = [
        ("role", c_char_p),
        ("role_len", c_size_t),
        ("content", c_char_p),
        ("content_len", c_size_t),
    ]


class BackendInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_uint32),
        ("device_index", c_int32),
        ("name", c_char * 128),
        ("device_type", c_char * 16),
        ("memory_bytes", c_uint64),
    ]


class KvPolicyInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("policy", c_uint32),
        ("name", c_char_p),
        ("gathers_statistics", c_int32),
        ("has_recent_window", c_int32),
        ("keeps_sinks", c_int32),
        ("default_recent_ratio", c_float),
        ("default_horizon", c_float),
    ]


class SessionParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_ctx", c_uint32),
        ("n_threads", c_uint32),
        ("n_batch", c_uint32),
        ("seed", c_uint64),
        ("kv_budget", c_uint32),
        ("kv_policy", c_uint32),
        ("kv_recent", c_uint32),
        ("kv_recent_ratio", c_float),
        ("kv_sinks", c_uint32),
        ("position_rolling", c_int32),
        ("backend", c_uint32),
        ("device_index", c_int32),
        ("kv_type", c_uint32),
        ("max_memory_bytes", c_uint64),
        ("kv_horizon", c_uint32),
        ("experimental", c_double * EXPERIMENTAL_CAPACITY),
        ("kv_overflow", c_uint32),
    ]


class KvLayout(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("budget", c_uint32),
        ("policy", c_uint32),
        ("recent", c_uint32),
        ("sinks", c_uint32),
        ("heavy", c_uint32),
        ("position_rolling", c_int32),
        ("type", c_uint32),
        ("n_ctx", c_uint32),
        ("horizon", c_uint32),
        ("min_layer_budget", c_uint32),
        ("max_layer_budget", c_uint32),
        ("min_head_budget", c_uint32),
    ]


class DeviceTraffic(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("bytes_to_device", c_uint64),
        ("bytes_to_host", c_uint64),
        ("submissions", c_uint64),
        ("device_memory_bytes", c_uint64),
    ]


class MemoryReport(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("weight_bytes", c_uint64),
        ("kv_bytes", c_uint64),
        ("scratch_bytes", c_uint64),
    ]


class SpanInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("span_id", c_uint32),
        ("min_share", c_float),
        ("min_tokens", c_int32),
        ("n_tokens", ctypes.c_int64),
        ("kept_min", c_int32),
        ("kept_max", c_int32),
        ("kept_mean", c_double),
        ("attention_share", c_double),
    ]


class GenerateParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_tokens", c_uint32),
        ("temperature", c_float),
        ("top_k", c_uint32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("repeat_penalty", c_float),
        ("repeat_last_n", c_uint32),
        ("stop_strings", POINTER(c_char_p)),
        ("n_stop_strings", c_size_t),
        ("stop_at_eos", c_int32),
        ("grammar", c_char_p),
        ("grammar_len", c_size_t),
        ("json_schema", c_char_p),
        ("json_schema_len", c_size_t),
        ("logit_bias_tokens", POINTER(c_int32)),
        ("logit_bias_values", POINTER(c_float)),
        ("n_logit_bias", c_size_t),
    ]


class KvUsage(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("capacity", c_uint32),
        ("n_past", c_uint64),
        ("n_held", c_uint64),
        ("n_evicted", c_uint64),
        ("n_pinned", c_uint64),
        ("evicting_since", c_uint64),
        ("evicts", c_int32),
    ]


class GenerateStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_prompt_tokens", c_uint32),
        ("n_generated_tokens", c_uint32),
        ("stop_reason", c_uint32),
        ("n_past", c_uint64),
        ("prompt_seconds", c_double),
        ("generate_seconds", c_double),
    ]


# Every struct of the header, by its C name (the layout test compares each with a C compiler's).
STRUCTS = {
    "h2o_model_params": ModelParams,
    "h2o_model_info": ModelInfo,
    "h2o_prefix_cache_stats": PrefixCacheStats,
    "h2o_chat_message": ChatMessage,
    "h2o_backend_info": BackendInfo,
    "h2o_kv_policy_info": KvPolicyInfo,
    "h2o_session_params": SessionParams,
    "h2o_kv_layout": KvLayout,
    "h2o_kv_usage": KvUsage,
    "h2o_device_traffic": DeviceTraffic,
    "h2o_memory_report": MemoryReport,
    "h2o_span_info": SpanInfo,
    "h2o_generate_params": GenerateParams,
    "h2o_generate_stats": GenerateStats,
}

ProgressCallback = CFUNCTYPE(c_int, c_float, c_void_p)
EventCallback = CFUNCTYPE(None, c_uint32, POINTER(KvUsage), c_void_p)

status = c_int  # h2o_status
model_p = c_void_p
session_p = c_void_p
sizep = POINTER(c_size_t)
u32p = POINTER(c_uint32)


def _declare(name: str, restype: Any, *argtypes: Any) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_declare("h2o_version", c_char_p)
_declare("h2o_version_number", c_uint32)
_declare("h2o_status_string", c_char_p, c_int32)
_declare("h2o_last_error", c_char_p)
_declare("h2o_model_params_init", status, POINTER(ModelParams), c_size_t)
_declare("h2o_model_load", status, c_char_p, POINTER(ModelParams), POINTER(model_p))
_declare("h2o_model_free", None, model_p)
_declare("h2o_model_get_info", status, model_p, POINTER(ModelInfo))
_declare("h2o_model_get_prefix_cache_stats", status, model_p, POINTER(PrefixCacheStats))
_declare("h2o_model_get_text", status, model_p, c_uint32, c_void_p, c_size_t, sizep)
_declare("h2o_tokenize", status, model_p, c_char_p, c_size_t, c_uint32, POINTER(c_int32), c_size_t, sizep)
_declare("h2o_detokenize", status, model_p, POINTER(c_int32), c_size_t, c_void_p, c_size_t, sizep)
_declare("h2o_token_to_piece", status, model_p, c_int32, c_void_p, c_size_t, sizep)
_declare("h2o_token_is_end_of_generation", c_int, model_p, c_int32)
_declare("h2o_chat_format", status, model_p, c_char_p, POINTER(ChatMessage), c_size_t, c_int, c_void_p, c_size_t, sizep)
_declare("h2o_backend_count", status, sizep)
_declare("h2o_backend_get_info", status, c_size_t, POINTER(BackendInfo))
_declare("h2o_backend_kind_name", c_char_p, c_uint32)
_declare("h2o_backend_kind_from_name", status, c_char_p, u32p)
_declare("h2o_kv_policy_name", c_char_p, c_uint32)
_declare("h2o_kv_policy_from_name", status, c_char_p, u32p)
_declare("h2o_kv_policy_get_info", status, c_uint32, POINTER(KvPolicyInfo))
_declare("h2o_kv_type_name", c_char_p, c_uint32)
_declare("h2o_kv_type_from_name", status, c_char_p, u32p)
_declare("h2o_experimental_name", c_char_p, c_uint32)
_declare("h2o_experimental_from_name", status, c_char_p, u32p)
_declare("h2o_experimental_bounds", status, c_uint32, POINTER(c_double), POINTER(c_double))
_declare("h2o_session_params_init", status, POINTER(SessionParams), c_size_t)
_declare("h2o_session_params_set_experimental", status, POINTER(SessionParams), c_uint32, c_double)
_declare("h2o_session_params_get_experimental", status, POINTER(SessionParams), c_uint32, POINTER(c_double))
_declare("h2o_session_create", status, model_p, POINTER(SessionParams), POINTER(session_p))
_declare("h2o_session_free", None, session_p)
_declare("h2o_session_get_experimental", status, session_p, c_uint32, POINTER(c_double))
_declare("h2o_session_get_backend", status, session_p, POINTER(BackendInfo))
_declare("h2o_session_get_device_traffic", status, session_p, POINTER(DeviceTraffic))
_declare("h2o_session_get_kv_layout", status, session_p, POINTER(KvLayout))
_declare("h2o_session_get_kv_usage", status, session_p, POINTER(KvUsage))
_declare("h2o_session_set_event_callback", status, session_p, EventCallback, c_void_p)
_declare("h2o_session_reset", status, session_p)
_declare("h2o_session_cancel", status, session_p)
_declare("h2o_session_set_seed", status, session_p, c_uint64)
_declare("h2o_session_last_error", c_char_p, session_p)
_declare("h2o_session_memory", status, session_p, POINTER(MemoryReport))
_declare("h2o_session_add_text", status, session_p, c_char_p, c_size_t, c_uint32)
_declare("h2o_session_add_span_text", status, session_p, c_uint32, c_float, c_char_p, c_size_t, c_uint32)
_declare("h2o_session_get_span_info", status, session_p, c_uint32, POINTER(SpanInfo))
_declare("h2o_session_save", status, session_p, c_char_p)
_declare("h2o_session_load", status, model_p, c_char_p, POINTER(SessionParams), POINTER(session_p))
_declare("h2o_session_state_size", status, session_p, sizep)
_declare("h2o_session_save_to_buffer", status, session_p, c_void_p, c_size_t, sizep)
_declare("h2o_session_load_from_buffer", status, model_p, c_char_p, c_size_t, POINTER(SessionParams), POINTER(session_p))
_declare("h2o_session_fork", status, session_p, POINTER(session_p))
_declare("h2o_generate_params_init", status, POINTER(GenerateParams), c_size_t)
_declare("h2o_generate_begin", status, session_p, c_char_p, c_size_t, POINTER(GenerateParams))
_declare("h2o_generate_next", status, session_p, POINTER(ctypes.c_void_p), sizep, u32p)
_declare("h2o_session_get_stats", status, session_p, POINTER(GenerateStats))
_declare("h2o_session_decode", status, session_p, POINTER(c_int32), c_size_t)
_declare("h2o_session_get_logits", status, session_p, POINTER(c_float), c_size_t)
_declare("h2o_json_schema_to_grammar", status, c_char_p, c_size_t, c_void_p, c_size_t, sizep)
_declare("h2o_chat_format_tools", status, model_p, c_char_p, c_char_p, c_size_t, c_char_p, c_size_t, c_int, c_void_p, c_size_t, sizep)
_declare("h2o_tool_call_grammar", status, model_p, c_char_p, c_char_p, c_size_t, c_char_p, c_int, c_void_p, c_size_t, sizep)
_declare("h2o_parse_tool_calls", status, model_p, c_char_p, c_char_p, c_size_t, c_uint64, c_void_p, c_size_t, sizep)

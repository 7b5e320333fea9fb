"""h2o: Llama-family language models in constant memory (ctypes over the C library).

    import h2o_llm as h2o
    with h2o.Model("model.gguf") as model, model.session(kv_budget=256, position_rolling=True) as s:
        s.add_text("You are a helpful assistant.", pin=True)
        print(s.generate(" Hello!", max_tokens=32, temperature=0))

Every failed call raises H2oError (Cancelled for a cancelled call) with the library's status and
message. The interface follows include/h2o/h2o.h, whose comments say what each call does.
"""

from ._api import (
    BackendInfo,
    GenerateStats,
    KvLayout,
    KvUsage,
    MemoryReport,
    Model,
    ModelInfo,
    Session,
    SpanInfo,
    backends,
    experimental_bounds,
    experimental_names,
    json_schema_to_grammar,
    kv_policies,
    kv_types,
    version,
)
from ._errors import Cancelled, H2oError, Status

__version__ = "0.7.0"

__all__ = [
    "BackendInfo",
    "Cancelled",
    "GenerateStats",
    "H2oError",
    "KvLayout",
    "KvUsage",
    "MemoryReport",
    "Model",
    "ModelInfo",
    "Session",
    "SpanInfo",
    "Status",
    "backends",
    "experimental_bounds",
    "experimental_names",
    "json_schema_to_grammar",
    "kv_policies",
    "kv_types",
    "version",
]

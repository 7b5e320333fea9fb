"""Streams a story piece by piece: python stream.py [MODEL.gguf] [PROMPT]"""

import os
import sys

import h2o_llm as h2o

path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("H2O_MODEL", "../shared/models/stories260K.gguf")
prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"
with h2o.Model(path) as model, model.session(kv_budget=128, position_rolling=True) as session:
    print(prompt, end="", flush=True)
    for piece in session.stream(prompt, max_tokens=128, temperature=0.8):
        print(piece, end="", flush=True)
    print()
    stats = session.stats
    print(f"[{stats.n_generated_tokens} tokens, stopped by {stats.stop_reason}]", file=sys.stderr)

"""A constant-memory assistant: python chat.py [MODEL.gguf], one user turn per line on stdin.
The KV cache has a fixed budget, the instructions are pinned so eviction never drops them, and
position rolling lets the conversation go on without end. Ctrl-C cancels the current reply."""

import os
import signal
import sys
import threading

import h2o_llm as h2o

SYSTEM = "You are a friendly storyteller. You answer with short, happy stories.\n"

path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("H2O_MODEL", "../shared/models/stories260K.gguf")
with h2o.Model(path) as model, model.session(kv_budget=256, kv_policy="scissorhands", position_rolling=True) as session:
    session.add_text(SYSTEM, pin=True)
    replying = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        if not replying.is_set():
            raise KeyboardInterrupt
        session.cancel()  # the reply stops at the next token; the conversation goes on

    signal.signal(signal.SIGINT, on_interrupt)
    for line in sys.stdin:
        replying.set()
        try:
            for piece in session.stream(f"\nUser: {line.strip()}\nAssistant:", max_tokens=200, temperature=0.7, stop=["\nUser:"]):
                print(piece, end="", flush=True)
        except h2o.Cancelled:
            print(" [stopped]", end="")
        finally:
            replying.clear()
        print()

#!/usr/bin/env python3
"""h2o-server's costs, measured against the library itself on the same model and threads:

  scripts/bench-server.py --build BUILD_DIR --model MODEL [--format NAME] [--threads T]
                          [--streams 8] [--tokens 64] [--rounds 5] [--history 2000]

1. Overhead: aggregate tokens/s of --streams concurrent streamed conversations through the server
   (generation only: from each stream's first token to its last) against h2o-bench's decoding
   speed (-p 0 -n TOKENS), the two interleaved round by round.
2. Resuming: time to the first token of a conversation with --history tokens behind it, restored
   from its snapshot (it lost its session to another conversation), against a fresh conversation
   reading the same history.
Prints the median and the spread (min..max) of each."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
from server_harness import Server  # noqa: E402


def streamed(srv, model_id, messages, max_tokens, conversation_id=None):
    """(seconds to the first token, seconds from the first token to the last, tokens) of one streamed reply."""
    body = {"model": model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if conversation_id:
        body["conversation_id"] = conversation_id
    req = urllib.request.Request(srv.base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    start, first, last, tokens = time.perf_counter(), None, None, 0
    with urllib.request.urlopen(req, timeout=3600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    return first - start, last - first, tokens, first, last


def bench_decode(args):
    """h2o-bench's decoding speed (tokens/s) for --tokens tokens."""
    out = subprocess.run([os.path.join(args.build, "tools", "h2o-bench"), "-m", args.model, "-p", "0", "-n", str(args.tokens), "-r", "1",
                          "-t", str(args.threads), "--kv-budget", str(args.budget), "--rolling", "--json"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        row = json.loads(line)
        if row.get("test", "").startswith("tg"):
            return row["tokens_per_second"]["median"]
    raise RuntimeError("no decoding figure in h2o-bench's output:\n" + out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--format", default="chatml")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--history", type=int, default=2000)
    args = p.parse_args()
    server_bin = os.path.join(args.build, "tools", "h2o-server")
    model_id = os.path.basename(args.model)[:-5] if args.model.endswith(".gguf") else os.path.basename(args.model)
    common = ["--chat-format", args.format, "--kv-budget", str(args.budget), "-t", str(args.threads)]

    print("1. %d concurrent streams of %d tokens through the server against h2o-bench -n %d (%d threads, budget %d)"
          % (args.streams, args.tokens, args.tokens, args.threads, args.budget))
    ratios, served, direct = [], [], []
    srv = Server(server_bin, args.model, *common, "--sessions", str(args.streams), "--queue", str(4 * args.streams))
    try:
        for r in range(args.rounds):
            bench = bench_decode(args)
            results = [None] * args.streams

            def one(i):
                messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Story %d of round %d." % (i, r)}]
                results[i] = streamed(srv, model_id, messages, args.tokens)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(args.streams)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            total = sum(x[2] for x in results)
            span = max(x[4] for x in results) - min(x[3] for x in results)
            through = total / span
            served.append(through)
            direct.append(bench)
            ratios.append(through / bench)
            print("   round %d: h2o-bench %.2f tok/s, server %.2f tok/s (%d tokens in %.2f s): %.3f" % (r + 1, bench, through, total, span, through / bench),
                  flush=True)
    finally:
        srv.stop()
    print("   server / h2o-bench: median %.3f (%.3f..%.3f); overhead %.1f%%" % (statistics.median(ratios), min(ratios), max(ratios),
                                                                            100 * (1 - statistics.median(ratios))))

    print("2. time to first token with %d tokens of history: restored from its snapshot against read again" % args.history)
    state = "/tmp/h2o-bench-server-state-%d" % os.getpid()
    srv = Server(server_bin, args.model, *common, "--sessions", "1", "--state-dir", state)
    try:
        words = ("Once upon a time there was a little cat who liked to play in the garden with a red ball. " * 400).split()
        # The history: a user message of about --history tokens (checked by the usage figures).
        n = len(words)
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            st, body = srv.request("POST", "/v1/chat/completions", {"model": model_id, "max_tokens": 1, "temperature": 0,
                                                                     "messages": [{"role": "user", "content": " ".join(words[:mid])}],
                                                                     "conversation_id": "probe"})
            if body["usage"]["prompt_tokens"] < args.history:
                lo = mid + 1
            else:
                hi = mid
        history = [{"role": "user", "content": " ".join(words[:lo])}]
        restored, reread = [], []
        for r in range(args.rounds):
            cid = "resume-%d" % r
            st, body = srv.request("POST", "/v1/chat/completions", {"model": model_id, "max_tokens": 4, "temperature": 0,
                                                                     "messages": history, "conversation_id": cid})
            turn = history + [{"role": "assistant", "content": body["choices"][0]["message"]["content"]}, {"role": "user", "content": "And then?"}]
            srv.request("POST", "/v1/chat/completions", {"model": model_id, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                                                        "conversation_id": "other"})  # takes the only session
            restored.append(streamed(srv, model_id, turn, 1, cid)[0])
            reread.append(streamed(srv, model_id, turn, 1, "fresh-%d" % r)[0])
            print("   round %d: restored %.3f s, read again %.3f s: %.3f" % (r + 1, restored[-1], reread[-1], restored[-1] / reread[-1]), flush=True)
    finally:
        srv.stop()
        subprocess.run(["rm", "-rf", state])
    ratios = [a / b for a, b in zip(restored, reread)]
    print("   restored / read again: median %.3f (%.3f..%.3f)" % (statistics.median(ratios), min(ratios), max(ratios)))


if __name__ == "__main__":
    main()

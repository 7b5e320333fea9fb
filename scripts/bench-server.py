#!/usr/bin/env python3
"""h2o-server's costs, measured against the library itself on the same model and threads:

  scripts/bench-server.py --build BUILD_DIR --model MODEL [--format NAME] [--threads T]
                          [--streams 8] [--tokens 64] [--rounds 5] [--history 2000]

1. Overhead: aggregate tokens/s of --streams concurrent streamed conversations through the server
   while all of them are generating (from the last stream's first piece to the first stream's
   last; pieces counted as tokens) against h2o-bench's decoding speed (-p 0 -n TOKENS) measured
   just before and just after it, round by round.
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
    """(seconds to the first token, the arrival time of each piece of text) of one streamed reply."""
    body = {"model": model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if conversation_id:
        body["conversation_id"] = conversation_id
    req = urllib.request.Request(srv.base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    start, arrivals = time.perf_counter(), []
    with urllib.request.urlopen(req, timeout=3600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
    return arrivals[0] - start, arrivals


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
    p.add_argument("--skip-resume", action="store_true", help="measure the overhead only")
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
            before = bench_decode(args)
            results = [None] * args.streams

            def one(i):
                messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Story %d of round %d." % (i, r)}]
                results[i] = streamed(srv, model_id, messages, args.tokens)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(args.streams)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # The window in which every stream is generating: no prompt is being read in it.
            begin = max(arrivals[0] for _, arrivals in results)
            end = min(arrivals[-1] for _, arrivals in results)
            total = sum(sum(1 for t in arrivals if begin < t <= end) for _, arrivals in results)
            span = end - begin
            if span <= 0:
                sys.exit("   the streams never generated at once (a compute slice holds a whole reply): give more --tokens")
            through = total / span
            # h2o-bench before and after the server's round: the machine's drift cancels.
            bench = (before + bench_decode(args)) / 2
            served.append(through)
            direct.append(bench)
            ratios.append(through / bench)
            print("   round %d: h2o-bench %.2f tok/s, server %.2f tok/s (%d tokens in %.2f s): %.3f" % (r + 1, bench, through, total, span, through / bench),
                  flush=True)
    finally:
        srv.stop()
    print("   server / h2o-bench: median %.3f (%.3f..%.3f); overhead %.1f%%" % (statistics.median(ratios), min(ratios), max(ratios),
                                                                            100 * (1 - statistics.median(ratios))))

    if args.skip_resume:
        return
    print("2. time to first token with %d tokens of history: restored from its snapshot against read again" % args.history)
    state = "/tmp/h2o-bench-server-state-%d" % os.getpid()
    # No prefix cache: reading the history again must read it.
    srv = Server(server_bin, args.model, *common, "--sessions", "1", "--state-dir", state, "--prefix-cache", "0")
    try:
        words = ("Once upon a time there was a little cat who liked to play in the garden with a red ball. " * 400).split()
        # The history: a user message of about --history tokens (the text repeats, so tokens
        # per word are steady: one probe of 200 words gives the count).
        def prompt_tokens(n_words):
            st, body = srv.request("POST", "/v1/chat/completions", {"model": model_id, "max_tokens": 1, "temperature": 0,
                                                                     "messages": [{"role": "user", "content": " ".join(words[:n_words])}],
                                                                     "conversation_id": "probe"})
            return body["usage"]["prompt_tokens"]
        lo = min(len(words), int(200 * args.history / prompt_tokens(200)))
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

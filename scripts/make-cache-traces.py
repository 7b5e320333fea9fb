#!/usr/bin/env python3
"""Writes synthetic request traces for h2o-cache-replay (tools/server/cache_replay.cpp).

Usage: scripts/make-cache-traces.py OUT_DIR [--seed N]

Three traces, one request per line ({"t", "conversation", "named", "system", "system_tokens",
"history_tokens", "new_tokens", "reply_tokens"}):

  chat.jsonl     after the consumer trace (Trace A) of "KVCache Cache in the Wild" (Wang et al.,
                 USENIX ATC '25), at one user's scale: conversations of a chat front-end (named),
                 the gap between turns exponential with 80% of reuses within 10 minutes (the
                 paper's figure for Trace A: a mean of 600 / ln 5 = 373 s), a few shared system
                 prompts. Not from the paper (it gives no such figure in the parts used here):
                 a new conversation every 3 minutes on average and 3 turns per conversation on
                 average (geometric).
  api.jsonl      after its business trace (Trace B): single-turn requests (unnamed) through the
                 API, 80% of a template's reuses within 10 seconds (the paper's figure for Trace
                 B), templates of 200-2000 tokens chosen by a Zipf law (our choice: 16 templates,
                 a request every 8 s on average).
  desktop.jsonl  a desktop's day as we expect one (no recording of real use exists): three long
                 conversations worked on in bursts (turns 90 s apart on average, breaks of 30-90
                 minutes between bursts), one-shot requests from apps every 2 minutes on average
                 with two shared system prompts, and a short named chat every 20 minutes.

Token counts are log-normal: a user's message 40 tokens at the median, a reply 120.
"""
import argparse
import json
import math
import os
import random


def tokens(rng, median, sigma=0.8, low=4, high=4000):
    return int(min(high, max(low, rng.lognormvariate(math.log(median), sigma))))


def zipf_choice(rng, n, s=1.2):
    weights = [1 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def conversation_requests(rng, cid, start, turns, gap, named, system, system_tokens):
    """The requests of one conversation: its turns, gap() seconds apart."""
    out, t, history = [], start, 0
    for _ in range(turns):
        new, reply = tokens(rng, 40), tokens(rng, 120)
        out.append({"t": round(t, 3), "conversation": cid, "named": named, "system": system, "system_tokens": system_tokens,
                    "history_tokens": history, "new_tokens": new, "reply_tokens": reply})
        history += new + reply
        t += gap()
    return out


def chat_trace(rng, hours=8):
    mean_gap = 600 / math.log(5)  # 80% of reuses within 10 minutes
    prompts = [rng.randint(150, 400) for _ in range(4)]
    requests, t, n = [], 0.0, 0
    while t < hours * 3600:
        t += rng.expovariate(1 / 180)
        turns = 1 + int(rng.expovariate(1 / 2))  # geometric-like, mean 3
        k = zipf_choice(rng, len(prompts))
        requests += conversation_requests(rng, "chat-%d" % n, t, turns, lambda: rng.expovariate(1 / mean_gap), True, "sys-%d" % k,
                                          prompts[k])
        n += 1
    return requests


def api_trace(rng, hours=2):
    templates = [rng.randint(200, 2000) for _ in range(16)]
    requests, t, n = [], 0.0, 0
    while t < hours * 3600:
        t += rng.expovariate(1 / 8)
        k = zipf_choice(rng, len(templates))
        requests.append({"t": round(t, 3), "conversation": "api-%d" % n, "named": False, "system": "tpl-%d" % k,
                         "system_tokens": templates[k], "history_tokens": 0, "new_tokens": tokens(rng, 120, high=1500),
                         "reply_tokens": tokens(rng, 120)})
        n += 1
    return requests


def desktop_trace(rng, hours=10):
    end = hours * 3600
    requests = []
    # Three long conversations, each in bursts of 5-15 turns with breaks between.
    for c in range(3):
        t, history, turn = rng.uniform(0, 1800), 0, 0
        while t < end and turn < 60:
            for _ in range(rng.randint(5, 15)):
                new, reply = tokens(rng, 40), tokens(rng, 120)
                requests.append({"t": round(t, 3), "conversation": "long-%d" % c, "named": True, "system": "assistant",
                                 "system_tokens": 300, "history_tokens": history, "new_tokens": new, "reply_tokens": reply})
                history += new + reply
                turn += 1
                t += rng.expovariate(1 / 90)
            t += rng.uniform(1800, 5400)
    # One-shot requests from apps, with two shared system prompts.
    t, n = 0.0, 0
    while t < end:
        t += rng.expovariate(1 / 120)
        k = rng.randint(0, 1)
        requests.append({"t": round(t, 3), "conversation": "app-%d" % n, "named": False, "system": "app-%d" % k,
                         "system_tokens": 500, "history_tokens": 0, "new_tokens": tokens(rng, 200, high=2000),
                         "reply_tokens": tokens(rng, 80)})
        n += 1
    # Short named chats.
    t, n = 0.0, 0
    while t < end:
        t += rng.expovariate(1 / 1200)
        requests += conversation_requests(rng, "short-%d" % n, t, rng.randint(2, 3), lambda: rng.expovariate(1 / 60), True,
                                          "assistant", 300)
        n += 1
    return [r for r in requests if r["t"] < end]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for name, make in (("chat", chat_trace), ("api", api_trace), ("desktop", desktop_trace)):
        rng = random.Random("%s-%d" % (name, args.seed))
        requests = sorted(make(rng), key=lambda r: r["t"])
        path = os.path.join(args.out_dir, name + ".jsonl")
        with open(path, "w") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
        print("%s: %d requests, %d conversations" % (path, len(requests), len({r["conversation"] for r in requests})))


if __name__ == "__main__":
    main()

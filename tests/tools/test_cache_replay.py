"""h2o-cache-replay on the traces scripts/make-cache-traces.py writes: the table for both policies,
the workload-aware policy ahead of LRU where its categories tell conversations apart (the desktop
trace: long named conversations among one-shot requests, at two live sessions), and clear errors
for bad traces.

Usage: test_cache_replay.py H2O_CACHE_REPLAY SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile


def check(condition, message):
    if not condition:
        print("FAIL: " + message)
        sys.exit(1)


def table(replay, *args):
    result = subprocess.run([replay, *args], capture_output=True, text=True, timeout=120)
    check(result.returncode == 0, "h2o-cache-replay %s: %s" % (" ".join(args), result.stderr))
    rows = {}
    for line in result.stdout.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1], cells[2], cells[3])] = cells
    return rows


def main():
    replay, source = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, os.path.join(source, "scripts", "make-cache-traces.py"), work, "--seed", "1"], check=True,
                       capture_output=True)
        traces = [os.path.join(work, name + ".jsonl") for name in ("desktop", "chat", "api")]
        rows = table(replay, *traces, "--sessions", "2,4", "--prefix-cache-mib", "4,64")
        check(len(rows) == 3 * 2 * 2 * 2, "rows: %d" % len(rows))
        mean = lambda key: float(rows[key][6])
        lru, reuse = ("desktop.jsonl", "2", "64 MiB", "lru"), ("desktop.jsonl", "2", "64 MiB", "reuse")
        check(mean(reuse) < 0.85 * mean(lru), "desktop at 2 sessions: reuse %s s against LRU %s s" % (mean(reuse), mean(lru)))
        # A larger prefix cache holds more system prompts, under either policy.
        for policy in ("lru", "reuse"):
            small, large = ("desktop.jsonl", "2", "4 MiB", policy), ("desktop.jsonl", "2", "64 MiB", policy)
            check(float(rows[large][5].rstrip("%")) > float(rows[small][5].rstrip("%")), "prefix hits %s" % policy)
        # One-shot requests only: where no template fits the prefix cache, the same figures; where
        # some do, the reuse policy keeps the templates used most.
        check(rows[("api.jsonl", "4", "4 MiB", "lru")][4:8] == rows[("api.jsonl", "4", "4 MiB", "reuse")][4:8], "api trace")
        api_lru, api_reuse = ("api.jsonl", "2", "64 MiB", "lru"), ("api.jsonl", "2", "64 MiB", "reuse")
        check(mean(api_reuse) < mean(api_lru), "api at 64 MiB: reuse %s s against LRU %s s" % (mean(api_reuse), mean(api_lru)))
        print("desktop, 2 sessions, 64 MiB: lru %.3f s, reuse %.3f s" % (mean(lru), mean(reuse)))

        bad = os.path.join(work, "bad.jsonl")
        for content, message in (('{"t": 1, "conversation": "a"}\n{"t": 0, "conversation": "b"}\n', "bad.jsonl:2: requests must come in time order"),
                                 ('{"t": 1}\n', "bad.jsonl:1: \"conversation\" must be a string"),
                                 ('{"t": 1, "conversation": "a", "new_tokens": -3}\n', "bad.jsonl:1: \"new_tokens\" must be a whole number"),
                                 ("not json\n", "bad.jsonl:1: not a JSON object")):
            with open(bad, "w") as f:
                f.write(content)
            result = subprocess.run([replay, bad], capture_output=True, text=True)
            check(result.returncode != 0 and message in result.stderr, "%r: %s" % (content, result.stderr))
        result = subprocess.run([replay, traces[0], "--sessions", "0"], capture_output=True, text=True)
        check(result.returncode != 0 and "--sessions" in result.stderr, result.stderr)
        result = subprocess.run([replay, os.path.join(work, "missing.jsonl")], capture_output=True, text=True)
        check(result.returncode != 0 and "cannot read" in result.stderr, result.stderr)
    print("ok")


if __name__ == "__main__":
    main()

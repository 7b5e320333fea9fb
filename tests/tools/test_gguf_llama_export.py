#!/usr/bin/env python3
"""The training tools' GGUF export (tools/train/gguf_writer.py) against h2o: a tiny llama with
random weights, written as the trainer writes its model, must score a text in h2o-eval (full
cache, F32) as an independent float64 forward pass here does. That checks the conventions the
trainer relies on: GGUF's dimension order, rotary positions on adjacent pairs, grouped-query
heads, RMSNorm's epsilon, the byte-fallback vocabulary with no space prefix.

    test_gguf_llama_export.py H2O_EVAL
"""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from gguf_writer import LlamaShape, llama_layer_tensors, write_llama  # noqa: E402

SHAPE = LlamaShape(dim=16, layers=2, heads=4, kv_heads=2, ff=24, vocab=260, context=64, rope_base=10000.0, eps=1e-5)
CHUNK = 24  # BOS + 23 tokens
SPACE, SPACE_ID = "\u2581", 259
TEXT = "The cache keeps what matters; the rest goes.\nA second line, with digits 0123.\n"


def random_tensors(rng):
    def matrix(shape, scale):
        n = math.prod(shape)
        if len(shape) == 1:  # norm weights around 1
            values = [1.0 + rng.gauss(0, 0.1) for _ in range(n)]
        else:
            values = [rng.gauss(0, scale) for _ in range(n)]
        return shape, values

    t = {"token_embd.weight": matrix((SHAPE.vocab, SHAPE.dim), 1.0)}
    for i in range(SHAPE.layers):
        for name, shape in llama_layer_tensors(SHAPE):
            t[f"blk.{i}.{name}.weight"] = matrix(shape, 0.5)
    t["output_norm.weight"] = matrix((SHAPE.dim,), 0)
    t["output.weight"] = matrix((SHAPE.vocab, SHAPE.dim), 0.5)
    return t


def vocabulary():
    # <unk>, <s>, </s>, the 256 byte tokens, and sentencepiece's space mark: every space is that
    # piece and every other character its UTF-8 bytes.
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [SPACE]
    return pieces, [0.0] * len(pieces), [2, 3, 3] + [6] * 256 + [1]


def encode(text):
    return [SPACE_ID if b == 0x20 else 3 + b for b in text.encode("utf-8")]


def rows(tensor):
    shape, values = tensor
    return [values[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]


def matvec(w, x):
    return [sum(a * b for a, b in zip(row, x)) for row in w]


def rms_norm(x, weight):
    scale = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + SHAPE.eps)
    return [v * scale * g for v, g in zip(x, weight)]


def rotate(x, position):
    out = list(x)
    for i in range(0, SHAPE.head_dim, 2):
        angle = position * SHAPE.rope_base ** (-i / SHAPE.head_dim)
        c, s = math.cos(angle), math.sin(angle)
        out[i], out[i + 1] = x[i] * c - x[i + 1] * s, x[i] * s + x[i + 1] * c
    return out


def chunk_nll(t, tokens):
    """Float64 forward over tokens (BOS first); the summed NLL of every token after the first."""
    hd, group = SHAPE.head_dim, SHAPE.heads // SHAPE.kv_heads
    w = {n: rows(v) if len(v[0]) == 2 else v[1] for n, v in t.items()}
    keys = [[[] for _ in range(SHAPE.kv_heads)] for _ in range(SHAPE.layers)]
    values = [[[] for _ in range(SHAPE.kv_heads)] for _ in range(SHAPE.layers)]
    total = 0.0
    for position, token in enumerate(tokens[:-1]):
        x = list(w["token_embd.weight"][token])
        for i in range(SHAPE.layers):
            p = lambda n: w[f"blk.{i}.{n}.weight"]  # noqa: E731
            h = rms_norm(x, p("attn_norm"))
            q, k, v = matvec(p("attn_q"), h), matvec(p("attn_k"), h), matvec(p("attn_v"), h)
            for g in range(SHAPE.kv_heads):
                keys[i][g].append(rotate(k[g * hd:(g + 1) * hd], position))
                values[i][g].append(v[g * hd:(g + 1) * hd])
            attended = []
            for head in range(SHAPE.heads):
                g = head // group
                qh = rotate(q[head * hd:(head + 1) * hd], position)
                logits = [sum(a * b for a, b in zip(qh, key)) / math.sqrt(hd) for key in keys[i][g]]
                top = max(logits)
                weights = [math.exp(l - top) for l in logits]
                norm = sum(weights)
                attended += [sum(wt * val[d] for wt, val in zip(weights, values[i][g])) / norm for d in range(hd)]
            x = [a + b for a, b in zip(x, matvec(p("attn_output"), attended))]
            h = rms_norm(x, p("ffn_norm"))
            gate, up = matvec(p("ffn_gate"), h), matvec(p("ffn_up"), h)
            act = [gv / (1 + math.exp(-gv)) * uv for gv, uv in zip(gate, up)]
            x = [a + b for a, b in zip(x, matvec(p("ffn_down"), act))]
        logits = matvec(w["output.weight"], rms_norm(x, w["output_norm.weight"]))
        top = max(logits)
        log_sum = top + math.log(sum(math.exp(l - top) for l in logits))
        total += log_sum - logits[tokens[position + 1]]
    return total


def main():
    h2o_eval = sys.argv[1]
    t = random_tensors(random.Random(20261127))
    packed = {n: struct.pack(f"<{len(v)}f", *v) for n, (_, v) in t.items()}
    # What the file holds is float32: the reference reads those values back.
    t = {n: (shape, list(struct.unpack(f"<{len(v)}f", packed[n]))) for n, (shape, v) in t.items()}
    with tempfile.TemporaryDirectory() as work:
        model, text = os.path.join(work, "tiny.gguf"), os.path.join(work, "text.txt")
        # A tensor of the wrong size is refused before anything is written.
        broken = dict(packed, **{"output.weight": packed["output.weight"][:-4]})
        try:
            write_llama(model, SHAPE, vocabulary(), broken, "tiny")
            sys.exit("a short tensor was accepted")
        except ValueError:
            pass
        assert not os.listdir(work), f"a refused export left {os.listdir(work)}"
        write_llama(model, SHAPE, vocabulary(), packed, "tiny")
        assert os.listdir(work) == ["tiny.gguf"], os.listdir(work)
        with open(text, "w") as f:
            f.write(TEXT)
        out = subprocess.run([h2o_eval, "-m", model, "-f", text, "--policies", "full", "--chunk", str(CHUNK),
                              "--chunks", "3", "--kv-type", "f32", "--json", "--quiet"],
                             check=True, capture_output=True, text=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
    ids = encode(TEXT)
    scored, total = 0, 0.0
    for c in range(3):
        chunk = [1] + ids[c * (CHUNK - 1):(c + 1) * (CHUNK - 1)]
        total += chunk_nll(t, chunk)
        scored += len(chunk) - 1
    expected = total / scored
    print(f"h2o mean NLL {got['mean_nll']:.6f} over {got['tokens']} tokens; float64 reference {expected:.6f} over {scored}")
    assert got["tokens"] == scored, "the tokenizer or the chunking differs"
    assert abs(got["mean_nll"] - expected) < 2e-5 * max(1.0, expected), "the export's conventions differ from h2o's"


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Trains a small Llama on plain text and writes it as a GGUF file in the layout of the "llama"
architecture, which h2o loads.

The second real model of the KV evaluation (docs/EVALUATION.md): a different text, a different
shape (grouped-query attention, 32-wide heads, a 2048-token vocabulary) from stories260K.

    prepare_text.py DATA                 # DATA/train.txt, DATA/val.txt from python3-doc
    train_llama.py DATA OUT.gguf         # tokenizer (sentencepiece) + model, seeded

Reproducible: the tokenizer, the weights' initialisation and the batches all follow --seed, and
torch runs deterministically on the CPU with the same thread count (--threads). The model is the
architecture llama.cpp names 'llama': RMSNorm before attention and the feed-forward, rotary
positions on adjacent pairs (x[2i], x[2i+1]; GGUF's normal rope, so the weights are written as
trained, with no permutation), SwiGLU, no biases, an untied output matrix.
"""
import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_writer import LlamaShape, write_llama  # noqa: E402

BOS, EOS, UNK = 1, 2, 0
NEWLINE = 3 + 0x0A  # the byte-fallback token <0x0A>: the tokenizer's first 3 ids are specials


class RmsNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    # x: [batch, heads, T, head_dim]; pairs (x[2i], x[2i+1]) turn by angle position * theta_i.
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.attn_norm, self.ffn_norm = RmsNorm(c.dim, c.eps), RmsNorm(c.dim, c.eps)
        self.q = torch.nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.k = torch.nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.v = torch.nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.o = torch.nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.gate = torch.nn.Linear(c.dim, c.ff, bias=False)
        self.up = torch.nn.Linear(c.dim, c.ff, bias=False)
        self.down = torch.nn.Linear(c.ff, c.dim, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = c.heads // c.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") \
            else causal_attention(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, c.dim))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def causal_attention(q, k, v):
    t = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = torch.nn.Embedding(c.vocab, c.dim)
        self.blocks = torch.nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RmsNorm(c.dim, c.eps)
        self.output = torch.nn.Linear(c.dim, c.vocab, bias=False)
        theta = c.rope_base ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        angles = torch.arange(c.context, dtype=torch.float64)[:, None] * theta[None, :]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # Residual projections scaled down with depth (GPT-2's initialisation).
                std = 0.02 / math.sqrt(2 * c.layers) if name.endswith(("o.weight", "down.weight")) else 0.02
                torch.nn.init.normal_(p, std=std)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.output(self.norm(x))


def train_tokenizer(data, prefix, vocab, seed):
    # Byte fallback, so any text encodes; no dummy prefix, so a paragraph encodes the same alone
    # as within the whole text (the GGUF says add_space_prefix = false to match).
    subprocess.run([
        "spm_train", f"--input={data}/train.txt", f"--model_prefix={prefix}", f"--vocab_size={vocab}",
        "--model_type=bpe", "--character_coverage=0.9995", "--byte_fallback=true", "--split_digits=true",
        "--add_dummy_prefix=false", "--remove_extra_whitespaces=false", "--normalization_rule_name=identity",
        "--max_sentence_length=16384", "--num_threads=1", f"--random_seed={seed}",
        "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=-1", "--minloglevel=2",
    ], check=True)


def encode(prefix, path):
    # Line by line (spm_encode's unit), with the newlines between lines as their byte token:
    # what the GGUF's tokenizer gives for the whole file.
    out = subprocess.run(["spm_encode", f"--model={prefix}.model", "--output_format=id", path],
                         check=True, capture_output=True, text=True).stdout
    ids = []
    for line in out.split("\n")[:-1]:
        ids.extend(int(t) for t in line.split())
        ids.append(NEWLINE)
    return np.array(ids, dtype=np.int32)


def vocabulary(prefix):
    out = subprocess.run(["spm_export_vocab", f"--model={prefix}.model"], check=True, capture_output=True,
                         text=True).stdout
    pieces, scores, types = [], [], []
    for i, line in enumerate(out.split("\n")[:-1]):
        piece, score = line.rsplit("\t", 1)
        pieces.append(piece)
        scores.append(float(score))
        if i == UNK:
            types.append(2)  # unknown
        elif i in (BOS, EOS):
            types.append(3)  # control
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            types.append(6)  # byte
        else:
            types.append(1)  # normal
    return pieces, scores, types


def batches(ids, context, batch, generator):
    # Windows of context tokens, each a BOS then context - 1 tokens of the text from a random start.
    starts = torch.randint(0, len(ids) - context, (batch,), generator=generator).numpy()
    rows = np.stack([np.concatenate(([BOS], ids[s:s + context])) for s in starts])
    rows = torch.from_numpy(rows.astype(np.int64))
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def validation_loss(model, ids, context, chunks):
    # h2o-eval's chunk-512 protocol: consecutive chunks of context - 1 tokens, BOS first, every
    # token after BOS scored.
    total, count = 0.0, 0
    for n in range(chunks):
        chunk = torch.from_numpy(np.concatenate(([BOS], ids[n * (context - 1):(n + 1) * (context - 1)]))
                                 .astype(np.int64))[None]
        logits = model(chunk[:, :-1])
        losses = F.cross_entropy(logits[0], chunk[0, 1:], reduction="none")
        total += losses.sum().item()
        count += losses.numel()
    return total / count


def export(model, c, vocab, path, name):
    layers = {"attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
              "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}
    params = {"token_embd.weight": model.embed.weight, "output_norm.weight": model.norm.weight,
              "output.weight": model.output.weight}
    for i, b in enumerate(model.blocks):
        for gguf_name, module in layers.items():
            params[f"blk.{i}.{gguf_name}.weight"] = getattr(b, module).weight
    tensors = {n: p.detach().contiguous().numpy().astype("<f4").tobytes() for n, p in params.items()}
    write_llama(path, c, vocab, tensors, name)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="the folder with train.txt and val.txt (prepare_text.py)")
    p.add_argument("out", help="the GGUF file to write")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-chunks", type=int, default=8)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    prefix = os.path.splitext(args.out)[0] + ".tokenizer"
    train_tokenizer(args.data, prefix, args.vocab, args.seed)
    train_ids, val_ids = encode(prefix, f"{args.data}/train.txt"), encode(prefix, f"{args.data}/val.txt")
    pieces, scores, types = vocabulary(prefix)
    c = LlamaShape(args.dim, args.layers, args.heads, args.kv_heads, args.ff, len(pieces), args.context)
    model = Llama(c)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{len(train_ids)} training tokens, {len(val_ids)} validation tokens, {n_params} parameters", flush=True)

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(args.seed)
    start = time.time()
    for step in range(1, args.steps + 1):
        # Linear warmup, then cosine decay to a tenth.
        progress = max(0.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = batches(train_ids, args.context, args.batch, generator)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} {time.time() - start:.0f} s", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            v = validation_loss(model, val_ids, args.context, args.eval_chunks)
            model.train()
            print(f"step {step} validation loss {v:.4f} perplexity {math.exp(v):.4f}", flush=True)
    export(model, c, (pieces, scores, types), args.out, f"pydoc-llama {n_params / 1e6:.1f}M")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

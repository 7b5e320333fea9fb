#!/usr/bin/env python3
"""Writes the ids llama.cpp's llama-tokenize gives each text with each vocabulary, summarized as
the test reads them (README.md says how the vocabulary files are made).

usage: make_expected.py LLAMA_TOKENIZE VOCAB_DIR SHARED_DIR

For every VOCAB in llama3, qwen3, gpt4o, gemma3 and every TEXT in tinystories_val (SHARED_DIR/data/) and
stress (this folder), runs
    LLAMA_TOKENIZE -m VOCAB_DIR/VOCAB.gguf -f TEXT --ids --log-disable --no-bos --no-parse-special --no-escape
and writes VOCAB.TEXT.ids here: the id count, the FNV-1a 64-bit hash of the ids (each as 4
little-endian bytes) and the first 256 ids."""
import json
import os
import struct
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
tool, vocab_dir, shared = sys.argv[1:4]
texts = {'tinystories_val': os.path.join(shared, 'data', 'tinystories_val.txt'),
         'stress': os.path.join(here, 'stress.txt')}


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for b in b''.join(struct.pack('<i', i) for i in ids):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


for vocab in ('llama3', 'qwen3', 'gpt4o', 'gemma3'):
    for name, path in texts.items():
        out = subprocess.run([tool, '-m', os.path.join(vocab_dir, vocab + '.gguf'), '-f', path, '--ids', '--log-disable',
                              '--no-bos', '--no-parse-special', '--no-escape'], capture_output=True, text=True, check=True)
        ids = json.loads(out.stdout)
        with open(os.path.join(here, f'{vocab}.{name}.ids'), 'w') as f:
            f.write(f'count {len(ids)}\nfnv1a64 {fnv1a64(ids):016x}\nfirst {" ".join(map(str, ids[:256]))}\n')
        print(f'{vocab}.{name}: {len(ids)} ids')

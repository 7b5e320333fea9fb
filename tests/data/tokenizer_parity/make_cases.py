#!/usr/bin/env python3
"""Writes the case files of whitespace runs and chat prompts and the ids llama.cpp gives them
(README.md says how the vocabulary files and the maker are made).

usage: make_cases.py H2O_BUILD LLAMA_TOKENS VOCAB_DIR SHARED_DIR

  whitespace.inp          runs of spaces, tabs, newlines and their mixtures, 1 to 40 long, alone,
                          at the start, in the middle and at the end of text (special tokens not
                          parsed)
  VOCAB.special.inp       the family's chat prompts as h2o's chat formats write them, and runs of
                          whitespace before, after and between the vocabulary's special tokens
                          (special tokens parsed)
  VOCAB.whitespace.out,   one line of ids per case, as `LLAMA_TOKENS -m VOCAB.gguf -f CASES.inp
  VOCAB.special.out       [--special]` (tools/llama_golden/llama_tokens.cpp) writes them

The chat prompts are formatted by the library itself (its Python binding, over H2O_BUILD's
libh2o-llm) on a small model that h2o-synth writes with each vocabulary."""
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
build, maker, vocab_dir, shared = sys.argv[1:5]
sys.path.insert(0, os.path.join(here, '..', '..', '..', 'bindings', 'python'))
os.environ['H2O_LIB_DIR'] = build
import h2o_llm  # noqa: E402

SEPARATOR = '\n__ggml_vocab_test__\n'
RUNS = [' ', '\t', '\n', ' \t', '\t ', '\n ', ' \n', '\r\n', '\n\n ', ' \t\n']
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 40]


def run_of(unit, n):
    """n characters of the repeated unit."""
    return (unit * n)[:n]


def whitespace_cases():
    cases = []
    for unit in RUNS:
        for n in LENGTHS:
            ws = run_of(unit, n)
            cases += [ws, ws + 'Hello', 'a' + ws + 'b', 'Hello' + ws, 'def f():' + ws + 'return 1']
    return cases


# Each vocabulary: where its GGUF is, the chat format of its family (None: none) and special
# tokens to put whitespace beside.
VOCABS = {
    'llama-spm': (os.path.join(shared, 'vocab', 'ggml-vocab-llama-spm.gguf'), 'llama2', ['<s>', '</s>']),
    'phi-3': (os.path.join(shared, 'vocab', 'ggml-vocab-phi-3.gguf'), 'phi3', ['<|user|>', '<|end|>', '<|assistant|>', '<s>', '<|endoftext|>']),
    'gpt-2': (os.path.join(shared, 'vocab', 'ggml-vocab-gpt-2.gguf'), None, ['<|endoftext|>']),
    'llama3': (os.path.join(vocab_dir, 'llama3.gguf'), 'llama3', ['<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>']),
    'qwen3': (os.path.join(vocab_dir, 'qwen3.gguf'), 'chatml', ['<|im_start|>', '<|im_end|>', '<think>']),
    'gemma3': (os.path.join(vocab_dir, 'gemma3.gguf'), 'gemma', ['<start_of_turn>', '<end_of_turn>', '<bos>']),
    'gpt4o': (os.path.join(vocab_dir, 'gpt4o.gguf'), 'phi3', ['<|endoftext|>', '<|endofprompt|>']),
}

CONVERSATIONS = [
    [('system', 'You are a helpful assistant.'), ('user', 'What is 2 + 2?')],
    [('user', 'Hi'), ('assistant', 'Hello! How can I help?'), ('user', 'Indent this:\ndef f():\n    return  1\n\n\tdone  ')],
]


def chat_prompts(gguf, fmt):
    if fmt is None:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, 'model.gguf')
        subprocess.run([os.path.join(build, 'tools', 'h2o-synth'), '-o', model_path, '--type', 'F32', '--dim', '32', '--layers', '1',
                        '--heads', '2', '--kv-heads', '1', '--ff', '32', '--tied', '--vocab', gguf], check=True, capture_output=True)
        model = h2o_llm.Model(model_path)
        # Llama 2's and Gemma's formats have no system turn of their own: they fold it in.
        return [model.format_chat(c, format=fmt) for c in CONVERSATIONS]


def special_cases(specials):
    cases = []
    for t in specials:
        for ws in [' ', '  ', '\n', '\n\n', '\t', ' \n ', '   \n', '\r\n']:
            cases += [t + ws + 'Hi', 'Hi' + ws + t, t + ws + t, ws + t + ws]
    return cases


def write_cases(path, cases):
    with open(path, 'w', encoding='utf-8', newline='') as f:
        f.write(''.join(c + SEPARATOR for c in cases))


def llama_ids(gguf, cases_path, special):
    out = subprocess.run([maker, '-m', gguf, '-f', cases_path] + (['--special'] if special else []), capture_output=True, text=True,
                         check=True)
    return out.stdout


whitespace = os.path.join(here, 'whitespace.inp')
write_cases(whitespace, whitespace_cases())
for name, (gguf, fmt, specials) in VOCABS.items():
    cases = chat_prompts(gguf, fmt) + special_cases(specials)
    special = os.path.join(here, name + '.special.inp')
    write_cases(special, cases)
    with open(os.path.join(here, name + '.whitespace.out'), 'w') as f:
        f.write(llama_ids(gguf, whitespace, False))
    with open(os.path.join(here, name + '.special.out'), 'w') as f:
        f.write(llama_ids(gguf, special, True))
    print(f'{name}: {len(cases)} special cases')

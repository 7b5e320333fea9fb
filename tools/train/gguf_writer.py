"""A GGUF (version 3) writer for the trained model: metadata and F32 tensors, nothing else, and
the 'llama' architecture's keys and tensor names (write_llama).

The file is written to a temporary name beside the target and renamed into place when complete,
so an interrupted export never leaves a partial model at the target path.
"""
import os
import struct

ALIGNMENT = 32
# Metadata value types (GGUF specification).
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
TENSOR_F32 = 0


def _string(text):
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _value(kind, value):
    if kind == UINT32:
        return struct.pack("<I", value)
    if kind == INT32:
        return struct.pack("<i", value)
    if kind == FLOAT32:
        return struct.pack("<f", value)
    if kind == BOOL:
        return struct.pack("<?", value)
    if kind == STRING:
        return _string(value)
    raise ValueError(f"unsupported metadata type {kind}")


class GgufWriter:
    def __init__(self):
        self.metadata = []  # (key, bytes of type and value)
        self.tensors = []   # (name, shape outermost first, little-endian float32 bytes)

    def add(self, key, kind, value):
        self.metadata.append((key, struct.pack("<I", kind) + _value(kind, value)))

    def add_array(self, key, kind, values):
        body = b"".join(_value(kind, v) for v in values)
        self.metadata.append((key, struct.pack("<IIQ", ARRAY, kind, len(values)) + body))

    def add_tensor(self, name, shape, data):
        # shape as torch and numpy give it (outermost first); data: the row-major float32 bytes.
        count = 1
        for d in shape:
            count *= d
        if len(data) != 4 * count:
            raise ValueError(f"{name}: {len(data)} bytes for shape {tuple(shape)}")
        self.tensors.append((name, tuple(shape), bytes(data)))

    def write(self, path):
        header = bytearray(b"GGUF")
        header += struct.pack("<IQQ", 3, len(self.tensors), len(self.metadata))
        for key, body in self.metadata:
            header += _string(key) + body
        offset = 0
        for name, shape, data in self.tensors:
            # GGUF lists dimensions innermost first: a torch weight [out, in] is ne = [in, out].
            dims = list(reversed(shape))
            header += _string(name) + struct.pack("<I", len(dims))
            header += b"".join(struct.pack("<Q", d) for d in dims)
            header += struct.pack("<IQ", TENSOR_F32, offset)
            offset += -(-len(data) // ALIGNMENT) * ALIGNMENT
        header += b"\0" * (-len(header) % ALIGNMENT)
        temporary = path + ".partial"
        try:
            with open(temporary, "wb") as f:
                f.write(header)
                for _, _, data in self.tensors:
                    f.write(data)
                    f.write(b"\0" * (-len(data) % ALIGNMENT))
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise


class LlamaShape:
    """The hyperparameters GGUF's 'llama' architecture names."""

    def __init__(self, dim, layers, heads, kv_heads, ff, vocab, context, rope_base=10000.0, eps=1e-5):
        self.dim, self.layers, self.heads, self.kv_heads = dim, layers, heads, kv_heads
        self.ff, self.vocab, self.context, self.rope_base, self.eps = ff, vocab, context, rope_base, eps
        self.head_dim = dim // heads


# A layer's tensors in GGUF's names, in the order they are written, with their shapes
# (outermost first, as torch's nn.Linear holds a weight: [out, in]).
def llama_layer_tensors(s):
    return [
        ("attn_norm", (s.dim,)), ("attn_q", (s.heads * s.head_dim, s.dim)),
        ("attn_k", (s.kv_heads * s.head_dim, s.dim)), ("attn_v", (s.kv_heads * s.head_dim, s.dim)),
        ("attn_output", (s.dim, s.heads * s.head_dim)), ("ffn_norm", (s.dim,)),
        ("ffn_gate", (s.ff, s.dim)), ("ffn_up", (s.ff, s.dim)), ("ffn_down", (s.dim, s.ff)),
    ]


def write_llama(path, shape, vocab, tensors, name):
    """A sentencepiece-vocabulary llama: vocab = (pieces, scores, token types), special ids
    unk 0, bos 1, eos 2, no space prefix; tensors: {GGUF name: float32 bytes} for
    token_embd, every blk.N.* of llama_layer_tensors, output_norm and output."""
    pieces, scores, types = vocab
    w = GgufWriter()
    w.add("general.architecture", STRING, "llama")
    w.add("general.name", STRING, name)
    w.add("general.file_type", UINT32, 0)
    w.add("llama.context_length", UINT32, shape.context)
    w.add("llama.embedding_length", UINT32, shape.dim)
    w.add("llama.block_count", UINT32, shape.layers)
    w.add("llama.feed_forward_length", UINT32, shape.ff)
    w.add("llama.attention.head_count", UINT32, shape.heads)
    w.add("llama.attention.head_count_kv", UINT32, shape.kv_heads)
    w.add("llama.rope.dimension_count", UINT32, shape.head_dim)
    w.add("llama.rope.freq_base", FLOAT32, shape.rope_base)
    w.add("llama.attention.layer_norm_rms_epsilon", FLOAT32, shape.eps)
    w.add("llama.vocab_size", UINT32, shape.vocab)
    w.add("tokenizer.ggml.model", STRING, "llama")
    w.add_array("tokenizer.ggml.tokens", STRING, pieces)
    w.add_array("tokenizer.ggml.scores", FLOAT32, scores)
    w.add_array("tokenizer.ggml.token_type", INT32, types)
    w.add("tokenizer.ggml.bos_token_id", UINT32, 1)
    w.add("tokenizer.ggml.eos_token_id", UINT32, 2)
    w.add("tokenizer.ggml.unknown_token_id", UINT32, 0)
    w.add("tokenizer.ggml.add_bos_token", BOOL, True)
    w.add("tokenizer.ggml.add_space_prefix", BOOL, False)
    layout = [("token_embd.weight", (shape.vocab, shape.dim))]
    for i in range(shape.layers):
        layout += [(f"blk.{i}.{n}.weight", dims) for n, dims in llama_layer_tensors(shape)]
    layout += [("output_norm.weight", (shape.dim,)), ("output.weight", (shape.vocab, shape.dim))]
    if set(tensors) != {n for n, _ in layout}:
        raise ValueError(f"tensors differ from the llama layout: {sorted(set(tensors) ^ {n for n, _ in layout})}")
    for tensor_name, dims in layout:
        w.add_tensor(tensor_name, dims, tensors[tensor_name])
    w.write(path)

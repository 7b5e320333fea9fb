#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Budgets that move between kv heads (kv_head_budgets.h), done on the device: the host runs the
// rule on a copy of the bookkeeping alone (KvCache::init_bookkeeping) and hands over what it did
// to the rows (KvRowEdits) and which bookkeeping words changed, as entries of two words in
// `edits`, a chunk at a time; the rows never leave the device. One step per variant:
//   OP_ROLL     (slot, shift): the slot's key rolls back by `shift` positions, decoded, rotated
//               by the host's cosines and sines (KvCache::rotate_back_table) and encoded: the
//               bits of KvCache::rotate_back
//   OP_GATHER   (from, to): the key and value rows of slot `from`, and the bookkeeping words that
//               go with its token (KV_TOKEN_WORDS: stream index, position, tag, statistics), are
//               copied to the chunk's rows area in `edits` (from rows_off, entry after entry)
//   OP_SCATTER  the same entries: the rows area is copied to slot `to`
//   OP_PATCH    (word, value): the bookkeeping word is set
// A chunk's gather before its scatter moves its rows as one move after another in the rule's
// order would (no move reads a slot an earlier one wrote: KvRowEdits). Slots are the cache's
// (KvImage order); the rows bound are those of the pool of layers from first_slot.

#define WG 64
#define MAX_HEAD_DIM 256
layout(local_size_x = WG) in;

layout(binding = 0) buffer Keys { uint keys[]; };
layout(binding = 1) buffer Values { uint values[]; };
layout(binding = 2) buffer Meta { uint meta[]; };
layout(binding = 3) buffer Edits { uint edits[]; };
layout(binding = 4) readonly buffer Table { vec2 rollback_table[]; };  // [shift][pair]: (cos, sin)

layout(push_constant) uniform Params {
    uint n;  // entries
    uint edits_off, rows_off, keys_off, values_off, meta_off;
    uint table_off;  // rollback_table's first pair, in vec2 units
    uint first_slot, head_dim, pairs, pairing;
    uint formats;  // KvRowFormat of keys | of values << 8
    uint n_cells, total_slots, n_kv, max_batch;  // the meta buffer's layout (kv_meta_layout.h)
} p;

#define KEY_FORMAT (p.formats & 0xFFu)
#define VALUE_FORMAT (p.formats >> 8)

#include "kv_layout.glsl"
#include "kv_row.glsl"
#include "rotary.glsl"
vec2 rollback_cos_sin(int shift, uint i) { return rollback_table[p.table_off + uint(shift) * p.pairs + i]; }
#include "kv_key_rows.glsl"

void main() {
    const uint key_words = kv_row_words(KEY_FORMAT, p.head_dim), value_words = kv_row_words(VALUE_FORMAT, p.head_dim);
#if defined(OP_ROLL) || defined(OP_PATCH)
    const uint i = linear_invocation(WG);
    if (i >= p.n) return;
    const uint a = edits[p.edits_off + 2u * i], b = edits[p.edits_off + 2u * i + 1u];
#if defined(OP_ROLL)
    roll_key_back(p.keys_off + (a - p.first_slot) * key_words, int(b), p.pairing, p.pairs);
#else
    meta[p.meta_off + a] = b;
#endif
#else
    // One invocation per word of a slot's move (key row, value row, token words): entry i, word w.
    const KvLayout L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    const uint row_words = key_words + value_words, slot_words = row_words + KV_TOKEN_WORDS, k = linear_invocation(WG);
    if (k >= p.n * slot_words) return;
    const uint i = k / slot_words, w = k % slot_words;
    const uint area = p.rows_off + i * slot_words + w;
#if defined(OP_GATHER)
    const uint slot = edits[p.edits_off + 2u * i];
    uint word;
    if (w < key_words) {
        word = keys[p.keys_off + (slot - p.first_slot) * key_words + w];
    } else if (w < row_words) {
        word = values[p.values_off + (slot - p.first_slot) * value_words + w - key_words];
    } else {
        word = meta[kv_token_word(L, slot, w - row_words)];
    }
    edits[area] = word;
#else
    const uint slot = edits[p.edits_off + 2u * i + 1u];
    if (w < key_words) {
        keys[p.keys_off + (slot - p.first_slot) * key_words + w] = edits[area];
    } else if (w < row_words) {
        values[p.values_off + (slot - p.first_slot) * value_words + w - key_words] = edits[area];
    } else {
        meta[kv_token_word(L, slot, w - row_words)] = edits[area];
    }
#endif
#endif
}

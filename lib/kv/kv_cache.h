// Host-resident KV cache: the reference layout and eviction bookkeeping, used by the CPU backend.
//
// Every (layer, kv head), a cell, owns a region of its layer's slots: KvConfig::slots_in(layer) (n_slots,
// or the layer's share of the budget), or, when the heads' budgets move (KvConfig::head_share,
// rebalance_heads), what the last rebalancing gave it. A slot holds a key and a value vector and what
// eviction needs: the token's stream index (-1 when free), its rotary position, its retention tag
// (pinned flag and retention span: kv_policy_spec.h), and its attention statistics (kv_policy.h).
// Memory is allocated once in init(); tokens take slots in place, and only rebalancing moves
// kept slots (to their cells' new regions, between batches).
#pragma once

#include <cstdint>
#include <vector>

#include "byte_io.h"
#include "kv_config.h"
#include "kv_image.h"
#include "kv_policy.h"

namespace h2o {

// What rebalancing the heads' budgets did to the key and value rows of a cache whose rows live
// elsewhere (a device's memory: KvCache::init_bookkeeping), for their owner to do the same: first
// every rotation (keys rolled back in place), then every move, in order. Both lists go pool after
// pool (kv_head_budgets.h), so each pool's entries are a run of them.
struct KvRowEdits {
    struct Rotation {
        int64_t slot;   // the key of this slot (KvImage order)
        int32_t shift;  // rolls back by this many positions (KvCache::rotate_back)
    };
    struct Move {
        int64_t from, to;  // the key and value rows of slot `from` go to slot `to`
    };
    std::vector<Rotation> rotations;
    // In the rule's order, in which no move reads a slot an earlier move wrote (move_to_regions):
    // reading the sources of any run of consecutive moves before writing their destinations
    // gives the same rows as moving one at a time.
    std::vector<Move> moves;
    void clear() {
        rotations.clear();
        moves.clear();
    }
};

// The cosines and sines that roll a key back by each shift of 1..max_shift positions under
// `rope`: [shift][pair][cos, sin], rope.pairs() pairs, row 0 unused (rotary_cos_sin's values,
// computed in double and rounded). KvCache::rotate_back reads them, and so does a device that
// rolls keys back (its own sines and cosines would differ in the last bit, and a quantized key's
// rounding with them). Throws std::bad_alloc.
std::vector<float> kv_rotate_back_table(const RotarySpec &rope, int max_shift);

class KvCache {
public:
    // threads: how many kv heads may make room at once (make_room's `thread` argument).
    Status init(const KvConfig &config, int threads = 1);
    // The bookkeeping of a cache whose rows another backend keeps (no keys or values here), on
    // which that backend runs rebalance_heads: the rule then records what it does to the rows in
    // row_edits() (cleared by each rebalance_heads) instead of doing it. Only rebalance_heads,
    // cell_fill, image() and row_edits() are meant for such a cache.
    Status init_bookkeeping(const KvConfig &config);
    const KvRowEdits &row_edits() const { return row_edits_; }
    void clear();

    const KvConfig &config() const { return config_; }
    // Bytes init allocated (planned_bytes), or init_bookkeeping.
    size_t bytes() const;
    // Bytes init(config) allocates: keys, values, slot bookkeeping and (for the policies that
    // read them) attention statistics.
    static size_t planned_bytes(const KvConfig &config);
    size_t key_row_bytes() const { return image_.key_row_bytes; }
    size_t value_row_bytes() const { return image_.value_row_bytes; }

    // A view of one cell, one (layer, kv head): cell_slots(layer, kv_head) entries; keys and values are rows of
    // key_row_bytes() and value_row_bytes() in the cache type's row formats (kv_format.h).
    struct CellView {
        uint8_t *keys;
        uint8_t *values;
        int64_t *stream_index;
        int32_t *position;
        uint8_t *tag;      // kv_make_tag: pinned flag and retention span
        SlotStats *stats;  // null when the policy reads none
    };
    // A slot's statistics (zeros when the policy keeps none).
    static SlotStats slot_stats(const CellView &view, int slot) { return view.stats ? view.stats[slot] : kv_stats_zero(); }
    CellView cell(int layer, int kv_head);

    // The slots of a cell's region: slots_in(layer) unless rebalancing moved them.
    int cell_slots(int layer, int kv_head) const { return image_.cell_slots[cell_index(layer, kv_head)]; }
    // The most slots any cell may be given (the size of per-cell scratch; computed once, as
    // attention asks for it on every call).
    int max_cell_slots() const { return max_cell_slots_; }

    // Slots [0, used(layer, head)) have been written at least once; later slots are untouched.
    int used(int layer, int kv_head) const { return image_.used[cell_index(layer, kv_head)]; }
    int free_slots(int layer, int kv_head) const;

    // Frees slots for n incoming tokens (the first of which has stream index next_index) by
    // evicting victims as the policy says, then, with rolling, rotates the remaining keys back by
    // the number of evicted tokens before each of them. Returns the number of evictions.
    // Different kv heads may make room at once, each call with its own `thread` (< the init()
    // threads), except under the random policy, whose one generator draws for the heads in order.
    int make_room(int layer, int kv_head, int n, int64_t next_index, int thread = 0);

    // llama.cpp's context shift: evicts the cell's n oldest tokens that are not pinned and whose
    // stream index is at least `keep` (at most discardable() of them), at once, rolling the kept
    // keys back as make_room does. For comparing the policies with it (h2o-eval's `shift`).
    int discardable(int layer, int kv_head, int64_t keep) const;
    void discard_oldest(int layer, int kv_head, int n, int64_t keep);
    // The slot of the cell that holds the unpinned token of this stream index, or -1; and evicting
    // it as make_room would (h2o-eval's `oracle`, which chooses its victims itself).
    int unpinned_slot_of(int layer, int kv_head, int64_t stream_index) const;
    void evict_slot(int layer, int kv_head, int slot);

    // Budgets per kv head (kv_head_budgets.h): before `incoming` more tokens whose first has
    // stream index next_index, evicts in every pool of cells (a layer, or the whole cache with
    // share_across_layers) whose cells cannot all take them, across its cells, the tokens its
    // policies value least, then gives each cell a region that holds what it kept plus a share of
    // the free slots (at least KvConfig::cell_minimum(layer, floor): a pool also rebalances, and
    // evicts from the cells above their minimum, when a cell is smaller than that), moving the
    // kept slots into the new regions in order (when no size changes, the victims' slots are
    // freed in place instead); with rolling, each cell's kept keys roll back past its victims as
    // make_room's do. Nothing happens when head_share is 0.
    void rebalance_heads(int64_t next_index, int incoming, int floor = 0);

    // Each cell's tokens held and slots, [layer][kv head] (either may be null).
    void cell_fill(int32_t *held, int32_t *slots) const;

    // Expected Attention (kv_policy_spec.h): folds the batch's queries of one cell into its running
    // statistics, before make_room ranks its tokens. queries: token t's query head g of the cell's
    // group at queries[t * stride + g * head_dim], rotated by positions[t] as attention reads them.
    // Does nothing for the other policies and in local layers. `thread` as for make_room.
    void observe_queries(int layer, int kv_head, const float *queries, int64_t stride, const int32_t *positions, int n, int thread = 0);

    // Takes a free slot for a new token and resets its bookkeeping. Returns the slot.
    int claim_slot(int layer, int kv_head, int64_t stream_index, int32_t position, uint8_t tag);

    // Each retention span's minimum per (layer, kv head), in tokens (KV_MAX_SPANS entries; all
    // zero after clear()). Eviction keeps a cell's tokens of span s while it holds no more than
    // minimum[s] of them.
    void set_span_minimums(const int32_t *minimums);

    // Faster kernels for re-rotating keys when positions roll, each giving exactly the portable
    // code's bits (the CPU backend's, with the processor's instructions): rotary.h's rotate_pair
    // over a row's pairs, of floats or of an F16 row in place (widened, rotated, rounded back as
    // fp16.h rounds). Rolling re-rotates up to a budget of keys per eviction and (layer, kv head);
    // with the portable code that was a third of decoding. Null members: the portable code.
    struct RotationKernels {
        void (*rotate_pairs)(float *x, const float *cos_sin, int64_t n_pairs) = nullptr;
        void (*rotate_half_pairs)(uint16_t *row, const float *cos_sin, int64_t n_pairs) = nullptr;
    };
    void set_rotation_kernels(const RotationKernels &kernels) { rotation_kernels_ = kernels; }
    const int32_t *span_minimums() const { return image_.span_minimum; }

    // The cache as a session snapshot holds it, and back (save_kv_image, load_kv_image: a loaded
    // cache evicts and sums exactly as the saved one would have; on error it is cleared).
    void save(ByteWriter &out) const;
    Status load(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans);

    // The cache's state (kv_image.h): what a snapshot holds, and what a device backend that
    // rebalances on a host copy of its bookkeeping (CUDA) copies in and out. Whoever changes it keeps the
    // image's invariants (each cell's free list names its freed slots, the regions tile the pools).
    const KvImage &image() const { return image_; }
    KvImage &image() { return image_; }

private:
    Status init_with(const KvConfig &config, int threads, bool rows);
    size_t cell_index(int layer, int kv_head) const { return static_cast<size_t>(layer) * config_.n_head_kv + kv_head; }
    size_t slot_base(int layer, int kv_head) const { return static_cast<size_t>(image_.cell_first_slot[cell_index(layer, kv_head)]); }
    // rebalance_heads for the pool of layers [first_layer, end_layer), and its last step: moving
    // each cell's kept slots, in order, to the start of its new region (`slots` per cell).
    void rebalance_pool(int first_layer, int end_layer, int64_t next_index, int incoming, int floor);
    void move_to_regions(int first_layer, int end_layer, const int32_t *kept, const int32_t *slots);
    void move_slot(size_t from, size_t to);
    // make_room's working memory, one per thread.
    struct EvictionScratch {
        std::vector<int32_t> candidates;  // max_slots()
        std::vector<float> priority;      // max_slots(), by slot: the candidates' victim priorities
        std::vector<int64_t> evicted;     // max_slots() stream indices
        std::vector<float> key;           // one key as floats (head_dim), then its rotary pairs (rope.dims)
        int32_t span_held[KV_MAX_SPANS] = {};
        // The query-agnostic scorers' working rows (kv_key_scores.cpp): a value or a query
        // (head_dim), the key diff's anchor (head_dim), Expected Attention's logits per query
        // head and slot (query_group * max_slots()) and its average rotation (rope.dims).
        std::vector<float> row, anchor, logits, rotation;
    };
    // rebalance_heads' working memory: a pool's candidates across its cells, and per cell its
    // kept count, its span counts and its new size.
    struct RebalanceScratch {
        std::vector<int64_t> candidates;    // pool slot offsets, as many as the largest pool's slots
        std::vector<int64_t> destinations;  // as many: where move_to_regions puts each kept slot
        std::vector<float> priority;        // by pool slot offset
        std::vector<int32_t> span_held;     // the largest pool's cells * KV_MAX_SPANS
        std::vector<int32_t> kept, slots;   // the largest pool's cells
    };
    // The query-agnostic scorers' priorities (kv_policy_spec.h) of a cell's first `used` slots,
    // into scratch.priority by slot (free slots get none): kv_key_scores.cpp.
    void score_keys(int layer, int kv_head, int used, EvictionScratch &scratch);
    // Decodes slot s's key of a cell into scratch.key.
    const float *decoded_key(const CellView &v, int s, EvictionScratch &scratch) const;
    // Rotates a key of `layer` back by `shift` positions (config_.rope_in(layer)).
    void rotate_back(int layer, uint8_t *key, int shift, float *scratch);
    // With rolling, after a cell of `layer` lost the tokens evicted[0, n_evicted) (stream indices,
    // sorted here): each kept token moves back one rank per evicted token that preceded it (its
    // key rotated back, or the rotation recorded when the rows live elsewhere).
    void roll_back_kept(int layer, const CellView &v, int used, int64_t *evicted, int n_evicted, float *key_scratch);
    // Frees the slots scratch.candidates[0, n_victims) of a cell and, with rolling, rolls its
    // kept keys back past them.
    void free_victims(int layer, int kv_head, const CellView &v, int used, int n_victims, EvictionScratch &scratch);
    // Counts each span's tokens among the first `used` slots of a head into scratch.span_held.
    static void count_span_tokens(const CellView &v, int used, EvictionScratch &scratch);
    // Whether the unpinned token in slot s may go now (its span, if any, holds more than its
    // minimum); if so, counts it out of its span.
    bool take_if_span_allows(const CellView &v, int s, EvictionScratch &scratch) const;
    uint64_t next_random();

    KvConfig config_;
    std::vector<int64_t> layer_first_slot_;     // config_.first_slot_of, per layer
    std::vector<KvPolicyConfig> layer_policy_;  // config_.policy_in, per layer
    KvRowFormat key_format_ = KvRowFormat::F32, value_format_ = KvRowFormat::F32;
    int max_cell_slots_ = 0;  // config_.max_cell_slots()
    KvImage image_;
    bool rows_elsewhere_ = false;           // init_bookkeeping: row operations are recorded in row_edits_
    KvRowEdits row_edits_;                  // reserved for a whole cache's slots, so recording never allocates
    RebalanceScratch rebalance_;            // allocated once, when head_share > 0
    std::vector<EvictionScratch> scratch_;  // allocated once
    RotationKernels rotation_kernels_;
    // With rolling: kv_rotate_back_table for shifts up to max_cell_slots_, of the global layers'
    // rotary spec, then of the local layers' (config_.local_rope), when there are any.
    std::vector<float> rotate_back_cos_sin_[2];
    std::vector<double> rope_inv_freq_;  // config_.rope.inv_freqs(), for Expected Attention
};

}  // namespace h2o

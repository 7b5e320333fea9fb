// The KV cache as a session sees it, apart from the compute backend: every backend provides one,
// in the memory it owns (Backend::kv_store). Attention (Backend::attention) is where the store
// takes new keys and values, evicts and gathers statistics, in one device operation; everything
// else the session asks of the cache is here: making and clearing it, moving budgets between
// cells, retention spans, what it holds, and its snapshot image.
#pragma once

#include <cstddef>
#include <cstdint>

#include "byte_io.h"
#include "kv_config.h"
#include "kv_policy_spec.h"
#include "status.h"

namespace h2o {

class KvStore {
public:
    virtual ~KvStore() = default;

    // Allocates the KV cache (all of its memory, once). Errors: H2O_ERR_OUT_OF_MEMORY.
    virtual Status create_kv(const KvConfig &config) = 0;
    // Forgets every cached token (no memory is freed).
    virtual Status clear_kv() = 0;
    // Bytes of the KV cache: keys, values and per-slot bookkeeping.
    virtual size_t kv_bytes() const = 0;
    // Copies the stream index held by every slot (-1: free), ordered [layer][kv head][slot] with
    // each cell's slots (download_kv_cell_slots; KvConfig::total_slots() in all), to the host. For tests and evaluation: which tokens each (layer, kv head) kept.
    virtual Status download_kv_stream_indices(int64_t *out) = 0;
    // Copies each cell's number of slots, [layer][kv head]: KvConfig::slots_in(layer) unless the
    // heads' budgets move (KvConfig::head_share). The downloads above give each cell that many.
    virtual Status download_kv_cell_slots(int32_t *out) = 0;
    // Moves slots between each layer's kv heads by their attention, for `incoming` more tokens
    // from stream index next_index, every global cell keeping at least `floor` slots
    // (KvCache::rebalance_heads, kv_head_budgets.h), then copies each cell's tokens held and
    // slots, [layer][kv head], to `held` and `slots` (either may be null; what rolling ranks the
    // batch by: kv_batch_positions). Nothing when head_share is 0.
    virtual Status rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) = 0;
    // Copies every slot's attention statistics (kv_policy.h) to the host, in the same order.
    // For tests and evaluation only.
    virtual Status download_kv_statistics(SlotStats *out) = 0;
    // Copies every slot's retention tag (kv_make_tag; 0 for a free slot), in the same order.
    virtual Status download_kv_tags(uint8_t *out) = 0;
    // Sets each retention span's minimum per (layer, kv head), in tokens (KV_MAX_SPANS entries):
    // eviction keeps a cell's tokens of span s while it holds no more than minimums[s] of them.
    // clear_kv() and load_kv() set them all to zero.
    virtual Status set_kv_span_minimums(const int32_t *minimums) = 0;
    // Evicts from every cell its n oldest tokens that are not pinned and whose stream index is at
    // least `keep`, rolling kept keys back with position rolling (KvCache::discard_oldest):
    // llama.cpp's context shift, which the evaluation compares the policies with. Every cell must
    // hold that many (else H2O_ERR_INVALID_ARGUMENT, nothing changed). Only the CPU backend runs
    // it; the others answer H2O_ERR_UNSUPPORTED.
    virtual Status discard_kv(int64_t n, int64_t keep) {
        (void)n;
        (void)keep;
        return make_error(H2O_ERR_UNSUPPORTED, "this backend cannot discard cached tokens (the CPU backend can)");
    }
    // Evicts from each cell, [layer][kv head], the unpinned token of stream index stream_index[c]
    // (rolling kept keys back with position rolling): victims chosen by the caller, the
    // evaluation's oracle. Every cell must hold its token unpinned (else H2O_ERR_INVALID_ARGUMENT,
    // nothing changed). Only the CPU backend runs it; the others answer H2O_ERR_UNSUPPORTED.
    virtual Status evict_kv_tokens(const int64_t *stream_index) {
        (void)stream_index;
        return make_error(H2O_ERR_UNSUPPORTED, "this backend cannot evict chosen tokens (the CPU backend can)");
    }
    // The whole KV cache as a snapshot holds it (save_kv_image, load_kv_image: kv_image.h), and
    // back (H2O_ERR_STATE_FORMAT, naming what is inconsistent, for a refused one).
    virtual Status save_kv(ByteWriter &out) = 0;
    virtual Status load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) = 0;
};

}  // namespace h2o

// The CUDA backend's attention (cuda_impl.cuh): make room and store a batch (kv_claim_kernel, after
// kv_expect_kernel for Expected Attention), attend a chunk of queries at a time and fold the statistics.
#include "cuda/cuda_impl.cuh"

namespace h2o {

namespace {

// Outside every protection (kv_victim_rules.h).
__device__ bool eligible(const ClaimArgs &a, size_t at) {
    return kv_slot_evictable(a.kv.stream[at], kv_tag_pinned(a.kv.tag[at]), a.recent_from, static_cast<KV_UINT>(a.sinks));
}

// Retention spans, per cell: each span's tokens (held) and how many of them are eligible; held
// goes down as victims are taken, and a span's tokens stop being taken at its minimum
// (KvCache::make_room).
struct SpanCounts {
    int held[KV_MAX_SPANS];
    int eligible[KV_MAX_SPANS];
};

// Every thread of the block calls it.
__device__ void count_spans(const ClaimArgs &a, size_t base, int used, SpanCounts *c) {
    for (int i = threadIdx.x; i < static_cast<int>(KV_MAX_SPANS); i += blockDim.x) c->held[i] = c->eligible[i] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        const size_t at = base + s;
        const uint32_t span = kv_tag_span(a.kv.tag[at]);
        if (span == 0 || a.kv.stream[at] < 0) continue;
        atomicAdd(&c->held[span - 1], 1);
        if (eligible(a, at)) atomicAdd(&c->eligible[span - 1], 1);
    }
    __syncthreads();
}

__device__ bool span_allows(const ClaimArgs &a, const SpanCounts &c, size_t at) {
    const uint32_t span = kv_tag_span(a.kv.tag[at]);
    return span == 0 || kv_span_allows_eviction(static_cast<uint32_t>(c.held[span - 1]), static_cast<uint32_t>(a.span_min[span - 1]));
}

// One thread, after span_allows: the victim leaves its span's count.
__device__ void leave_span(const ClaimArgs &a, SpanCounts *c, size_t at) {
    const uint32_t span = kv_tag_span(a.kv.tag[at]);
    if (span != 0) --c->held[span - 1];
}

// How many eligible tokens can be taken before every span is down to its minimum.
__device__ int takeable(const ClaimArgs &a, const SpanCounts &c, int plain_candidates) {
    int total = plain_candidates;
    for (uint32_t i = 0; i < KV_MAX_SPANS; ++i) {
        total += static_cast<int>(
            kv_span_takeable(static_cast<KV_UINT>(c.held[i]), static_cast<KV_UINT>(c.eligible[i]), static_cast<KV_UINT>(a.span_min[i])));
    }
    return total;
}

// The query-agnostic scorers' scores of a cell's held slots (KvCache::score_keys), into
// key_scores[h][slot][0], its key norms into [1]; summed in the CPU's order. Every thread of the
// block calls it.
__device__ void score_keys(const ClaimArgs &a, size_t base, int used, int h) {
    __shared__ float anchor[kCudaMaxHeadDim];
    float *scores = a.kv.key_scores + static_cast<size_t>(h) * a.stride * 2;
    float key[kCudaMaxHeadDim];
    auto norm_of = [&](const float *x) {
        float sum = 0.0f;
        for (int j = 0; j < a.head_dim; ++j) sum = __fadd_rn(sum, __fmul_rn(x[j], x[j]));
        return sqrtf(sum);
    };
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        if (a.kv.stream[base + s] < 0) continue;
        kv_decode_row(a.key_format, a.kv.keys + (base + s) * a.key_row, a.head_dim, key);
        const float norm = norm_of(key);
        scores[2 * s] = kv_key_norm_priority(norm);
        scores[2 * s + 1] = norm;
    }
    if (a.policy != KV_POLICY_KEY_DIFF) {
        __syncthreads();
        return;
    }
    __syncthreads();
    // The anchor, the mean of the unit keys (unscaled), a dimension per thread.
    for (int j = threadIdx.x; j < a.head_dim; j += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < used; ++s) {
            const float norm = scores[2 * s + 1];
            if (a.kv.stream[base + s] >= 0 && norm > 0.0f)
                sum = __fadd_rn(sum, __fdiv_rn(kv_row_element(a.key_format, a.kv.keys + (base + s) * a.key_row, j), norm));
        }
        anchor[j] = sum;
    }
    __syncthreads();
    const float anchor_norm = norm_of(anchor);
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        if (a.kv.stream[base + s] < 0) continue;
        kv_decode_row(a.key_format, a.kv.keys + (base + s) * a.key_row, a.head_dim, key);
        float dot = 0.0f;
        for (int j = 0; j < a.head_dim; ++j) dot = __fadd_rn(dot, __fmul_rn(key[j], anchor[j]));
        const float norms = __fmul_rn(scores[2 * s + 1], anchor_norm);
        scores[2 * s] = kv_key_diff_priority(norms > 0.0f ? __fdiv_rn(dot, norms) : 0.0f);
    }
    __syncthreads();
}

__device__ float victim_priority(const ClaimArgs &a, size_t at, KV_UINT cell, size_t base, int h) {
    const int64_t stream = a.kv.stream[at];
    if (kv_policy_scores_keys(a.policy)) {
        return kv_scored_priority(a.kv.key_scores[(static_cast<size_t>(h) * a.stride + (at - base)) * 2], stream < a.stale_before);
    }
    const SlotStats s = a.kv.stats ? a.kv.stats[at] : kv_stats_zero();
    return kv_batch_priority(a.policy, a.by_proxy, s, stream < a.stale_before, stream, cell, a.prompt_seed, a.prompt_share);
}

// The slot with the smallest (priority, stream index) among eligible slots, or by_age: the oldest
// occupied unpinned slot, that their spans allow to go; -1 when there is none. Every thread of
// the block calls it.
__device__ int argmin_slot(const ClaimArgs &a, const SpanCounts &spans, size_t cell, size_t base, int used, bool by_age, int h) {
    __shared__ float best_priority[kBlock];
    __shared__ int64_t best_stream[kBlock];
    __shared__ int best_slot[kBlock];
    float bp = 0.0f;
    int64_t bs = 0;
    int bslot = -1;
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        const size_t at = base + s;
        const bool candidate = by_age ? kv_slot_evictable_by_age(a.kv.stream[at], kv_tag_pinned(a.kv.tag[at])) : eligible(a, at);
        if (!candidate || !span_allows(a, spans, at)) continue;
        const float p = by_age ? 0.0f : victim_priority(a, at, static_cast<KV_UINT>(cell), base, h);
        const int64_t st = a.kv.stream[at];
        if (bslot < 0 || kv_victim_before(p, st, bp, bs)) {
            bp = p;
            bs = st;
            bslot = s;
        }
    }
    best_priority[threadIdx.x] = bp;
    best_stream[threadIdx.x] = bs;
    best_slot[threadIdx.x] = bslot;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        const int me = threadIdx.x, o = me + half;
        if (me < half && best_slot[o] >= 0 &&
            (best_slot[me] < 0 || kv_victim_before(best_priority[o], best_stream[o], best_priority[me], best_stream[me]))) {
            best_priority[me] = best_priority[o];
            best_stream[me] = best_stream[o];
            best_slot[me] = best_slot[o];
        }
        __syncthreads();
    }
    const int result = best_slot[0];
    __syncthreads();
    return result;
}

// Expected Attention for one global layer, before kv_claim_kernel ranks by it: per kv head, the
// batch's queries into the cell's running statistics (KvCache::observe_queries), then each held
// slot's score into key_scores (KvCache::score_keys), sums in the CPU's order. One block per kv
// head.
struct ExpectArgs {
    KvDevice kv;
    int layer, n_kv, group, head_dim, n, pairs, stride;
    RotaryPairing pairing;
    KvRowFormat key_format, value_format;
    size_t key_row, value_row;
    float scale;
    const float *q;
    int64_t q_cols;
    const int32_t *positions;
    bool positions_per_kv_head;
};

__global__ void __launch_bounds__(kBlock) kv_expect_kernel(ExpectArgs a) {
    __shared__ float rotation[kCudaMaxHeadDim];  // (c, s) per rotary pair
    __shared__ float top, total;
    const int hd = a.head_dim, dims = 2 * a.pairs, units = a.pairs + (hd - dims);
    const size_t words = 2 + 2 * static_cast<size_t>(a.group) * hd;
    for (int h = blockIdx.x; h < a.n_kv; h += gridDim.x) {
        const size_t cell = static_cast<size_t>(a.layer) * a.n_kv + h;
        float *stats = a.kv.query_stats + cell * words;
        float *mean = stats + 2, *variance = mean + static_cast<size_t>(a.group) * hd;
        const int32_t *positions = a.positions + (a.positions_per_kv_head ? static_cast<size_t>(h) * a.n : 0);
        const float count = stats[0], window = kv_expected_attention_queries();
        // One thread per (query head, rotary pair or unrotated dimension), the tokens in order.
        for (int u = threadIdx.x; u < a.group * units; u += blockDim.x) {
            const int g = u / units, i = u % units;
            const bool rotated = i < a.pairs;
            const int e0 = rotated ? rotary_pair_first(a.pairing, i) : dims + (i - a.pairs);
            const int e1 = rotated ? e0 + rotary_pair_offset(a.pairing, a.pairs) : e0;
            float *m = mean + static_cast<size_t>(g) * hd, *v = variance + static_cast<size_t>(g) * hd;
            auto fold = [&](int j, float x, float rate) {
                const float d = x - m[j];
                v[j] = kv_query_variance(v[j], d, rate);
                m[j] = kv_query_mean(m[j], d, rate);
            };
            for (int t = 0; t < a.n; ++t) {
                const float rate = kv_query_rate(fminf(count + static_cast<float>(t), window), window);
                const float *q = a.q + t * a.q_cols + static_cast<size_t>(h * a.group + g) * hd;
                float x = q[e0], y = q[e1];
                if (rotated) {
                    float c, sn;
                    rotary_cos_sin(-positions[t], a.kv.inv_freq[i], &c, &sn);
                    rotate_pair(&x, &y, c, sn);
                }
                fold(e0, x, rate);
                if (rotated) fold(e1, y, rate);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            stats[0] = fminf(count + static_cast<float>(a.n), window);
            stats[1] = static_cast<float>(positions[0]);
        }
        __syncthreads();

        const size_t base = static_cast<size_t>(a.kv.cell_first[cell]);
        const int used = a.kv.used[cell], cell_slots = a.kv.cell_slots[cell];
        // Scores are read only when the batch must evict (kv_claim_kernel).
        if (a.n <= cell_slots - used + a.kv.free_count[cell]) continue;
        for (int i = threadIdx.x; i < a.pairs; i += blockDim.x) {
            kv_expected_rotation(a.kv.inv_freq[i], stats[1], cell_slots, &rotation[2 * i], &rotation[2 * i + 1]);
        }
        float *scores = a.kv.key_scores + static_cast<size_t>(h) * a.stride * 2;  // [slot]: score, logit
        for (int s = threadIdx.x; s < used; s += blockDim.x) scores[2 * s] = 0.0f;
        __syncthreads();
        float row[kCudaMaxHeadDim];
        for (int g = 0; g < a.group; ++g) {
            const float *m = mean + static_cast<size_t>(g) * hd, *v = variance + static_cast<size_t>(g) * hd;
            auto term = [&](int j, float u) { return kv_expected_logit_term(u, m[j], v[j], a.scale); };
            for (int s = threadIdx.x; s < used; s += blockDim.x) {
                if (a.kv.stream[base + s] < 0) continue;
                kv_decode_row(a.key_format, a.kv.keys + (base + s) * a.key_row, hd, row);
                float z = 0.0f;
                for (int i = 0; i < a.pairs; ++i) {
                    const int e0 = rotary_pair_first(a.pairing, i), e1 = e0 + rotary_pair_offset(a.pairing, a.pairs);
                    const float c = rotation[2 * i], sn = rotation[2 * i + 1];
                    z += term(e0, kv_expected_pair_u_first(row[e0], row[e1], c, sn)) +
                         term(e1, kv_expected_pair_u_second(row[e0], row[e1], c, sn));
                }
                for (int j = dims; j < hd; ++j) z += term(j, row[j]);
                scores[2 * s + 1] = z;
            }
            __syncthreads();
            if (threadIdx.x == 0) {  // the softmax's maximum and sum in slot order
                float best = -INFINITY, sum = 0.0f;
                for (int s = 0; s < used; ++s) {
                    if (a.kv.stream[base + s] >= 0) best = fmaxf(best, scores[2 * s + 1]);
                }
                for (int s = 0; s < used; ++s) {
                    if (a.kv.stream[base + s] >= 0) sum += expf(scores[2 * s + 1] - best);
                }
                top = best;
                total = sum;
            }
            __syncthreads();
            for (int s = threadIdx.x; s < used; s += blockDim.x) {
                if (a.kv.stream[base + s] >= 0) scores[2 * s] += expf(scores[2 * s + 1] - top) / (total * static_cast<float>(a.group));
            }
            __syncthreads();
        }
        for (int s = threadIdx.x; s < used; s += blockDim.x) {
            if (a.kv.stream[base + s] < 0) continue;
            kv_decode_row(a.value_format, a.kv.values + (base + s) * a.value_row, hd, row);
            float sum = 0.0f;
            for (int j = 0; j < hd; ++j) sum += row[j] * row[j];
            scores[2 * s] = kv_expected_attention_priority(scores[2 * s], sqrtf(sum));
        }
        __syncthreads();
    }
}

// One layer: for each kv head, make room for the batch (KvCache::make_room), take its slots
// (KvCache::claim_slot) and store its keys and values. One block per kv head, or for the random
// policy one block walking the kv heads in order, its generator being one sequence.
__global__ void __launch_bounds__(kBlock) kv_claim_kernel(ClaimArgs a) {
    __shared__ int sh_used, sh_free, sh_count, sh_victims;
    __shared__ SpanCounts spans;
    for (int h = blockIdx.x; h < a.n_kv; h += gridDim.x) {
        const size_t cell = static_cast<size_t>(a.layer) * a.n_kv + h, base = static_cast<size_t>(a.kv.cell_first[cell]);
        const int cell_slots = a.kv.cell_slots[cell];
        if (threadIdx.x == 0) {
            sh_used = a.kv.used[cell];
            sh_free = a.kv.free_count[cell];
            sh_count = 0;
            sh_victims = 0;
        }
        __syncthreads();
        const int used = sh_used;
        const int needed = a.n - (cell_slots - used + sh_free);
        __syncthreads();  // every thread has read the counts before thread 0 changes them
        int64_t *victims = a.kv.victims + static_cast<size_t>(h) * a.stride;
        auto evict = [&](int slot) {  // thread 0 only
            const size_t at = base + slot;
            victims[sh_victims++] = a.kv.stream[at];
            a.kv.stream[at] = -1;
            a.kv.free_list[base + sh_free++] = slot;
        };
        if (needed > 0) {
            count_spans(a, base, used, &spans);
            int mine = 0;
            for (int s = threadIdx.x; s < used; s += blockDim.x) {
                mine += eligible(a, base + s) && kv_tag_span(a.kv.tag[base + s]) == 0 ? 1 : 0;
            }
            atomicAdd(&sh_count, mine);
            __syncthreads();
            // The policy's choice stands only when enough candidates can be taken.
            const bool enough = takeable(a, spans, sh_count) >= needed;
            if (a.random) {
                // A partial Fisher-Yates shuffle of the candidates in slot order, one draw each
                // until enough are taken or none is left; the draws are made (the generator
                // advances) even when the fallback below replaces the choice.
                if (threadIdx.x == 0) {
                    int count = 0;
                    for (int s = 0; s < used; ++s) {
                        if (eligible(a, base + s)) a.kv.candidates[count++] = s;
                    }
                    int taken = 0;
                    for (int i = 0; i < count && taken < needed; ++i) {
                        const int j = i + static_cast<int>(kv_random_index(kv_next_random(a.kv.rng), static_cast<KV_UINT>(count - i)));
                        const int32_t swap = a.kv.candidates[i];
                        a.kv.candidates[i] = a.kv.candidates[j];
                        a.kv.candidates[j] = swap;
                        const int slot = a.kv.candidates[i];
                        if (!span_allows(a, spans, base + slot)) continue;
                        leave_span(a, &spans, base + slot);
                        a.kv.candidates[taken++] = slot;
                    }
                    if (taken == needed) {
                        for (int i = 0; i < taken; ++i) evict(a.kv.candidates[i]);
                    }
                }
                __syncthreads();
            } else if (enough) {
                // (Expected Attention's scores come from kv_expect_kernel.)
                if (a.policy == KV_POLICY_KEY_NORM || a.policy == KV_POLICY_KEY_DIFF) score_keys(a, base, used, h);
                for (int i = 0; i < needed; ++i) {
                    const int slot = argmin_slot(a, spans, cell, base, used, false, h);
                    if (threadIdx.x == 0) {
                        leave_span(a, &spans, base + slot);
                        evict(slot);
                    }
                    __syncthreads();
                }
            }
            if (!enough) {
                // Everything evictable is protected by the windows: the oldest unpinned tokens
                // go, span minimums still kept.
                count_spans(a, base, used, &spans);
                for (int i = 0; i < needed; ++i) {
                    const int slot = argmin_slot(a, spans, cell, base, used, true, h);
                    if (slot < 0) break;
                    if (threadIdx.x == 0) {
                        leave_span(a, &spans, base + slot);
                        evict(slot);
                    }
                    __syncthreads();
                }
            }
            __syncthreads();
            const int evicted = sh_victims;
            if (a.rolling && evicted > 0) {
                // Each kept token moves back one rank per evicted token that preceded it.
                for (int s = threadIdx.x; s < used; s += blockDim.x) {
                    const size_t at = base + s;
                    const int64_t index = a.kv.stream[at];
                    if (index < 0) continue;
                    int shift = 0;
                    for (int i = 0; i < evicted; ++i) shift += victims[i] < index ? 1 : 0;
                    if (shift == 0) continue;
                    a.kv.position[at] -= shift;
                    roll_key_back(a.kv.keys + at * a.key_row, shift, a.key_format, a.head_dim, a.kv.inv_freq, a.pairing, a.pairs);
                }
            }
            __syncthreads();
        }
        int32_t *batch_slot = a.kv.batch_slot + static_cast<size_t>(h) * a.stride;
        const int32_t *positions = a.positions + (a.positions_per_kv_head ? static_cast<size_t>(h) * a.n : 0);
        if (threadIdx.x == 0) {
            for (int t = 0; t < a.n; ++t) {
                const int slot = sh_free > 0 ? a.kv.free_list[base + --sh_free] : sh_used++;
                batch_slot[t] = slot;
                const size_t at = base + slot;
                a.kv.stream[at] = a.first_index + t;
                a.kv.position[at] = positions[t];
                a.kv.tag[at] = a.tag;
                if (a.kv.stats) a.kv.stats[at] = kv_stats_zero();
            }
            a.kv.used[cell] = sh_used;
            a.kv.free_count[cell] = sh_free;
        }
        __syncthreads();
        // One thread per row: a quantized row's scale depends on all of its elements.
        for (int u = threadIdx.x; u < 2 * a.n; u += blockDim.x) {
            const int t = u / 2;
            const size_t at = base + batch_slot[t];
            if (u % 2 == 0) {
                kv_encode_row(a.key_format, a.k + t * a.k_cols + h * a.head_dim, a.head_dim, a.kv.keys + at * a.key_row);
            } else {
                kv_encode_row(a.value_format, a.v + t * a.v_cols + h * a.head_dim, a.head_dim, a.kv.values + at * a.value_row);
            }
        }
        __syncthreads();
    }
}

struct AttentionArgs {
    KvDevice kv;
    int layer, n_kv, n_head, stride, head_dim, n, t0;  // stride: of the scores' rows
    KvRowFormat key_format, value_format;
    size_t key_row, value_row;
    int64_t first_index;
    float scale;
    float softcap;   // scores become soft_cap(score, softcap); 0: as they are
    int64_t window;  // a local layer's sliding window (0: a global layer)
    const float *q;
    int64_t q_cols;
    float *out;
    int64_t out_cols;
    // A query head's slots are read in n_split ranges of split_len slots, one block each, so that
    // a long cache read by one token still spreads over the device (split attention).
    int n_split, split_len;
    SoftmaxState *split_state;  // [chunk][n_head][n_split]: each range's softmax
    int32_t *split_visible;     // [chunk][n_kv][n_split]: each range's visible slots
    float *partial_out;         // [chunk][n_head][n_split][head_dim]: each range's weighted values (n_split > 1)
};

constexpr int kAttentionWarps = kBlock / 32;

// Whether the query at stream index `query` sees the token at `index` (-1: a free slot): stored,
// not after it and, in a local layer (window > 0), less than `window` tokens before it.
__device__ bool attention_visible(int64_t index, int64_t query, int64_t window) {
    return index >= 0 && index <= query && (window == 0 || index > query - window);
}

struct AttentionBlock {
    int c, t, head, h, group, split, begin, end;
    size_t cell, base;
};

__device__ AttentionBlock attention_block(const AttentionArgs &a) {
    AttentionBlock b;
    b.c = blockIdx.x;
    b.t = a.t0 + b.c;
    b.head = blockIdx.y;
    b.split = blockIdx.z;
    b.group = a.n_head / a.n_kv;
    b.h = b.head / b.group;
    b.cell = static_cast<size_t>(a.layer) * a.n_kv + b.h;
    b.base = static_cast<size_t>(a.kv.cell_first[b.cell]);
    const int used = a.kv.used[b.cell];
    b.begin = min(used, b.split * a.split_len);
    b.end = min(used, b.begin + a.split_len);
    return b;
}

// Pass 1, one block per (query token of the chunk, query head, range of slots): the range's
// scores, kept in the chunk's scratch, and their online softmax.
__global__ void __launch_bounds__(kBlock) attention_scores_kernel(AttentionArgs a) {
    __shared__ float q[kCudaMaxHeadDim];
    __shared__ SoftmaxState states[kBlock];
    __shared__ int counts[kBlock];
    const AttentionBlock b = attention_block(a);
    const int64_t query_index = a.first_index + b.t;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) q[d] = a.q[b.t * a.q_cols + b.head * a.head_dim + d];
    __syncthreads();
    float *weights = a.kv.scores + (static_cast<size_t>(b.c) * a.n_head + b.head) * a.stride;
    SoftmaxState state = softmax_empty();
    int visible = 0;
    for (int s = b.begin + threadIdx.x; s < b.end; s += blockDim.x) {
        const int64_t index = a.kv.stream[b.base + s];
        float score = -INFINITY;
        if (attention_visible(index, query_index, a.window)) {
            const uint8_t *row = a.kv.keys + (b.base + s) * a.key_row;
            float dot = 0.0f;
            for (int d = 0; d < a.head_dim; ++d) dot += q[d] * kv_row_element(a.key_format, row, d);
            score = dot * a.scale;
            if (a.softcap != 0.0f) score = soft_cap(score, a.softcap);
            ++visible;
        }
        weights[s] = score;
        state = softmax_add(state, score);
    }
    states[threadIdx.x] = state;
    counts[threadIdx.x] = visible;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        if (static_cast<int>(threadIdx.x) < half) {
            states[threadIdx.x] = softmax_merge(states[threadIdx.x], states[threadIdx.x + half]);
            counts[threadIdx.x] += counts[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        a.split_state[(static_cast<size_t>(b.c) * a.n_head + b.head) * a.n_split + b.split] = states[0];
        if (b.head % b.group == 0) a.split_visible[(static_cast<size_t>(b.c) * a.n_kv + b.h) * a.n_split + b.split] = counts[0];
    }
}

// Pass 2, the same blocks: the ranges' softmaxes merged in range order, the range's weights
// normalised in the scratch (for the statistics), and its weighted sum of the value rows, written
// as the output when there is one range and as the range's part otherwise.
__global__ void __launch_bounds__(kBlock) attention_values_kernel(AttentionArgs a) {
    __shared__ SoftmaxState total;
    const AttentionBlock b = attention_block(a);
    if (threadIdx.x == 0) {
        const SoftmaxState *states = a.split_state + (static_cast<size_t>(b.c) * a.n_head + b.head) * a.n_split;
        SoftmaxState merged = states[0];
        for (int i = 1; i < a.n_split; ++i) merged = softmax_merge(merged, states[i]);
        total = merged;
        if (b.split == 0 && b.head % b.group == 0) {
            const int32_t *counts = a.split_visible + (static_cast<size_t>(b.c) * a.n_kv + b.h) * a.n_split;
            int visible = 0;
            for (int i = 0; i < a.n_split; ++i) visible += counts[i];
            a.kv.visible[static_cast<size_t>(b.c) * a.n_kv + b.h] = visible;
        }
    }
    __syncthreads();
    float *weights = a.kv.scores + (static_cast<size_t>(b.c) * a.n_head + b.head) * a.stride;
    for (int s = b.begin + threadIdx.x; s < b.end; s += blockDim.x) weights[s] = softmax_weight(total, weights[s]);
    __syncthreads();
    // Warp w takes the range's slots w, w + kAttentionWarps, ..., its lanes a row's dimensions side
    // by side; the warps' sums are then added in warp order.
    __shared__ float warp_out[kAttentionWarps][kCudaMaxHeadDim];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int d0 = 0; d0 < a.head_dim; d0 += 32) {
        const int d = d0 + lane;
        float acc = 0.0f;
        if (d < a.head_dim) {
            for (int s = b.begin + warp; s < b.end; s += kAttentionWarps) {
                const float w = weights[s];
                if (w != 0.0f) acc += w * kv_row_element(a.value_format, a.kv.values + (b.base + s) * a.value_row, d);
            }
            warp_out[warp][d] = acc;
        }
    }
    __syncthreads();
    float *dest = a.n_split == 1 ? a.out + b.t * a.out_cols + b.head * a.head_dim
                                 : a.partial_out + ((static_cast<size_t>(b.c) * a.n_head + b.head) * a.n_split + b.split) * a.head_dim;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < kAttentionWarps; ++w) acc += warp_out[w][d];
        dest[d] = acc;
    }
}

// Pass 3 when there are several ranges, one block per (query token, query head): the ranges'
// parts added in range order.
__global__ void attention_reduce_kernel(AttentionArgs a) {
    const int c = blockIdx.x, head = blockIdx.y;
    const float *parts = a.partial_out + (static_cast<size_t>(c) * a.n_head + head) * a.n_split * a.head_dim;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < a.n_split; ++i) acc += parts[static_cast<size_t>(i) * a.head_dim + d];
        a.out[(a.t0 + c) * a.out_cols + head * a.head_dim + d] = acc;
    }
}

struct StatsArgs {
    KvDevice kv;
    int layer, n_kv, n_head, stride, n, t0, count;  // stride: of the per-kv-head scratch
    int64_t first_index;
    float decay;
    int proxy;       // kv_proxy_queries
    int64_t window;  // a local layer's sliding window (0: a global layer)
};

// The chunk's queries' contributions to each slot's statistics of the batch (kv_policy_spec.h):
// blocks (kv head, range of kBlock slots), one thread per slot.
__global__ void attention_stats_kernel(StatsArgs a) {
    const int h = blockIdx.x, group = a.n_head / a.n_kv;
    const size_t cell = static_cast<size_t>(a.layer) * a.n_kv + h, base = static_cast<size_t>(a.kv.cell_first[cell]);
    const int used = a.kv.used[cell];
    for (int s = blockIdx.y * blockDim.x + threadIdx.x; s < used; s += gridDim.y * blockDim.x) {
        const int64_t index = a.kv.stream[base + s];
        if (index < 0) continue;
        SlotStats partial = a.kv.partial[static_cast<size_t>(h) * a.stride + s];
        for (int c = 0; c < a.count; ++c) {
            const int t = a.t0 + c;
            if (!attention_visible(index, a.first_index + t, a.window)) continue;
            float w = 0.0f;
            for (int g = 0; g < group; ++g) w += a.kv.scores[(static_cast<size_t>(c) * a.n_head + h * group + g) * a.stride + s];
            const float threshold = kv_importance_threshold(static_cast<KV_UINT>(group),
                                                            static_cast<KV_UINT>(a.kv.visible[static_cast<size_t>(c) * a.n_kv + h]));
            partial = kv_stats_add_query(
                partial, w, threshold, kv_persistence_weight(a.decay, static_cast<KV_UINT>(a.n), static_cast<KV_UINT>(t)),
                kv_is_proxy_query(static_cast<KV_UINT>(a.n), static_cast<KV_UINT>(t), static_cast<KV_UINT>(a.proxy)));
        }
        a.kv.partial[static_cast<size_t>(h) * a.stride + s] = partial;
    }
}

__global__ void attention_fold_kernel(KvDevice kv, int layer, int n_kv, int stride, float old_persistence_weight) {
    const int h = blockIdx.x;
    const size_t cell = static_cast<size_t>(layer) * n_kv + h, base = static_cast<size_t>(kv.cell_first[cell]);
    const int used = kv.used[cell];
    for (int s = blockIdx.y * blockDim.x + threadIdx.x; s < used; s += gridDim.y * blockDim.x) {
        kv.stats[base + s] =
            kv_stats_fold(kv.stats[base + s], kv.partial[static_cast<size_t>(h) * stride + s], old_persistence_weight, true);
    }
}

}  // namespace

Status CudaBackend::attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                              const ModelShape &shape) {
    H2O_TRY(failed_);
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: attention without a KV cache");
    const int n = batch.n_tokens;
    if (n <= 0) return Status::Ok();
    // Each cell's region is on the device (cell_first, cell_slots); the scratch rows are as long
    // as the most slots a cell of the layer may hold.
    const int stride = kv_config_.max_cell_slots(layer);
    if (n > kv_config_.min_cell_slots(layer)) return make_error(H2O_ERR_INTERNAL, "cuda backend: a batch larger than the KV cache");
    if (shape.n_head_kv != kv_config_.n_head_kv || shape.head_dim != kv_config_.head_dim || shape.n_head % shape.n_head_kv != 0) {
        return make_error(H2O_ERR_INTERNAL, "cuda backend: the model's heads do not match the KV cache");
    }
    H2O_TRY(ensure_attention_scratch(shape));
    const KvPolicyConfig policy = kv_config_.policy_in(layer);
    const ClaimArgs c = claim_args(k, v, layer, batch, shape, policy, stride);
    if (policy.policy == KvPolicy::ExpectedAttention) H2O_TRY(expect_queries(c, q, shape));
    kv_claim_kernel<<<c.random ? 1 : shape.n_head_kv, kBlock, 0, stream_>>>(c);
    H2O_TRY(launched("kv_claim"));

    const bool statistics = kv_.stats != nullptr;
    if (statistics) {
        H2O_TRY(check(cudaMemsetAsync(kv_.partial, 0, sizeof(SlotStats) * static_cast<size_t>(shape.n_head_kv) * stride, stream_),
                      "cudaMemsetAsync"));
    }
    const dim3 slot_blocks(static_cast<unsigned>(shape.n_head_kv), static_cast<unsigned>((stride + kBlock - 1) / kBlock));
    for (int t0 = 0; t0 < n; t0 += chunk_) {
        const int count = std::min(chunk_, n - t0);
        H2O_TRY(attend_chunk(out, q, layer, batch, shape, c, t0, count));
        if (!statistics) continue;
        StatsArgs s;
        s.kv = kv_;
        s.layer = layer;
        s.n_kv = shape.n_head_kv;
        s.n_head = shape.n_head;
        s.stride = stride;
        s.n = n;
        s.t0 = t0;
        s.count = count;
        s.first_index = batch.first_index;
        s.decay = policy.persistence_decay;
        s.proxy = kv_proxy_queries(policy);
        s.window = shape.is_local(layer) ? shape.sliding_window : 0;
        attention_stats_kernel<<<slot_blocks, kBlock, 0, stream_>>>(s);
        H2O_TRY(launched("attention_stats"));
    }
    if (statistics) {
        attention_fold_kernel<<<slot_blocks, kBlock, 0, stream_>>>(kv_, layer, shape.n_head_kv, stride,
                                                                   kv_power(policy.persistence_decay, static_cast<KV_UINT>(n)));
        H2O_TRY(launched("attention_fold"));
    }
    return Status::Ok();
}

// The attention scratch, sized at the first attention call (when the number of query heads is
// known): the weights of a chunk of queries and their visible-slot counts, as many tokens as the
// budget allows, and split attention's parts.
Status CudaBackend::ensure_attention_scratch(const ModelShape &shape) {
    if (scratch_heads_ >= shape.n_head) return Status::Ok();
    const size_t per_token = sizeof(float) * static_cast<size_t>(shape.n_head) * kv_config_.max_cell_slots() +
                             sizeof(int32_t) * static_cast<size_t>(shape.n_head_kv);
    chunk_ = static_cast<int>(std::clamp<size_t>(kAttentionScratchBudget / per_token, 1, static_cast<size_t>(max_batch_)));
    H2O_TRY(device_array(per_token / sizeof(float) * chunk_, &kv_.scores));
    H2O_TRY(device_array(static_cast<size_t>(shape.n_head_kv) * chunk_, &kv_.visible));
    // Split attention's parts: at most about kAttentionSplitBlocks ranges beyond one per
    // (query, head) (attention_splits).
    const size_t parts = static_cast<size_t>(chunk_) * shape.n_head + 2 * kAttentionSplitBlocks;
    H2O_TRY(device_array(parts, &split_state_));
    H2O_TRY(device_array(parts, &split_visible_));
    H2O_TRY(device_array(parts * static_cast<size_t>(shape.head_dim), &partial_out_));
    scratch_heads_ = shape.n_head;
    return Status::Ok();
}

// What kv_claim_kernel needs to make room in a layer's cells and store the batch's keys and values.
ClaimArgs CudaBackend::claim_args(const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch, const ModelShape &shape,
                                  const KvPolicyConfig &policy, int stride) const {
    const int n = batch.n_tokens;
    ClaimArgs c;
    c.kv = kv_;
    if (kv_config_.is_window_layer(layer)) c.kv.inv_freq = local_inv_freq_;  // rolled keys turn back by the local rotation
    c.layer = layer;
    c.n_kv = shape.n_head_kv;
    c.stride = stride;
    c.head_dim = shape.head_dim;
    c.n = n;
    c.pairs = kv_config_.rope.pairs();
    c.pairing = kv_config_.rope.pairing;
    c.key_format = kv_key_format(kv_config_.type);
    c.value_format = kv_value_format(kv_config_.type);
    c.key_row = key_row_;
    c.value_row = value_row_;
    c.policy = static_cast<uint32_t>(policy.policy);
    c.first_index = batch.first_index;
    c.recent_from = kv_recent_from(policy, batch.first_index, n);
    c.stale_before = kv_stale_before(policy, batch.first_index, n);
    c.sinks = policy.sinks;
    c.tag = batch.tag;
    std::copy(span_min_, span_min_ + KV_MAX_SPANS, c.span_min);
    c.rolling = kv_config_.rolling;
    c.random = policy.policy == KvPolicy::Random;
    c.by_proxy = kv_ranks_by_proxy(policy, n);
    c.prompt_share = policy.prompt_random_share;
    c.prompt_seed = kv_prompt_seed(policy);
    c.k = device_ptr<const float>(k);
    c.v = device_ptr<const float>(v);
    c.k_cols = k.cols;
    c.v_cols = v.cols;
    c.positions = device_ptr<const int32_t>(batch.positions);
    c.positions_per_kv_head = batch.positions_per_kv_head;
    return c;
}

// Expected Attention: the batch's queries into the cells' statistics, then every held slot's
// score (kv_expect_kernel), which the claim ranks by.
Status CudaBackend::expect_queries(const ClaimArgs &c, const Tensor &q, const ModelShape &shape) {
    ExpectArgs e;
    e.kv = kv_;
    e.layer = c.layer;
    e.n_kv = shape.n_head_kv;
    e.group = kv_config_.query_group;
    e.head_dim = shape.head_dim;
    e.n = c.n;
    e.pairs = kv_config_.rope.pairs();
    e.stride = c.stride;
    e.pairing = kv_config_.rope.pairing;
    e.key_format = c.key_format;
    e.value_format = c.value_format;
    e.key_row = key_row_;
    e.value_row = value_row_;
    e.scale = kv_config_.attention_scale;
    e.q = device_ptr<const float>(q);
    e.q_cols = q.cols;
    e.positions = c.positions;
    e.positions_per_kv_head = c.positions_per_kv_head;
    kv_expect_kernel<<<shape.n_head_kv, kBlock, 0, stream_>>>(e);
    return launched("kv_expect");
}

// Attention of the batch's queries [t0, t0 + count) over the layer's cells, each (query, head)
// reading its slots in one range or, when few, in several that attention_reduce_kernel joins.
Status CudaBackend::attend_chunk(const Tensor &out, const Tensor &q, int layer, const AttentionBatch &batch, const ModelShape &shape,
                                 const ClaimArgs &c, int t0, int count) {
    AttentionArgs a;
    a.kv = kv_;
    a.layer = layer;
    a.n_kv = shape.n_head_kv;
    a.n_head = shape.n_head;
    a.stride = c.stride;
    a.head_dim = shape.head_dim;
    a.n = c.n;
    a.t0 = t0;
    a.key_format = c.key_format;
    a.value_format = c.value_format;
    a.key_row = key_row_;
    a.value_row = value_row_;
    a.first_index = batch.first_index;
    a.scale = shape.attention_scale != 0.0f ? shape.attention_scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    a.softcap = shape.attention_softcap;
    a.window = shape.is_local(layer) ? shape.sliding_window : 0;
    a.q = device_ptr<const float>(q);
    a.q_cols = q.cols;
    a.out = device_ptr<float>(out);
    a.out_cols = out.cols;
    a.n_split = attention_splits(count * shape.n_head, c.stride);
    a.split_len = (c.stride + a.n_split - 1) / a.n_split;
    a.split_state = split_state_;
    a.split_visible = split_visible_;
    a.partial_out = partial_out_;
    const dim3 blocks(static_cast<unsigned>(count), static_cast<unsigned>(shape.n_head), static_cast<unsigned>(a.n_split));
    attention_scores_kernel<<<blocks, kBlock, 0, stream_>>>(a);
    H2O_TRY(launched("attention_scores"));
    attention_values_kernel<<<blocks, kBlock, 0, stream_>>>(a);
    H2O_TRY(launched("attention_values"));
    if (a.n_split > 1) {
        attention_reduce_kernel<<<dim3(static_cast<unsigned>(count), static_cast<unsigned>(shape.n_head)), 128, 0, stream_>>>(a);
        H2O_TRY(launched("attention_reduce"));
    }
    return Status::Ok();
}

}  // namespace h2o

// The query-agnostic scorers on the host cache (kv_policy_spec.h states them): key_norm, key_diff
// and expected_attention rank a cell's tokens by its stored rows, and Expected Attention also by
// the running statistics of the queries the cell has seen (KvImage::query_stats).
#include <cmath>

#include "kv_cache.h"
#include "rotary.h"

namespace h2o {

namespace {

float norm_of(const float *x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += x[i] * x[i];
    return std::sqrt(sum);
}

float dot_of(const float *a, const float *b, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

}  // namespace

const float *KvCache::decoded_key(const CellView &v, int s, EvictionScratch &scratch) const {
    kv_load_row(key_format_, v.keys + static_cast<size_t>(s) * image_.key_row_bytes, config_.head_dim, scratch.key.data());
    return scratch.key.data();
}

void KvCache::observe_queries(int layer, int kv_head, const float *queries, int64_t stride, const int32_t *positions, int n, int thread) {
    if (config_.policy.policy != KvPolicy::ExpectedAttention || config_.is_window_layer(layer)) return;
    EvictionScratch &scratch = scratch_[static_cast<size_t>(thread)];
    const int hd = config_.head_dim, group = config_.query_group, n_pairs = config_.rope.pairs();
    float *stats = image_.query_stats.data() + cell_index(layer, kv_head) * kv_query_stats_floats(config_);
    float *mean = stats + 2, *variance = mean + static_cast<size_t>(group) * hd;
    float *query = scratch.row.data();
    stats[1] = static_cast<float>(positions[0]);
    for (int t = 0; t < n; ++t) {
        // Each pair turned back by the query's position: the query as it was before rotation
        // (scaled by the rotary magnitude, as the stored keys are).
        float *cos_sin = scratch.rotation.data();
        for (int i = 0; i < n_pairs; ++i)
            rotary_cos_sin(-positions[t], rope_inv_freq_[static_cast<size_t>(i)], &cos_sin[2 * i], &cos_sin[2 * i + 1]);
        const float rate = kv_query_rate(stats[0], kv_expected_attention_queries());
        for (int g = 0; g < group; ++g) {
            const float *q = queries + t * stride + static_cast<int64_t>(g) * hd;
            for (int j = 0; j < hd; ++j) query[j] = q[j];
            for (int i = 0; i < n_pairs; ++i) rotate_head_pair(query, config_.rope.pairing, i, n_pairs, cos_sin[2 * i], cos_sin[2 * i + 1]);
            float *m = mean + static_cast<size_t>(g) * hd, *v = variance + static_cast<size_t>(g) * hd;
            for (int j = 0; j < hd; ++j) {
                const float d = query[j] - m[j];
                v[j] = kv_query_variance(v[j], d, rate);
                m[j] = kv_query_mean(m[j], d, rate);
            }
        }
        // The count stops at the window: the rate is constant from there on.
        stats[0] = std::fmin(stats[0] + 1.0f, kv_expected_attention_queries());
    }
}

void KvCache::score_keys(int layer, int kv_head, int used, EvictionScratch &scratch) {
    const CellView v = cell(layer, kv_head);
    const int hd = config_.head_dim;
    float *priority = scratch.priority.data();
    const KvPolicy policy = config_.policy.policy;
    if (policy == KvPolicy::KeyNorm) {
        for (int s = 0; s < used; ++s) {
            if (v.stream_index[s] >= 0) priority[s] = kv_key_norm_priority(norm_of(decoded_key(v, s, scratch), hd));
        }
        return;
    }
    if (policy == KvPolicy::KeyDiff) {
        // The anchor: the mean of the cell's keys at unit length (its length does not matter).
        // Each key's norm waits in its priority until the second pass reads it.
        float *anchor = scratch.anchor.data();
        std::fill(anchor, anchor + hd, 0.0f);
        for (int s = 0; s < used; ++s) {
            if (v.stream_index[s] < 0) continue;
            const float *key = decoded_key(v, s, scratch);
            const float norm = priority[s] = norm_of(key, hd);
            for (int j = 0; norm > 0.0f && j < hd; ++j) anchor[j] += key[j] / norm;
        }
        const float anchor_norm = norm_of(anchor, hd);
        for (int s = 0; s < used; ++s) {
            if (v.stream_index[s] < 0) continue;
            const float *key = decoded_key(v, s, scratch);
            const float norms = priority[s] * anchor_norm;
            priority[s] = kv_key_diff_priority(norms > 0.0f ? dot_of(key, anchor, hd) / norms : 0.0f);
        }
        return;
    }
    // Expected Attention. The average rotation over the next T positions from the latest batch's
    // first (kv_expected_rotation). T is the cell's slots: with rolling no query is further than
    // that from a kept key, and without it a token kept that long has met that many queries.
    const int group = config_.query_group, n_pairs = config_.rope.pairs();
    const float *stats = image_.query_stats.data() + cell_index(layer, kv_head) * kv_query_stats_floats(config_);
    const float *mean = stats + 2, *variance = mean + static_cast<size_t>(group) * hd;
    float *rotation = scratch.rotation.data();
    for (int i = 0; i < n_pairs; ++i) {
        kv_expected_rotation(rope_inv_freq_[static_cast<size_t>(i)], stats[1], cell_slots(layer, kv_head), &rotation[2 * i],
                             &rotation[2 * i + 1]);
    }
    const float scale = config_.attention_scale;
    const int offset = rotary_pair_offset(config_.rope.pairing, n_pairs);
    float *logits = scratch.logits.data();
    const size_t stride = static_cast<size_t>(max_cell_slots_);
    for (int s = 0; s < used; ++s) {
        if (v.stream_index[s] < 0) continue;
        const float *key = decoded_key(v, s, scratch);
        for (int g = 0; g < group; ++g) {
            const float *m = mean + static_cast<size_t>(g) * hd, *spread = variance + static_cast<size_t>(g) * hd;
            auto term = [&](int j, float u) { return kv_expected_logit_term(u, m[j], spread[j], scale); };
            float z = 0.0f;
            for (int i = 0; i < n_pairs; ++i) {
                const int a = rotary_pair_first(config_.rope.pairing, i), b = a + offset;
                const float c = rotation[2 * i], sn = rotation[2 * i + 1];
                z += term(a, kv_expected_pair_u_first(key[a], key[b], c, sn)) + term(b, kv_expected_pair_u_second(key[a], key[b], c, sn));
            }
            for (int j = config_.rope.dims; j < hd; ++j) z += term(j, key[j]);
            logits[g * stride + s] = z;
        }
    }
    // Each query head's softmax over the cell's tokens, averaged over the group, times |v|.
    for (int s = 0; s < used; ++s) priority[s] = 0.0f;
    for (int g = 0; g < group; ++g) {
        const float *z = logits + g * stride;
        float top = -INFINITY, sum = 0.0f;
        for (int s = 0; s < used; ++s) {
            if (v.stream_index[s] >= 0) top = std::fmax(top, z[s]);
        }
        for (int s = 0; s < used; ++s) {
            if (v.stream_index[s] >= 0) sum += std::exp(z[s] - top);
        }
        for (int s = 0; s < used; ++s) {
            if (v.stream_index[s] >= 0) priority[s] += std::exp(z[s] - top) / (sum * static_cast<float>(group));
        }
    }
    for (int s = 0; s < used; ++s) {
        if (v.stream_index[s] < 0) continue;
        kv_load_row(value_format_, v.values + static_cast<size_t>(s) * image_.value_row_bytes, hd, scratch.row.data());
        priority[s] = kv_expected_attention_priority(priority[s], norm_of(scratch.row.data(), hd));
    }
}

}  // namespace h2o

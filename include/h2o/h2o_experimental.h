/**
 * @file h2o_experimental.h
 * Research settings of h2o's KV cache, outside the stable interface.
 *
 * The settings here are experiments: each is tested and saved in snapshots like any other, but
 * any minor release may change what one does, or remove it (setting a removed key then fails
 * with H2O_ERR_UNSUPPORTED), without a new H2O_ABI_VERSION. They live in the
 * h2o_session_params.experimental array, by key, so that adding or removing one changes no
 * struct: a binding exposes them through the functions below, not field by field.
 *
 * A key's value 0 leaves its experiment off. h2o_session_params_init writes 0 for every key but
 * H2O_EXP_KV_REBALANCE_INTERVAL, whose default is measured to cost little (see there).
 */
#ifndef H2O_EXPERIMENTAL_H
#define H2O_EXPERIMENTAL_H

#include "h2o.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The research settings, as keys of h2o_session_params.experimental. */
typedef enum h2o_experimental_key {
    /** How the KV memory spreads across layers, in [-0.9, 0.9]: layer l of L gets
     * kv_budget * (1 + slope * (2l / (L - 1) - 1)) slots per kv head (rounded, at least 2), so
     * that the layers together hold L * kv_budget, the memory of a uniform cache. Positive: upper
     * layers get more slots than lower ones. Each layer's recent window is the same share of its
     * slots as kv_recent is of kv_budget; pinned tokens and span minimums must fit the smallest
     * layer. On a model with sliding-window layers, the budget spreads over its global layers
     * alone (a local layer holds its window). Ignored by a full cache (every layer then holds
     * n_ctx). */
    H2O_EXP_KV_LAYER_SLOPE = 0,
    /** One-shot prompt eviction (as NACL, within the fixed slots), a count in [0, 4096]. 0: while
     * a prompt is read, each batch's victims are the ones the policy ranks lowest by the
     * statistics of every query read so far. N > 0: a batch of more than one token ranks them by
     * the attention of the previous batch's last N queries (what the end of the text read so far
     * attends to), H2O_EXP_KV_PROMPT_RANDOM_SHARE of the tokens with that attention multiplied by
     * a random factor in [0, 2) drawn from the seed; generation keeps the policy's ranking. Only
     * with the policies that gather statistics (h2o_kv_policy_info). */
    H2O_EXP_KV_PROMPT_PROXY = 1,
    /** The share of tokens, in [0, 1], whose proxy attention gets a random factor when
     * H2O_EXP_KV_PROMPT_PROXY > 0 (NACL's random eviction: tokens the proxy ignores may stay). */
    H2O_EXP_KV_PROMPT_RANDOM_SHARE = 2,
    /** Budgets per kv head (as Ada-KV, within the same memory), in [0, 0.9]: the share of each
     * layer's slots that moves between its kv heads by their attention. Before a batch (every
     * H2O_EXP_KV_REBALANCE_INTERVAL stream tokens), a layer that must evict does so across all
     * its kv heads at once, taking the tokens its policy values least, and each head's region of
     * the layer's slots is resized to what it kept plus an even share of the rest. Each head keeps
     * at least (1 - share) of its layer's budget, and more when pinned tokens and span minimums
     * need it: a head too small to hold them and a slot to evict into is raised at once, taking
     * slots from the heads above their minimum, so that pins up to the largest size every head
     * can be given at once, less one, are accepted (kv_budget - 1 within each layer and, with
     * H2O_EXP_KV_SHARE_ACROSS_LAYERS, mostly across layers too). Only with the policies that gather
     * statistics; ignored by a full cache. With position_rolling, each head's rotary positions
     * are ranks among its own tokens. On a model with sliding-window layers, slots move within
     * each global layer (a local layer holds its window). Every backend runs it: the CPU on its
     * cache, Vulkan and CUDA on a host copy of theirs at each rebalancing. */
    H2O_EXP_KV_HEAD_SHARE = 3,
    /** 1: H2O_EXP_KV_HEAD_SHARE's slots move between the kv heads of every layer instead of each
     * layer's own, so a layer whose heads attend to few tokens gives slots to one whose heads
     * attend to many. Needs a head share above 0 (ignored by a full cache); refused for models
     * with sliding-window layers, whose global layers' cells are not one region. On the Vulkan
     * backend the whole cache's keys (and its values) must then fit one storage buffer binding. */
    H2O_EXP_KV_SHARE_ACROSS_LAYERS = 4,
    /** 1: every evicting policy keeps the first kv_sinks tokens of the stream (attention sinks),
     * not only sink_window and mean_h2o, which always do. kv_sinks must then be smaller than the
     * smallest layer's budget. */
    H2O_EXP_KV_SINKS_EVERY_POLICY = 5,
    /** How often budgets per kv head move, in stream tokens, in [0, 1048576]: a batch that holds a
     * stream index divisible by N rebalances as H2O_EXP_KV_HEAD_SHARE describes; the batches
     * between keep every head's region and evict within it by the policy, as fixed budgets do.
     * 0 (or 1): before every batch, as sessions before this key did (a snapshot of format 8 or
     * older loads with 0). h2o_session_params_init writes H2O_KV_REBALANCE_INTERVAL_DEFAULT.
     * Ignored (read back as 0) without a head share. */
    H2O_EXP_KV_REBALANCE_INTERVAL = 6
} h2o_experimental_key;

/** H2O_EXP_KV_REBALANCE_INTERVAL's value in h2o_session_params_init. */
#define H2O_KV_REBALANCE_INTERVAL_DEFAULT 16

/** The name of a key as tools print it ("kv_layer_slope", "kv_prompt_proxy",
 * "kv_prompt_random_share", "kv_head_share", "kv_share_across_layers",
 * "kv_sinks_every_policy", "kv_rebalance_interval"): NULL for a key this library does not know, so iterating from 0
 * until NULL lists them all. */
H2O_API const char *h2o_experimental_name(uint32_t key);
/** Parses such a name. Errors: H2O_ERR_INVALID_ARGUMENT (NULL arguments or an unknown name). */
H2O_API h2o_status h2o_experimental_from_name(const char *name, uint32_t *key);
/** The values a key accepts: [*min, *max] (the keys documented above as counts, flags or
 * intervals also need a whole number), as h2o_session_params_set_experimental checks them, so
 * that tools and bindings need not repeat the limits. The ends of a setting the session holds as
 * a float are that float's value (0.9 as 0.89999997...). Errors: H2O_ERR_INVALID_ARGUMENT (NULL
 * min or max), H2O_ERR_UNSUPPORTED (a key this library does not know). Since 0.8. */
H2O_API h2o_status h2o_experimental_bounds(uint32_t key, double *min, double *max);

/** Sets a research setting in *params (after h2o_session_params_init). Errors:
 * H2O_ERR_INVALID_ARGUMENT (NULL params, a struct_size too small to hold the settings, or a value
 * outside the key's range or not a whole number where one is needed), H2O_ERR_UNSUPPORTED (a key
 * this library does not know). Whether it suits the session's other settings (a policy that
 * gathers statistics, say) is checked by h2o_session_create. */
H2O_API h2o_status h2o_session_params_set_experimental(h2o_session_params *params, uint32_t key, double value);
/** Reads a research setting of *params. Errors as h2o_session_params_set_experimental. */
H2O_API h2o_status h2o_session_params_get_experimental(const h2o_session_params *params, uint32_t key, double *value);
/** The value a session runs with, after resolution (0 where the session ignores the setting: a
 * full cache, say). Errors: H2O_ERR_INVALID_ARGUMENT (NULL arguments), H2O_ERR_UNSUPPORTED (an
 * unknown key). */
H2O_API h2o_status h2o_session_get_experimental(const h2o_session *session, uint32_t key, double *value);

/** llama.cpp's context shift, for comparing the eviction policies with the strategy most
 * runtimes use at a full context (h2o-eval's `shift`): evicts, from every (layer, kv head) at once,
 * the n_discard oldest tokens that are not pinned among those from stream index n_keep on; with
 * position_rolling the tokens after them move back n_discard positions (their keys rotated back),
 * so the cache holds n_discard free slots. The evicted tokens count in h2o_kv_usage's n_evicted;
 * evicting_since stays the length at which the cache itself filled. Needs a cache whose cells all
 * have the same slots (no kv_layer_slope, no kv_head_share, no sliding-window layers), no
 * retention spans, a policy other than H2O_KV_FULL, and the CPU backend. Errors:
 * H2O_ERR_INVALID_ARGUMENT (NULL session, a full-cache policy, or a (layer, kv head) holding fewer
 * than n_discard such tokens: the message names it, and nothing changes), H2O_ERR_UNSUPPORTED (a
 * cache or backend that cannot). Since 0.8. */
H2O_API h2o_status h2o_experimental_session_discard(h2o_session *session, uint64_t n_keep, uint64_t n_discard);

/** What an offline reference that chooses its own victims reads (h2o-eval's `oracle`): for every
 * slot, [layer][kv head][slot] with h2o_kv_usage's capacity slots per (layer, kv head), n =
 * n_layer * n_head_kv * capacity in all, the stream index of the token it holds (-1: free) and,
 * unless attention is NULL, the attention weight the last query decoded gave it (summed over the
 * kv head's query heads; 0 for a free slot). The weights need a policy that gathers attention
 * statistics (h2o_kv_policy_info). The cache as h2o_experimental_session_discard needs it; any
 * backend. Errors: H2O_ERR_INVALID_ARGUMENT (NULL session or stream_index, another n, weights
 * asked of a policy without statistics), H2O_ERR_UNSUPPORTED (such a cache). Since 0.8. */
H2O_API h2o_status h2o_experimental_session_kv_attention(h2o_session *session, int64_t *stream_index, float *attention, size_t n);

/** Evicts from each (layer, kv head) the token of stream index stream_index[c], c = layer *
 * n_head_kv + kv head (n = n_layer * n_head_kv entries), rolling the kept keys as the policy's own
 * evictions do: victims chosen by the caller. The cache, backend and policy as
 * h2o_experimental_session_discard needs them. Errors: H2O_ERR_INVALID_ARGUMENT (NULL arguments,
 * another n, a full-cache policy, or a (layer, kv head) that does not hold its token or holds it
 * pinned: the message names it, and nothing changes), H2O_ERR_UNSUPPORTED. Since 0.8. */
H2O_API h2o_status h2o_experimental_session_evict(h2o_session *session, const int64_t *stream_index, size_t n);

#ifdef __cplusplus
}
#endif

#endif /**< H2O_EXPERIMENTAL_H */

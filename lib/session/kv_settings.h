// The settings that shape a session's KV cache, specified once.
//
// kCacheSettings has one row per setting: its public name and where its public value lives (a
// field of h2o_session_params or a key of h2o_experimental.h), its range as a research key, and
// its word in the snapshot header. From that table come the session's equality for snapshots
// (same_cache_settings), the prefix cache's key (cache_settings_hash), the snapshot header's
// settings (write/read_cache_settings), the public parameters that recreate a session
// (params_for) and the experimental interface (set/get by key). resolve_session_settings turns
// public parameters into settings: the settings' behaviour, validation included.
//
// A new cache setting is a row here, a field of SessionSettings, its resolution and its effect;
// as a research key it also needs its h2o_experimental.h enumerator, as a snapshot word a new
// kSnapshotFormatVersion. Nothing else lists the settings.
#pragma once

#include <cstddef>
#include <cstdint>

#include "byte_io.h"
#include "h2o/h2o.h"
#include "kv_format.h"
#include "kv_policy.h"
#include "status.h"

namespace h2o {

// Everything a session is made with. The cache-shaping fields are kCacheSettings' rows; backend,
// device_index, n_threads and max_memory_bytes are the host's choices, not saved in snapshots.
struct SessionSettings {
    uint32_t backend = H2O_BACKEND_AUTO;  // h2o_backend_kind
    int device_index = -1;
    int n_ctx = 0;                        // longest stream without rolling (rotary positions stay below it)
    int kv_budget = 0;                    // KV slots per (layer, kv head), the mean over layers; n_ctx for a full cache
    float kv_layer_slope = 0.0f;          // how the budget spreads across layers (kv_layer_budgets.h)
    float kv_head_share = 0.0f;           // how much of each layer's slots moves between its kv heads (kv_head_budgets.h)
    bool kv_share_across_layers = false;  // they move between the kv heads of every layer
    bool kv_sinks_every_policy = false;   // every policy keeps policy.sinks (resolved into policy.sinks)
    int kv_rebalance_interval = 0;        // with a head share: how often budgets move (kv_rebalance_due); 0: every batch
    KvPolicyConfig policy;
    KvType kv_type = KvType::F16;  // as h2o_session_params_init
    bool rolling = false;
    int n_threads = 1;
    int n_batch = 256;
    uint64_t seed = 0;
    uint64_t max_memory_bytes = 0;  // 0: no cap on KV + activations + scratch
};

// A snapshot header's settings word.
enum class SettingWord : uint8_t {
    U32,
    F32,
    U64
};

struct CacheSetting {
    const char *name;      // the h2o_session_params field, or the research key's name
    int experimental_key;  // h2o_experimental_key, or -1: a field of h2o_session_params
    // A research key's accepted values (set_experimental checks them): [min, max], whole numbers
    // only when integral. Fields of h2o_session_params are checked by resolve_session_settings.
    double min, max;
    bool integral;
    SettingWord word;
    uint32_t snapshot_version;                 // the first snapshot format that records it; older ones hold 0
    uint32_t word_version;                     // the first format with its word (a reserved zero before snapshot_version)
    uint32_t max_word;                         // the largest U32 word a snapshot may hold (the range is checked again on load)
    uint64_t (*get)(const SessionSettings &);  // the resolved value's bits (a float's 32)
    void (*set)(SessionSettings &, uint64_t bits);
    // Writes the public value that resolves to the same setting; null for a research key (its
    // value goes to h2o_session_params.experimental).
    void (*to_params)(const SessionSettings &, h2o_session_params *);
};

// The rows in the order of the snapshot header's words.
extern const CacheSetting kCacheSettings[];
extern const size_t kCacheSettingCount;

// The snapshot format written; its header holds every row's word.
constexpr uint32_t kSnapshotFormatVersion = 9;

// The research key's row, or null for a key this library does not know.
const CacheSetting *experimental_setting(uint32_t key);
// The row's resolved value, as the C API reports it.
double cache_setting_value(const CacheSetting &row, const SessionSettings &settings);
// A research value as the session will hold it (a float row's value rounded to float), and
// whether its row accepts it (H2O_ERR_INVALID_ARGUMENT naming the setting and its range).
double research_setting_value(const CacheSetting &row, double value);
Status check_research_value(const CacheSetting &row, double value);

// Whether two sessions' caches were shaped alike (the host's choices aside).
bool same_cache_settings(const SessionSettings &a, const SessionSettings &b);
// A hash of the cache-shaping settings: sessions whose caches were shaped differently never share
// the prefix cache's states.
uint64_t cache_settings_hash(const SessionSettings &settings);

// The settings' words in a snapshot header of kSnapshotFormatVersion; their total size for a
// format version.
void write_cache_settings(const SessionSettings &settings, ByteWriter *out);
size_t cache_settings_bytes(uint32_t version);
// Reads the words of a header of `version`: reserved words must be zero and U32 words at most
// their row's max_word, else H2O_ERR_STATE_FORMAT. Ranges and combinations are checked again when
// a session is made from the settings.
Status read_cache_settings(ByteReader *in, uint32_t version, SessionSettings *settings);

// The defaults of h2o_session_params_init.
h2o_session_params default_session_params();
// The public parameters that recreate a session with `settings` (resolved values, so the new
// session resolves to the same ones), with the host's choices of `host`.
h2o_session_params params_for(const SessionSettings &settings, const h2o_session_params &host);

// The compute threads of a session that asks for 0 (the default): the cores, at most 8.
int default_thread_count();

// The model's facts that resolution needs.
struct ResolveContext {
    int n_ctx_train = 0;  // the model's context length
    int n_layer = 0;
    int default_threads = 1;
    // The model's sliding-window layers (ModelShape::local_layers): they hold their windows
    // (KvConfig::layer_window), and the budget spreads over the other, global, layers.
    int n_local_layers = 0;
};
// Validates public parameters (defaults merged in) and resolves them into settings: the policy
// and its windows, sinks and horizon, the research settings. H2O_ERR_INVALID_ARGUMENT names the
// parameter that is wrong and why.
Status resolve_session_settings(const h2o_session_params &params, const ResolveContext &context, SessionSettings *settings);

}  // namespace h2o

// The KV cache's settings table (lib/session/kv_settings.h), the research settings of h2o_experimental.h
// and the policy traits of h2o_kv_policy_get_info.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "kv_settings.h"
#include "model.h"
#include "session.h"
#include "session_util.h"
#include "test_util.h"

using namespace h2o;

namespace {

// Settings in which every row holds a value other than its default (0).
SessionSettings unusual_settings() {
    SessionSettings s;
    s.n_ctx = 256;
    s.kv_budget = 64;
    s.policy.policy = KvPolicy::MeanH2O;
    s.policy.recent = 16;
    s.policy.sinks = 3;
    s.kv_type = KvType::K8V4;
    s.rolling = true;
    s.n_batch = 32;
    s.seed = 0x123456789ABCull;
    s.policy.seed = s.seed;
    s.policy.horizon = 96;
    s.kv_layer_slope = -0.25f;
    s.policy.prompt_proxy = 7;
    s.policy.prompt_random_share = 0.125f;
    s.kv_head_share = 0.5f;
    s.kv_share_across_layers = true;
    s.kv_sinks_every_policy = true;
    s.kv_rebalance_interval = 5;
    return s;
}

ResolveContext stories_context() {
    ResolveContext c;
    c.n_ctx_train = 2048;
    c.n_layer = 5;
    return c;
}

}  // namespace

TEST_CASE("kv settings table: every row takes part in equality, the prefix key and the snapshot words") {
    const SessionSettings base = unusual_settings();
    CHECK(same_cache_settings(base, base));
    std::set<std::string> names;
    for (size_t i = 0; i < kCacheSettingCount; ++i) {
        const CacheSetting &row = kCacheSettings[i];
        CAPTURE(row.name);
        CHECK(names.insert(row.name).second);
        CHECK(row.get(base) != 0);  // unusual_settings sets every row
        SessionSettings changed = base;
        row.set(changed, 0);
        CHECK_FALSE(same_cache_settings(base, changed));
        CHECK(cache_settings_hash(base) != cache_settings_hash(changed));
        CHECK(row.word_version <= row.snapshot_version);
        CHECK(row.snapshot_version <= kSnapshotFormatVersion);
        CHECK((row.experimental_key >= 0) == (row.to_params == nullptr));
    }
    // The host's choices are not cache settings.
    SessionSettings host = base;
    host.n_threads = 7;
    host.backend = H2O_BACKEND_VULKAN;
    host.max_memory_bytes = 1;
    CHECK(same_cache_settings(base, host));
    CHECK(cache_settings_hash(base) == cache_settings_hash(host));
}

TEST_CASE("kv settings table: snapshot words round-trip, and each format's header size follows from the rows") {
    const SessionSettings base = unusual_settings();
    std::vector<uint8_t> bytes;
    ByteWriter w(&bytes);
    write_cache_settings(base, &w);
    CHECK(bytes.size() == cache_settings_bytes(kSnapshotFormatVersion));
    ByteReader r(bytes.data(), bytes.size());
    SessionSettings read;
    REQUIRE(read_cache_settings(&r, kSnapshotFormatVersion, &read).ok());
    CHECK(same_cache_settings(base, read));
    // Magic, version, size, fingerprint, payload size, compressed size and hash: 48 bytes.
    const size_t header_sizes[] = {88, 96, 96, 96, 104, 112, 112, 116, 120};
    for (uint32_t version = 1; version <= kSnapshotFormatVersion; ++version) {
        CAPTURE(version);
        CHECK(48 + cache_settings_bytes(version) == header_sizes[version - 1]);
    }
    // A word that its version reserves must be zero: kv_sinks_every_policy's in format 7 has
    // none, kv_share_across_layers' in format 6 is reserved.
    SessionSettings no_sinks_flag = base;
    no_sinks_flag.kv_sinks_every_policy = false;
    std::vector<uint8_t> v7;
    ByteWriter w7(&v7);
    write_cache_settings(no_sinks_flag, &w7);
    v7.resize(cache_settings_bytes(7));
    ByteReader r6(v7.data(), cache_settings_bytes(6));
    Status s = read_cache_settings(&r6, 6, &read);
    CHECK(s.code == H2O_ERR_STATE_FORMAT);
    CHECK(s.message.find("reserves for kv_share_across_layers") != std::string::npos);
    // A U32 word beyond its row's range.
    std::vector<uint8_t> bad = bytes;
    const uint32_t policy = kKvPolicyCount;
    std::memcpy(bad.data() + 8, &policy, sizeof(policy));
    ByteReader rb(bad.data(), bad.size());
    s = read_cache_settings(&rb, kSnapshotFormatVersion, &read);
    CHECK(s.code == H2O_ERR_STATE_FORMAT);
    CHECK(s.message.find("kv_policy") != std::string::npos);
    // Truncated words name the row they stop in.
    ByteReader short_reader(bytes.data(), 10);
    s = read_cache_settings(&short_reader, kSnapshotFormatVersion, &read);
    CHECK(s.code == H2O_ERR_STATE_FORMAT);
}

TEST_CASE("kv settings table: the parameters for resolved settings resolve to the same settings") {
    const ResolveContext context = stories_context();
    struct Case {
        uint32_t policy, budget;
        int32_t rolling;
        double slope, proxy, share, head_share, across, sinks_every_policy, interval;
    };
    const Case cases[] = {{H2O_KV_SCISSORHANDS, 32, 0, 0, 0, 0, 0, 0, 0, 16}, {H2O_KV_SCISSORHANDS, 0, 0, 0.5, 0, 0, 0.5, 1, 0, 16},
                          {H2O_KV_H2O, 48, 1, -0.25, 6, 0.3, 0.5, 1, 1, 0},   {H2O_KV_WINDOW, 40, 1, 0.25, 0, 0, 0, 0, 1, 3},
                          {H2O_KV_SINK_WINDOW, 64, 0, 0, 0, 0, 0, 0, 0, 16},  {H2O_KV_TOVA, 32, 0, 0, 4, 0, 0.25, 0, 1, 7},
                          {H2O_KV_RANDOM, 32, 1, 0, 0, 0, 0, 0, 0, 16},       {H2O_KV_MEAN_H2O, 64, 0, 0.5, 0, 0, 0, 0, 0, 16}};
    for (const Case &c : cases) {
        CAPTURE(c.policy);
        CAPTURE(c.budget);
        h2o_session_params p = default_session_params();
        p.kv_policy = c.policy;
        p.kv_budget = c.budget;
        p.position_rolling = c.rolling;
        const std::pair<uint32_t, double> research[] = {
            {H2O_EXP_KV_LAYER_SLOPE, c.slope},          {H2O_EXP_KV_PROMPT_PROXY, c.proxy},
            {H2O_EXP_KV_PROMPT_RANDOM_SHARE, c.share},  {H2O_EXP_KV_HEAD_SHARE, c.head_share},
            {H2O_EXP_KV_SHARE_ACROSS_LAYERS, c.across}, {H2O_EXP_KV_SINKS_EVERY_POLICY, c.sinks_every_policy},
            {H2O_EXP_KV_REBALANCE_INTERVAL, c.interval}};
        for (const auto &[key, value] : research) REQUIRE(h2o_session_params_set_experimental(&p, key, value) == H2O_OK);
        SessionSettings first, second;
        REQUIRE(resolve_session_settings(p, context, &first).ok());
        REQUIRE(resolve_session_settings(params_for(first, default_session_params()), context, &second).ok());
        CHECK(same_cache_settings(first, second));
    }
}

TEST_CASE("research settings: set, get, ranges and unknown keys") {
    h2o_session_params p;
    REQUIRE(h2o_session_params_init(&p, sizeof p) == H2O_OK);
    for (uint32_t key = 0; h2o_experimental_name(key); ++key) {
        double value = -1.0;
        REQUIRE(h2o_session_params_get_experimental(&p, key, &value) == H2O_OK);
        // Every experiment off by default; the rebalancing interval, whose 0 rebalances before
        // every batch, at its measured default.
        CHECK(value == (key == H2O_EXP_KV_REBALANCE_INTERVAL ? H2O_KV_REBALANCE_INTERVAL_DEFAULT : 0.0));
    }
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_REBALANCE_INTERVAL, 1 << 20) == H2O_OK);
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_REBALANCE_INTERVAL, (1 << 20) + 1) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_REBALANCE_INTERVAL, 1.5) == H2O_ERR_INVALID_ARGUMENT);
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_HEAD_SHARE, 0.3) == H2O_OK);
    double value = 0.0;
    REQUIRE(h2o_session_params_get_experimental(&p, H2O_EXP_KV_HEAD_SHARE, &value) == H2O_OK);
    CHECK(value == static_cast<double>(0.3f));                                               // held as the session holds it, a float
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_HEAD_SHARE, 0.9) == H2O_OK);  // the maximum itself

    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_HEAD_SHARE, 0.95) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()) == "kv_head_share 0.95 must lie in [0, 0.9]");
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_PROMPT_PROXY, 2.5) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()) == "kv_prompt_proxy 2.5 must be a whole number in [0, 4096]");
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_SHARE_ACROSS_LAYERS, 2) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_LAYER_SLOPE, std::nan("")) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_LAYER_SLOPE, std::numeric_limits<double>::infinity()) ==
          H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_LAYER_SLOPE, -1e300) == H2O_ERR_INVALID_ARGUMENT);  // beyond float's range
    CHECK(h2o_session_params_set_experimental(&p, H2O_EXP_KV_PROMPT_PROXY, 1e300) == H2O_ERR_INVALID_ARGUMENT);
    REQUIRE(h2o_session_params_get_experimental(&p, H2O_EXP_KV_HEAD_SHARE, &value) == H2O_OK);
    CHECK(value == static_cast<double>(0.9f));  // a refused value leaves the setting as it was

    CHECK(h2o_session_params_set_experimental(&p, 1000, 1) == H2O_ERR_UNSUPPORTED);
    CHECK(h2o_session_params_get_experimental(&p, H2O_EXPERIMENTAL_CAPACITY, &value) == H2O_ERR_UNSUPPORTED);
    CHECK(h2o_session_params_set_experimental(nullptr, H2O_EXP_KV_HEAD_SHARE, 0.1) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_params_get_experimental(&p, H2O_EXP_KV_HEAD_SHARE, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    h2o_session_params small = p;
    small.struct_size = 96;  // ABI 0's struct
    CHECK(h2o_session_params_set_experimental(&small, H2O_EXP_KV_HEAD_SHARE, 0.1) == H2O_ERR_INVALID_ARGUMENT);

    // Every key has a row, a name that parses back, and fits the array.
    for (uint32_t key = 0; h2o_experimental_name(key); ++key) {
        CAPTURE(key);
        CHECK(key < H2O_EXPERIMENTAL_CAPACITY);
        const CacheSetting *row = experimental_setting(key);
        REQUIRE(row != nullptr);
        CHECK(std::string(row->name) == h2o_experimental_name(key));
    }
}

TEST_CASE("research settings: the array is checked again when the session is made, and the session reports what it runs") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session_params p;
    h2o_session_params_init(&p, sizeof p);
    p.n_threads = 1;
    p.kv_budget = 32;
    p.experimental[H2O_EXP_KV_PROMPT_PROXY] = 1.5;  // written directly, bypassing the checks
    h2o_session *session = nullptr;
    CHECK(h2o_session_create(model, &p, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_prompt_proxy 1.5") != std::string::npos);
    p.experimental[H2O_EXP_KV_PROMPT_PROXY] = 0;
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_HEAD_SHARE, 0.5) == H2O_OK);
    REQUIRE(h2o_session_create(model, &p, &session) == H2O_OK);
    double value = 0.0;
    REQUIRE(h2o_session_get_experimental(session, H2O_EXP_KV_HEAD_SHARE, &value) == H2O_OK);
    CHECK(value == 0.5);
    CHECK(h2o_session_get_experimental(session, 99, &value) == H2O_ERR_UNSUPPORTED);
    CHECK(h2o_session_get_experimental(session, H2O_EXP_KV_HEAD_SHARE, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_experimental(nullptr, H2O_EXP_KV_HEAD_SHARE, &value) == H2O_ERR_INVALID_ARGUMENT);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("policy traits: h2o_kv_policy_get_info describes what resolution does") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    uint32_t count = 0;
    for (uint32_t policy = 0; h2o_kv_policy_name(policy); ++policy, ++count) {
        CAPTURE(policy);
        h2o_kv_policy_info info{};
        info.struct_size = sizeof info;
        REQUIRE(h2o_kv_policy_get_info(policy, &info) == H2O_OK);
        CHECK(info.policy == policy);
        CHECK(std::string(info.name) == h2o_kv_policy_name(policy));
        if (policy == H2O_KV_FULL) continue;  // a full cache is what a budget of n_ctx makes
        // A session with this policy, a budget of 64 and the defaults: its layout follows the traits.
        h2o_session_params p;
        h2o_session_params_init(&p, sizeof p);
        p.n_threads = 1;
        p.kv_budget = 64;
        p.kv_policy = policy;
        h2o_session *session = nullptr;
        REQUIRE(h2o_session_create(model, &p, &session) == H2O_OK);
        h2o_kv_layout layout{};
        layout.struct_size = sizeof layout;
        REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
        CHECK(layout.recent == (info.has_recent_window ? static_cast<uint32_t>(info.default_recent_ratio * 64) : 0u));
        CHECK(layout.sinks == (info.keeps_sinks ? 4u : 0u));
        CHECK(layout.horizon == static_cast<uint32_t>(info.default_horizon * 64));
        h2o_session_free(session);
        session = nullptr;
        // One-shot prompt eviction needs the statistics.
        REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_PROMPT_PROXY, 4) == H2O_OK);
        const h2o_status st = h2o_session_create(model, &p, &session);
        CHECK(st == (info.gathers_statistics ? H2O_OK : H2O_ERR_INVALID_ARGUMENT));
        h2o_session_free(session);
        session = nullptr;
    }
    CHECK(count == 12);
    h2o_kv_policy_info info{};
    info.struct_size = sizeof info;
    CHECK(h2o_kv_policy_get_info(count, &info) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_kv_policy_get_info(H2O_KV_H2O, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    info.struct_size = 4;
    CHECK(h2o_kv_policy_get_info(H2O_KV_H2O, &info) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_free(model);
}

TEST_CASE("kv_sinks_every_policy: a window with it keeps exactly what sink_window keeps, and snapshots keep it") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    auto kept_after_text = [&](uint32_t policy, double sinks_every_policy, std::vector<int64_t> *kept, std::string *text_out) {
        h2o_session_params p = default_session_params();
        p.n_threads = 1;
        p.kv_budget = 32;
        p.kv_policy = policy;
        p.kv_sinks = 4;
        REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_SINKS_EVERY_POLICY, sinks_every_policy) == H2O_OK);
        ResolveContext context;
        context.n_ctx_train = static_cast<int>(model->n_ctx_train());
        context.n_layer = model->shape().n_layer;
        SessionSettings settings;
        REQUIRE(resolve_session_settings(p, context, &settings).ok());
        std::unique_ptr<Session> session;
        REQUIRE(Session::create(*model, settings, &session).ok());
        auto append = [](const char *piece, size_t length, void *out) {
            static_cast<std::string *>(out)->append(piece, length);
            return false;
        };
        REQUIRE(session->generate("Once upon a time", h2o_test::greedy(300), append, text_out).ok());
        const KvConfig &kv = session->kv_config();
        kept->assign(static_cast<size_t>(kv.total_slots()), -1);
        REQUIRE(session->backend().kv_store().download_kv_stream_indices(kept->data()).ok());
        std::sort(kept->begin(), kept->end());
    };
    std::vector<int64_t> window, with_sinks, sink_window;
    std::string window_text, with_sinks_text, sink_window_text;
    kept_after_text(H2O_KV_WINDOW, 0, &window, &window_text);
    kept_after_text(H2O_KV_WINDOW, 1, &with_sinks, &with_sinks_text);
    kept_after_text(H2O_KV_SINK_WINDOW, 0, &sink_window, &sink_window_text);
    CHECK(with_sinks == sink_window);
    CHECK(with_sinks_text == sink_window_text);
    CHECK(window != with_sinks);  // a plain window lets the first tokens go
    CHECK(std::count(with_sinks.begin(), with_sinks.end(), 0) > 0);
    CHECK(std::count(window.begin(), window.end(), 0) == 0);

    // Through the C API: the layout reports the sinks, and a snapshot (format 8) keeps the setting.
    h2o_model *handle = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &handle) == H2O_OK);
    h2o_session_params p;
    h2o_session_params_init(&p, sizeof p);
    p.n_threads = 1;
    p.kv_budget = 32;
    p.kv_policy = H2O_KV_H2O;
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_SINKS_EVERY_POLICY, 1) == H2O_OK);
    h2o_session *session = nullptr;
    REQUIRE(h2o_session_create(handle, &p, &session) == H2O_OK);
    h2o_kv_layout layout{};
    layout.struct_size = sizeof layout;
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(layout.sinks == 4);
    CHECK(layout.heavy == 32 - 16 - 4);
    const std::string text =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
        "One day, she saw a big red ball in the park and ran to get it, but a dog got there first.";
    REQUIRE(h2o_session_add_text(session, text.data(), text.size(), 0) == H2O_OK);
    size_t bound = 0, size = 0;
    REQUIRE(h2o_session_state_size(session, &bound) == H2O_OK);
    std::vector<uint8_t> snapshot(bound);
    REQUIRE(h2o_session_save_to_buffer(session, snapshot.data(), snapshot.size(), &size) == H2O_OK);
    snapshot.resize(size);
    CHECK(snapshot[8] == kSnapshotFormatVersion);
    h2o_session *loaded = nullptr;
    REQUIRE(h2o_session_load_from_buffer(handle, snapshot.data(), snapshot.size(), nullptr, &loaded) == H2O_OK);
    double value = 0.0;
    REQUIRE(h2o_session_get_experimental(loaded, H2O_EXP_KV_SINKS_EVERY_POLICY, &value) == H2O_OK);
    CHECK(value == 1.0);
    // kv_sinks must fit the budget, as for sink_window.
    p.kv_sinks = 32;
    h2o_session *refused = nullptr;
    CHECK(h2o_session_create(handle, &p, &refused) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_sinks 32 must be smaller than kv_budget 32") != std::string::npos);
    h2o_session_free(loaded);
    h2o_session_free(session);
    h2o_model_free(handle);
}

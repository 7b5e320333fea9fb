// Session snapshots (save, load, fork): exact resumption for every policy, and a malformed-snapshot
// sweep in the style of the GGUF reader's tests.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "doctest/doctest.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "session_snapshot.h"
#include "snapshot_formats.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace {

int collect(const char *text, size_t length, void *user_data) {
    static_cast<std::string *>(user_data)->append(text, length);
    return 0;
}

std::string generate(h2o_session *session, const char *prompt, uint32_t n, float temperature) {
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = n;
    gen.temperature = temperature;
    gen.stop_at_eos = 0;
    gen.repeat_penalty = 1.1f;  // so the token history matters too
    std::string text;
    REQUIRE(h2o_generate(session, prompt, std::strlen(prompt), &gen, collect, &text) == H2O_OK);
    return text;
}

std::vector<uint8_t> save(h2o_session *session) {
    size_t bound = 0, size = 0;
    REQUIRE(h2o_session_state_size(session, &bound) == H2O_OK);
    std::vector<uint8_t> bytes(bound);
    REQUIRE(h2o_session_save_to_buffer(session, bytes.data(), bytes.size(), &size) == H2O_OK);
    REQUIRE(size <= bound);
    bytes.resize(size);
    return bytes;
}

h2o_session_params small_session(uint32_t policy, int rolling, uint32_t kv_type) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    sp.backend = H2O_BACKEND_CPU;
    sp.kv_budget = 32;
    sp.n_ctx = 512;
    sp.n_batch = 16;
    sp.kv_policy = policy;
    sp.position_rolling = rolling;
    sp.kv_type = kv_type;
    sp.seed = 1234;
    return sp;
}

// Saves a session of `sp` on `saved_on` after a pinned sentence and an evicting generation, loads
// the snapshot into a freshly loaded model on `loaded_on`, and checks that both continue alike.
void check_resumption(const std::string &path, h2o_session_params sp, float temperature, uint32_t saved_on, uint32_t loaded_on) {
    sp.backend = saved_on;
    h2o_test::ApiSession original;
    REQUIRE_MESSAGE(original.open(path, sp), h2o_last_error());
    const char *pinned = "Lily had a red ball.";
    REQUIRE(h2o_session_add_text(original.session, pinned, std::strlen(pinned), H2O_TEXT_PIN) == H2O_OK);
    generate(original.session, " Once upon a time", 40, temperature);  // past the budget: evicting
    const std::vector<uint8_t> snapshot = save(original.session);

    // A freshly loaded model, as another process would have.
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session_params lp;
    h2o_session_params_init(&lp, sizeof lp);
    lp.backend = loaded_on;
    h2o_session *loaded = nullptr;
    REQUIRE(h2o_session_load_from_buffer(model, snapshot.data(), snapshot.size(), &lp, &loaded) == H2O_OK);
    h2o_model_free(model);

    h2o_kv_layout a, b;
    a.struct_size = b.struct_size = sizeof(h2o_kv_layout);
    REQUIRE(h2o_session_get_kv_layout(original.session, &a) == H2O_OK);
    REQUIRE(h2o_session_get_kv_layout(loaded, &b) == H2O_OK);
    CHECK(std::memcmp(&a, &b, sizeof(a)) == 0);
    // The logits of the last token come back, so generation continues at once.
    std::vector<float> la(512), lb(512);
    REQUIRE(h2o_session_get_logits(original.session, la.data(), la.size()) == H2O_OK);
    REQUIRE(h2o_session_get_logits(loaded, lb.data(), lb.size()) == H2O_OK);
    CHECK(la == lb);

    CHECK(generate(loaded, "", 40, temperature) == generate(original.session, "", 40, temperature));
    CHECK(generate(loaded, " The end.", 10, temperature) == generate(original.session, " The end.", 10, temperature));
    h2o_session_free(loaded);
}

// A loaded session has the saved one's settings and cache: saved again after `generated` greedy
// tokens, its snapshot is the same bytes.
void check_saved_again(const std::string &path, const h2o_session_params &sp, uint32_t generated) {
    h2o_test::ApiSession original;
    REQUIRE(original.open(path, sp));
    generate(original.session, " Once upon a time there was a girl", generated, 0.0f);
    const std::vector<uint8_t> snapshot = save(original.session);
    h2o_session *loaded = nullptr;
    REQUIRE_MESSAGE(h2o_session_load_from_buffer(original.model, snapshot.data(), snapshot.size(), nullptr, &loaded) == H2O_OK,
                    std::string(h2o_last_error()));
    CHECK(save(loaded) == snapshot);
    h2o_session_free(loaded);
}

TEST_CASE("session state: a loaded session continues exactly as the saved one, for every policy") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (uint32_t policy = 1; h2o_kv_policy_name(policy); ++policy) {
        for (int rolling : {0, 1}) {
            for (uint32_t kv_type : {uint32_t{H2O_KV_TYPE_F32}, uint32_t{H2O_KV_TYPE_K8V4}}) {
                for (float temperature : {0.0f, 0.9f}) {
                    CAPTURE(h2o_kv_policy_name(policy));
                    CAPTURE(rolling);
                    CAPTURE(kv_type);
                    CAPTURE(temperature);
                    check_resumption(path, small_session(policy, rolling, kv_type), temperature, H2O_BACKEND_CPU, H2O_BACKEND_CPU);
                }
            }
        }
    }
}

TEST_CASE("session state: budgets spread across layers (kv_layer_slope) are saved and continue exactly") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (uint32_t policy : {uint32_t{H2O_KV_SCISSORHANDS}, uint32_t{H2O_KV_H2O}, uint32_t{H2O_KV_SINK_WINDOW}, uint32_t{H2O_KV_RANDOM}}) {
        for (int rolling : {0, 1}) {
            for (float slope : {0.5f, -0.5f}) {
                CAPTURE(h2o_kv_policy_name(policy));
                CAPTURE(rolling);
                CAPTURE(slope);
                h2o_session_params sp = small_session(policy, rolling, H2O_KV_TYPE_F16);
                sp.experimental[H2O_EXP_KV_LAYER_SLOPE] = slope;
                check_resumption(path, sp, 0.9f, H2O_BACKEND_CPU, H2O_BACKEND_CPU);
            }
        }
    }
}

TEST_CASE("session state: one-shot prompt eviction's settings are saved and continue exactly") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (uint32_t policy : {uint32_t{H2O_KV_SCISSORHANDS}, uint32_t{H2O_KV_H2O}, uint32_t{H2O_KV_TOVA}}) {
        for (int rolling : {0, 1}) {
            CAPTURE(h2o_kv_policy_name(policy));
            CAPTURE(rolling);
            h2o_session_params sp = small_session(policy, rolling, H2O_KV_TYPE_F16);
            sp.experimental[H2O_EXP_KV_PROMPT_PROXY] = 6;
            sp.experimental[H2O_EXP_KV_PROMPT_RANDOM_SHARE] = rolling ? 0.3f : 0.0f;
            check_resumption(path, sp, 0.9f, H2O_BACKEND_CPU, H2O_BACKEND_CPU);
            check_saved_again(path, sp, 30);
        }
    }
}

TEST_CASE(
    "session state: budgets per kv head (kv_head_share), within and across layers, are saved with each cell's size and continue exactly") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (uint32_t policy : {uint32_t{H2O_KV_SCISSORHANDS}, uint32_t{H2O_KV_H2O}, uint32_t{H2O_KV_ROCO}}) {
        for (float slope : {0.0f, 0.25f}) {  // the smallest layer's heads keep at least 12 slots: room for the pins
            // Rolling for one policy in two: each cell's positions are its own ranks. Budgets
            // across layers with one slope in two.
            const int rolling = policy == H2O_KV_H2O ? 0 : 1, across_layers = (policy == H2O_KV_ROCO) == (slope == 0.0f) ? 1 : 0;
            CAPTURE(h2o_kv_policy_name(policy));
            CAPTURE(slope);
            CAPTURE(rolling);
            CAPTURE(across_layers);
            h2o_session_params sp = small_session(policy, rolling, H2O_KV_TYPE_F16);
            sp.experimental[H2O_EXP_KV_HEAD_SHARE] = 0.5f;
            sp.experimental[H2O_EXP_KV_SHARE_ACROSS_LAYERS] = across_layers;
            sp.experimental[H2O_EXP_KV_LAYER_SLOPE] = slope;
            // Rebalancing before every batch, or every 5 or 16 (the default) stream tokens: the
            // snapshots fall between rebalancings, whose schedule and cell fill carry on.
            const uint32_t interval = policy == H2O_KV_ROCO ? 1 : policy == H2O_KV_H2O ? 5 : H2O_KV_REBALANCE_INTERVAL_DEFAULT;
            CAPTURE(interval);
            sp.experimental[H2O_EXP_KV_REBALANCE_INTERVAL] = interval;
            check_resumption(path, sp, 0.9f, H2O_BACKEND_CPU, H2O_BACKEND_CPU);
            check_saved_again(path, sp, 60);
        }
    }
}

TEST_CASE("session state: a snapshot of format 8 with budgets per kv head rebalances before every batch, as it did") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp = small_session(H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_F16);
    sp.experimental[H2O_EXP_KV_HEAD_SHARE] = 0.5f;
    sp.experimental[H2O_EXP_KV_REBALANCE_INTERVAL] = 0;  // what format 8 and older mean
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    generate(m.session, "Once upon a time", 40, 0.8f);
    const std::vector<uint8_t> current = save(m.session);
    const std::vector<uint8_t> v8 = h2o_test::snapshot_as_version(current, 8);
    REQUIRE(v8.size() == current.size() - 4);
    h2o_session *a = nullptr, *b = nullptr;
    REQUIRE(h2o_session_load_from_buffer(m.model, current.data(), current.size(), nullptr, &a) == H2O_OK);
    REQUIRE(h2o_session_load_from_buffer(m.model, v8.data(), v8.size(), nullptr, &b) == H2O_OK);
    double interval = -1.0;
    REQUIRE(h2o_session_get_experimental(b, H2O_EXP_KV_REBALANCE_INTERVAL, &interval) == H2O_OK);
    CHECK(interval == 0.0);
    CHECK(generate(a, " The", 60, 0.8f) == generate(b, " The", 60, 0.8f));
    CHECK(save(b) == save(a));
    h2o_session_free(a);
    h2o_session_free(b);
}

// Sessions on a device backend (Vulkan, CUDA) save their device's cache through the host image
// (kv_image.h), load it back onto the device and continue alike; the format is the backends'
// common one, so the cache also continues on the CPU. Two test cases per device (lavapipe is slow,
// and CTest runs them side by side): every policy, then the settings that shape the cache.
void check_device_snapshots_of_policies(const std::string &path, uint32_t device) {
    // Every policy, with and without rolling and in both formats alternately (lavapipe is slow;
    // every third policy under AddressSanitizer, kAddressSanitized).
    for (uint32_t policy = 1; h2o_kv_policy_name(policy); ++policy) {
        if (h2o_test::kAddressSanitized && policy % 3 != 1) continue;
        const int rolling = policy % 2;
        const uint32_t kv_type = policy % 4 < 2 ? H2O_KV_TYPE_F32 : H2O_KV_TYPE_K8V4;
        CAPTURE(h2o_kv_policy_name(policy));
        CAPTURE(rolling);
        CAPTURE(kv_type);
        check_resumption(path, small_session(policy, rolling, kv_type), 0.9f, device, device);
    }
}

void check_device_snapshots_of_settings(const std::string &path, uint32_t device) {
    // Greedily on the CPU, where the two backends' logits, equal to rounding, pick the same tokens.
    for (uint32_t policy : {uint32_t{H2O_KV_SCISSORHANDS}, uint32_t{H2O_KV_H2O}}) {
        CAPTURE(h2o_kv_policy_name(policy));
        check_resumption(path, small_session(policy, 1, H2O_KV_TYPE_K8V4), 0.0f, device, H2O_BACKEND_CPU);
    }
    // Layers of different budgets: the device's per-layer regions map to the host's.
    h2o_session_params sloped = small_session(H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_F32);
    sloped.experimental[H2O_EXP_KV_LAYER_SLOPE] = 0.5f;
    check_resumption(path, sloped, 0.9f, device, device);
    check_resumption(path, sloped, 0.0f, device, H2O_BACKEND_CPU);
    // One-shot prompt eviction: its settings travel with the snapshot to the device's session.
    h2o_session_params one_shot = small_session(H2O_KV_H2O, 1, H2O_KV_TYPE_F16);
    one_shot.experimental[H2O_EXP_KV_PROMPT_PROXY] = 6;
    one_shot.experimental[H2O_EXP_KV_PROMPT_RANDOM_SHARE] = 0.3f;
    check_resumption(path, one_shot, 0.9f, device, device);
    // Budgets per kv head: the device's cell regions travel with the snapshot, both ways; across
    // layers (one region of rows for the whole cache) with rolling.
    for (int rolling : {0, 1}) {
        CAPTURE(rolling);
        h2o_session_params per_head = small_session(H2O_KV_SCISSORHANDS, rolling, H2O_KV_TYPE_F16);
        per_head.experimental[H2O_EXP_KV_HEAD_SHARE] = 0.5f;
        per_head.experimental[H2O_EXP_KV_SHARE_ACROSS_LAYERS] = rolling;
        check_resumption(path, per_head, 0.9f, device, device);
        check_resumption(path, per_head, 0.0f, device, H2O_BACKEND_CPU);
    }
}

uint32_t devices_of_kind(uint32_t kind) {
    size_t n_devices = 0;
    REQUIRE(h2o_backend_count(&n_devices) == H2O_OK);
    uint32_t found = 0;
    for (size_t i = 0; i < n_devices; ++i) {
        h2o_backend_info info;
        info.struct_size = sizeof info;
        if (h2o_backend_get_info(i, &info) == H2O_OK && info.kind == kind) ++found;
    }
    return found;
}

// The device's backend kind, or 0 (after the skip marker) when there is none and the environment
// does not require one (H2O_REQUIRE_VULKAN, H2O_REQUIRE_CUDA).
uint32_t device_or_skip(uint32_t kind) {
    const bool vulkan = kind == H2O_BACKEND_VULKAN;
    if (devices_of_kind(kind) == 0 && !std::getenv(vulkan ? "H2O_REQUIRE_VULKAN" : "H2O_REQUIRE_CUDA")) {
        std::printf("H2O-SKIP: no %s device\n", vulkan ? "Vulkan" : "CUDA");
        return 0;
    }
    return kind;
}

TEST_CASE("session state: Vulkan sessions save and load their device cache, for every policy, and continue on the CPU") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    if (device_or_skip(H2O_BACKEND_VULKAN)) check_device_snapshots_of_policies(path, H2O_BACKEND_VULKAN);
}

TEST_CASE(
    "session state: Vulkan sessions save and load their device cache with layer slopes, one-shot prompt eviction and moving budgets") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    if (device_or_skip(H2O_BACKEND_VULKAN)) check_device_snapshots_of_settings(path, H2O_BACKEND_VULKAN);
}

TEST_CASE("session state: CUDA sessions save and load their device cache, for every policy, and continue on the CPU") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    if (device_or_skip(H2O_BACKEND_CUDA)) check_device_snapshots_of_policies(path, H2O_BACKEND_CUDA);
}

TEST_CASE("session state: CUDA sessions save and load their device cache with layer slopes and one-shot prompt eviction") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    if (device_or_skip(H2O_BACKEND_CUDA)) check_device_snapshots_of_settings(path, H2O_BACKEND_CUDA);
}

TEST_CASE("session state: a fresh process continues a saved session exactly") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (float temperature : {0.0f, 0.8f}) {
        CAPTURE(temperature);
        const h2o_session_params sp = small_session(H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_K8V4);
        h2o_test::ApiSession m;
        REQUIRE(m.open(path, sp));
        generate(m.session, "Once upon a time", 40, temperature);
        const std::string file = h2o_test::temp_path("fresh_process.h2os");
        REQUIRE(h2o_session_save(m.session, file.c_str()) == H2O_OK);
        const std::string command = std::string(H2O_SNAPSHOT_CONTINUE) + " '" + path + "' '" + file + "' 40 " + std::to_string(temperature);
        FILE *child = popen(command.c_str(), "r");
        REQUIRE(child != nullptr);
        std::string from_child;
        char buffer[4096];
        for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, child)) > 0;) from_child.append(buffer, n);
        CHECK(pclose(child) == 0);
        CHECK(from_child == generate(m.session, "", 40, temperature));
        std::filesystem::remove(file);
    }
}

TEST_CASE("session state: save and load through a file, atomically") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const h2o_session_params sp = small_session(H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_Q8);
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    generate(m.session, "Once upon a time", 30, 0.7f);
    const std::string file = h2o_test::temp_path("state.h2os");
    std::filesystem::remove(file);
    REQUIRE(h2o_session_save(m.session, file.c_str()) == H2O_OK);
    for (const auto &entry : std::filesystem::directory_iterator(std::filesystem::path(file).parent_path())) {
        CHECK(entry.path().filename().string().find("state.h2os.tmp.") == std::string::npos);
    }
    h2o_session *loaded = nullptr;
    h2o_session_params host;
    h2o_session_params_init(&host, sizeof host);
    host.n_threads = 2;  // host-side settings may differ
    REQUIRE(h2o_session_load(m.model, file.c_str(), &host, &loaded) == H2O_OK);
    CHECK(generate(loaded, "", 30, 0.7f) == generate(m.session, "", 30, 0.7f));
    h2o_session_free(loaded);

    // A failed save leaves nothing at the path.
    const std::string missing_dir = h2o_test::temp_path("no_such_dir/state.h2os");
    CHECK(h2o_session_save(m.session, missing_dir.c_str()) == H2O_ERR_IO);
    CHECK_FALSE(std::filesystem::exists(missing_dir));
    loaded = nullptr;
    CHECK(h2o_session_load(m.model, missing_dir.c_str(), nullptr, &loaded) == H2O_ERR_IO);
    CHECK(std::string(h2o_last_error()).find("no_such_dir") != std::string::npos);
    CHECK(loaded == nullptr);
    std::filesystem::remove(file);
}

TEST_CASE("session state: fork starts conversations from a processed system prompt") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const h2o_session_params sp = small_session(H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_F32);
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    const char *system = "Tom was a kind dog who liked to help.";
    REQUIRE(h2o_session_add_text(m.session, system, std::strlen(system), H2O_TEXT_PIN) == H2O_OK);
    h2o_session *a = nullptr, *b = nullptr;
    REQUIRE(h2o_session_fork(m.session, &a) == H2O_OK);
    REQUIRE(h2o_session_fork(m.session, &b) == H2O_OK);
    const std::string from_a = generate(a, " One day", 40, 0.8f);
    CHECK(generate(b, " Once", 20, 0.8f) != "");  // b goes its own way: a is unaffected
    CHECK(generate(m.session, " One day", 40, 0.8f) == from_a);
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(a, &stats) == H2O_OK);
    size_t prompt_tokens = 0;
    h2o_tokenize(m.model, " One day", 8, 0, nullptr, 0, &prompt_tokens);
    CHECK(stats.n_prompt_tokens == prompt_tokens);  // the system prompt was not processed again
    h2o_session_free(a);
    h2o_session_free(b);
    CHECK(h2o_session_fork(nullptr, &a) == H2O_ERR_INVALID_ARGUMENT);
}

// The malformed-snapshot sweep: every way of damaging a real snapshot is refused with a status and
// a message, and creates nothing.
struct Refusal {
    h2o_status status;
    std::string message;
    std::vector<uint8_t> resaved;  // H2O_OK: the loaded session saved again
};

// The snapshot header of lib/session/session_snapshot.h (version 9); its last 8 bytes hash the others.
const size_t kHeaderSize = h2o::snapshot_header_size();

void rehash_header(std::vector<uint8_t> *bytes, size_t header_size) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (size_t i = 0; i + 8 < header_size; ++i) h = (h ^ (*bytes)[i]) * 0x100000001b3ull;
    std::memcpy(bytes->data() + header_size - 8, &h, sizeof(h));
}

Refusal try_load(h2o_model *model, const std::vector<uint8_t> &bytes) {
    h2o_session *session = nullptr;
    const h2o_status st = h2o_session_load_from_buffer(model, bytes.data(), bytes.size(), nullptr, &session);
    if (st == H2O_OK) {
        Refusal accepted{st, "", save(session)};
        h2o_session_free(session);
        return accepted;
    }
    CHECK(session == nullptr);
    return {st, h2o_last_error(), {}};
}

TEST_CASE("session state: truncated, corrupted, foreign and hostile snapshots are refused by name") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const h2o_session_params sp = small_session(H2O_KV_H2O, 1, H2O_KV_TYPE_F16);
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    generate(m.session, "Once upon a time", 40, 0.8f);
    const std::vector<uint8_t> good = save(m.session);
    REQUIRE(try_load(m.model, good).status == H2O_OK);

    SUBCASE("every truncation") {
        for (size_t n = 0; n < good.size(); n += (n < 200 ? 1 : 97)) {
            CAPTURE(n);
            const Refusal r = try_load(m.model, std::vector<uint8_t>(good.begin(), good.begin() + n));
            CHECK(r.status == H2O_ERR_STATE_FORMAT);
            CHECK(r.message.find("not a valid session snapshot") != std::string::npos);
        }
        std::vector<uint8_t> longer = good;
        longer.push_back(0);
        CHECK(try_load(m.model, longer).message.find("truncated or extended") != std::string::npos);
    }
    SUBCASE("every header byte and a sample of payload bytes flipped") {
        std::mt19937 rng(7);
        std::vector<size_t> positions;
        for (size_t i = 0; i < kHeaderSize; ++i) positions.push_back(i);
        for (int i = 0; i < 300; ++i) positions.push_back(kHeaderSize + rng() % (good.size() - kHeaderSize));
        for (size_t at : positions) {
            CAPTURE(at);
            std::vector<uint8_t> bad = good;
            bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
            const Refusal r = try_load(m.model, bad);
            if (r.status == H2O_OK && at >= kHeaderSize) {
                // A few bits of a zstd frame are never read by the decoder (the content checksum
                // guards the content, not them): the state is then intact, and so is the session.
                CHECK(r.resaved == good);
                continue;
            }
            // The version field gets its own code; every other change is a format error.
            CHECK((r.status == H2O_ERR_STATE_FORMAT || (at >= 8 && at < 12 && r.status == H2O_ERR_UNSUPPORTED)));
            CHECK_FALSE(r.message.empty());
        }
    }
    SUBCASE("another model's snapshot") {
        h2o::SyntheticModelSpec spec;
        spec.n_embd = 64;
        spec.n_layer = 5;
        spec.n_head = 8;
        spec.n_head_kv = 4;
        spec.n_ff = 172;
        spec.n_vocab = 512;
        spec.type = h2o::TensorType::F32;
        const std::string other_path = h2o_test::temp_path("other_model.gguf");
        REQUIRE(h2o::write_synthetic_model(spec, other_path).ok());
        h2o_model *other = nullptr;
        REQUIRE(h2o_model_load(other_path.c_str(), nullptr, &other) == H2O_OK);
        const Refusal r = try_load(other, good);
        CHECK(r.status == H2O_ERR_STATE_FORMAT);
        CHECK(r.message.find("another model") != std::string::npos);
        h2o_model_free(other);
    }
    SUBCASE("prompt eviction settings out of range, with a valid hash") {
        const uint32_t proxy = 5000;
        const float share = 2.0f, nan = std::numeric_limits<float>::quiet_NaN(), head_share = 0.95f;
        // Sharing across layers is 0 or 1, and 1 only with a head share (this session has none).
        const uint32_t across_layers = 1, not_a_flag = 2, interval = (1u << 20) + 1;
        for (int which = 0; which < 8; ++which) {
            CAPTURE(which);
            std::vector<uint8_t> bad = good;
            if (which == 0) std::memcpy(bad.data() + 72, &proxy, sizeof(proxy));
            if (which == 1) std::memcpy(bad.data() + 76, &share, sizeof(share));
            if (which == 2) std::memcpy(bad.data() + 76, &nan, sizeof(nan));
            if (which == 3) std::memcpy(bad.data() + 80, &head_share, sizeof(head_share));
            if (which == 4) std::memcpy(bad.data() + 80, &nan, sizeof(nan));
            if (which == 5) std::memcpy(bad.data() + 84, &across_layers, sizeof(across_layers));
            if (which == 6) std::memcpy(bad.data() + 84, &not_a_flag, sizeof(not_a_flag));
            if (which == 7) std::memcpy(bad.data() + 92, &interval, sizeof(interval));
            rehash_header(&bad, kHeaderSize);
            const Refusal r = try_load(m.model, bad);
            CHECK(r.status == H2O_ERR_STATE_FORMAT);
            CHECK(r.message.find("settings are out of range") != std::string::npos);
        }
    }
    SUBCASE("a header that claims a huge payload, with a valid hash") {
        std::vector<uint8_t> bad = good;
        const uint64_t huge = uint64_t{1} << 40;
        std::memcpy(bad.data() + kHeaderSize - 24, &huge, sizeof(huge));  // the payload size
        rehash_header(&bad, kHeaderSize);                                 // as a forger would
        const Refusal r = try_load(m.model, bad);
        CHECK(r.status == H2O_ERR_STATE_FORMAT);
        CHECK(r.message.find("at most") != std::string::npos);
    }
    SUBCASE(
        "snapshots of formats 1 (library 0.2, no horizon), 2 (no spans), 4 (0.3), 5 (0.4), 6 (0.5), 7 (0.6) and 8 load and continue "
        "the same") {
        h2o_session *current = nullptr;
        REQUIRE(h2o_session_load_from_buffer(m.model, good.data(), good.size(), nullptr, &current) == H2O_OK);
        const std::string expected = generate(current, " The", 60, 0.8f);
        h2o_session_free(current);
        for (uint32_t version : {1u, 2u, 4u, 5u, 6u, 7u, 8u}) {
            CAPTURE(version);
            const std::vector<uint8_t> old = h2o_test::snapshot_as_version(good, version);
            REQUIRE(!old.empty());
            h2o_session *loaded = nullptr;
            REQUIRE(h2o_session_load_from_buffer(m.model, old.data(), old.size(), nullptr, &loaded) == H2O_OK);
            CHECK(generate(loaded, " The", 60, 0.8f) == expected);
            h2o_session_free(loaded);
        }
        std::vector<uint8_t> v1 = h2o_test::snapshot_as_version(good, 1);
        v1[12] = 96;  // a version-1 header of a later size
        CHECK(try_load(m.model, v1).message.find("header size") != std::string::npos);
        // A version-3 payload under a version-2 header: the span count is read as the last token.
        std::vector<uint8_t> mislabelled = h2o_test::snapshot_as_version(good, 4);
        mislabelled[8] = 2;
        rehash_header(&mislabelled, 96);
        CHECK(try_load(m.model, mislabelled).status == H2O_ERR_STATE_FORMAT);
        // A version-6 header whose word at 84 (reserved there) is not zero.
        std::vector<uint8_t> v6 = h2o_test::snapshot_as_version(good, 6);
        v6[84] = 1;
        rehash_header(&v6, 112);
        CHECK(try_load(m.model, v6).message.find("settings are out of range") != std::string::npos);
        // A version-9 header labelled 8, 7, 5 or 4: its size is not theirs.
        for (uint8_t older : {uint8_t{4}, uint8_t{5}, uint8_t{7}, uint8_t{8}}) {
            std::vector<uint8_t> relabelled = good;
            relabelled[8] = older;
            rehash_header(&relabelled, kHeaderSize);
            CHECK(try_load(m.model, relabelled).message.find("header size") != std::string::npos);
        }
    }
    SUBCASE("bad arguments") {
        h2o_session *session = nullptr;
        CHECK(h2o_session_load_from_buffer(nullptr, good.data(), good.size(), nullptr, &session) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(h2o_session_load_from_buffer(m.model, nullptr, 10, nullptr, &session) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(h2o_session_load_from_buffer(m.model, good.data(), good.size(), nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        size_t size = 0;
        CHECK(h2o_session_save_to_buffer(m.session, nullptr, 0, &size) == H2O_ERR_BUFFER_TOO_SMALL);
        CHECK(size == good.size());
        CHECK(h2o_session_save(m.session, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    }
}

}  // namespace

namespace {

TEST_CASE("session state: the model's prefix cache starts new sessions from a processed system prompt") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    // Under either policy, and from a caller of ABI 1 (whose struct ends before the policy: the
    // default's).
    const uint32_t abi1_size = offsetof(h2o_model_params, prefix_cache_policy);
    for (const uint32_t policy : {uint32_t{H2O_CACHE_POLICY_REUSE}, uint32_t{H2O_CACHE_POLICY_LRU}, uint32_t{99}}) {
        CAPTURE(policy);
        h2o_model_params mp;
        h2o_model_params_init(&mp, sizeof mp);
        mp.prefix_cache_bytes = 64u << 20;
        if (policy == 99) {
            mp.struct_size = abi1_size;
        } else {
            mp.prefix_cache_policy = policy;
        }
        h2o_model *cached = nullptr, *plain = nullptr;
        REQUIRE(h2o_model_load(path.c_str(), &mp, &cached) == H2O_OK);
        REQUIRE(h2o_model_load(path.c_str(), nullptr, &plain) == H2O_OK);
        const h2o_session_params sp = small_session(H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_F32);
        const std::string system = "Once upon a time, there was a little girl named Lily. She loved to play outside with her dog.";

        auto conversation = [&](h2o_model *model) {
            h2o_session *session = nullptr;
            REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
            REQUIRE(h2o_session_add_text(session, system.data(), system.size(), H2O_TEXT_PIN) == H2O_OK);
            const std::string text = generate(session, " One day", 40, 0.8f);
            h2o_session_free(session);
            return text;
        };
        const std::string reference = conversation(plain);
        CHECK(conversation(cached) == reference);  // a miss: processes the prompt and keeps its state
        CHECK(conversation(cached) == reference);  // a hit: starts from that state
        CHECK(conversation(cached) == reference);
        h2o_prefix_cache_stats stats;
        stats.struct_size = sizeof(stats);
        REQUIRE(h2o_model_get_prefix_cache_stats(cached, &stats) == H2O_OK);
        CHECK(stats.hits == 2);
        CHECK(stats.misses == 1);
        CHECK(stats.entries == 1);
        CHECK(stats.bytes > 0);
        CHECK(stats.bytes <= mp.prefix_cache_bytes);
        REQUIRE(h2o_model_get_prefix_cache_stats(plain, &stats) == H2O_OK);
        CHECK(stats.entries == 0);

        // Other cache-shaping settings never share a state.
        h2o_session_params other = sp;
        other.kv_budget = 48;
        h2o_session *session = nullptr;
        REQUIRE(h2o_session_create(cached, &other, &session) == H2O_OK);
        REQUIRE(h2o_session_add_text(session, system.data(), system.size(), H2O_TEXT_PIN) == H2O_OK);
        h2o_session_free(session);
        REQUIRE(h2o_model_get_prefix_cache_stats(cached, &stats) == H2O_OK);
        CHECK(stats.hits == 2);
        CHECK(stats.entries == 2);
        h2o_model_free(cached);
        h2o_model_free(plain);
    }
}

}  // namespace

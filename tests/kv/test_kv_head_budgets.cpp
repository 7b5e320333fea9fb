// Budgets per kv head (kv_head_budgets.h): the rule on a hand-made cache where the right answer is
// known (which tokens go, each cell's new region, what moves where), its snapshot form, and on the
// real model: the regions' bounds in a long generation, validation, and the Vulkan backend
// rebalancing exactly as the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "byte_io.h"
#include "cpu/cpu_backend.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "kv_cache.h"
#include "kv_head_budgets.h"
#include "model.h"
#include "rotary.h"
#include "session.h"
#include "session_util.h"
#include "gemma_test_model.h"
#include "test_util.h"
#ifdef H2O_HAVE_VULKAN
#include "vulkan_test_util.h"
#endif

using namespace h2o;

namespace {

// Cell h's key for token i as a rolling cache stores it at rank `rank` (rotated by it).
std::array<float, 4> rolled_key(int h, int i, int rank) {
    std::array<float, 4> key = {1.0f, 0.5f + h, 1.0f + i, 2.0f};
    for (int pair = 0; pair < 2; ++pair) {
        float c, s;
        rotary_cos_sin(rank, rotary_inv_freq(10000.0f, pair, 4), &c, &s);
        rotate_pair(&key[2 * pair], &key[2 * pair + 1], c, s);
    }
    return key;
}

// One layer of two kv heads of 8 slots, head_share 0.5 (each cell keeps at least 4 slots, at most
// 12), H2O without a recent window. Both cells hold stream indices 0..7; a key's first element
// names its cell and token. Head 0 attends to every token (accumulated 10 + i); head 1 to its
// last two only (0.1 * i for the first six, 10 + i for 6 and 7).
// With rolling, token i's key is rolled_key(h, i, i).
// Two layers: the same two cells as layers 0 and 1 of one kv head each (cell h is (h, 0)).
struct TwoHeads {
    KvCache cache;
    int layer_of[2] = {0, 0}, head_of[2] = {0, 1};
    explicit TwoHeads(const uint8_t *tags = nullptr, bool rolling = false, bool two_layers = false, bool across_layers = false,
                      int sinks = 0, int horizon = 0) {
        KvConfig c;
        c.n_layer = two_layers ? 2 : 1;
        c.n_head_kv = two_layers ? 1 : 2;
        c.share_across_layers = across_layers;
        if (two_layers) {
            layer_of[1] = 1;
            head_of[1] = 0;
        }
        c.head_dim = 4;
        c.n_slots = 8;
        c.head_share = 0.5f;
        c.policy.policy = KvPolicy::H2O;
        c.policy.sinks = sinks;
        c.policy.horizon = horizon;
        c.rope.dims = 4;
        c.rolling = rolling;
        REQUIRE(cache.init(c).ok());
        for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 8; ++i) {
                const int s = cache.claim_slot(layer_of[h], head_of[h], i, i, tags ? tags[i] : 0);
                KvCache::CellView v = cell(h);
                std::array<float, 4> key = {static_cast<float>(100 * h + i), 0, 0, 0};
                if (rolling) key = rolled_key(h, i, i);
                std::memcpy(v.keys + s * cache.key_row_bytes(), key.data(), sizeof key);
                v.stats[s].accumulated = h == 0 || i >= 6 ? 10.0f + i : 0.1f * i;
            }
        }
    }
    KvCache::CellView cell(int h) { return cache.cell(layer_of[h], head_of[h]); }
    int cell_slots(int h) const { return cache.cell_slots(layer_of[h], head_of[h]); }
    // The stream indices cell h holds, slot by slot over its region.
    std::vector<int64_t> held(int h) {
        const KvCache::CellView v = cell(h);
        return std::vector<int64_t>(v.stream_index, v.stream_index + cell_slots(h));
    }
};

}  // namespace

TEST_CASE("rebalancing evicts the layer's least attended tokens across heads and resizes the regions") {
    SUBCASE("plain: head 1's least attended tokens go, and head 1 shrinks") {
        TwoHeads t;
        // Two incoming tokens for each cell: 16 held + 4 incoming - 16 slots = 4 victims, all of
        // head 1 (accumulated 0, 0.1, 0.2, 0.3 are the layer's smallest).
        t.cache.rebalance_heads(8, 2);
        // Head 0 kept 8, head 1 kept 4 (at least its minimum 4); the 4 slots left are shared.
        CHECK(t.cache.cell_slots(0, 0) == 10);
        CHECK(t.cache.cell_slots(0, 1) == 6);
        CHECK(t.held(0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, -1, -1});
        CHECK(t.held(1) == std::vector<int64_t>{4, 5, 6, 7, -1, -1});
        // The moved slots carry their rows and statistics.
        const KvCache::CellView v = t.cache.cell(0, 1);
        for (int s = 0; s < 4; ++s) {
            float key[4];
            std::memcpy(key, v.keys + s * t.cache.key_row_bytes(), sizeof key);
            CHECK(key[0] == 100.0f + 4 + s);
            CHECK(v.position[s] == 4 + s);
        }
        CHECK(v.stats[0].accumulated == doctest::Approx(0.4f));
        CHECK(t.cache.used(0, 1) == 4);
        CHECK(t.cache.free_slots(0, 0) == 2);
        CHECK(t.cache.free_slots(0, 1) == 2);
        // The incoming tokens then take free slots without evicting.
        CHECK(t.cache.make_room(0, 1, 2, 8) == 0);
    }
    SUBCASE("with rolling, a cell's kept keys roll back past its own victims") {
        TwoHeads t(nullptr, true);
        t.cache.rebalance_heads(8, 2);
        CHECK(t.held(1) == std::vector<int64_t>{4, 5, 6, 7, -1, -1});
        // Head 1 lost 0..3: tokens 4..7 are ranks 0..3 now, keys rotated back by 4; head 0 lost
        // nothing and keeps its ranks.
        for (int h = 0; h < 2; ++h) {
            const KvCache::CellView v = t.cache.cell(0, h);
            for (int s = 0; s < t.cache.used(0, h); ++s) {
                const int i = static_cast<int>(v.stream_index[s]), rank = h == 0 ? i : i - 4;
                CHECK(v.position[s] == rank);
                std::array<float, 4> key;
                std::memcpy(key.data(), v.keys + s * t.cache.key_row_bytes(), sizeof key);
                const std::array<float, 4> expected = rolled_key(h, i, rank);
                for (int d = 0; d < 4; ++d) CHECK(key[d] == doctest::Approx(expected[d]).epsilon(1e-5));
            }
        }
        int32_t held[2], slots[2];
        t.cache.cell_fill(held, slots);
        CHECK(held[0] == 8);
        CHECK(held[1] == 4);
        CHECK(slots[0] == 10);
        CHECK(slots[1] == 6);
    }
    SUBCASE("pinned tokens stay; the victims are the next least attended") {
        uint8_t tags[8] = {};
        tags[0] = tags[1] = kv_make_tag(true, 0);
        TwoHeads t(tags);
        t.cache.rebalance_heads(8, 2);
        CHECK(t.held(1) == std::vector<int64_t>{0, 1, 6, 7, -1, -1});
    }
    SUBCASE("a span's minimum in a cell is kept") {
        uint8_t tags[8] = {};
        tags[2] = tags[3] = kv_make_tag(false, 1);
        TwoHeads t(tags);
        int32_t minimums[KV_MAX_SPANS] = {2};
        t.cache.set_span_minimums(minimums);
        t.cache.rebalance_heads(8, 2);
        CHECK(t.held(1) == std::vector<int64_t>{2, 3, 6, 7, -1, -1});
    }
    SUBCASE("a cell keeps its minimum even when its tokens are the least attended") {
        TwoHeads t;
        // 4 incoming per cell: 8 victims, head 1's six weakest and then head 0's 0 and 1 (10, 11
        // against head 1's 16 and 17). Head 1 keeps 2 tokens in a region of its minimum 4, head 0
        // 6 in 6; the 6 slots left are shared.
        t.cache.rebalance_heads(8, 4);
        CHECK(t.held(0) == std::vector<int64_t>{2, 3, 4, 5, 6, 7, -1, -1, -1});
        CHECK(t.held(1) == std::vector<int64_t>{6, 7, -1, -1, -1, -1, -1});
    }
    SUBCASE("heads alike: the regions stay and the victims' slots are freed in place") {
        TwoHeads t;
        KvCache::CellView v = t.cache.cell(0, 1);
        for (int s = 0; s < 8; ++s) v.stats[s].accumulated = 10.0f + s;
        // Victims in order: stream index 0 of head 0, of head 1 (a tie: the lower kv head
        // first), then 1 of each; each cell keeps 6 and gets 2 of the 4 free slots: 8, as before.
        t.cache.rebalance_heads(8, 2);
        CHECK(t.cache.cell_slots(0, 0) == 8);
        CHECK(t.held(0) == std::vector<int64_t>{-1, -1, 2, 3, 4, 5, 6, 7});
        CHECK(t.held(1) == std::vector<int64_t>{-1, -1, 2, 3, 4, 5, 6, 7});
        CHECK(t.cache.free_slots(0, 1) == 2);
        CHECK(t.cache.claim_slot(0, 1, 8, 8, 0) < 2);
    }
    SUBCASE("room for the incoming tokens: nothing moves") {
        TwoHeads t;
        t.cache.rebalance_heads(0, 0);
        CHECK(t.cache.cell_slots(0, 0) == 8);
        CHECK(t.held(1) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
    }
    SUBCASE("snapshots carry the regions; sizes outside the bounds are refused") {
        TwoHeads t;
        t.cache.rebalance_heads(8, 2);
        std::vector<uint8_t> bytes;
        ByteWriter w(&bytes);
        t.cache.save(w);
        TwoHeads loaded;
        ByteReader r(bytes.data(), bytes.size());
        REQUIRE(loaded.cache.load(r, 8, 8, 0, 0).ok());
        CHECK(loaded.cache.cell_slots(0, 1) == 6);
        CHECK(loaded.held(1) == t.held(1));
        // The cell sizes follow the random state (8 bytes): 3 is below the minimum of 4, and
        // 11 + 6 is more than the layer's 16 slots.
        const int32_t bad_sizes[2][2] = {{13, 3}, {11, 6}};
        for (const auto &sizes : bad_sizes) {
            std::vector<uint8_t> bad = bytes;
            std::memcpy(bad.data() + 8, sizes, 2 * sizeof(int32_t));
            ByteReader br(bad.data(), bad.size());
            const Status st = loaded.cache.load(br, 8, 8, 0, 0);
            CHECK(st.code == H2O_ERR_STATE_FORMAT);
            CHECK(st.message.find("cell size") != std::string::npos);
        }
    }
}

// On a device backend (Vulkan runs the rule where the cache lives, kv_rebalance.comp; CUDA on a
// host copy of its bookkeeping): from each hand-made cache above, loaded into the device, a few
// rebalancings in turn leave the device's cache byte for byte the CPU's (rows, positions,
// statistics, free lists, cell sizes), each branch of the rule taken: victims across cells,
// rolling, pins, span minimums, cells at their minimum, regions that stay, nothing to do, a pool
// across layers, raised cells and the oldest-first fallback, stale tokens' tied priorities. On
// Vulkan only each layer's parameters go to the device and each cell's counts come back.
void check_rule_on_device(h2o_backend_kind kind) {
    struct Step {
        int64_t next;
        int incoming, floor;
    };
    struct Case {
        const char *name;
        std::vector<Step> steps;
        std::array<uint8_t, 8> tags{};
        bool rolling = false, two_layers = false, heads_alike = false;
        bool early_tokens_heavy = false;  // head 1 attends to its first four tokens, not its last
        int sinks = 0, span_minimum = 0, horizon = 0;
        // A start of unequal full cells: a cache without sinks rebalances for this many tokens
        // per cell and takes them, and t's cache (with its sinks) loads it.
        int prelude_tokens = 0;
    };
    const uint8_t pin = kv_make_tag(true, 0), span = kv_make_tag(false, 1);
    std::vector<Case> cases(11);
    cases[0] = {"plain", {{8, 2, 0}, {10, 3, 0}, {11, 0, 8}}};
    cases[1] = {"rolling", {{8, 2, 0}, {10, 3, 0}, {11, 0, 8}}};
    cases[1].rolling = true;
    cases[2] = {"pins", {{8, 2, 0}, {10, 3, 0}}, {pin, pin}};
    cases[3] = {"a span's minimum", {{8, 2, 0}, {10, 3, 0}}, {0, 0, span, span, span}};
    cases[3].span_minimum = 2;
    cases[4] = {"a cell at its minimum", {{8, 4, 0}}};
    cases[5] = {"heads alike: regions stay", {{8, 2, 0}, {8, 2, 0}}};
    cases[5].heads_alike = true;
    cases[6] = {"room for the batch", {{0, 0, 0}, {8, 0, 0}}};
    cases[7] = {"across layers", {{8, 2, 0}, {10, 3, 0}, {11, 0, 8}}};
    cases[7].two_layers = true;
    cases[8] = {"raised cells, protected tokens: the oldest go", {{10, 1, 8}}};
    cases[8].sinks = 10;  // every token: no candidate at all
    cases[8].prelude_tokens = 2;
    cases[9] = {"stale tokens first (ties of priority -1)", {{8, 2, 0}, {10, 3, 0}}};
    cases[9].horizon = 6;
    // Head 1 keeps its first slots and head 0 grows: head 1's slots move right, each onto the
    // next one's source.
    cases[10] = {"a later cell's slots move right", {{8, 2, 0}}};
    cases[10].early_tokens_heavy = true;
    for (const Case &k : cases) {
        const std::string name = k.name;
        CAPTURE(name);
        TwoHeads t(k.tags.data(), k.rolling, k.two_layers, k.two_layers, k.sinks, k.horizon);
        if (k.heads_alike || k.early_tokens_heavy) {
            KvCache::CellView v = t.cell(1);
            for (int s = 0; s < 8; ++s) v.stats[s].accumulated = k.heads_alike || s < 4 ? 10.0f + s : 0.1f * s;
        }
        int32_t minimums[KV_MAX_SPANS] = {k.span_minimum};
        t.cache.set_span_minimums(minimums);
        auto saved = [](auto save) {
            std::vector<uint8_t> bytes;
            ByteWriter out(&bytes);
            save(out);
            return bytes;
        };
        int64_t n_past = 8;
        if (k.prelude_tokens > 0) {
            TwoHeads unequal(k.tags.data(), k.rolling, k.two_layers, k.two_layers);
            unequal.cache.rebalance_heads(8, k.prelude_tokens);
            n_past += k.prelude_tokens;
            for (int h = 0; h < 2; ++h) {
                for (int64_t i = 8; i < n_past; ++i)
                    unequal.cache.claim_slot(unequal.layer_of[h], unequal.head_of[h], i, static_cast<int32_t>(i), 0);
            }
            const std::vector<uint8_t> bytes = saved([&](ByteWriter &out) { unequal.cache.save(out); });
            ByteReader in(bytes.data(), bytes.size());
            REQUIRE(t.cache.load(in, n_past, n_past, 0, 0).ok());
            REQUIRE(t.cell_slots(0) != t.cell_slots(1));
        }
#ifdef H2O_HAVE_VULKAN
        // (Vulkan with its validation layer.)
        std::unique_ptr<Backend> device = kind == H2O_BACKEND_VULKAN ? h2o_test::make_vk(8) : h2o_test::backend_or_skip(kind, 8);
#else
        std::unique_ptr<Backend> device = h2o_test::backend_or_skip(kind, 8);
#endif
        if (!device) return;
        KvStore &store = device->kv_store();
        REQUIRE(store.create_kv(t.cache.config()).ok());
        const std::vector<uint8_t> start = saved([&](ByteWriter &out) { t.cache.save(out); });
        ByteReader in(start.data(), start.size());
        const int n_pinned = static_cast<int>(std::count(k.tags.begin(), k.tags.end(), pin));
        REQUIRE(store.load_kv(in, n_past, n_past, n_pinned, k.span_minimum > 0 ? 1 : 0).ok());
        REQUIRE(store.set_kv_span_minimums(minimums).ok());
        const int n_layer = t.cache.config().n_layer;
        for (const Step &step : k.steps) {
            CAPTURE(step.next);
            CAPTURE(step.incoming);
            CAPTURE(step.floor);
            int32_t cpu_held[2], cpu_slots[2], held[2], slots[2];
            t.cache.rebalance_heads(step.next, step.incoming, step.floor);
            t.cache.cell_fill(cpu_held, cpu_slots);
            const Backend::Traffic before = device->traffic();
            REQUIRE(store.rebalance_kv(step.next, step.incoming, step.floor, held, slots).ok());
            REQUIRE(device->synchronize().ok());
            const Backend::Traffic after = device->traffic();
            CHECK(std::vector<int32_t>(held, held + 2) == std::vector<int32_t>(cpu_held, cpu_held + 2));
            CHECK(std::vector<int32_t>(slots, slots + 2) == std::vector<int32_t>(cpu_slots, cpu_slots + 2));
            const std::vector<uint8_t> expected = saved([&](ByteWriter &out) { t.cache.save(out); });
            const std::vector<uint8_t> got = saved([&](ByteWriter &out) { REQUIRE(store.save_kv(out).ok()); });
            CHECK(got == expected);
            if (kind == H2O_BACKEND_VULKAN) {
                // Down: 4 words a cell; up: 8 words a layer (its parameters). Nothing of a slot.
                CHECK(after.bytes_to_host - before.bytes_to_host == 2 * 4 * sizeof(uint32_t));
                CHECK(after.bytes_to_device - before.bytes_to_device == static_cast<uint64_t>(n_layer) * 8 * sizeof(uint32_t));
            }
        }
#ifdef H2O_HAVE_VULKAN
        if (kind == H2O_BACKEND_VULKAN) h2o_test::check_validation_clean(*device);
#endif
    }
}

TEST_CASE("the rule's hand-made cases on Vulkan: the device's cache after each rebalancing is the CPU's, byte for byte") {
    check_rule_on_device(H2O_BACKEND_VULKAN);
    // Every move a chunk of its own: the chunks' order (left moves in increasing order, right
    // ones in decreasing order) is what keeps a move from reading a slot another one wrote.
    const h2o_test::ScopedEnv one_move("H2O_VULKAN_REBALANCE_CHUNK", "1");
    check_rule_on_device(H2O_BACKEND_VULKAN);
}

TEST_CASE("the rule's hand-made cases on CUDA: the device's cache after each rebalancing is the CPU's, byte for byte") {
    check_rule_on_device(H2O_BACKEND_CUDA);
}

TEST_CASE("rebalancing across layers moves slots from a layer whose heads attend to few tokens to one whose heads attend to many") {
    SUBCASE("the pool is the whole cache: layer 1's least attended tokens go, and layer 0's cell grows past its layer's budget") {
        TwoHeads t(nullptr, false, /*two_layers=*/true, /*across_layers=*/true);
        CHECK(t.cache.config().max_cell_slots(0) == 12);
        t.cache.rebalance_heads(8, 2);
        CHECK(t.cell_slots(0) == 10);
        CHECK(t.cell_slots(1) == 6);
        CHECK(t.held(0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, -1, -1});
        CHECK(t.held(1) == std::vector<int64_t>{4, 5, 6, 7, -1, -1});
        // Layer 1's region now begins after layer 0's ten slots, and its rows moved with it.
        CHECK(t.cell(1).stream_index - t.cell(0).stream_index == 10);
        for (int s = 0; s < 4; ++s) {
            float key[4];
            std::memcpy(key, t.cell(1).keys + s * t.cache.key_row_bytes(), sizeof key);
            CHECK(key[0] == 100.0f + 4 + s);
        }
        CHECK(t.cache.make_room(1, 0, 2, 8) == 0);
    }
    SUBCASE("per layer, a layer of one kv head has nobody to share with: it evicts its own") {
        TwoHeads t(nullptr, false, /*two_layers=*/true, /*across_layers=*/false);
        CHECK(t.cache.config().max_cell_slots(0) == 8);
        t.cache.rebalance_heads(8, 2);
        CHECK(t.cell_slots(0) == 8);
        CHECK(t.held(0) == std::vector<int64_t>{-1, -1, 2, 3, 4, 5, 6, 7});
        CHECK(t.held(1) == std::vector<int64_t>{-1, -1, 2, 3, 4, 5, 6, 7});
    }
    SUBCASE("with rolling, each layer's cell keeps ranks of its own tokens") {
        TwoHeads t(nullptr, true, true, true);
        t.cache.rebalance_heads(8, 2);
        for (int h = 0; h < 2; ++h) {
            for (int s = 0; s < t.cache.used(t.layer_of[h], 0); ++s) {
                const int i = static_cast<int>(t.cell(h).stream_index[s]);
                CHECK(t.cell(h).position[s] == (h == 0 ? i : i - 4));
            }
        }
        int32_t held[2], slots[2];
        t.cache.cell_fill(held, slots);
        CHECK(held[1] == 4);
        CHECK(slots[0] == 10);
    }
    SUBCASE("snapshots carry the regions; sizes that do not sum to the cache's slots are refused") {
        TwoHeads t(nullptr, false, true, true);
        t.cache.rebalance_heads(8, 2);
        std::vector<uint8_t> bytes;
        ByteWriter w(&bytes);
        t.cache.save(w);
        TwoHeads loaded(nullptr, false, true, true);
        ByteReader r(bytes.data(), bytes.size());
        REQUIRE(loaded.cache.load(r, 8, 8, 0, 0).ok());
        CHECK(loaded.cell_slots(0) == 10);
        CHECK(loaded.held(1) == t.held(1));
        // Layer 0's size follows the random state (8 bytes): 9 and 11 are within a cell's bounds
        // [4, 12], but with layer 1's 6 they leave one slot of the 16 unowned or one too many.
        for (const int32_t size : {9, 11}) {
            CAPTURE(size);
            std::vector<uint8_t> bad = bytes;
            std::memcpy(bad.data() + 8, &size, sizeof size);
            ByteReader br(bad.data(), bad.size());
            const Status st = loaded.cache.load(br, 8, 8, 0, 0);
            CHECK(st.code == H2O_ERR_STATE_FORMAT);
            CHECK(st.message.find("cell sizes of layer 1") != std::string::npos);
        }
        std::vector<uint8_t> too_big = bytes;
        const int32_t size = 13;
        std::memcpy(too_big.data() + 8, &size, sizeof size);
        ByteReader br(too_big.data(), too_big.size());
        CHECK(loaded.cache.load(br, 8, 8, 0, 0).message.find("cell size 13 in (layer 0") != std::string::npos);
    }
}

TEST_CASE("rope with positions per kv head rotates each kv head and its query heads by their own positions") {
    // 4 query heads on 2 kv heads: query heads 0 and 1 and kv head 0 take the first set of
    // positions, query heads 2 and 3 and kv head 1 the second, exactly as a rope by each set alone.
    ModelShape shape;
    shape.n_head = 4;
    shape.n_head_kv = 2;
    shape.head_dim = 8;
    shape.n_embd = 32;
    shape.rope.dims = 8;
    const int n = 3;
    const std::vector<int32_t> first = {5, 6, 7}, second = {2, 3, 4};
    std::vector<int32_t> both = first;
    both.insert(both.end(), second.begin(), second.end());
    auto cpu = make_cpu_backend(1, n);
    auto rope = [&](const std::vector<int32_t> &positions, bool per_kv_head, std::vector<float> *q_out, std::vector<float> *k_out) {
        Tensor q, k, pos;
        REQUIRE(cpu->alloc(TensorType::F32, 32, n, &q).ok());
        REQUIRE(cpu->alloc(TensorType::F32, 16, n, &k).ok());
        REQUIRE(cpu->alloc(TensorType::I32, 1, static_cast<int64_t>(positions.size()), &pos).ok());
        std::vector<float> q_in(32 * n), k_in(16 * n);
        for (size_t i = 0; i < q_in.size(); ++i) q_in[i] = 0.01f * static_cast<float>(i) - 0.3f;
        for (size_t i = 0; i < k_in.size(); ++i) k_in[i] = 0.5f - 0.02f * static_cast<float>(i);
        REQUIRE(cpu->upload(q, q_in.data(), q_in.size() * sizeof(float)).ok());
        REQUIRE(cpu->upload(k, k_in.data(), k_in.size() * sizeof(float)).ok());
        REQUIRE(cpu->upload(pos, positions.data(), positions.size() * sizeof(int32_t)).ok());
        REQUIRE(cpu->rope(q, k, pos, n, shape, per_kv_head).ok());
        q_out->resize(q_in.size());
        k_out->resize(k_in.size());
        REQUIRE(cpu->download(q, q_out->data(), q_in.size() * sizeof(float)).ok());
        REQUIRE(cpu->download(k, k_out->data(), k_in.size() * sizeof(float)).ok());
    };
    std::vector<float> q_both, k_both, q_first, k_first, q_second, k_second;
    rope(both, true, &q_both, &k_both);
    rope(first, false, &q_first, &k_first);
    rope(second, false, &q_second, &k_second);
    for (int t = 0; t < n; ++t) {
        for (int d = 0; d < 32; ++d) {
            const size_t at = static_cast<size_t>(t) * 32 + d;
            CHECK(q_both[at] == (d < 16 ? q_first[at] : q_second[at]));
        }
        for (int d = 0; d < 16; ++d) {
            const size_t at = static_cast<size_t>(t) * 16 + d;
            CHECK(k_both[at] == (d < 8 ? k_first[at] : k_second[at]));
        }
    }
    CHECK(q_first != q_second);
}

namespace {

SessionSettings head_share_settings(const Model &model, float head_share, uint32_t backend) {
    SessionSettings s;
    s.backend = backend;
    s.n_ctx = static_cast<int>(model.n_ctx_train());
    s.kv_budget = 32;
    s.kv_head_share = head_share;
    s.policy.policy = KvPolicy::Scissorhands;
    s.policy.recent = 16;
    s.policy.horizon = 48;
    s.n_threads = 1;
    s.n_batch = 64;
    s.seed = 3;
    return s;
}

// Every cell's size, [layer * n_kv + head], and the stream indices of every slot.
struct CacheView {
    std::vector<int32_t> cell_slots;
    std::vector<int64_t> stream;
    explicit CacheView(Session &session) {
        const KvConfig &kv = session.kv_config();
        cell_slots.resize(static_cast<size_t>(kv.n_layer) * kv.n_head_kv);
        stream.resize(static_cast<size_t>(kv.total_slots()));
        REQUIRE(session.backend().kv_store().download_kv_cell_slots(cell_slots.data()).ok());
        REQUIRE(session.backend().kv_store().download_kv_stream_indices(stream.data()).ok());
    }
};

// A host copy of a session's cache, through the snapshot form (it carries every slot's position).
std::unique_ptr<KvCache> host_copy(Session &session, int64_t n_pinned) {
    std::vector<uint8_t> bytes;
    ByteWriter out(&bytes);
    REQUIRE(session.backend().kv_store().save_kv(out).ok());
    auto host = std::make_unique<KvCache>();
    REQUIRE(host->init(session.kv_config()).ok());
    ByteReader in(bytes.data(), bytes.size());
    REQUIRE(host->load(in, session.n_past(), 0, n_pinned, 0).ok());
    return host;
}

// Every slot's rotary position (-1: free), cell after cell.
std::vector<int32_t> cache_positions(Session &session) {
    const std::unique_ptr<KvCache> host = host_copy(session, 0);
    const KvConfig &kv = session.kv_config();
    std::vector<int32_t> positions;
    for (int l = 0; l < kv.n_layer; ++l) {
        for (int h = 0; h < kv.n_head_kv; ++h) {
            const KvCache::CellView v = host->cell(l, h);
            for (int s = 0; s < host->cell_slots(l, h); ++s) positions.push_back(v.stream_index[s] >= 0 ? v.position[s] : -1);
        }
    }
    return positions;
}

}  // namespace

TEST_CASE("kv_head_share on the real model: regions stay within bounds in the same memory, pins survive, heads differ") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    for (const bool across_layers : {false, true}) {
        CAPTURE(across_layers);
        SessionSettings settings = head_share_settings(*model, 0.5f, H2O_BACKEND_CPU);
        settings.kv_share_across_layers = across_layers;
        std::unique_ptr<Session> session;
        REQUIRE(Session::create(*model, settings, &session).ok());
        std::unique_ptr<Session> uniform;
        REQUIRE(Session::create(*model, head_share_settings(*model, 0.0f, H2O_BACKEND_CPU), &uniform).ok());
        REQUIRE(session->add_text("Lily had a ball.", /*pinned=*/true).ok());
        const int64_t pinned = session->n_past();
        // A retention span whose minimum (a quarter of the budget: 8 tokens) every head keeps.
        REQUIRE(session->add_span_text(7, 0.25f, " Tom was her big brown dog and he liked to run.", false, false).ok());
        REQUIRE(session->generate(" Once upon a time", h2o_test::greedy(400), nullptr, nullptr).ok());
        const KvConfig &kv = session->kv_config();
        const CacheView view(*session);
        const int64_t n_past = session->n_past();
        bool sizes_differ = false, layers_differ = false;
        size_t at = 0;
        int64_t pool_total = 0;
        for (int l = 0; l < kv.n_layer; ++l) {
            int64_t layer_total = 0;
            for (int h = 0; h < kv.n_head_kv; ++h) {
                const int32_t slots = view.cell_slots[static_cast<size_t>(l) * kv.n_head_kv + h];
                CAPTURE(l);
                CAPTURE(h);
                CHECK(slots >= kv.min_cell_slots(l));
                CHECK(slots <= kv.max_cell_slots(l));
                layer_total += slots;
                sizes_differ |= slots != kv.slots_in(l);
                std::vector<int64_t> held;
                for (int s = 0; s < slots; ++s, ++at) {
                    if (view.stream[at] >= 0) held.push_back(view.stream[at]);
                }
                std::sort(held.begin(), held.end());
                CHECK(std::unique(held.begin(), held.end()) == held.end());
                for (int64_t i = 0; i < pinned; ++i) CHECK(std::binary_search(held.begin(), held.end(), i));
                CHECK(held.back() == n_past - 1);  // the newest token is always kept
            }
            // Each layer's cells own its slots; across layers, only the whole cache's.
            layers_differ |= layer_total != static_cast<int64_t>(kv.n_head_kv) * kv.slots_in(l);
            pool_total += layer_total;
            if (l + 1 == kv.pool_end_layer(l)) {
                CHECK(pool_total == kv.pool_slots(l));
                pool_total = 0;
            }
        }
        CHECK(at == view.stream.size());
        CHECK(sizes_differ);
        CHECK(layers_differ == across_layers);
        SpanReport span;
        REQUIRE(session->span_report(7, &span).ok());
        CHECK(span.kept_min == 8);
        CHECK(span.kept_max >= 8);
        // The same memory as fixed budgets, but for rebalancing's working lists: a pool's slot
        // offsets, destinations and priorities (a layer's, or the whole cache's), and per cell of a
        // pool its kept count, new size and span counts.
        const size_t pool_slots =
            across_layers ? static_cast<size_t>(kv.total_slots()) : static_cast<size_t>(kv.n_head_kv) * kv.max_slots();
        const size_t pool_cells = static_cast<size_t>(across_layers ? kv.n_layer : 1) * kv.n_head_kv;
        CHECK(session->backend().kv_store().kv_bytes() - uniform->backend().kv_store().kv_bytes() ==
              pool_slots * (2 * sizeof(int64_t) + sizeof(float)) + pool_cells * (2 + KV_MAX_SPANS) * sizeof(int32_t));
    }
}

TEST_CASE("kv_rebalance_due: the batches that hold a multiple of the interval") {
    for (int interval : {0, 1}) {
        CHECK(kv_rebalance_due(interval, 0, 1));
        CHECK(kv_rebalance_due(interval, 37, 1));
    }
    CHECK(kv_rebalance_due(8, 0, 1));
    CHECK_FALSE(kv_rebalance_due(8, 1, 7));  // 1..7
    CHECK(kv_rebalance_due(8, 1, 8));        // 1..8
    CHECK(kv_rebalance_due(8, 16, 1));
    CHECK_FALSE(kv_rebalance_due(8, 17, 1));
    CHECK(kv_rebalance_due(8, 9, 100));
    int due = 0;
    for (int64_t i = 1000; i < 2000; ++i) due += kv_rebalance_due(16, i, 1) ? 1 : 0;
    CHECK(due == 62);  // 1008, 1024, ..., 1984
    CHECK(kv_rebalance_due(kMaxKvRebalanceInterval, int64_t{1} << 40, 1));
}

TEST_CASE("kv_rebalance_interval: a session moves the budgets only in the batches it schedules") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    for (const bool rolling : {false, true}) {
        CAPTURE(rolling);
        SessionSettings settings = head_share_settings(*model, 0.5f, H2O_BACKEND_CPU);
        settings.kv_share_across_layers = true;
        settings.kv_rebalance_interval = 8;
        settings.rolling = rolling;
        std::unique_ptr<Session> session;
        REQUIRE(Session::create(*model, settings, &session).ok());
        REQUIRE(session->add_text("Once upon a time, there was a little dog named Max. He liked to run in the park.", false).ok());
        std::vector<int32_t> tokens;
        REQUIRE(session->model()
                    .tokenizer()
                    .encode(" One day, Max saw a big red ball. He ran to it and played with it all day long. His friend Lily came too.",
                            false, &tokens)
                    .ok());
        std::vector<int32_t> before = CacheView(*session).cell_slots;
        int moves = 0;
        for (const int32_t token : tokens) {
            const int64_t next_index = session->n_past();
            REQUIRE(session->decode(&token, 1).ok());
            const std::vector<int32_t> after = CacheView(*session).cell_slots;
            CAPTURE(next_index);
            if (!kv_rebalance_due(8, next_index, 1)) CHECK(after == before);
            moves += after != before ? 1 : 0;
            before = after;
        }
        CHECK(moves >= 2);  // the scheduled batches do move them
    }
}

TEST_CASE("kv_head_share on a model with sliding-window layers: the global layers' heads share slots, local layers keep windows") {
    // Layers 2 and 5 global, the others local with 8-token windows; two kv heads.
    const std::string path = h2o_test::write_small_gemma3("gemma3-head-share.gguf", 2);
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    SessionSettings settings = head_share_settings(*model, 0.5f, H2O_BACKEND_CPU);
    settings.n_ctx = 64;
    settings.rolling = true;
    settings.kv_layer_slope = 0.5f;
    settings.n_batch = 6;
    settings.policy.horizon = 0;  // stale tokens, evicted first, would leave the heads' shares even
    std::unique_ptr<Session> session;
    REQUIRE(Session::create(*model, settings, &session).ok());
    REQUIRE(session->add_text("Once upon a time there was a little fox who lived by the river and loved to sing.", false).ok());
    REQUIRE(session->generate("", h2o_test::greedy(150), nullptr, nullptr).ok());
    const KvConfig &kv = session->kv_config();
    REQUIRE(kv.slots_in(2) == 16);  // the slope over the two global layers: 16 and 48
    REQUIRE(kv.slots_in(5) == 48);
    const CacheView view(*session);
    bool moved = false;
    size_t at = 0;
    for (int l = 0; l < kv.n_layer; ++l) {
        int64_t layer_total = 0;
        for (int h = 0; h < kv.n_head_kv; ++h) {
            CAPTURE(l);
            CAPTURE(h);
            const int32_t slots = view.cell_slots[static_cast<size_t>(l) * kv.n_head_kv + h];
            layer_total += slots;
            if (kv.is_window_layer(l)) {
                CHECK(slots == 13);  // the window and a batch
                for (int s = 0; s < slots; ++s) CHECK(view.stream[at + s] >= session->n_past() - 13);
            } else {
                CHECK(slots >= kv.min_cell_slots(l));
                moved |= slots != kv.slots_in(l);
            }
            at += static_cast<size_t>(slots);
        }
        CHECK(layer_total == static_cast<int64_t>(kv.n_head_kv) * kv.slots_in(l));
    }
    CHECK(moved);
}

TEST_CASE("kv_head_share with rolling on the real model: every cell's positions are the ranks of its own tokens") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    // H2O with a layer slope; Scissorhands within each layer and across layers, moving the budgets
    // before every batch and every 7 tokens (between, the session counts each cell's fill itself).
    for (const KvPolicy policy : {KvPolicy::Scissorhands, KvPolicy::H2O}) {
        for (const bool across_layers : {false, true}) {
            if (across_layers && policy == KvPolicy::H2O) continue;
            CAPTURE(static_cast<int>(policy));
            CAPTURE(across_layers);
            SessionSettings settings = head_share_settings(*model, 0.5f, H2O_BACKEND_CPU);
            settings.policy.policy = policy;
            settings.kv_share_across_layers = across_layers;
            settings.kv_rebalance_interval = across_layers ? 7 : 0;
            settings.rolling = true;
            settings.n_ctx = 256;
            settings.kv_layer_slope = policy == KvPolicy::H2O ? 0.5f : 0.0f;
            std::unique_ptr<Session> session;
            REQUIRE(Session::create(*model, settings, &session).ok());
            REQUIRE(session->add_text("Lily had a ball.", /*pinned=*/true).ok());
            const int64_t pinned = session->n_past();
            // Past the session's context: positions must stay ranks for the stream to go on.
            REQUIRE(session->generate(" Once upon a time", h2o_test::greedy(600), nullptr, nullptr).ok());
            REQUIRE(session->n_past() > settings.n_ctx);
            const KvConfig &kv = session->kv_config();
            const std::unique_ptr<KvCache> copy = host_copy(*session, pinned);
            KvCache &host = *copy;
            bool sizes_differ = false;
            for (int l = 0; l < kv.n_layer; ++l) {
                for (int h = 0; h < kv.n_head_kv; ++h) {
                    CAPTURE(l);
                    CAPTURE(h);
                    sizes_differ |= host.cell_slots(l, h) != kv.slots_in(l);
                    const KvCache::CellView v = host.cell(l, h);
                    std::vector<std::pair<int64_t, int32_t>> held;  // (stream index, position)
                    for (int s = 0; s < host.used(l, h); ++s) {
                        if (v.stream_index[s] >= 0) held.emplace_back(v.stream_index[s], v.position[s]);
                    }
                    std::sort(held.begin(), held.end());
                    REQUIRE(held.size() > static_cast<size_t>(pinned));
                    for (size_t r = 0; r < held.size(); ++r) CHECK(held[r].second == static_cast<int32_t>(r));
                    CHECK(held.back().first == session->n_past() - 1);
                    CHECK(held[static_cast<size_t>(pinned) - 1].first == pinned - 1);
                }
            }
            CHECK(sizes_differ);
        }
    }
}

TEST_CASE("kv_head_share: until a cell must evict, a prompt's logits and statistics are those of fixed budgets, bit for bit") {
    // The cells may grow to max_cell_slots, so the backends' per-cell scratch is laid out by it: a
    // batch of many queries fills every row of it.
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<SlotStats>> stats;
    // Fixed budgets, then a share within each layer and across layers (cells up to almost half
    // the cache).
    for (int run = 0; run < 3; ++run) {
        SessionSettings settings = head_share_settings(*model, run == 0 ? 0.0f : 0.75f, H2O_BACKEND_CPU);
        settings.kv_share_across_layers = run == 2;
        settings.kv_budget = 160;
        settings.n_threads = 2;
        settings.n_batch = 160;
        std::unique_ptr<Session> session;
        REQUIRE(Session::create(*model, settings, &session).ok());
        std::string text;
        for (int i = 0; i < 5; ++i) text += " Once upon a time, there was a little dog named Max. He liked to run in the park.";
        REQUIRE(session->add_text(text, false).ok());
        REQUIRE(session->n_past() > 100);
        REQUIRE(session->n_past() < 160);
        REQUIRE(session->fetch_logits().ok());
        logits.push_back(session->logits());
        stats.emplace_back(static_cast<size_t>(session->kv_config().total_slots()));
        REQUIRE(session->backend().kv_store().download_kv_statistics(stats.back().data()).ok());
    }
    for (int run = 1; run < 3; ++run) {
        CAPTURE(run);
        CHECK(logits[0] == logits[run]);
        CHECK(std::memcmp(stats[0].data(), stats[run].data(), stats[0].size() * sizeof(SlotStats)) == 0);
    }
}

TEST_CASE("kv_head_share: validation") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    auto create = [&](uint32_t policy, float share, uint32_t budget, h2o_session **out, int32_t across_layers = 0) {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.backend = H2O_BACKEND_CPU;
        sp.kv_budget = budget;
        sp.kv_policy = policy;
        // Budget 0: the cache that never evicts (n_ctx slots, kv_overflow = error).
        if (budget == 0) sp.kv_overflow = H2O_KV_OVERFLOW_ERROR;
        sp.experimental[H2O_EXP_KV_HEAD_SHARE] = share;
        sp.experimental[H2O_EXP_KV_SHARE_ACROSS_LAYERS] = across_layers;
        return h2o_session_create(model, &sp, out);
    };
    auto resolved = [](const h2o_session *session, uint32_t key) {
        double value = -1.0;
        REQUIRE(h2o_session_get_experimental(session, key, &value) == H2O_OK);
        return value;
    };
    h2o_session *session = nullptr;
    CHECK(create(H2O_KV_SCISSORHANDS, 0.95f, 32, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_head_share") != std::string::npos);
    CHECK(create(H2O_KV_SCISSORHANDS, -0.1f, 32, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(create(H2O_KV_WINDOW, 0.5f, 32, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("statistics") != std::string::npos);
    // A full cache ignores it.
    REQUIRE(create(H2O_KV_SCISSORHANDS, 0.5f, 0, &session) == H2O_OK);
    h2o_kv_layout layout;
    layout.struct_size = sizeof layout;
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(resolved(session, H2O_EXP_KV_HEAD_SHARE) == 0.0);
    h2o_session_free(session);
    // The layout reports it and each head's fewest slots; pins beyond them raise the heads that
    // must hold them, up to the budget - 1 (31 here).
    REQUIRE(create(H2O_KV_H2O, 0.75f, 32, &session) == H2O_OK);
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(resolved(session, H2O_EXP_KV_HEAD_SHARE) == 0.75);
    CHECK(layout.min_head_budget == 8);
    const std::string text = "Once upon a time, there was a little girl named Lily.";  // 14 tokens with BOS
    CHECK(h2o_session_add_text(session, text.data(), text.size(), H2O_TEXT_PIN) == H2O_OK);
    CHECK(h2o_session_add_text(session, text.data(), text.size(), H2O_TEXT_PIN) == H2O_OK);
    CHECK(h2o_session_add_text(session, text.data(), text.size(), H2O_TEXT_PIN) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_session_last_error(session)).find("the most slots every kv head can be given") != std::string::npos);
    CHECK(resolved(session, H2O_EXP_KV_SHARE_ACROSS_LAYERS) == 0.0);
    h2o_session_free(session);
    // Sharing across layers: 0 or 1, and only a head share's slots move.
    CHECK(create(H2O_KV_H2O, 0.0f, 32, &session, 1) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_share_across_layers") != std::string::npos);
    CHECK(create(H2O_KV_H2O, 0.5f, 32, &session, 2) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_share_across_layers") != std::string::npos);
    REQUIRE(create(H2O_KV_H2O, 0.5f, 32, &session, 1) == H2O_OK);
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(resolved(session, H2O_EXP_KV_SHARE_ACROSS_LAYERS) == 1.0);
    CHECK(layout.min_head_budget == 16);
    h2o_session_free(session);
    // A full cache ignores both.
    REQUIRE(create(H2O_KV_SCISSORHANDS, 0.0f, 0, &session, 1) == H2O_OK);
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(resolved(session, H2O_EXP_KV_SHARE_ACROSS_LAYERS) == 0.0);
    h2o_session_free(session);
    h2o_model_free(model);
}

// On a device backend (Vulkan, CUDA): the same regions, kept tokens, positions and text as the
// CPU.
void check_head_share_on_device(const Model &model, uint32_t device) {
    // The backends' statistics agree to rounding, not bit for bit, so over a long generation two
    // tokens whose priorities are within rounding of each other are ranked differently sooner or
    // later, with fixed budgets as with these (a Scissorhands count of weights above a threshold
    // sooner than H2O's and RoCo's sums; ranking across a layer's heads compares more pairs). The
    // prompt and the first 16 tokens, with a rebalancing before each, are compared here; the
    // snapshot tests continue a Vulkan session's rebalanced cache on the CPU.
    // Each policy with stream positions and with rolling ones; budgets across layers (one region
    // of rows for the whole cache) for one policy in two.
    for (const bool rolling : {false, true})
        for (KvPolicy policy : {KvPolicy::RoCo, KvPolicy::H2O}) {
            const std::string name = kv_policy_name(policy);
            const bool across_layers = rolling == (policy == KvPolicy::RoCo);
            CAPTURE(name);
            CAPTURE(rolling);
            CAPTURE(across_layers);
            SessionSettings settings = head_share_settings(model, 0.75f, device);
            settings.policy.policy = policy;
            settings.rolling = rolling;
            settings.kv_share_across_layers = across_layers;
            settings.kv_layer_slope = policy == KvPolicy::H2O ? 0.5f : 0.0f;
            settings.policy.horizon = 0;  // stale tokens, evicted first, leave the cells' shares even
            std::unique_ptr<Session> gpu = h2o_test::session_or_skip(model, settings);
            if (!gpu) return;
            settings.backend = H2O_BACKEND_CPU;
            std::unique_ptr<Session> cpu;
            REQUIRE(Session::create(model, settings, &cpu).ok());
            std::string gpu_text, cpu_text;
            const TextSink collect = [](const char *piece, size_t size, void *out) {
                static_cast<std::string *>(out)->append(piece, size);
                return false;  // go on
            };
            const std::string prompt = "Once upon a time, there was a little dog named Max. He liked to run in the park with his friend.";
            REQUIRE(gpu->generate(prompt, h2o_test::greedy(16), collect, &gpu_text).ok());
            REQUIRE(cpu->generate(prompt, h2o_test::greedy(16), collect, &cpu_text).ok());
            CHECK(gpu_text.size() > 30);  // 16 tokens
            CHECK(gpu_text == cpu_text);
            const CacheView g(*gpu), c(*cpu);
            CHECK(g.cell_slots == c.cell_slots);
            size_t first_difference = 0, differences = 0;
            for (size_t i = 0; i < c.stream.size(); ++i) {
                if (g.stream[i] != c.stream[i] && differences++ == 0) first_difference = i;
            }
            INFO(differences << " slots differ, the first " << first_difference << ": " << g.stream[first_difference] << " against "
                             << c.stream[first_difference]);
            CHECK(g.stream == c.stream);
            const KvConfig &kv = cpu->kv_config();
            CHECK(cache_positions(*gpu) == cache_positions(*cpu));
            bool moved = false, layers_moved = false;
            for (size_t i = 0; i < c.cell_slots.size(); ++i) moved |= c.cell_slots[i] != kv.slots_in(static_cast<int>(i / kv.n_head_kv));
            for (int l = 0; l < kv.n_layer; ++l) {
                int64_t layer_total = 0;
                for (int h = 0; h < kv.n_head_kv; ++h) layer_total += c.cell_slots[static_cast<size_t>(l) * kv.n_head_kv + h];
                layers_moved |= layer_total != static_cast<int64_t>(kv.n_head_kv) * kv.slots_in(l);
            }
            CHECK(moved);
            CHECK(layers_moved == across_layers);
        }
}

// From one cache of the real model, loaded into both backends, rebalancings leave the device's
// cache byte for byte the CPU's, rows, positions, statistics and free lists included, and the
// rows never cross to the host (Vulkan: nor does any slot's bookkeeping).
void check_rebalancing_on_device_rows(const Model &model, uint32_t device) {
    for (const KvType type : {KvType::F16, KvType::Q8, KvType::K8V4})
        for (const bool rolling : {false, true}) {
            const bool across_layers = rolling == (type == KvType::Q8);
            CAPTURE(static_cast<int>(type));
            CAPTURE(rolling);
            CAPTURE(across_layers);
            SessionSettings settings = head_share_settings(model, 0.75f, H2O_BACKEND_CPU);
            settings.kv_type = type;
            settings.rolling = rolling;
            settings.kv_share_across_layers = across_layers;
            settings.kv_rebalance_interval = 1 << 10;  // the session leaves the regions as they are
            settings.policy.horizon = 0;
            std::unique_ptr<Session> cpu;
            REQUIRE(Session::create(model, settings, &cpu).ok());
            settings.backend = device;
            std::unique_ptr<Session> gpu = h2o_test::session_or_skip(model, settings);
            if (!gpu) return;
            const std::string prompt = "Once upon a time, there was a little dog named Max. He liked to run in the park with his friend.";
            REQUIRE(cpu->generate(prompt, h2o_test::greedy(24), nullptr, nullptr).ok());
            auto saved = [](Session &session) {
                std::vector<uint8_t> bytes;
                ByteWriter out(&bytes);
                REQUIRE(session.backend().kv_store().save_kv(out).ok());
                return bytes;
            };
            const std::vector<uint8_t> start = saved(*cpu);
            ByteReader in(start.data(), start.size());
            KvStore &store = gpu->backend().kv_store();
            REQUIRE(store.load_kv(in, cpu->n_past(), 0, 0, 0).ok());
            const KvConfig &kv = cpu->kv_config();
            const size_t n_cells = static_cast<size_t>(kv.n_layer) * kv.n_head_kv;
            // The bookkeeping (Vulkan's kv_meta_layout.h, CUDA's arrays): at most 10 words a slot, 5 a
            // cell, the generator and the span minimums.
            const int64_t bookkeeping_bytes = 4 * (10 * kv.total_slots() + 5 * static_cast<int64_t>(n_cells) + 2 + KV_MAX_SPANS);
            bool resized = false;
            // More tokens coming each time (more victims), then cells raised to a floor. Then
            // caches of many shapes: before each of 24 more rebalancings the CPU session reads a
            // token (evicting within the regions the last one left) and the device loads its
            // cache, and the tokens coming and the floor (none, or up to what a session may hold
            // from eviction, plus one) are drawn.
            std::vector<std::array<int, 3>> steps{{1, 0, 0}, {6, 0, 0}, {13, 0, 0}, {2, 20, 0}};
            uint32_t state = 12345;
            auto draw = [&](int below) {
                state = state * 1664525u + 1013904223u;
                return static_cast<int>((state >> 8) % static_cast<uint32_t>(below));
            };
            for (int i = 0; i < 24; ++i) {
                const int incoming = 1 + draw(8), floor = draw(2) == 0 ? 0 : 1 + draw(kv.max_held_from_eviction() + 1);
                steps.push_back({incoming, floor, 1});
            }
            for (const std::array<int, 3> &step : steps) {
                const int incoming = step[0], floor = step[1];
                CAPTURE(incoming);
                CAPTURE(floor);
                if (step[2] != 0) {
                    const int32_t token = 100 + draw(300);
                    REQUIRE(cpu->decode(&token, 1, Retention{}).ok());
                    const std::vector<uint8_t> now = saved(*cpu);
                    ByteReader reader(now.data(), now.size());
                    REQUIRE(store.load_kv(reader, cpu->n_past(), 0, 0, 0).ok());
                }
                std::vector<int32_t> cpu_held(n_cells), cpu_slots(n_cells), gpu_held(n_cells), gpu_slots(n_cells);
                REQUIRE(cpu->backend().kv_store().rebalance_kv(cpu->n_past(), incoming, floor, cpu_held.data(), cpu_slots.data()).ok());
                const Backend::Traffic before = gpu->backend().traffic();
                REQUIRE(store.rebalance_kv(cpu->n_past(), incoming, floor, gpu_held.data(), gpu_slots.data()).ok());
                REQUIRE(gpu->backend().synchronize().ok());
                const Backend::Traffic after = gpu->backend().traffic();
                CHECK(gpu_held == cpu_held);
                CHECK(gpu_slots == cpu_slots);
                const std::vector<uint8_t> expected = saved(*cpu), got = saved(*gpu);
                CHECK(got.size() == expected.size());
                CHECK(got == expected);
                if (device == H2O_BACKEND_VULKAN) {
                    // The rule runs on the device: down 4 words a cell, up 8 words a layer.
                    CHECK(after.bytes_to_host - before.bytes_to_host == 4 * sizeof(uint32_t) * n_cells);
                    CHECK(after.bytes_to_device - before.bytes_to_device == 8 * sizeof(uint32_t) * static_cast<uint64_t>(kv.n_layer));
                } else {
                    // The rule runs on a host copy of the bookkeeping. Down: the bookkeeping; up: at
                    // most the bookkeeping and an entry of 16 bytes per rotation and per move (at
                    // most one of each a slot). No rows.
                    CHECK(static_cast<int64_t>(after.bytes_to_host - before.bytes_to_host) <= bookkeeping_bytes);
                    CHECK(static_cast<int64_t>(after.bytes_to_device - before.bytes_to_device) <=
                          bookkeeping_bytes + 32 * kv.total_slots());
                }
                for (size_t c = 0; c < n_cells; ++c) resized |= cpu_slots[c] != kv.slots_in(static_cast<int>(c / kv.n_head_kv));
            }
            CHECK(resized);
        }
}

TEST_CASE("kv_head_share on Vulkan: the same regions, kept tokens and text as the CPU") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    check_head_share_on_device(*model, H2O_BACKEND_VULKAN);
}

TEST_CASE("kv_head_share on Vulkan: rebalancing edits the device's rows as the CPU's rule edits its own, byte for byte") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    check_rebalancing_on_device_rows(*model, H2O_BACKEND_VULKAN);
}

TEST_CASE("kv_head_share on CUDA: rebalancing edits the device's rows as the CPU's rule edits its own, byte for byte") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    check_rebalancing_on_device_rows(*model, H2O_BACKEND_CUDA);
}

TEST_CASE("kv_head_share on CUDA: the same regions, kept tokens and text as the CPU") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    check_head_share_on_device(*model, H2O_BACKEND_CUDA);
}

TEST_CASE("budgets that move hold pins up to the budget - 1: the heads that must hold them are raised, on the CPU and Vulkan") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    // The slope leaves the bottom layer 16 slots a head and the share half of them (8): 31 pins
    // need every head of the bottom layers raised, slots taken from the upper layers.
    std::vector<int32_t> story;
    REQUIRE(model->tokenizer()
                .encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her "
                        "friends and her big brown dog, who was called Max.",
                        true, &story)
                .ok());
    REQUIRE(story.size() > 32);
    std::vector<std::string> texts;
    for (const uint32_t backend : {uint32_t{H2O_BACKEND_CPU}, uint32_t{H2O_BACKEND_VULKAN}}) {
        CAPTURE(backend);
        SessionSettings settings = head_share_settings(*model, 0.5f, backend);
        settings.kv_layer_slope = 0.5f;
        settings.kv_share_across_layers = true;
        settings.kv_rebalance_interval = 16;
        settings.rolling = true;
        settings.n_ctx = 256;
        settings.policy.horizon = 96;
        std::unique_ptr<Session> session = h2o_test::session_or_skip(*model, settings);
        if (!session) break;
        const KvConfig &kv = session->kv_config();
        REQUIRE(kv.slots_in(0) == 16);
        REQUIRE(kv.max_held_from_eviction() == 31);
        REQUIRE(session->decode(story.data(), 31, Retention{true}).ok());
        // One more pinned token would leave a head of 32 slots none to evict into.
        CHECK(session->decode(story.data() + 31, 1, Retention{true}).code == H2O_ERR_INVALID_ARGUMENT);
        std::string text;
        const TextSink collect = [](const char *piece, size_t size, void *out) {
            static_cast<std::string *>(out)->append(piece, size);
            return false;  // go on
        };
        REQUIRE(session->generate(" Then", h2o_test::greedy(200), collect, &text).ok());
        texts.push_back(text);
        const CacheView view(*session);
        size_t at = 0;
        for (int l = 0; l < kv.n_layer; ++l) {
            for (int h = 0; h < kv.n_head_kv; ++h) {
                CAPTURE(l);
                CAPTURE(h);
                const int32_t slots = view.cell_slots[static_cast<size_t>(l) * kv.n_head_kv + h];
                CHECK(slots >= 32);  // the pins and a slot to evict into
                std::vector<int64_t> held;
                for (int s = 0; s < slots; ++s, ++at) {
                    if (view.stream[at] >= 0) held.push_back(view.stream[at]);
                }
                std::sort(held.begin(), held.end());
                for (int64_t i = 0; i < 31; ++i) CHECK(std::binary_search(held.begin(), held.end(), i));
                CHECK(held.back() == session->n_past() - 1);
            }
        }
        // A snapshot continues exactly.
        std::vector<uint8_t> state;
        REQUIRE(session->save_state(&state).ok());
        std::unique_ptr<Session> loaded;
        REQUIRE(Session::create(*model, settings, &loaded).ok());
        REQUIRE(loaded->load_state(state.data(), state.size()).ok());
        std::string a, b;
        REQUIRE(session->generate("", h2o_test::greedy(24), collect, &a).ok());
        REQUIRE(loaded->generate("", h2o_test::greedy(24), collect, &b).ok());
        CHECK(a == b);
    }
    // Vulkan's statistics agree with the CPU's to rounding: the first tokens are compared.
    if (texts.size() == 2) CHECK(texts[0].substr(0, 40) == texts[1].substr(0, 40));
}

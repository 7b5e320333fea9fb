// Writes the seed corpora of the fuzz targets (run by the build; nothing binary is committed):
//
//   h2o-fuzz-seeds OUT_DIR DEFAULT_SHARED_DIR     ($H2O_SHARED_DIR wins when set)
//
// OUT_DIR/gguf_load: tiny synthetic models of every weight type h2o-synth writes, the real
// stories260K model, and copies of it and of the vocabulary-only GGUF with hostile metadata
// values, truncations and broken headers. OUT_DIR/text: sample stories and awkward UTF-8, each
// behind the two control bytes fuzz_text.cpp reads. Without the shared data folder only the
// synthetic and hand-written seeds are written, and the run says so with the marker that makes
// CTest report it as skipped.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <zstd.h>

#include "h2o/h2o.h"
#include "snapshot_formats.h"
#include "synthetic_model.h"

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

[[noreturn]] void die(const std::string &message) {
    std::fprintf(stderr, "h2o-fuzz-seeds: %s\n", message.c_str());
    std::exit(1);
}

Bytes read_file(const fs::path &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) die("cannot read " + path.string());
    return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const fs::path &path, const Bytes &bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) die("cannot write " + path.string());
}

void put_u32(Bytes &b, size_t offset, uint32_t v) {
    for (int i = 0; i < 4; ++i) b.at(offset + i) = static_cast<uint8_t>(v >> (8 * i));
}

// A copy of a GGUF file with the 32-bit integer value of metadata key `key` replaced. Keys are
// stored as their bytes followed by the value's type id (4: uint32, 5: int32) and the value.
Bytes with_u32(const Bytes &file, const std::string &key, uint32_t value) {
    const auto it = std::search(file.begin(), file.end(), key.begin(), key.end());
    if (it == file.end()) die("no key " + key + " in the model");
    const size_t type_at = static_cast<size_t>(it - file.begin()) + key.size();
    const uint8_t type = file.at(type_at);
    if (type != 4 && type != 5) die(key + " is not a 32-bit integer");
    Bytes copy = file;
    put_u32(copy, type_at + 4, value);
    return copy;
}

Bytes prefix(const Bytes &b, size_t n) { return Bytes(b.begin(), b.begin() + std::min(n, b.size())); }

void synthetic_seeds(const fs::path &dir) {
    struct Case {
        const char *name;
        h2o::TensorType type;
    };
    const Case cases[] = {{"f32", h2o::TensorType::F32},   {"f16", h2o::TensorType::F16},   {"q8_0", h2o::TensorType::Q8_0},
                          {"q4_0", h2o::TensorType::Q4_0}, {"q4_k", h2o::TensorType::Q4_K}, {"q5_k", h2o::TensorType::Q5_K},
                          {"q6_k", h2o::TensorType::Q6_K}};
    for (const Case &c : cases) {
        h2o::SyntheticModelSpec spec;
        const bool kquant = h2o::traits(c.type).block_elements == 256;
        // The smallest shapes the writer accepts: K-quant rows must hold a 256-element block.
        spec.n_embd = kquant ? 256 : 32;
        spec.n_ff = kquant ? 256 : 64;
        spec.n_head = kquant ? 2 : 4;
        spec.n_head_kv = kquant ? 1 : 2;
        spec.n_layer = 1;
        spec.n_vocab = 300;
        spec.n_ctx = 64;
        spec.type = c.type;
        spec.tied_output = kquant;  // keeps the K-quant files small
        const fs::path out = dir / (std::string("synth-") + c.name + ".gguf");
        const h2o::Status st = h2o::write_synthetic_model(spec, out.string());
        if (!st.ok()) die(out.string() + ": " + st.message);
    }
    // Two layers, multi-query attention, separate output matrix.
    h2o::SyntheticModelSpec spec;
    spec.n_embd = 32, spec.n_ff = 32, spec.n_head = 2, spec.n_head_kv = 1, spec.n_layer = 2, spec.n_vocab = 300, spec.n_ctx = 32;
    spec.type = h2o::TensorType::Q8_0;
    const h2o::Status st = h2o::write_synthetic_model(spec, (dir / "synth-q8_0-mqa-2layers.gguf").string());
    if (!st.ok()) die(st.message);
}

void real_model_seeds(const fs::path &dir, const fs::path &shared) {
    const Bytes model = read_file(shared / "models/stories260K.gguf");
    write_file(dir / "stories260K.gguf", model);
    write_file(dir / "stories260K-context-4G.gguf", with_u32(model, "llama.context_length", 0xFFFFFFFFu));
    write_file(dir / "stories260K-kv-heads-0.gguf", with_u32(model, "llama.attention.head_count_kv", 0));
    write_file(dir / "stories260K-kv-heads-5.gguf", with_u32(model, "llama.attention.head_count_kv", 5));
    write_file(dir / "stories260K-blocks-1000.gguf", with_u32(model, "llama.block_count", 1000));
    write_file(dir / "stories260K-embd-65.gguf", with_u32(model, "llama.embedding_length", 65));
    write_file(dir / "stories260K-rope-dims-0.gguf", with_u32(model, "llama.rope.dimension_count", 0));
    write_file(dir / "stories260K-bos-past-vocab.gguf", with_u32(model, "tokenizer.ggml.bos_token_id", 512));
    write_file(dir / "stories260K-truncated-half.gguf", prefix(model, model.size() / 2));

    // Header: magic, version (u32), tensor count and key count (u64 each).
    const Bytes vocab = read_file(shared / "vocab/ggml-vocab-llama-spm.gguf");
    write_file(dir / "vocab-only.gguf", vocab);
    write_file(dir / "vocab-truncated-4k.gguf", prefix(vocab, 4096));
    write_file(dir / "vocab-truncated-header.gguf", prefix(vocab, 20));
    Bytes v = prefix(vocab, 65536);
    put_u32(v, 4, 1);  // version 1 (unsupported)
    write_file(dir / "vocab-version-1.gguf", v);
    v = prefix(vocab, 65536);
    put_u32(v, 12, 0x100);  // 2^40 tensors
    write_file(dir / "vocab-tensor-count-huge.gguf", v);
    v = prefix(vocab, 65536);
    put_u32(v, 16, 0x7FFFFFFF);  // 2^31 - 1 keys
    write_file(dir / "vocab-key-count-huge.gguf", v);
}

// Snapshots of real sessions of stories260K (several policies, KV formats, rolling), each as a
// whole file (mode byte 0) and as its decompressed state (mode byte 1), as fuzz_snapshot_read.cpp
// reads them. The state seeds use the settings of that target's header template.
void snapshot_seeds(const fs::path &dir, const fs::path &shared) {
    const std::string model_path = (shared / "models/stories260K.gguf").string();
    h2o_model *model = nullptr;
    if (h2o_model_load(model_path.c_str(), nullptr, &model) != H2O_OK) die(h2o_last_error());
    struct Setting {
        uint32_t policy, kv_type, budget, n_ctx;
        int32_t rolling;
        float head_share;  // kv_head_share: the payload then holds every cell's size
        int32_t across_layers;  // kv_share_across_layers: cell sizes sum over the whole cache
    };
    const Setting settings[] = {{H2O_KV_SCISSORHANDS, H2O_KV_TYPE_F32, 32, 256, 1, 0.0f, 0}, {H2O_KV_H2O, H2O_KV_TYPE_F32, 32, 256, 1, 0.0f, 0},
                                {H2O_KV_SINK_WINDOW, H2O_KV_TYPE_Q8, 32, 256, 1, 0.0f, 0},  {H2O_KV_TOVA, H2O_KV_TYPE_K8V4, 32, 256, 0, 0.0f, 0},
                                {H2O_KV_RANDOM, H2O_KV_TYPE_F16, 48, 256, 0, 0.0f, 0},      {H2O_KV_ROCO, H2O_KV_TYPE_F16, 32, 256, 0, 0.5f, 0},
                                {H2O_KV_MEAN_H2O, H2O_KV_TYPE_F16, 32, 256, 1, 0.5f, 1}};
    int n = 0;
    for (const Setting &s : settings) {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.kv_policy = s.policy;
        sp.kv_type = s.kv_type;
        sp.kv_budget = s.budget;
        sp.n_ctx = s.n_ctx;
        sp.position_rolling = s.rolling;
        sp.kv_head_share = s.head_share;
        sp.kv_share_across_layers = s.across_layers;
        if (s.policy == H2O_KV_TOVA) {  // one-shot prompt eviction's settings in the header
            sp.kv_prompt_proxy = 8;
            sp.kv_prompt_random_share = 0.25f;
        }
        h2o_session *session = nullptr;
        if (h2o_session_create(model, &sp, &session) != H2O_OK) die(h2o_last_error());
        const char *pinned = "Lily had a ball.";
        h2o_session_add_text(session, pinned, std::strlen(pinned), H2O_TEXT_PIN);
        if (s.policy != H2O_KV_H2O) {  // that one is also written in the older formats, which had no spans
            const char *span = " Tom was her dog.";
            if (h2o_session_add_span_text(session, 5, 0.125f, span, std::strlen(span), 0) != H2O_OK) die(h2o_session_last_error(session));
        }
        h2o_generate_params gen;
        h2o_generate_params_init(&gen, sizeof gen);
        gen.max_tokens = 40;  // past the budget: slots have been evicted and reused
        gen.stop_at_eos = 0;
        if (h2o_generate(session, " Once", 5, &gen, nullptr, nullptr) != H2O_OK) die(h2o_session_last_error(session));
        size_t bound = 0, size = 0;
        h2o_session_state_size(session, &bound);
        Bytes snapshot(bound);
        if (h2o_session_save_to_buffer(session, snapshot.data(), snapshot.size(), &size) != H2O_OK) die(h2o_session_last_error(session));
        snapshot.resize(size);
        h2o_session_free(session);
        Bytes whole = {0};
        whole.insert(whole.end(), snapshot.begin(), snapshot.end());
        write_file(dir / ("snapshot-" + std::to_string(n)), whole);
        if (s.policy == H2O_KV_H2O) {
            // The same snapshot in formats 1 (library 0.2), 2 (before retention spans), 4
            // (library 0.3), 5 (library 0.4) and 6 (library 0.5), which are still read.
            for (uint32_t version : {1u, 2u, 4u, 5u, 6u}) {
                Bytes older = h2o_test::snapshot_as_version(snapshot, version);
                if (older.empty()) die("cannot write an older snapshot format");
                older.insert(older.begin(), 0);
                write_file(dir / ("snapshot-v" + std::to_string(version) + "-" + std::to_string(n)), older);
            }
        }
        if (s.budget == 32 && s.n_ctx == 256 && s.rolling && s.policy == H2O_KV_SCISSORHANDS) {
            const size_t header = 112;  // lib/session_snapshot.h, version 7
            Bytes state(ZSTD_getFrameContentSize(snapshot.data() + header, snapshot.size() - header));
            if (ZSTD_isError(ZSTD_decompress(state.data(), state.size(), snapshot.data() + header, snapshot.size() - header))) die("zstd");
            state.insert(state.begin(), 1);
            write_file(dir / ("state-" + std::to_string(n)), state);
        }
        ++n;
    }
    h2o_model_free(model);
}

void text_seeds(const fs::path &dir, const fs::path &stories_path) {
    std::ifstream stories(stories_path);
    std::vector<std::string> texts;
    for (std::string line; texts.size() < 8 && std::getline(stories, line);) {
        if (!line.empty()) texts.push_back(line.substr(0, 200));
    }
    // An added text and a prompt (after the NUL), invalid UTF-8, characters split by byte
    // fallback, text that spells special tokens, and whitespace runs.
    texts.push_back(std::string("Lily liked to play.\0She went", 28));
    texts.push_back("caf\xC3\xA9 \xE2\x82\xAC 100 \xF0\x9F\x98\x80 \xE4\xBD\xA0\xE5\xA5\xBD");
    texts.push_back("bad \xC3 end \xFF\xFE \xED\xA0\x80 \xF4\x90\x80\x80");
    texts.push_back("<s></s><unk><0x41> [INST] <<SYS>>");
    texts.push_back("   \n\n\t  two  spaces   ");
    texts.push_back(std::string("\0\0only a prompt", 16));
    const uint8_t controls[][2] = {{0x00, 0x08}, {0x05, 0x4F}, {0x0A, 0x17}, {0x4C, 0x2B}, {0xD3, 0xC8}, {0x9B, 0x66}};
    int n = 0;
    for (const std::string &t : texts) {
        for (const auto &c : controls) {
            Bytes b = {c[0], c[1]};
            b.insert(b.end(), t.begin(), t.end());
            char name[32];
            std::snprintf(name, sizeof(name), "text-%03d", n++);
            write_file(dir / name, b);
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) die("usage: h2o-fuzz-seeds OUT_DIR DEFAULT_SHARED_DIR ($H2O_SHARED_DIR wins when set)");
    const char *env = std::getenv("H2O_SHARED_DIR");
    const fs::path out = argv[1], shared = env && *env ? env : argv[2];
    for (const char *target : {"gguf_load", "text", "snapshot_read"}) {
        fs::remove_all(out / target);
        fs::create_directories(out / target);
    }
    synthetic_seeds(out / "gguf_load");
    const fs::path needed[] = {shared / "models/stories260K.gguf", shared / "vocab/ggml-vocab-llama-spm.gguf",
                               shared / "data/tinystories_val.txt"};
    for (const fs::path &p : needed) {
        if (!fs::exists(p)) {
            text_seeds(out / "text", p);  // the hand-written texts only
            std::printf("H2O-SKIP: %s not found: the corpus holds only synthetic seeds. Put the shared data "
                        "folder beside the checkout or set H2O_SHARED_DIR to it.\n", p.c_str());
            return 0;
        }
    }
    real_model_seeds(out / "gguf_load", shared);
    text_seeds(out / "text", shared / "data/tinystories_val.txt");
    snapshot_seeds(out / "snapshot_read", shared);
    return 0;
}

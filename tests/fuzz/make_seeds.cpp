// Writes the seed corpora of the fuzz targets (run by the build; nothing binary is committed):
//
//   h2o-fuzz-seeds OUT_DIR DEFAULT_SHARED_DIR     ($H2O_SHARED_DIR wins when set)
//
// OUT_DIR/gguf_load: tiny synthetic models of every weight type h2o-synth writes, the real
// stories260K model, and copies of it and of the vocabulary-only GGUF with hostile metadata
// values, truncations and broken headers. OUT_DIR/text: sample stories and awkward UTF-8, each
// behind the two control bytes fuzz_text.cpp reads. OUT_DIR/bpe_tokenizer and
// OUT_DIR/hf_tokenizer: texts, vocabulary descriptions and tokenizer.json files (see those targets). Without the shared data folder only the
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
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <zstd.h>

#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "session_snapshot.h"
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
                          {"q4_0", h2o::TensorType::Q4_0}, {"q5_0", h2o::TensorType::Q5_0}, {"q4_k", h2o::TensorType::Q4_K},
                          {"q5_k", h2o::TensorType::Q5_K}, {"q6_k", h2o::TensorType::Q6_K}};
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
    // The other architectures' tensors and keys: Llama 3's frequency factors (tied), Qwen 2's
    // biases, Qwen 3's per-head norms and a head size of its own (attention.key_length), Phi-3's
    // fused projections, partial rotation and LongRoPE.
    for (const char *arch : {"llama", "qwen2", "qwen3", "phi3"}) {
        h2o::SyntheticModelSpec a;
        a.architecture = arch;
        a.n_embd = 32, a.n_ff = 32, a.n_head = 2, a.n_head_kv = 1, a.n_layer = 1, a.n_vocab = 300, a.n_ctx = 32;
        a.type = h2o::TensorType::F32;
        a.rope_freqs = a.tied_output = a.architecture == "llama";
        a.head_dim = a.architecture == "qwen3" ? 24 : 0;
        a.rope_dims = a.architecture == "phi3" ? 8 : 0;
        a.long_rope_context = a.architecture == "phi3" ? 16 : 0;
        const fs::path out = dir / (std::string("synth-") + arch + "-architecture.gguf");
        const h2o::Status written = h2o::write_synthetic_model(a, out.string());
        if (!written.ok()) die(out.string() + ": " + written.message);
    }
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
        float head_share;       // kv_head_share: the payload then holds every cell's size
        int32_t across_layers;  // kv_share_across_layers: cell sizes sum over the whole cache
    };
    const Setting settings[] = {
        {H2O_KV_SCISSORHANDS, H2O_KV_TYPE_F32, 32, 256, 1, 0.0f, 0}, {H2O_KV_H2O, H2O_KV_TYPE_F32, 32, 256, 1, 0.0f, 0},
        {H2O_KV_SINK_WINDOW, H2O_KV_TYPE_Q8, 32, 256, 1, 0.0f, 0},   {H2O_KV_TOVA, H2O_KV_TYPE_K8V4, 32, 256, 0, 0.0f, 0},
        {H2O_KV_RANDOM, H2O_KV_TYPE_F16, 48, 256, 0, 0.0f, 0},       {H2O_KV_ROCO, H2O_KV_TYPE_F16, 32, 256, 0, 0.5f, 0},
        {H2O_KV_MEAN_H2O, H2O_KV_TYPE_F16, 32, 256, 1, 0.5f, 1},     {H2O_KV_EXPECTED_ATTENTION, H2O_KV_TYPE_F16, 32, 256, 1, 0.0f, 0}};
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
        sp.experimental[H2O_EXP_KV_HEAD_SHARE] = s.head_share;
        sp.experimental[H2O_EXP_KV_SHARE_ACROSS_LAYERS] = s.across_layers;
        if (s.across_layers) sp.experimental[H2O_EXP_KV_REBALANCE_INTERVAL] = 3;  // the default 16 for the other share
        if (s.policy == H2O_KV_TOVA) {                                            // one-shot prompt eviction's settings in the header
            sp.experimental[H2O_EXP_KV_PROMPT_PROXY] = 8;
            sp.experimental[H2O_EXP_KV_PROMPT_RANDOM_SHARE] = 0.25f;
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
            // (library 0.3), 5 (library 0.4), 6 (library 0.5), 7 (library 0.6) and 8 (library
            // 0.7), which are still read.
            for (uint32_t version : {1u, 2u, 4u, 5u, 6u, 7u, 8u}) {
                Bytes older = h2o_test::snapshot_as_version(snapshot, version);
                if (older.empty()) die("cannot write an older snapshot format");
                older.insert(older.begin(), 0);
                write_file(dir / ("snapshot-v" + std::to_string(version) + "-" + std::to_string(n)), older);
            }
        }
        if (s.budget == 32 && s.n_ctx == 256 && s.rolling && s.policy == H2O_KV_SCISSORHANDS) {
            const size_t header = h2o::snapshot_header_size();
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

// Byte-level BPE: texts for each pre-tokenizer (mode byte 0, pre-tokenizer byte 0..5) and
// vocabulary descriptions, valid and hostile (mode byte 1), as fuzz_bpe_tokenizer.cpp reads them.
void bpe_tokenizer_seeds(const fs::path &dir, const fs::path &stories_path) {
    std::vector<std::string> texts;
    std::ifstream stories(stories_path);
    for (std::string line; texts.size() < 4 && std::getline(stories, line);) {
        if (!line.empty()) texts.push_back(line.substr(0, 300));
    }
    texts.push_back(
        "Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
        "apple\xE5\xB7\xA5\xE4\xBD\x9C"
        "1314151\xE5\xA4\xA9~");
    texts.push_back(
        "  \n\n\t\t  CamelCaseWord \xC3\x89TAT \xC3\xA9t\xC3\xA9 e\xCC\x81 \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82 12345678 3.14\r\n");
    texts.push_back("<|endoftext|> <s> I'LL they're 'S \xE3\x80\x80\xE1\xA0\x8E\xC2\x85 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7");
    texts.push_back("bad \xC3 end \xFF\xFE \xED\xA0\x80 \xF4\x90\x80\x80");
    int n = 0;
    for (const std::string &t : texts) {
        for (uint8_t pre = 0; pre < 6; ++pre) {
            Bytes b = {0, pre};
            b.insert(b.end(), t.begin(), t.end());
            char name[32];
            std::snprintf(name, sizeof(name), "text-%03d", n++);
            write_file(dir / name, b);
        }
    }
    // Each: the description, then (after the NUL the target looks for) the text.
    const std::pair<std::string, std::string> descriptions[] = {
        {"pre=llama-bpe\nab\nabc\nbc\n#<|eot_id|>\n@<tool>\n\na b\nab c\nb c", "abc <tool> abcabc <|eot_id|> bc"},
        {"pre=qwen2\n\xC4\xA0t\n\xC4\xA0th\nth\n\n\xC4\xA0 t\n\xC4\xA0t h\nt h", " the thin th 2024"},
        {"pre=gpt-4o\nHe\nHel\nlo\n\nH e\nHe l\nl o", "HelloWorld HELLO h\xC3\xA9llo"},
        {"pre=smollm\n12\n\n1 2", " 123 1212"},
        {"pre=default\n,,\n\n, ,", "a,,b 1234567"},
        {"ab\n\na b\nabc", "ab"},         // a merge without a space
        {"ab\n\na b\na zz", "ab"},        // a part that is not a token
        {"ab\n#cd\n\na b\nc d", "abcd"},  // a merge into a control token
        {"pre=klingon\n", "x"},           // an unknown pre-tokenizer
        {"ab\nab\n", "ab"},               // a token twice
    };
    n = 0;
    for (const auto &[description, text] : descriptions) {
        Bytes b = {1};
        b.insert(b.end(), description.begin(), description.end());
        b.push_back(0);
        b.insert(b.end(), text.begin(), text.end());
        char name[32];
        std::snprintf(name, sizeof(name), "vocabulary-%03d", n++);
        write_file(dir / name, b);
    }
}

// tokenizer.json readings (fuzz_hf_tokenizer.cpp: a size byte, then the files separated by NUL):
// small hand-written ones of each pre-tokenizer kind, hostile ones, and cut-down copies of the
// real Llama 3, Qwen3 and GPT-4o tokenizers (their first 600 tokens and the merges among them).
void hf_tokenizer_seeds(const fs::path &dir, const fs::path &shared) {
    using nlohmann::json;
    int n = 0;
    auto seed = [&](uint8_t size_byte, const std::vector<std::string> &files) {
        Bytes b = {size_byte};
        for (size_t i = 0; i < files.size(); ++i) {
            if (i > 0) b.push_back(0);
            b.insert(b.end(), files[i].begin(), files[i].end());
        }
        char name[32];
        std::snprintf(name, sizeof(name), "tokenizer-%03d", n++);
        write_file(dir / name, b);
    };
    const std::string model =
        R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4}, "merges": ["a b", ["\u0120", "ab"]]})";
    const std::string added =
        R"("added_tokens": [{"id": 5, "content": "<|im_end|>", "special": true}, {"id": 6, "content": "<think>", "special": false}])";
    seed(0, {R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": true}, )" + model + ", " + added + "}",
             R"({"eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": "{{ messages }}"})", R"({"bos_token_id": 5})"});
    seed(201, {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true},
                 {"type": "ByteLevel", "use_regex": true}]}, )" +
               model + "}"});
    seed(0, {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x"},
                 "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}, )" +
             model + "}"});
    seed(0, {std::string(5000, '[')});
    seed(0, {R"({"model": {"type": "BPE", "vocab": {"a": 2000000}}, "pre_tokenizer": {"type": "ByteLevel"}})"});
    seed(0, {R"({"model": {"type": "WordPiece"}})", "[]", "7"});
    for (const char *name : {"llama3", "qwen3", "gpt4o"}) {
        const fs::path folder = shared / "vocab" / name;
        if (!fs::exists(folder / "tokenizer.json")) continue;
        const Bytes raw = read_file(folder / "tokenizer.json");
        json tokenizer = json::parse(raw.begin(), raw.end());
        json &vocab = tokenizer["model"]["vocab"];
        json kept = json::object();
        for (const auto &[text, id] : vocab.items()) {
            if (id.get<int64_t>() < 600) kept[text] = id;
        }
        json merges = json::array();
        for (const json &m : tokenizer["model"]["merges"]) {
            std::string left, right;
            if (m.is_string()) {
                const std::string s = m.get<std::string>();
                const size_t space = s.find(' ', 1);
                left = s.substr(0, space), right = s.substr(space + 1);
            } else {
                left = m[0].get<std::string>(), right = m[1].get<std::string>();
            }
            if (kept.contains(left) && kept.contains(right) && kept.contains(left + right)) merges.push_back(m);
        }
        json added_tokens = json::array();
        for (const json &a : tokenizer["added_tokens"]) {
            if (added_tokens.size() == 8) break;
            json copy = a;
            copy["id"] = 600 + added_tokens.size();
            added_tokens.push_back(copy);
        }
        vocab = kept;
        tokenizer["model"]["merges"] = merges;
        tokenizer["added_tokens"] = added_tokens;
        std::string config = "{}";
        if (fs::exists(folder / "tokenizer_config.json")) {
            const Bytes c = read_file(folder / "tokenizer_config.json");
            json parsed = json::parse(c.begin(), c.end());
            parsed.erase("added_tokens_decoder");
            config = parsed.dump();
        }
        seed(0, {tokenizer.dump(), config});
    }
}

// h2o-server's inputs (fuzz_chat_request.cpp): byte 0 below 128 and a request body, 128 and the
// head of a conversation file, or 192 and a line of a request trace.
void chat_request_seeds(const fs::path &dir) {
    const char *const requests[] = {
        R"({"model":"m","messages":[{"role":"user","content":"Hello"}]})",
        R"({"model":"m","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]},)"
        R"({"role":"assistant","content":null},{"role":"user","content":"Go on"}],"max_tokens":12,"temperature":0.5,"top_p":0.9,)"
        R"("seed":-3,"stop":["\n\n","END"],"stream":true,"stream_options":{"include_usage":true},"conversation_id":"c-1"})",
        R"({"model":"m","messages":[{"role":"tool","content":"x"}],"n":2,"tools":[{"type":"function"}]})",
        R"({"model":"m","messages":[[[[[[[[]]]]]]]]})",
        R"({"model":"m","messages":[{"role":"user","content":"\u00e9\ud83d\ude00 é"}]})",
    };
    int index = 0;
    for (const char *request : requests) {
        Bytes bytes{0};
        bytes.insert(bytes.end(), request, request + std::strlen(request));
        write_file(dir / ("request_" + std::to_string(index++)), bytes);
    }
    const std::string head = std::string("h2o-server conversation 1\n{\"history\":\"") + std::string(64, 'a') +
                             "\",\"id\":\"c-2\",\"messages\":3}\nSNAPSHOT BYTES";
    Bytes bytes{128};
    bytes.insert(bytes.end(), head.begin(), head.end());
    write_file(dir / "conversation_file", bytes);
    const std::string with_messages = std::string("h2o-server conversation 1\n{\"history\":\"") + std::string(64, 'a') +
                                      "\",\"id\":\"c-3\",\"messages\":1,\"transcript_bytes\":32}\n" +
                                      R"([{"role":"user","content":"Hi"}])" + "SNAPSHOT";
    Bytes file_bytes{128};
    file_bytes.insert(file_bytes.end(), with_messages.begin(), with_messages.end());
    write_file(dir / "conversation_file_with_messages", file_bytes);
    const std::string line = R"({"t": 12.5, "conversation": "chat-1", "named": true, "system": "sys-0", "system_tokens": 300,)"
                             R"( "history_tokens": 420, "new_tokens": 40, "reply_tokens": 120})";
    Bytes trace{192};
    trace.insert(trace.end(), line.begin(), line.end());
    write_file(dir / "trace_line", trace);
}

}  // namespace

// Grammars and schemas (fuzz_grammar.cpp): byte 0 even for GBNF, odd for a JSON schema.
void grammar_seeds(const fs::path &dir) {
    const char *const grammars[] = {
        // One literal in parentheses: clang warns of adjacent literals in an array otherwise.
        ("root ::= \"{\" ws (pair (\",\" ws pair)*)? \"}\"\npair ::= \"\\\"\" [a-z]+ \"\\\":\" ws (\"true\" | [0-9]{1,3})\nws ::= [ "
         "\\n]{0,2}\n"),
        "root ::= (\"a\" | \"b\"* | [^\\x00-\\x1F]?){2,5} . # comment\n",
        "root ::= [\\u00e9\\u20ac] \"!\"\n",
        "root ::= x\nx ::= \"(\" x? \")\"\n",
    };
    const char *const schemas[] = {
        R"({"type":"object","properties":{"a":{"type":"string","maxLength":3},"b":{"enum":[1,"x",null]}},"required":["a"]})",
        R"({"$defs":{"n":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}},"$ref":"#/$defs/n"})",
        R"({"anyOf":[{"type":"integer"},{"type":"string","format":"date"},{"const":{"k":[true]}}]})",
    };
    int index = 0;
    for (const char *g : grammars) {
        Bytes bytes{0};
        bytes.insert(bytes.end(), g, g + std::strlen(g));
        write_file(dir / ("grammar_" + std::to_string(index++)), bytes);
    }
    for (const char *s : schemas) {
        Bytes bytes{1};
        bytes.insert(bytes.end(), s, s + std::strlen(s));
        write_file(dir / ("schema_" + std::to_string(index++)), bytes);
    }
}

// Tool calls (fuzz_tool_calls.cpp): byte 0 picks tools (0), messages (1) or a reply (2).
void tool_call_seeds(const fs::path &dir) {
    const std::pair<uint8_t, const char *> seeds[] = {
        {0, R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city":
            {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now"}}])"},
        {1, R"([{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "u"}]}, {"role": "assistant",
            "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": \"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}])"},
        {2,
         "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", "
         "\"arguments\": {}}\n</tool_call>"},
        {2, "{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\"}]}}"},
        {2, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"k\": null}}]}"},
        {2, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"x\"}, \"id\": \"a1B2c3D4e\"}]"},
    };
    int index = 0;
    for (const auto &[part, text] : seeds) {
        Bytes bytes{part};
        bytes.insert(bytes.end(), text, text + std::strlen(text));
        write_file(dir / ("tool_calls_" + std::to_string(index++)), bytes);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) die("usage: h2o-fuzz-seeds OUT_DIR DEFAULT_SHARED_DIR ($H2O_SHARED_DIR wins when set)");
    const char *env = std::getenv("H2O_SHARED_DIR");
    const fs::path out = argv[1], shared = env && *env ? env : argv[2];
    for (const char *target :
         {"gguf_load", "text", "snapshot_read", "bpe_tokenizer", "hf_tokenizer", "chat_request", "grammar", "tool_calls"}) {
        fs::remove_all(out / target);
        fs::create_directories(out / target);
    }
    synthetic_seeds(out / "gguf_load");
    chat_request_seeds(out / "chat_request");
    grammar_seeds(out / "grammar");
    tool_call_seeds(out / "tool_calls");
    bpe_tokenizer_seeds(out / "bpe_tokenizer", shared / "data/tinystories_val.txt");  // stories when present
    hf_tokenizer_seeds(out / "hf_tokenizer", shared);                                 // real ones when present
    const fs::path needed[] = {shared / "models/stories260K.gguf", shared / "vocab/ggml-vocab-llama-spm.gguf",
                               shared / "data/tinystories_val.txt"};
    for (const fs::path &p : needed) {
        if (!fs::exists(p)) {
            text_seeds(out / "text", p);  // the hand-written texts only
            std::printf(
                "H2O-SKIP: %s not found: the corpus holds only synthetic seeds. Put the shared data "
                "folder beside the checkout or set H2O_SHARED_DIR to it.\n",
                p.c_str());
            return 0;
        }
    }
    real_model_seeds(out / "gguf_load", shared);
    text_seeds(out / "text", shared / "data/tinystories_val.txt");
    snapshot_seeds(out / "snapshot_read", shared);
    return 0;
}

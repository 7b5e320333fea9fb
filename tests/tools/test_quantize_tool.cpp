// h2o-quantize's engine (tools/quantize_model.*): every preset on a synthetic model whose sizes
// fit the K-quants and on the real stories260K (whose 64- and 172-wide rows do not), checking the
// types and fallbacks written, that metadata survives unchanged, that the result loads and
// generates, and that its logits stay close to the F32 model's. Also: malformed K-quant tensors
// are rejected by the GGUF reader with H2O_ERR_MODEL_FORMAT.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gguf.h"
#include "h2o/h2o.h"
#include "quant.h"
#include "quantize_model.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace h2o;

namespace {

const QuantPreset kPresets[] = {QuantPreset::F16,  QuantPreset::Q8_0, QuantPreset::Q4_0,  QuantPreset::Q4_K,
                                QuantPreset::Q5_K, QuantPreset::Q6_K, QuantPreset::Q4_K_M};

std::unique_ptr<GgufFile> open_gguf(const std::string &path) {
    std::unique_ptr<GgufFile> f;
    const Status st = GgufFile::open(path, &f);
    INFO(st.message);
    REQUIRE(st.ok());
    return f;
}

size_t element_size(GgufType t) {
    switch (t) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::BOOL:
            return 1;
        case GgufType::UINT16:
        case GgufType::INT16:
            return 2;
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::FLOAT32:
            return 4;
        default:
            return 8;
    }
}

bool same_value(const GgufValue &a, const GgufValue &b) {
    if (a.type != b.type) return false;
    if (a.type == GgufType::STRING) return a.str == b.str;
    if (a.type != GgufType::ARRAY) {
        return a.i64 == b.i64 && a.u64 == b.u64 && std::memcmp(&a.f64, &b.f64, sizeof a.f64) == 0;
    }
    if (a.array_type != b.array_type || a.array_size != b.array_size) return false;
    if (a.array_type == GgufType::STRING) return a.array_strings == b.array_strings;
    return a.array_size == 0 || std::memcmp(a.array_data, b.array_data, a.array_size * element_size(a.array_type)) == 0;
}

// Metadata of out equals that of in, key by key and in order, except general.file_type.
void check_metadata_copied(const GgufFile &in, const GgufFile &out, uint32_t file_type) {
    std::vector<const GgufKeyValue *> a, b;
    for (const GgufKeyValue &kv : in.metadata()) {
        if (kv.key != "general.file_type") a.push_back(&kv);
    }
    for (const GgufKeyValue &kv : out.metadata()) {
        if (kv.key != "general.file_type") b.push_back(&kv);
    }
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(std::string(a[i]->key));
        CHECK(a[i]->key == b[i]->key);
        CHECK(same_value(a[i]->value, b[i]->value));
    }
    uint32_t ft = 0;
    REQUIRE(out.get_u32("general.file_type", &ft).ok());
    CHECK(ft == file_type);
    CHECK(out.alignment() == in.alignment());
}

using h2o_test::ApiSession;
using h2o_test::append_text;

void load(const std::string &path, ApiSession *out) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU;
    sp.n_threads = 2;
    sp.n_ctx = 64;
    REQUIRE_MESSAGE(out->open(path, sp), h2o_last_error());
}

// Logits after a fixed token sequence.
std::vector<float> logits_after(const std::string &path, const std::vector<int32_t> &tokens) {
    ApiSession m;
    load(path, &m);
    h2o_model_info info{};
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(m.model, &info) == H2O_OK);
    REQUIRE(h2o_session_decode(m.session, tokens.data(), tokens.size()) == H2O_OK);
    std::vector<float> logits(info.n_vocab);
    REQUIRE(h2o_session_get_logits(m.session, logits.data(), logits.size()) == H2O_OK);
    return logits;
}

double relative_distance(const std::vector<float> &a, const std::vector<float> &ref) {
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        d += (static_cast<double>(a[i]) - ref[i]) * (a[i] - ref[i]);
        r += static_cast<double>(ref[i]) * ref[i];
    }
    return std::sqrt(d / r);
}

// Greedy generation through the public API; returns the number of tokens generated.
uint32_t generate(const std::string &path, const char *prompt) {
    ApiSession m;
    load(path, &m);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 12;
    gen.temperature = 0.0f;
    gen.stop_at_eos = 0;
    std::string text;
    const h2o_status st = h2o_generate(m.session, prompt, std::strlen(prompt), &gen, append_text, &text);
    INFO(h2o_session_last_error(m.session));
    REQUIRE(st == H2O_OK);
    h2o_generate_stats stats{};
    stats.struct_size = sizeof stats;
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    return stats.n_generated_tokens;
}

QuantizeReport quantize(const std::string &in, const std::string &out, QuantPreset preset) {
    QuantizeOptions options;
    options.preset = preset;
    options.n_threads = 2;
    QuantizeReport report;
    const Status st = quantize_model(in, out, options, &report);
    INFO(st.message);
    REQUIRE(st.ok());
    return report;
}

// Logit tolerances, relative RMS distance from the F32 model's logits. The weights' own relative
// RMS errors are ~3e-4 (F16), 5e-3 (Q8_0), 0.017 (Q6_K), 0.035 (Q5_K), 0.070 (Q4_K), 0.086 (Q4_0);
// each matrix adds its error to the activations it produces and the errors of the layers add up
// roughly independently, so the logits move by about as much as one matrix's weights (measured:
// 1.2 to 1.4 times, e.g. 0.0087 for Q8_0, 0.023 Q6_K, 0.048 Q5_K, 0.091 Q4_K, 0.074 Q4_K_M,
// 0.113 Q4_0 on the synthetic model; similar on stories260K). The bounds are about three times
// the measured drift: a wrong kernel or layout gives distances near 1.
double logit_tolerance(QuantPreset preset) {
    switch (preset) {
        case QuantPreset::F16:
            return 0.001;
        case QuantPreset::Q8_0:
            return 0.03;
        case QuantPreset::Q6_K:
            return 0.07;
        case QuantPreset::Q5_K:
            return 0.15;
        default:
            return 0.35;  // 4-bit types
    }
}

}  // namespace

TEST_CASE("quantize tool: presets, file types and fallbacks") {
    QuantPreset p;
    CHECK(parse_quant_preset("Q4_K_M", &p));
    CHECK(p == QuantPreset::Q4_K_M);
    CHECK_FALSE(parse_quant_preset("q4_k_m", &p));
    CHECK_FALSE(parse_quant_preset("Q4_1", &p));
    CHECK(llama_file_type(QuantPreset::F16) == 1);
    CHECK(llama_file_type(QuantPreset::Q4_0) == 2);
    CHECK(llama_file_type(QuantPreset::Q8_0) == 7);
    CHECK(llama_file_type(QuantPreset::Q4_K) == 14);
    CHECK(llama_file_type(QuantPreset::Q4_K_M) == 15);
    CHECK(llama_file_type(QuantPreset::Q5_K) == 16);
    CHECK(llama_file_type(QuantPreset::Q6_K) == 18);

    CHECK(fallback_type(TensorType::Q4_K, 768) == TensorType::Q4_K);
    CHECK(fallback_type(TensorType::Q4_K, 64) == TensorType::Q4_0);
    CHECK(fallback_type(TensorType::Q5_K, 64) == TensorType::Q8_0);
    CHECK(fallback_type(TensorType::Q6_K, 64) == TensorType::Q8_0);
    CHECK(fallback_type(TensorType::Q6_K, 172) == TensorType::F16);
    CHECK(fallback_type(TensorType::Q4_0, 172) == TensorType::F16);
    CHECK(fallback_type(TensorType::F16, 37) == TensorType::F16);

    // Q4_K_M with 32 layers: llama.cpp's use_more_bits gives layers 0-3, 28-31 and every third
    // from 6 (6, 9, ..., 27) to attn_v and ffn_down.
    auto q4km = [](const char *name, bool tied = false) {
        return preset_tensor_type(QuantPreset::Q4_K_M, name, 2, 32, tied, TensorType::F32);
    };
    CHECK(q4km("output.weight") == TensorType::Q6_K);
    CHECK(q4km("token_embd.weight") == TensorType::Q4_K);
    CHECK(q4km("token_embd.weight", true) == TensorType::Q6_K);
    CHECK(q4km("blk.0.attn_v.weight") == TensorType::Q6_K);
    CHECK(q4km("blk.3.ffn_down.weight") == TensorType::Q6_K);
    CHECK(q4km("blk.4.attn_v.weight") == TensorType::Q4_K);
    CHECK(q4km("blk.5.attn_v.weight") == TensorType::Q4_K);
    CHECK(q4km("blk.6.attn_v.weight") == TensorType::Q6_K);
    CHECK(q4km("blk.7.ffn_down.weight") == TensorType::Q4_K);
    CHECK(q4km("blk.27.ffn_down.weight") == TensorType::Q6_K);
    CHECK(q4km("blk.28.attn_v.weight") == TensorType::Q6_K);
    CHECK(q4km("blk.6.attn_q.weight") == TensorType::Q4_K);
    CHECK(q4km("blk.6.ffn_up.weight") == TensorType::Q4_K);
    CHECK(preset_tensor_type(QuantPreset::Q4_K_M, "blk.0.attn_norm.weight", 1, 32, false, TensorType::F32) == TensorType::F32);
    CHECK(preset_tensor_type(QuantPreset::Q6_K, "token_embd.weight", 2, 32, false, TensorType::F32) == TensorType::Q6_K);
}

TEST_CASE("quantize tool: a synthetic model to every preset") {
    SyntheticModelSpec spec;
    spec.n_embd = 256;
    spec.n_layer = 3;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ff = 512;
    spec.n_vocab = 320;
    spec.n_ctx = 64;
    spec.type = TensorType::F32;
    const std::string f32 = h2o_test::temp_path("quant_synth_f32.gguf");
    REQUIRE(write_synthetic_model(spec, f32).ok());
    const std::vector<int32_t> tokens = {1, 50, 300, 7, 99, 260, 13, 42};
    const std::vector<float> ref = logits_after(f32, tokens);
    auto in = open_gguf(f32);

    for (QuantPreset preset : kPresets) {
        CAPTURE(quant_preset_name(preset));
        const std::string out = h2o_test::temp_path(std::string("quant_synth_") + quant_preset_name(preset) + ".gguf");
        const QuantizeReport report = quantize(f32, out, preset);
        auto q = open_gguf(out);
        check_metadata_copied(*in, *q, llama_file_type(preset));

        // Same tensors in the same order and shapes; types as the preset says, no fallbacks
        // (every row length here is a multiple of 256).
        REQUIRE(q->tensors().size() == in->tensors().size());
        REQUIRE(report.tensors.size() == in->tensors().size());
        for (size_t i = 0; i < in->tensors().size(); ++i) {
            const GgufTensor &a = in->tensors()[i], &b = q->tensors()[i];
            CAPTURE(std::string(a.name));
            CHECK(a.name == b.name);
            CHECK(a.n_dims == b.n_dims);
            for (int d = 0; d < 4; ++d) CHECK(a.ne[d] == b.ne[d]);
            TensorType want = TensorType::F32;
            if (a.n_dims >= 2) {
                const std::string name(a.name);
                const int layer = name.rfind("blk.", 0) == 0 ? std::stoi(name.substr(4)) : -1;
                const bool more_bits = layer == 2;  // llama.cpp's use_more_bits(i, 3) holds for layer 2 only
                if (preset != QuantPreset::Q4_K_M) {
                    want = preset == QuantPreset::F16    ? TensorType::F16
                           : preset == QuantPreset::Q8_0 ? TensorType::Q8_0
                           : preset == QuantPreset::Q4_0 ? TensorType::Q4_0
                           : preset == QuantPreset::Q4_K ? TensorType::Q4_K
                           : preset == QuantPreset::Q5_K ? TensorType::Q5_K
                                                         : TensorType::Q6_K;
                } else if (name == "output.weight" ||
                           (more_bits && (name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos))) {
                    want = TensorType::Q6_K;
                } else {
                    want = TensorType::Q4_K;
                }
            }
            CHECK(b.type == want);
            CHECK_FALSE(report.tensors[i].fell_back());
            if (a.n_dims == 1) CHECK(std::memcmp(a.data, b.data, a.n_bytes) == 0);  // norms copied
        }
        CHECK(report.tensor_bytes_out < report.tensor_bytes_in);

        // It loads, generates, and its logits stay near the F32 model's.
        const std::vector<float> logits = logits_after(out, tokens);
        const double dist = relative_distance(logits, ref);
        INFO("relative logit distance " << dist);
        CHECK(dist < logit_tolerance(preset));
        CHECK(generate(out, "hello") == 12);
    }
}

TEST_CASE("quantize tool: the real stories260K to every preset, with fallbacks") {
    H2O_SHARED_FILE_OR_SKIP(model, "models/stories260K.gguf");
    auto in = open_gguf(model);
    const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 442, 289, 262, 280, 400};
    const std::vector<float> ref = logits_after(model, tokens);

    for (QuantPreset preset : kPresets) {
        CAPTURE(quant_preset_name(preset));
        const std::string out = h2o_test::temp_path(std::string("quant_260k_") + quant_preset_name(preset) + ".gguf");
        const QuantizeReport report = quantize(model, out, preset);
        auto q = open_gguf(out);
        check_metadata_copied(*in, *q, llama_file_type(preset));
        REQUIRE(q->tensors().size() == in->tensors().size());
        for (size_t i = 0; i < in->tensors().size(); ++i) {
            const GgufTensor &a = in->tensors()[i], &b = q->tensors()[i];
            const TensorQuantReport &r = report.tensors[i];
            CAPTURE(std::string(a.name));
            CHECK(a.name == b.name);
            CHECK(b.type == r.type_out);
            if (a.n_dims == 1) {
                CHECK(b.type == TensorType::F32);
                continue;
            }
            // Rows are 64 wide (a multiple of 32, not of 256) except ffn_down's 172.
            if (a.ne[0] == 172) {
                CHECK(b.type == TensorType::F16);
                CHECK(r.fell_back() == (preset != QuantPreset::F16));
            } else if (r.wanted == TensorType::Q4_K) {
                CHECK(b.type == TensorType::Q4_0);
                CHECK(r.fell_back());
            } else if (r.wanted == TensorType::Q5_K || r.wanted == TensorType::Q6_K) {
                CHECK(b.type == TensorType::Q8_0);
                CHECK(r.fell_back());
            } else {
                CHECK(b.type == r.wanted);
                CHECK_FALSE(r.fell_back());
            }
        }
        const std::vector<float> logits = logits_after(out, tokens);
        const double dist = relative_distance(logits, ref);
        INFO("relative logit distance " << dist);
        CHECK(dist < logit_tolerance(preset));
        CHECK(generate(out, "Once upon a time") == 12);
    }
}

TEST_CASE("quantize tool: bad arguments and inputs are errors, and no output is left behind") {
    QuantizeOptions options;
    QuantizeReport report;
    const std::string out = h2o_test::temp_path("quant_never_written.gguf");
    std::remove(out.c_str());
    Status st = quantize_model(h2o_test::temp_path("quant_no_such_input.gguf"), out, options, &report);
    CHECK(st.code == H2O_ERR_IO);
    CHECK_FALSE(std::ifstream(out).good());

    const std::string junk = h2o_test::temp_path("quant_junk.gguf");
    std::ofstream(junk, std::ios::binary) << std::string("GGUF\x03\x00\x00\x00\x01", 9);  // truncated header
    st = quantize_model(junk, out, options, &report);
    CHECK(st.code == H2O_ERR_MODEL_FORMAT);
    CHECK(st.message.find(junk) != std::string::npos);
    CHECK_FALSE(std::ifstream(out).good());

    st = quantize_model(junk, junk, options, &report);
    CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("quantize tool: an output folder that does not exist fails before any tensor is converted") {
    const std::string in = h2o_test::temp_path("quant_folder_check_in.gguf");
    SyntheticModelSpec spec;
    spec.n_embd = 64;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 2;
    spec.n_ff = 128;
    spec.n_vocab = 300;
    spec.type = TensorType::F32;
    REQUIRE(write_synthetic_model(spec, in).ok());
    QuantizeOptions options;
    options.preset = QuantPreset::Q8_0;
    size_t converted = 0;
    options.on_tensor = [&converted](const TensorQuantReport &) { ++converted; };
    QuantizeReport report;
    const std::string out = h2o_test::temp_path("quant_no_such_folder") + "/out.gguf";
    const Status st = quantize_model(in, out, options, &report);
    CHECK(st.code == H2O_ERR_IO);
    CHECK(st.message.find("does not exist") != std::string::npos);
    CHECK(converted == 0);
    std::remove(in.c_str());
}

namespace {

// A GGUF with one Q4_K tensor of 2 rows of 256 (288 bytes of data, ending the file).
std::vector<uint8_t> q4k_file() {
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(512);
    for (float &v : x) v = nd(rng);
    std::vector<uint8_t> data(row_bytes(TensorType::Q4_K, 256) * 2);
    REQUIRE(quantize_row(TensorType::Q4_K, x.data(), data.data(), 512));
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_tensor("q.weight", TensorType::Q4_K, {256, 2}, data);
    REQUIRE(w.status().ok());
    return w.serialize();
}

Status parse_bytes(const std::vector<uint8_t> &bytes) {
    std::unique_ptr<GgufFile> f;
    return GgufFile::parse(bytes.data(), bytes.size(), &f);
}

// Offset of the first dimension of the named tensor's info: after its u64 length, its name and
// the u32 n_dims.
size_t dims_offset(const std::vector<uint8_t> &bytes, const std::string &name) {
    const auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
    REQUIRE(it != bytes.end());
    return static_cast<size_t>(it - bytes.begin()) + name.size() + 4;
}

void patch_u64(std::vector<uint8_t> *bytes, size_t offset, uint64_t v) { std::memcpy(bytes->data() + offset, &v, 8); }

}  // namespace

TEST_CASE("quantize tool: malformed K-quant tensors are H2O_ERR_MODEL_FORMAT") {
    const std::vector<uint8_t> good = q4k_file();
    REQUIRE(parse_bytes(good).ok());

    // Data shorter than the shape needs (the file ends early).
    std::vector<uint8_t> bytes(good.begin(), good.end() - 100);
    Status st = parse_bytes(bytes);
    CHECK(st.code == H2O_ERR_MODEL_FORMAT);
    CHECK(st.message.find("tensor 'q.weight': data") != std::string::npos);
    CHECK(st.message.find("extends past end of file") != std::string::npos);

    // A shape that needs more data than there is: 3 rows of 144 bytes in a file holding 2.
    bytes = good;
    patch_u64(&bytes, dims_offset(bytes, "q.weight") + 8, 3);
    st = parse_bytes(bytes);
    CHECK(st.code == H2O_ERR_MODEL_FORMAT);
    CHECK(st.message.find("extends past end of file") != std::string::npos);

    // A row length that is not a multiple of the 256-element super-block.
    bytes = good;
    patch_u64(&bytes, dims_offset(bytes, "q.weight"), 128);
    st = parse_bytes(bytes);
    CHECK(st.code == H2O_ERR_MODEL_FORMAT);
    CHECK(st.message.find("row length ne[0] = 128 is not a multiple of the Q4_K block size 256") != std::string::npos);

    // The writer rejects such data before it reaches a file.
    GgufWriter w;
    w.add_tensor("q.weight", TensorType::Q6_K, {256, 2}, std::vector<uint8_t>(419));
    CHECK(w.status().code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(w.status().message.find("data has 419 bytes, its shape needs 420") != std::string::npos);

    // Through the public loader: a Q4_K model whose attn_q rows claim 128 columns.
    SyntheticModelSpec spec;
    spec.n_embd = 256;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 2;
    spec.n_ff = 256;
    spec.n_vocab = 300;
    spec.n_ctx = 32;
    spec.type = TensorType::Q4_K;
    const std::string path = h2o_test::temp_path("quant_bad_q4k.gguf");
    REQUIRE(write_synthetic_model(spec, path).ok());
    std::vector<uint8_t> model_bytes;
    {
        std::ifstream f(path, std::ios::binary);
        model_bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    {
        ApiSession ok;
        load(path, &ok);  // the unpatched file is fine
    }
    patch_u64(&model_bytes, dims_offset(model_bytes, "blk.0.attn_q.weight"), 128);
    {
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char *>(model_bytes.data()), static_cast<std::streamsize>(model_bytes.size()));
    }
    h2o_model *model = nullptr;
    CHECK(h2o_model_load(path.c_str(), nullptr, &model) == H2O_ERR_MODEL_FORMAT);
    CHECK(model == nullptr);
    CHECK(std::string(h2o_last_error()).find("blk.0.attn_q.weight") != std::string::npos);
}

#include "quantize_model.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <thread>

#include "gguf.h"
#include "quant.h"

namespace h2o {

namespace {

struct PresetInfo {
    QuantPreset preset;
    const char *name;
    TensorType type;     // the base type
    uint32_t file_type;  // llama.cpp's LLAMA_FTYPE
};

constexpr PresetInfo kPresets[] = {
    {QuantPreset::F16, "F16", TensorType::F16, 1},         {QuantPreset::Q8_0, "Q8_0", TensorType::Q8_0, 7},
    {QuantPreset::Q4_0, "Q4_0", TensorType::Q4_0, 2},      {QuantPreset::Q4_K, "Q4_K", TensorType::Q4_K, 14},
    {QuantPreset::Q5_K, "Q5_K", TensorType::Q5_K, 16},     {QuantPreset::Q6_K, "Q6_K", TensorType::Q6_K, 18},
    {QuantPreset::Q4_K_M, "Q4_K_M", TensorType::Q4_K, 15},
};

const PresetInfo &info(QuantPreset preset) {
    for (const PresetInfo &p : kPresets) {
        if (p.preset == preset) return p;
    }
    return kPresets[0];  // unreachable: every enumerator is listed
}

// The N of a "blk.N." tensor name, or -1.
int layer_of(std::string_view name) {
    if (name.substr(0, 4) != "blk.") return -1;
    int n = 0;
    size_t i = 4;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
        if (n > 100000) return -1;
        n = n * 10 + (name[i] - '0');
    }
    return i > 4 && i < name.size() && name[i] == '.' ? n : -1;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// llama.cpp's choice of the layers that get more bits in the _M mixes: the first and last eighth,
// and every third layer in between.
bool use_more_bits(int layer, int n_layer) { return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2; }

// Converts rows [r0, r1) of one tensor; sums of squared errors and of squared inputs go to *err
// and *ref. in/out point at the first row of the tensor.
void convert_rows(TensorType type_in, const uint8_t *in, TensorType type_out, uint8_t *out, int64_t cols, int64_t r0, int64_t r1,
                  double *err, double *ref) {
    const size_t in_row = row_bytes(type_in, cols), out_row = row_bytes(type_out, cols);
    std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(cols));
    double e = 0.0, s = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
        dequantize_row(type_in, in + static_cast<size_t>(r) * in_row, x.data(), cols);
        quantize_row(type_out, x.data(), out + static_cast<size_t>(r) * out_row, cols);
        dequantize_row(type_out, out + static_cast<size_t>(r) * out_row, y.data(), cols);
        for (int64_t i = 0; i < cols; ++i) {
            const double d = static_cast<double>(y[i]) - x[i];
            e += d * d;
            s += static_cast<double>(x[i]) * x[i];
        }
    }
    *err = e;
    *ref = s;
}

bool same_file(const std::string &a, const std::string &b) {
    std::error_code ec;
    if (std::filesystem::equivalent(a, b, ec)) return true;
    // The output need not exist yet; compare the normalized paths then.
    const auto ca = std::filesystem::weakly_canonical(a, ec);
    if (ec) return false;
    const auto cb = std::filesystem::weakly_canonical(b, ec);
    return !ec && ca == cb;
}

// The folder the output goes to must exist and take new files: checked before any tensor is
// converted, so that a mistyped path fails at once rather than after the whole model.
Status check_output_folder(const std::string &out_path) {
    const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
    const std::filesystem::path folder = parent.empty() ? std::filesystem::path(".") : parent;
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::status(folder, ec);
    if (!std::filesystem::exists(status)) {
        return make_error(H2O_ERR_IO, "cannot write " + out_path + ": the folder " + folder.string() + " does not exist");
    }
    if (!std::filesystem::is_directory(status)) {
        return make_error(H2O_ERR_IO, "cannot write " + out_path + ": " + folder.string() + " is not a folder");
    }
    if (access(folder.c_str(), W_OK) != 0) {
        return make_error(
            H2O_ERR_IO, "cannot write " + out_path + ": the folder " + folder.string() + " is not writable (" + std::strerror(errno) + ")");
    }
    return Status::Ok();
}

}  // namespace

bool parse_quant_preset(std::string_view name, QuantPreset *out) {
    for (const PresetInfo &p : kPresets) {
        if (name == p.name) {
            *out = p.preset;
            return true;
        }
    }
    return false;
}

const char *quant_preset_name(QuantPreset preset) { return info(preset).name; }

const char *quant_preset_names() { return "F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, Q4_K_M"; }

uint32_t llama_file_type(QuantPreset preset) { return info(preset).file_type; }

TensorType preset_tensor_type(QuantPreset preset, std::string_view name, uint32_t n_dims, int n_layer, bool tied_output,
                              TensorType type_in) {
    if (n_dims < 2) return type_in;  // norms (and any other vector) stay as they are
    const TensorType base = info(preset).type;
    if (preset != QuantPreset::Q4_K_M) return base;
    if (name == "output.weight" || (tied_output && name == "token_embd.weight")) return TensorType::Q6_K;
    const int layer = layer_of(name);
    if (layer >= 0 && (ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight")) && use_more_bits(layer, n_layer)) {
        return TensorType::Q6_K;
    }
    return base;
}

TensorType fallback_type(TensorType wanted, int64_t row_length) {
    if (row_length % traits(wanted).block_elements == 0) return wanted;
    TensorType next = TensorType::F16;
    if (wanted == TensorType::Q4_K)
        next = TensorType::Q4_0;
    else if (wanted == TensorType::Q5_K || wanted == TensorType::Q6_K)
        next = TensorType::Q8_0;
    return row_length % traits(next).block_elements == 0 ? next : TensorType::F16;
}

Status quantize_model(const std::string &in_path, const std::string &out_path, const QuantizeOptions &options, QuantizeReport *report) {
    *report = QuantizeReport{};
    if (same_file(in_path, out_path)) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "input and output are the same file: " + out_path);
    }
    std::unique_ptr<GgufFile> file;
    H2O_TRY(GgufFile::open(in_path, &file));
    H2O_TRY(check_output_folder(out_path));

    int n_layer = 0;
    bool tied_output = true;
    for (const GgufTensor &t : file->tensors()) {
        n_layer = std::max(n_layer, layer_of(t.name) + 1);
        if (t.name == "output.weight") tied_output = false;
    }
    const uint32_t file_type = llama_file_type(options.preset);
    report->file_type = file_type;
    report->file_bytes_in = file->file_size();

    // general.alignment, when present, is copied like any key and sets the writer's alignment at
    // the key's original place; without it both files use the default.
    GgufWriter writer;
    bool wrote_file_type = false;
    for (const GgufKeyValue &kv : file->metadata()) {
        if (kv.key == "general.file_type") {
            writer.add_u32("general.file_type", file_type);
            wrote_file_type = true;
        } else {
            writer.add_copy(kv);
        }
    }
    if (!wrote_file_type) writer.add_u32("general.file_type", file_type);

    const int n_threads = options.n_threads > 0 ? options.n_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (const GgufTensor &t : file->tensors()) {
        TensorQuantReport r;
        r.name = std::string(t.name);
        r.shape.assign(t.ne, t.ne + t.n_dims);
        r.type_in = t.type;
        r.bytes_in = t.n_bytes;
        const bool convertible = quant_supported(t.type) && t.type != TensorType::I32;
        r.wanted = convertible ? preset_tensor_type(options.preset, t.name, t.n_dims, n_layer, tied_output, t.type) : t.type;
        r.type_out = fallback_type(r.wanted, t.ne[0]);
        if (t.n_dims >= 2 && !convertible) {
            return make_error(H2O_ERR_UNSUPPORTED, "tensor '" + r.name + "' has type " + type_name(t.type) + ", which cannot be converted");
        }

        std::vector<uint8_t> data;
        if (r.type_out == t.type) {
            r.copied = true;
            data.assign(t.data, t.data + t.n_bytes);
        } else {
            const int64_t rows = t.n_rows(), cols = t.ne[0];
            data.resize(row_bytes(r.type_out, cols) * static_cast<size_t>(rows));
            // Rows are independent: split them over threads, each with its own error sums.
            const int workers = static_cast<int>(std::min<int64_t>(n_threads, std::max<int64_t>(1, rows / 16)));
            std::vector<double> err(workers), ref(workers);
            std::vector<std::thread> threads;
            for (int w = 0; w < workers; ++w) {
                const int64_t r0 = rows * w / workers, r1 = rows * (w + 1) / workers;
                threads.emplace_back(convert_rows, t.type, t.data, r.type_out, data.data(), cols, r0, r1, &err[w], &ref[w]);
            }
            for (std::thread &th : threads) th.join();
            double e = 0.0, s = 0.0;
            for (int w = 0; w < workers; ++w) {
                e += err[w];
                s += ref[w];
            }
            r.rel_rms_error = s > 0.0 ? std::sqrt(e / s) : (e > 0.0 ? INFINITY : 0.0);
        }
        r.bytes_out = data.size();
        report->tensor_bytes_in += r.bytes_in;
        report->tensor_bytes_out += r.bytes_out;
        writer.add_tensor(r.name, r.type_out, r.shape, std::move(data));
        if (options.on_tensor) options.on_tensor(r);
        report->tensors.push_back(std::move(r));
    }

    H2O_TRY(writer.write(out_path));
    std::error_code ec;
    report->file_bytes_out = std::filesystem::file_size(out_path, ec);
    return Status::Ok();
}

}  // namespace h2o

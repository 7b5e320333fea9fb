// h2o-quantize: converts the weights of a GGUF model to another type.
//
//   h2o-quantize [-t THREADS] IN.gguf OUT.gguf TYPE
//
// TYPE is F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K (every matrix in that type) or Q4_K_M (llama.cpp's
// mix of Q4_K and Q6_K); see quantize_model.h for the rules and the fallbacks. Prints one line per
// tensor (shape, type in -> type out, relative RMS error) and the sizes. Exit status: 0 success,
// 1 failure (unreadable or malformed input, write error), 2 usage error.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "options.h"
#include "quantize_model.h"

namespace {

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s;
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? " x " : "") + std::to_string(shape[i]);
    return s;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char **argv) {
    std::vector<std::string> positional;
    h2o::QuantizeOptions options;
    const std::string usage = std::string("usage: h2o-quantize [-t THREADS] IN.gguf OUT.gguf TYPE\n") + "  TYPE                   " +
                              h2o::quant_preset_names() + "\n" +
                              "  -t N                   threads, 1 to 1024 (default: one per hardware thread)\n"
                              "  --version              print the library's version\n";
    h2o_tools::CommandLine cl("h2o-quantize", usage);
    cl.count("-t", 1, 1024, &options.n_threads);
    cl.positional([&](const std::string &arg) {
        if (positional.size() == 3) cl.fail("unexpected argument '" + arg + "': expected IN.gguf OUT.gguf TYPE");
        positional.push_back(arg);
    });
    cl.parse(argc, argv);
    if (positional.size() != 3) cl.fail("expected IN.gguf OUT.gguf TYPE");
    const std::string &in = positional[0], &out = positional[1], &type = positional[2];
    if (!h2o::parse_quant_preset(type, &options.preset)) cl.fail("unknown TYPE '" + type + "' (known: " + h2o::quant_preset_names() + ")");
    if (in.empty() || out.empty()) cl.fail("empty file name");

    bool header_done = false;  // printed with the first tensor, so a bad input prints only the error
    options.on_tensor = [&header_done](const h2o::TensorQuantReport &r) {
        if (!header_done) {
            std::printf("%-28s %-18s %-6s    %-6s  %-10s\n", "tensor", "shape", "in", "out", "rel. RMS err");
            header_done = true;
        }
        std::string note;
        if (r.fell_back()) {
            note = "  (fallback: row length " + std::to_string(r.shape[0]) + " does not fit " + h2o::type_name(r.wanted) + ")";
        } else if (r.copied) {
            note = "  (copied)";
        }
        std::printf("%-28s %-18s %-6s -> %-6s  %-10.5f%s\n", r.name.c_str(), shape_text(r.shape).c_str(), h2o::type_name(r.type_in),
                    h2o::type_name(r.type_out), r.rel_rms_error, note.c_str());
        std::fflush(stdout);
    };
    h2o::QuantizeReport report;
    const h2o::Status st = h2o::quantize_model(in, out, options, &report);
    if (!st.ok()) {
        std::fprintf(stderr, "h2o-quantize: %s (%s)\n", st.message.c_str(), h2o_status_string(st.code));
        return st.code == H2O_ERR_INVALID_ARGUMENT ? 2 : 1;
    }
    size_t fallbacks = 0;
    for (const auto &r : report.tensors) fallbacks += r.fell_back() ? 1 : 0;
    std::printf("tensors: %zu (%zu fell back to another type)\n", report.tensors.size(), fallbacks);
    std::printf("tensor data: %.2f MiB -> %.2f MiB (%.2fx smaller)\n", mib(report.tensor_bytes_in), mib(report.tensor_bytes_out),
                report.tensor_bytes_out ? static_cast<double>(report.tensor_bytes_in) / report.tensor_bytes_out : 0.0);
    std::printf("file: %.2f MiB -> %.2f MiB, general.file_type = %" PRIu32 " (%s)\n", mib(report.file_bytes_in), mib(report.file_bytes_out),
                report.file_type, h2o::quant_preset_name(options.preset));
    std::printf("wrote %s\n", out.c_str());
    return 0;
}

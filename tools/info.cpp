// h2o-info: what a model is, and what this build and machine can run it on.
//
//   h2o-info [MODEL] [--backends]
//
// MODEL: its architecture, name, context length, shape, parameters, vocabulary, special tokens
// and chat format, one "key: value" line each. --backends: the backends and devices that
// h2o-cli's and h2o-bench's --backend and --device choose from. Public API only.
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "h2o/h2o.h"
#include "options.h"

namespace {

constexpr const char *kUsage =
    "usage: h2o-info [MODEL] [--backends]\n"
    "  MODEL                  print the model's architecture, name, context length, shape, parameters,\n"
    "                         vocabulary and chat format\n"
    "  --backends             list the backends and devices sessions can run on (what --backend\n"
    "                         and --device of h2o-cli and h2o-bench choose from)\n"
    "  --version              print the library's version\n";

// One h2o_model_get_text value, or "none: " and the library's reason.
std::string model_text(const h2o_model *model, h2o_model_text what) {
    size_t n = 0;
    h2o_status st = h2o_model_get_text(model, what, nullptr, 0, &n);
    std::string text(n + 1, '\0');
    if (st == H2O_OK || st == H2O_ERR_BUFFER_TOO_SMALL) st = h2o_model_get_text(model, what, text.data(), text.size(), &n);
    if (st != H2O_OK) return std::string("none: ") + h2o_last_error();
    text.resize(n);
    return text;
}

// A token as "id \"piece\"", or "none".
std::string token_text(const h2o_model *model, int32_t id) {
    if (id < 0) return "none";
    size_t n = 0;
    std::string piece(64, '\0');
    if (h2o_token_to_piece(model, id, piece.data(), piece.size(), &n) == H2O_ERR_BUFFER_TOO_SMALL) {
        piece.resize(n);
        h2o_token_to_piece(model, id, piece.data(), piece.size(), &n);
    }
    piece.resize(n);
    return std::to_string(id) + " \"" + h2o_tools::json_escape(piece) + "\"";
}

int print_model(const std::string &path) {
    h2o_model *model = nullptr;
    const h2o_status st = h2o_model_load(path.c_str(), nullptr, &model);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-info: cannot load model: %s (%s)\n", h2o_last_error(), h2o_status_string(st));
        return 1;
    }
    h2o_model_info info;
    info.struct_size = sizeof(info);
    h2o_model_get_info(model, &info);
    const std::string name = model_text(model, H2O_MODEL_TEXT_NAME);
    std::printf("model: %s\n", path.c_str());
    std::printf("architecture: %s\n", model_text(model, H2O_MODEL_TEXT_ARCHITECTURE).c_str());
    std::printf("name: %s\n", name.empty() ? "(none in the file)" : name.c_str());
    std::printf("context length: %u tokens (trained; sessions default to at most 4096)\n", info.n_ctx_train);
    std::printf("parameters: %llu (%.2f M), %.2f MiB of weights\n", static_cast<unsigned long long>(info.n_params), info.n_params / 1e6,
                info.weight_bytes / 1048576.0);
    std::printf("layers: %u, embedding %u, feed-forward %u\n", info.n_layer, info.n_embd, info.n_ff);
    std::printf("attention heads: %u, kv heads %u, head dim %u\n", info.n_head, info.n_head_kv, info.head_dim);
    std::printf("vocabulary: %u tokens, BOS %s, EOS %s\n", info.n_vocab, token_text(model, info.bos_token).c_str(),
                token_text(model, info.eos_token).c_str());
    std::printf("chat format: %s\n", model_text(model, H2O_MODEL_TEXT_CHAT_FORMAT).c_str());
    h2o_model_free(model);
    return 0;
}

int print_backends() {
    size_t count = 0;
    const h2o_status st = h2o_backend_count(&count);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-info: cannot list the backends: %s (%s)\n", h2o_last_error(), h2o_status_string(st));
        return 1;
    }
    std::printf("%-8s %-7s %-11s %10s  %s\n", "backend", "device", "type", "memory", "name");
    for (size_t i = 0; i < count; ++i) {
        h2o_backend_info b;
        b.struct_size = sizeof(b);
        if (h2o_backend_get_info(i, &b) != H2O_OK) {
            std::fprintf(stderr, "h2o-info: backend device %zu: %s\n", i, h2o_last_error());
            return 1;
        }
        const std::string memory = b.memory_bytes ? std::to_string(b.memory_bytes >> 20) + " MiB" : "host";
        const char *kind = h2o_backend_kind_name(b.kind);
        std::printf("%-8s %-7d %-11s %10s  %s\n", kind ? kind : "unknown", b.device_index, b.device_type, memory.c_str(), b.name);
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::string model_path;
    bool backends = false;
    h2o_tools::CommandLine cl("h2o-info", kUsage);
    cl.flag("--backends", &backends);
    cl.positional([&](const std::string &path) {
        if (!model_path.empty()) cl.fail("unexpected argument '" + path + "': one MODEL at a time");
        model_path = path;
    });
    cl.parse(argc, argv);
    if (model_path.empty() && !backends) cl.fail("give a MODEL, --backends, or both");
    int rc = 0;
    if (!model_path.empty()) rc = print_model(model_path);
    if (backends && rc == 0) {
        if (!model_path.empty()) std::printf("\n");
        rc = print_backends();
    }
    return rc;
}

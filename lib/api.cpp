// The C ABI: argument validation, error recording and exception containment around the C++
// runtime. No exception ever crosses this boundary.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "h2o/h2o.h"
#include "backend_registry.h"
#include "model.h"
#include "session.h"
#include "utf8.h"

struct h2o_model {
    std::unique_ptr<h2o::Model> impl;
};

struct h2o_session {
    std::unique_ptr<h2o::Session> impl;
    h2o_model *model = nullptr;
    h2o::SessionSettings settings;
    mutable std::string last_error;
};

namespace {

using h2o::make_error;
using h2o::Status;

thread_local std::string t_last_error;

// Limits that keep every size computed from parameters far from overflow.
constexpr uint32_t kMaxContext = 1u << 22;
constexpr uint32_t kMaxThreads = 256;
constexpr uint32_t kMaxBatch = 4096;

// Records a failure for h2o_last_error() (and the session's message) and returns its code.
h2o_status fail(const Status &status, const h2o_session *session = nullptr) {
    t_last_error = status.message;
    if (session) session->last_error = status.message;
    return status.code;
}

h2o_status succeed(const h2o_session *session = nullptr) {
    t_last_error.clear();
    if (session) session->last_error.clear();
    return H2O_OK;
}

h2o_status invalid(const std::string &message, const h2o_session *session = nullptr) {
    return fail(make_error(H2O_ERR_INVALID_ARGUMENT, message), session);
}

// Runs body, turning escaped exceptions into status codes.
template <typename Body>
h2o_status guarded(const h2o_session *session, Body &&body) {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(make_error(H2O_ERR_OUT_OF_MEMORY, "out of memory"), session);
    } catch (const std::exception &e) {
        return fail(make_error(H2O_ERR_INTERNAL, std::string("internal error: ") + e.what()), session);
    } catch (...) {
        return fail(make_error(H2O_ERR_INTERNAL, "internal error: unknown exception"), session);
    }
}

// Copies a caller's params struct over the defaults, honouring its struct_size. Every struct is
// at its first version, so the smallest accepted size is the full size; later versions will
// accept the sizes of earlier ones.
template <typename Params>
Status read_params(const Params *src, size_t first_version_size, const char *what, Params *dst) {
    if (!src) return Status::Ok();  // NULL: defaults
    if (src->struct_size < first_version_size || src->struct_size > sizeof(Params)) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ".struct_size is " + std::to_string(src->struct_size) +
                                                        "; this library accepts " + std::to_string(first_version_size) +
                                                        " to " + std::to_string(sizeof(Params)) +
                                                        " (was the caller built against a different h2o.h?)");
    }
    std::memcpy(static_cast<void *>(dst), src, src->struct_size);
    return Status::Ok();
}

// The integer a caller stored in an enum field. Read through memcpy: a C caller (or a newer
// header) may store values outside this build's enumerators, and loading such a value through
// the enum type is undefined behaviour in C++.
template <typename Enum>
uint32_t raw_enum(const Enum &field) {
    static_assert(sizeof(Enum) == sizeof(uint32_t), "C enums of this API are 32 bits");
    uint32_t raw;
    std::memcpy(&raw, &field, sizeof(raw));
    return raw;
}

int default_thread_count() {
    const unsigned cores = std::thread::hardware_concurrency();
    return static_cast<int>(cores == 0 ? 1 : (cores > 8 ? 8 : cores));
}

}  // namespace

extern "C" {

H2O_API const char *h2o_version(void) {
#define H2O_STR2(x) #x
#define H2O_STR(x) H2O_STR2(x)
    return H2O_STR(H2O_VERSION_MAJOR) "." H2O_STR(H2O_VERSION_MINOR) "." H2O_STR(H2O_VERSION_PATCH);
}

H2O_API uint32_t h2o_version_number(void) { return H2O_VERSION_NUMBER; }

H2O_API const char *h2o_status_string(h2o_status status) {
    switch (status) {
        case H2O_OK: return "ok";
        case H2O_ERR_INVALID_ARGUMENT: return "invalid argument";
        case H2O_ERR_OUT_OF_MEMORY: return "out of memory";
        case H2O_ERR_IO: return "i/o error";
        case H2O_ERR_MODEL_FORMAT: return "malformed model file";
        case H2O_ERR_UNSUPPORTED: return "unsupported";
        case H2O_ERR_CONTEXT_FULL: return "context full";
        case H2O_ERR_BACKEND_UNAVAILABLE: return "backend unavailable";
        case H2O_ERR_INVALID_TEXT: return "invalid UTF-8 text";
        case H2O_ERR_BUFFER_TOO_SMALL: return "buffer too small";
        case H2O_ERR_TOKENIZER: return "tokenizer error";
        case H2O_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

H2O_API const char *h2o_last_error(void) { return t_last_error.c_str(); }

// ---- models ----------------------------------------------------------------------------------

H2O_API h2o_model_params h2o_model_params_default(void) {
    h2o_model_params p;
    std::memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.tokenizer_path = nullptr;
    return p;
}

H2O_API h2o_status h2o_model_load(const char *path, const h2o_model_params *params, h2o_model **out_model) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!path) return invalid("h2o_model_load: path is NULL");
        if (!out_model) return invalid("h2o_model_load: out_model is NULL");
        h2o_model_params p = h2o_model_params_default();
        if (Status s = read_params(params, sizeof(h2o_model_params), "h2o_model_params", &p); !s.ok()) return fail(s);
        auto model = std::make_unique<h2o_model>();
        if (Status s = h2o::Model::load(path, p.tokenizer_path ? p.tokenizer_path : "", &model->impl); !s.ok()) {
            return fail(make_error(s.code, std::string(path) + ": " + s.message));
        }
        *out_model = model.release();
        return succeed();
    });
}

H2O_API void h2o_model_free(h2o_model *model) { delete model; }

H2O_API h2o_status h2o_model_get_info(const h2o_model *model, h2o_model_info *info) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_model_get_info: model is NULL");
        if (!info) return invalid("h2o_model_get_info: info is NULL");
        if (info->struct_size < sizeof(h2o_model_info) || info->struct_size > sizeof(h2o_model_info)) {
            return invalid("h2o_model_info.struct_size is " + std::to_string(info->struct_size) + ", expected " +
                           std::to_string(sizeof(h2o_model_info)));
        }
        const h2o::Model &m = *model->impl;
        const h2o::ModelShape &s = m.shape();
        info->n_vocab = static_cast<uint32_t>(s.n_vocab);
        info->n_ctx_train = m.n_ctx_train();
        info->n_embd = static_cast<uint32_t>(s.n_embd);
        info->n_layer = static_cast<uint32_t>(s.n_layer);
        info->n_head = static_cast<uint32_t>(s.n_head);
        info->n_head_kv = static_cast<uint32_t>(s.n_head_kv);
        info->n_ff = static_cast<uint32_t>(s.n_ff);
        info->head_dim = static_cast<uint32_t>(s.head_dim);
        info->bos_token = m.tokenizer().bos();
        info->eos_token = m.tokenizer().eos();
        info->n_params = m.n_params();
        info->weight_bytes = m.weight_bytes();
        return succeed();
    });
}

H2O_API h2o_status h2o_tokenize(const h2o_model *model, const char *text, size_t text_len, int add_bos, int32_t *tokens,
                                size_t capacity, size_t *n_tokens) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_tokenize: model is NULL");
        if (!text && text_len > 0) return invalid("h2o_tokenize: text is NULL");
        if (!tokens && capacity > 0) return invalid("h2o_tokenize: tokens is NULL but capacity is not 0");
        if (!n_tokens) return invalid("h2o_tokenize: n_tokens is NULL");
        std::vector<int32_t> ids;
        if (Status s = model->impl->tokenizer().encode(std::string_view(text ? text : "", text_len), add_bos != 0, &ids); !s.ok()) {
            return fail(s);
        }
        *n_tokens = ids.size();
        if (ids.size() > capacity) {
            return fail(make_error(H2O_ERR_BUFFER_TOO_SMALL, "the text needs " + std::to_string(ids.size()) +
                                                                 " tokens; capacity is " + std::to_string(capacity)));
        }
        if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
        return succeed();
    });
}

H2O_API h2o_status h2o_detokenize(const h2o_model *model, const int32_t *tokens, size_t n_tokens, char *text,
                                  size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_detokenize: model is NULL");
        if (!tokens && n_tokens > 0) return invalid("h2o_detokenize: tokens is NULL");
        if (!text && capacity > 0) return invalid("h2o_detokenize: text is NULL but capacity is not 0");
        if (!n_bytes) return invalid("h2o_detokenize: n_bytes is NULL");
        std::string out;
        if (Status s = model->impl->tokenizer().decode(tokens, n_tokens, &out); !s.ok()) return fail(s);
        *n_bytes = out.size();
        if (out.size() > capacity) {
            return fail(make_error(H2O_ERR_BUFFER_TOO_SMALL, "the text needs " + std::to_string(out.size()) +
                                                                 " bytes; capacity is " + std::to_string(capacity)));
        }
        std::memcpy(text, out.data(), out.size());
        if (out.size() < capacity) text[out.size()] = '\0';
        return succeed();
    });
}

// ---- backends --------------------------------------------------------------------------------

namespace {

void fill_backend_info(const h2o::BackendDevice &d, h2o_backend_info *info) {
    info->kind = d.kind;
    info->device_index = d.device_index;
    std::snprintf(info->name, sizeof(info->name), "%s", d.name.c_str());
    std::snprintf(info->device_type, sizeof(info->device_type), "%s", d.type.c_str());
    info->memory_bytes = d.memory_bytes;
}

Status check_backend_info(const h2o_backend_info *info, const char *function) {
    if (!info) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(function) + ": info is NULL");
    if (info->struct_size != sizeof(h2o_backend_info)) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "h2o_backend_info.struct_size is " + std::to_string(info->struct_size) +
                                                        ", expected " + std::to_string(sizeof(h2o_backend_info)));
    }
    return Status::Ok();
}

}  // namespace

H2O_API h2o_status h2o_backend_count(size_t *count) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!count) return invalid("h2o_backend_count: count is NULL");
        *count = h2o::list_backend_devices().size();
        return succeed();
    });
}

H2O_API h2o_status h2o_backend_get_info(size_t index, h2o_backend_info *info) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (Status s = check_backend_info(info, "h2o_backend_get_info"); !s.ok()) return fail(s);
        const std::vector<h2o::BackendDevice> devices = h2o::list_backend_devices();
        if (index >= devices.size()) {
            return invalid("backend index " + std::to_string(index) + " is out of range (" + std::to_string(devices.size()) +
                           " devices)");
        }
        fill_backend_info(devices[index], info);
        return succeed();
    });
}

// ---- sessions --------------------------------------------------------------------------------

H2O_API h2o_session_params h2o_session_params_default(void) {
    h2o_session_params p;
    std::memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.n_ctx = 0;
    p.n_threads = 0;
    p.n_batch = 0;
    p.seed = 0x5EED;
    p.kv_budget = 0;
    p.kv_policy = H2O_KV_SCISSORHANDS;
    p.kv_recent = 0;
    p.kv_recent_ratio = -1.0f;
    p.kv_sinks = 4;
    p.position_rolling = 0;
    p.backend = H2O_BACKEND_AUTO;
    p.device_index = -1;
    p.kv_type = H2O_KV_TYPE_F32;
    return p;
}

H2O_API h2o_status h2o_session_create(h2o_model *model, const h2o_session_params *params, h2o_session **out_session) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_session_create: model is NULL");
        if (!out_session) return invalid("h2o_session_create: out_session is NULL");
        h2o_session_params p = h2o_session_params_default();
        if (Status s = read_params(params, sizeof(h2o_session_params), "h2o_session_params", &p); !s.ok()) return fail(s);
        if (p.n_ctx > kMaxContext) return invalid("n_ctx " + std::to_string(p.n_ctx) + " exceeds the maximum " + std::to_string(kMaxContext));
        if (p.n_threads > kMaxThreads) return invalid("n_threads " + std::to_string(p.n_threads) + " exceeds the maximum " + std::to_string(kMaxThreads));
        if (p.n_batch > kMaxBatch) return invalid("n_batch " + std::to_string(p.n_batch) + " exceeds the maximum " + std::to_string(kMaxBatch));

        if (raw_enum(p.kv_policy) >= h2o::kKvPolicyCount)
            return invalid("kv_policy " + std::to_string(raw_enum(p.kv_policy)) + " is not a known policy");
        if (!(p.kv_recent_ratio <= 1.0f)) return invalid("kv_recent_ratio must be at most 1 (negative: the policy's default)");

        if (raw_enum(p.backend) > H2O_BACKEND_CUDA)
            return invalid("backend " + std::to_string(raw_enum(p.backend)) + " is not a known backend kind");
        if (p.device_index < -1) return invalid("device_index must be -1 (best) or a device index");
        if (raw_enum(p.kv_type) >= h2o::kKvTypeCount)
            return invalid("kv_type " + std::to_string(raw_enum(p.kv_type)) + " is not a known KV format");

        auto session = std::make_unique<h2o_session>();
        session->model = model;
        h2o::SessionSettings &s = session->settings;
        s.backend = p.backend;
        s.device_index = p.device_index;
        s.kv_type = static_cast<h2o::KvType>(p.kv_type);
        s.n_ctx = static_cast<int>(p.n_ctx ? p.n_ctx : model->impl->n_ctx_train());
        s.kv_budget = (p.kv_budget == 0 || p.kv_budget > static_cast<uint32_t>(s.n_ctx)) ? s.n_ctx : static_cast<int>(p.kv_budget);
        s.rolling = p.position_rolling != 0;
        if (s.kv_budget < 2) return invalid("kv_budget must be at least 2");
        const bool evicting = s.kv_budget < s.n_ctx || s.rolling;
        s.policy.policy = evicting ? static_cast<h2o::KvPolicy>(p.kv_policy) : h2o::KvPolicy::Full;
        // Scissorhands' default keeps 7/8 of the budget recent: on our evaluation that is what
        // beats a plain window at small budgets and keeps a long stream's perplexity flat.
        const float ratio = p.kv_recent_ratio >= 0.0f ? p.kv_recent_ratio
                            : s.policy.policy == h2o::KvPolicy::Scissorhands ? 0.875f : 0.5f;
        const uint32_t recent = p.kv_recent ? p.kv_recent : static_cast<uint32_t>(ratio * s.kv_budget);
        if (recent > static_cast<uint32_t>(s.kv_budget)) return invalid("kv_recent " + std::to_string(recent) + " exceeds kv_budget " + std::to_string(s.kv_budget));
        if (p.kv_sinks >= static_cast<uint32_t>(s.kv_budget)) return invalid("kv_sinks must be smaller than kv_budget");
        // The window policies are all window, and TOVA is defined without one.
        const bool has_recent_window = s.policy.policy != h2o::KvPolicy::Tova && s.policy.policy != h2o::KvPolicy::Window &&
                                       s.policy.policy != h2o::KvPolicy::SinkWindow;
        s.policy.recent = has_recent_window ? static_cast<int>(recent) : 0;
        const bool uses_sinks = s.policy.policy == h2o::KvPolicy::SinkWindow || s.policy.policy == h2o::KvPolicy::MeanH2O;
        s.policy.sinks = uses_sinks ? static_cast<int>(p.kv_sinks) : 0;
        s.policy.seed = p.seed;
        s.n_threads = p.n_threads ? static_cast<int>(p.n_threads) : default_thread_count();
        s.n_batch = static_cast<int>(p.n_batch ? p.n_batch : 256);
        s.seed = p.seed;
        if (Status st = h2o::Session::create(*model->impl, s, &session->impl); !st.ok()) return fail(st);
        *out_session = session.release();
        return succeed();
    });
}

H2O_API void h2o_session_free(h2o_session *session) { delete session; }

H2O_API h2o_status h2o_session_get_backend(const h2o_session *session, h2o_backend_info *info) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_backend: session is NULL");
        if (Status s = check_backend_info(info, "h2o_session_get_backend"); !s.ok()) return fail(s, session);
        fill_backend_info(session->impl->device(), info);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_device_traffic(const h2o_session *session, h2o_device_traffic *traffic) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_device_traffic: session is NULL");
        if (!traffic) return invalid("h2o_session_get_device_traffic: traffic is NULL", session);
        if (traffic->struct_size != sizeof(h2o_device_traffic)) {
            return invalid("h2o_device_traffic.struct_size is " + std::to_string(traffic->struct_size) + ", expected " +
                               std::to_string(sizeof(h2o_device_traffic)), session);
        }
        const h2o::Backend::Traffic t = session->impl->backend().traffic();
        traffic->bytes_to_device = t.bytes_to_device;
        traffic->bytes_to_host = t.bytes_to_host;
        traffic->submissions = t.submissions;
        traffic->device_memory_bytes = t.device_memory_bytes;
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_kv_layout(const h2o_session *session, h2o_kv_layout *layout) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_kv_layout: session is NULL");
        if (!layout) return invalid("h2o_session_get_kv_layout: layout is NULL", session);
        if (layout->struct_size != sizeof(h2o_kv_layout)) {
            return invalid("h2o_kv_layout.struct_size is " + std::to_string(layout->struct_size) + ", expected " +
                               std::to_string(sizeof(h2o_kv_layout)), session);
        }
        const h2o::SessionSettings &s = session->settings;
        layout->budget = static_cast<uint32_t>(s.kv_budget);
        layout->policy = static_cast<h2o_kv_policy>(s.policy.policy);
        layout->recent = static_cast<uint32_t>(s.policy.recent);
        layout->sinks = static_cast<uint32_t>(s.policy.sinks);
        layout->position_rolling = s.rolling ? 1 : 0;
        layout->type = static_cast<h2o_kv_type>(s.kv_type);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_reset(h2o_session *session) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_reset: session is NULL");
        session->impl->reset();
        return succeed(session);
    });
}

H2O_API const char *h2o_session_last_error(const h2o_session *session) {
    return session ? session->last_error.c_str() : "";
}

// ---- generation ------------------------------------------------------------------------------

H2O_API h2o_generate_params h2o_generate_params_default(void) {
    h2o_generate_params p;
    std::memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.max_tokens = 256;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.stop_strings = nullptr;
    p.n_stop_strings = 0;
    p.stop_at_eos = 1;
    return p;
}

namespace {

Status to_generate_settings(const h2o_generate_params &p, h2o::GenerateSettings *out) {
    auto bad = [](const std::string &m) { return make_error(H2O_ERR_INVALID_ARGUMENT, "h2o_generate_params." + m); };
    if (p.max_tokens == 0) return bad("max_tokens must be at least 1");
    if (!std::isfinite(p.temperature) || p.temperature < 0) return bad("temperature must be a finite number >= 0");
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p must be in (0, 1]");
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p must be in [0, 1]");
    if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0) return bad("repeat_penalty must be a finite number > 0");
    if (p.repeat_last_n > h2o::TokenHistory::kCapacity)
        return bad("repeat_last_n must be at most " + std::to_string(h2o::TokenHistory::kCapacity));
    if (p.n_stop_strings > 0 && !p.stop_strings) return bad("stop_strings is NULL but n_stop_strings is not 0");
    if (p.n_stop_strings > 64) return bad("n_stop_strings must be at most 64");
    out->stop_strings.clear();
    for (size_t i = 0; i < p.n_stop_strings; ++i) {
        const char *stop = p.stop_strings[i];
        if (!stop || !*stop) return bad("stop_strings[" + std::to_string(i) + "] is NULL or empty");
        if (!h2o::is_valid_utf8(stop)) return make_error(H2O_ERR_INVALID_TEXT, "stop_strings[" + std::to_string(i) + "] is not valid UTF-8");
        out->stop_strings.emplace_back(stop);
    }
    out->max_tokens = p.max_tokens;
    out->sampler.temperature = p.temperature;
    out->sampler.top_k = p.top_k;
    out->sampler.top_p = p.top_p;
    out->sampler.min_p = p.min_p;
    out->sampler.repeat_penalty = p.repeat_penalty;
    out->sampler.repeat_last_n = p.repeat_last_n;
    out->stop_at_eos = p.stop_at_eos != 0;
    return Status::Ok();
}

struct CallbackBridge {
    h2o_token_callback callback;
    void *user_data;
};

bool call_token_callback(const char *text, size_t length, void *bridge) {
    const auto *b = static_cast<const CallbackBridge *>(bridge);
    return b->callback && b->callback(text, length, b->user_data) != 0;
}

}  // namespace

H2O_API h2o_status h2o_generate(h2o_session *session, const char *prompt, const h2o_generate_params *params,
                                h2o_token_callback callback, void *user_data) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_generate: session is NULL");
        if (!prompt) return invalid("h2o_generate: prompt is NULL (pass \"\" to generate from the current state)", session);
        h2o_generate_params p = h2o_generate_params_default();
        if (Status s = read_params(params, sizeof(h2o_generate_params), "h2o_generate_params", &p); !s.ok()) return fail(s, session);
        h2o::GenerateSettings settings;
        if (Status s = to_generate_settings(p, &settings); !s.ok()) return fail(s, session);
        CallbackBridge bridge{callback, user_data};
        if (Status s = session->impl->generate(prompt, settings, call_token_callback, &bridge); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_stats(const h2o_session *session, h2o_generate_stats *stats) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_stats: session is NULL");
        if (!stats) return invalid("h2o_session_get_stats: stats is NULL", session);
        if (stats->struct_size != sizeof(h2o_generate_stats)) {
            return invalid("h2o_generate_stats.struct_size is " + std::to_string(stats->struct_size) + ", expected " +
                               std::to_string(sizeof(h2o_generate_stats)), session);
        }
        *stats = session->impl->stats();
        stats->struct_size = sizeof(h2o_generate_stats);
        stats->n_past = static_cast<uint32_t>(session->impl->n_past());
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_memory(const h2o_session *session, h2o_memory_report *report) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_memory: session is NULL");
        if (!report) return invalid("h2o_session_memory: report is NULL", session);
        if (report->struct_size != sizeof(h2o_memory_report)) {
            return invalid("h2o_memory_report.struct_size is " + std::to_string(report->struct_size) + ", expected " +
                               std::to_string(sizeof(h2o_memory_report)), session);
        }
        *report = session->impl->memory();
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_add_text(h2o_session *session, const char *text, uint32_t flags) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_add_text: session is NULL");
        if (!text) return invalid("h2o_session_add_text: text is NULL", session);
        if (flags & ~H2O_TEXT_PIN) return invalid("h2o_session_add_text: unknown flags " + std::to_string(flags), session);
        if (Status s = session->impl->add_text(text, (flags & H2O_TEXT_PIN) != 0); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_decode(h2o_session *session, const int32_t *tokens, size_t n_tokens) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_decode: session is NULL");
        if (!tokens && n_tokens > 0) return invalid("h2o_session_decode: tokens is NULL", session);
        if (n_tokens == 0) return invalid("h2o_session_decode: n_tokens is 0", session);
        if (Status s = session->impl->decode(tokens, n_tokens); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_logits(const h2o_session *session, float *logits, size_t capacity) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_logits: session is NULL");
        if (!logits) return invalid("h2o_session_get_logits: logits is NULL", session);
        const std::vector<float> &src = session->impl->logits();
        if (capacity < src.size()) {
            return fail(make_error(H2O_ERR_BUFFER_TOO_SMALL, "logits need " + std::to_string(src.size()) +
                                                                 " floats; capacity is " + std::to_string(capacity)), session);
        }
        if (!session->impl->has_logits()) return invalid("no token has been processed yet", session);
        std::memcpy(logits, src.data(), src.size() * sizeof(float));
        return succeed(session);
    });
}

}  // extern "C"

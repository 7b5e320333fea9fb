// The C ABI: argument validation, error recording and exception containment around the C++
// runtime. No exception ever crosses this boundary.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "backend_registry.h"
#include "chat_format.h"
#include "grammar.h"
#include "grammar_matcher.h"
#include "json_schema.h"
#include "json_value.h"
#include "model.h"
#include "file_io.h"
#include "log.h"
#include "kv_head_budgets.h"
#include "kv_layer_budgets.h"
#include "session.h"
#include "session_snapshot.h"
#include "tool_calls.h"

#include <zstd.h>
#include "utf8.h"

// A model handle holds one reference; every session holds another, so the model outlives
// h2o_model_free for as long as a session uses it.
struct h2o_model {
    std::shared_ptr<const h2o::Model> impl;
};

struct h2o_session {
    std::shared_ptr<const h2o::Model> model;  // declared first: destroyed after the session
    std::unique_ptr<h2o::Session> impl;
    h2o::SessionSettings settings;
    std::string piece;  // the text h2o_generate_next returned last
    mutable std::string last_error;
};

namespace {

using h2o::default_session_params;
using h2o::make_error;
using h2o::Status;

thread_local std::string t_last_error;

// Every entry point reports its outcome through these: a failure's message becomes
// h2o_last_error() on the calling thread (and the session's message), a success clears it. Both
// return the status code.
h2o_status fail(const Status &status, const h2o_session *session = nullptr) {
    if (session) session->last_error = status.message;
    t_last_error = status.message;
    return status.code;
}

h2o_status succeed(const h2o_session *session = nullptr) {
    if (session) session->last_error.clear();
    t_last_error.clear();
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

// The size of a public struct's first published version: its bytes up to the end of `field`.
// Later versions only append fields, so every struct_size from this one up is accepted.
#define H2O_SIZE_THROUGH(type, field) (offsetof(type, field) + sizeof(((type *)nullptr)->field))
template <typename T>
constexpr size_t kFirstVersion = sizeof(T);
template <>
constexpr size_t kFirstVersion<h2o_model_params> = H2O_SIZE_THROUGH(h2o_model_params, prefix_cache_bytes);
template <>
constexpr size_t kFirstVersion<h2o_prefix_cache_stats> = H2O_SIZE_THROUGH(h2o_prefix_cache_stats, misses);
// ABI 1 began with the research settings in an array: its first h2o_session_params is the whole struct.
template <>
constexpr size_t kFirstVersion<h2o_session_params> = H2O_SIZE_THROUGH(h2o_session_params, experimental);
template <>
constexpr size_t kFirstVersion<h2o_generate_params> = H2O_SIZE_THROUGH(h2o_generate_params, stop_at_eos);
template <>
constexpr size_t kFirstVersion<h2o_model_info> = H2O_SIZE_THROUGH(h2o_model_info, weight_bytes);
template <>
constexpr size_t kFirstVersion<h2o_backend_info> = H2O_SIZE_THROUGH(h2o_backend_info, memory_bytes);
template <>
constexpr size_t kFirstVersion<h2o_kv_layout> = H2O_SIZE_THROUGH(h2o_kv_layout, n_ctx);
template <>
constexpr size_t kFirstVersion<h2o_device_traffic> = H2O_SIZE_THROUGH(h2o_device_traffic, device_memory_bytes);
template <>
constexpr size_t kFirstVersion<h2o_memory_report> = H2O_SIZE_THROUGH(h2o_memory_report, scratch_bytes);
template <>
constexpr size_t kFirstVersion<h2o_generate_stats> = H2O_SIZE_THROUGH(h2o_generate_stats, generate_seconds);
template <>
constexpr size_t kFirstVersion<h2o_kv_usage> = H2O_SIZE_THROUGH(h2o_kv_usage, evicts);

Status check_struct_size(size_t size, size_t first, const char *what) {
    if (size >= first) return Status::Ok();
    return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ".struct_size is " + std::to_string(size) +
                                                    "; the smallest version this library accepts has " + std::to_string(first) +
                                                    " bytes (set it to sizeof the struct)");
}

// Writes defaults into the first `size` bytes of a caller's struct: the fields this library knows,
// then zeros for the fields of a newer header (zero means "unused" to read_params).
template <typename T>
Status init_struct(T *dst, size_t size, const T &defaults, const char *what) {
    if (!dst) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
    if (size > UINT32_MAX) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": struct_size is absurdly large");
    H2O_TRY(check_struct_size(size, kFirstVersion<T>, what));
    const size_t known = std::min(size, sizeof(T));
    std::memcpy(static_cast<void *>(dst), &defaults, known);
    if (size > known) std::memset(reinterpret_cast<char *>(dst) + known, 0, size - known);
    dst->struct_size = static_cast<uint32_t>(size);
    return Status::Ok();
}

// Copies a caller's input struct over the defaults in *dst, honouring its struct_size. NULL
// means defaults. Fields of a newer header that this library does not know must be zero.
template <typename T>
Status read_params(const T *src, const char *what, T *dst) {
    if (!src) return Status::Ok();
    H2O_TRY(check_struct_size(src->struct_size, kFirstVersion<T>, what));
    const auto *bytes = reinterpret_cast<const unsigned char *>(src);
    for (size_t i = sizeof(T); i < src->struct_size; ++i) {
        if (bytes[i] != 0) {
            return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + " sets a field at byte " + std::to_string(i) +
                                                            " that this library (h2o " + h2o_version() + ") does not know");
        }
    }
    std::memcpy(static_cast<void *>(dst), src, std::min<size_t>(src->struct_size, sizeof(T)));
    dst->struct_size = sizeof(T);
    return Status::Ok();
}

// Writes an output struct into a caller's, honouring its struct_size: an older caller gets the
// prefix it knows, a newer caller zeros in the fields this library does not know.
template <typename T>
Status write_result(const T &value, T *dst, const char *what) {
    if (!dst) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
    const uint32_t size = dst->struct_size;
    H2O_TRY(check_struct_size(size, kFirstVersion<T>, what));
    const size_t known = std::min<size_t>(size, sizeof(T));
    std::memcpy(static_cast<void *>(dst), &value, known);
    if (size > known) std::memset(reinterpret_cast<char *>(dst) + known, 0, size - known);
    dst->struct_size = size;
    return Status::Ok();
}

// Gives text to a caller's buffer: *n_bytes receives the size; the bytes are copied when they fit,
// followed by a NUL when there is room (and terminate is set).
Status write_text(const std::string &value, char *text, size_t capacity, size_t *n_bytes, bool terminate = true) {
    *n_bytes = value.size();
    if (value.size() > capacity) {
        return make_error(H2O_ERR_BUFFER_TOO_SMALL,
                          "the text needs " + std::to_string(value.size()) + " bytes; capacity is " + std::to_string(capacity));
    }
    if (!value.empty()) std::memcpy(text, value.data(), value.size());  // text may be NULL when nothing is copied
    if (terminate && value.size() < capacity) text[value.size()] = '\0';
    return Status::Ok();
}

// The defaults, in one place for the init functions and for NULL params (the session's are
// kv_settings.cpp's).
h2o_model_params default_model_params() {
    h2o_model_params p;
    std::memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    return p;
}

h2o_generate_params default_generate_params() {
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
    p.stop_at_eos = 1;
    return p;
}

const char *const kBackendKindNames[] = {"auto", "cpu", "vulkan", "cuda"};

// Looks a name up among the values 0, 1, ... that name_of names (a public h2o_*_name function:
// NULL after the last).
Status value_from_name(const char *(*name_of)(uint32_t), const char *name, uint32_t *out, const char *what) {
    if (!name || !out) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": name or out pointer is NULL");
    std::string known;
    for (uint32_t i = 0; name_of(i); ++i) {
        if (std::strcmp(name, name_of(i)) == 0) {
            *out = i;
            return Status::Ok();
        }
        known += (i ? ", " : "") + std::string(name_of(i));
    }
    return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": unknown name '" + name + "' (known: " + known + ")");
}

}  // namespace

// Every H2O_API function below was declared extern "C" by h2o.h, so it keeps C linkage; the
// helpers between them are ordinary C++.

H2O_API const char *h2o_version(void) {
#define H2O_STR2(x) #x
#define H2O_STR(x) H2O_STR2(x)
    return H2O_STR(H2O_VERSION_MAJOR) "." H2O_STR(H2O_VERSION_MINOR) "." H2O_STR(H2O_VERSION_PATCH);
}

H2O_API uint32_t h2o_version_number(void) { return H2O_VERSION_NUMBER; }

H2O_API const char *h2o_status_string(int32_t status) {
    switch (status) {
        case H2O_OK:
            return "ok";
        case H2O_ERR_INVALID_ARGUMENT:
            return "invalid argument";
        case H2O_ERR_OUT_OF_MEMORY:
            return "out of memory";
        case H2O_ERR_IO:
            return "i/o error";
        case H2O_ERR_MODEL_FORMAT:
            return "malformed model file";
        case H2O_ERR_UNSUPPORTED:
            return "unsupported";
        case H2O_ERR_CONTEXT_FULL:
            return "context full";
        case H2O_ERR_BACKEND_UNAVAILABLE:
            return "backend unavailable";
        case H2O_ERR_INVALID_TEXT:
            return "invalid UTF-8 text";
        case H2O_ERR_BUFFER_TOO_SMALL:
            return "buffer too small";
        case H2O_ERR_TOKENIZER:
            return "tokenizer error";
        case H2O_ERR_INTERNAL:
            return "internal error";
        case H2O_ERR_CANCELLED:
            return "cancelled";
        case H2O_ERR_STATE_FORMAT:
            return "malformed session state";
        case H2O_ERR_BACKEND_FAILED:
            return "compute backend failed";
    }
    return "unknown status";
}

H2O_API const char *h2o_last_error(void) { return t_last_error.c_str(); }

H2O_API h2o_status h2o_set_log_callback(h2o_log_callback callback, void *user_data, int32_t min_level) {
    if (min_level < H2O_LOG_DEBUG || min_level > H2O_LOG_NONE) {
        return invalid("h2o_set_log_callback: min_level " + std::to_string(min_level) + " is not a log level (0 debug .. 4 none)");
    }
    h2o::set_log_sink(callback, user_data, static_cast<h2o_log_level>(min_level));
    return succeed();
}

// ---- models ----------------------------------------------------------------------------------

H2O_API h2o_status h2o_model_params_init(h2o_model_params *params, size_t struct_size) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (Status s = init_struct(params, struct_size, default_model_params(), "h2o_model_params"); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API h2o_status h2o_model_load(const char *path, const h2o_model_params *params, h2o_model **out_model) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!path) return invalid("h2o_model_load: path is NULL");
        if (!out_model) return invalid("h2o_model_load: out_model is NULL");
        h2o_model_params p = default_model_params();
        if (Status s = read_params(params, "h2o_model_params", &p); !s.ok()) return fail(s);
        if (p.prefix_cache_policy != H2O_CACHE_POLICY_REUSE && p.prefix_cache_policy != H2O_CACHE_POLICY_LRU) {
            return invalid("h2o_model_params.prefix_cache_policy is " + std::to_string(p.prefix_cache_policy) +
                           ": not an h2o_cache_policy (H2O_CACHE_POLICY_REUSE or H2O_CACHE_POLICY_LRU)");
        }
        const h2o::CachePolicy policy = p.prefix_cache_policy == H2O_CACHE_POLICY_LRU ? h2o::CachePolicy::kLru : h2o::CachePolicy::kReuse;
        h2o::LoadProgress progress{p.progress, p.progress_user_data};
        std::unique_ptr<h2o::Model> loaded;
        if (Status s = h2o::Model::load(path, p.tokenizer_path ? p.tokenizer_path : "", &loaded, progress, p.prefix_cache_bytes, policy);
            !s.ok()) {
            return fail(s);
        }
        auto model = std::make_unique<h2o_model>();
        model->impl = std::move(loaded);
        *out_model = model.release();
        return succeed();
    });
}

H2O_API void h2o_model_free(h2o_model *model) { delete model; }

H2O_API h2o_status h2o_model_get_info(const h2o_model *model, h2o_model_info *info) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_model_get_info: model is NULL");
        const h2o::Model &m = *model->impl;
        const h2o::ModelShape &s = m.shape();
        h2o_model_info out{};
        h2o_model_info *info_in = info;
        info = &out;
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
        if (Status st = write_result(out, info_in, "h2o_model_get_info: info"); !st.ok()) return fail(st);
        return succeed();
    });
}

H2O_API h2o_status h2o_model_get_text(const h2o_model *model, uint32_t what, char *text, size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_model_get_text: model is NULL");
        if (!text && capacity > 0) return invalid("h2o_model_get_text: text is NULL but capacity is not 0");
        if (!n_bytes) return invalid("h2o_model_get_text: n_bytes is NULL");
        const h2o::Model &m = *model->impl;
        std::string value;
        switch (what) {
            case H2O_MODEL_TEXT_ARCHITECTURE:
                value = m.architecture().name;
                break;
            case H2O_MODEL_TEXT_NAME:
                value = m.name();
                break;
            case H2O_MODEL_TEXT_CHAT_FORMAT: {
                h2o::ChatFormat format;
                if (Status s = h2o::chat_format_from_template(m.chat_template(), &format); !s.ok()) return fail(s);
                value = h2o::chat_format_name(format);
                break;
            }
            default:
                return invalid("h2o_model_get_text: " + std::to_string(what) + " is not an h2o_model_text");
        }
        if (Status s = write_text(value, text, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API h2o_status h2o_model_get_prefix_cache_stats(const h2o_model *model, h2o_prefix_cache_stats *stats) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_model_get_prefix_cache_stats: model is NULL");
        const h2o::PrefixCache::Counters c = model->impl->prefix_cache().counters();
        h2o_prefix_cache_stats out{};
        out.entries = static_cast<uint32_t>(c.entries);
        out.bytes = c.bytes;
        out.hits = c.hits;
        out.misses = c.misses;
        if (Status s = write_result(out, stats, "h2o_model_get_prefix_cache_stats: stats"); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API h2o_status h2o_tokenize(const h2o_model *model, const char *text, size_t text_len, uint32_t flags, int32_t *tokens, size_t capacity,
                                size_t *n_tokens) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_tokenize: model is NULL");
        if (!text && text_len > 0) return invalid("h2o_tokenize: text is NULL");
        if (!tokens && capacity > 0) return invalid("h2o_tokenize: tokens is NULL but capacity is not 0");
        if (!n_tokens) return invalid("h2o_tokenize: n_tokens is NULL");
        if (flags & ~(H2O_TOKENIZE_ADD_BOS | H2O_TOKENIZE_SPECIAL | H2O_TOKENIZE_VOCAB_BOS)) {
            return invalid("h2o_tokenize: unknown flags " + std::to_string(flags));
        }
        std::vector<int32_t> ids;
        const h2o::Tokenizer &tok = model->impl->tokenizer();
        const std::string_view view(text ? text : "", text_len);
        const bool add_bos = (flags & H2O_TOKENIZE_ADD_BOS) || ((flags & H2O_TOKENIZE_VOCAB_BOS) && tok.add_bos());
        if (Status s = flags & H2O_TOKENIZE_SPECIAL ? tok.encode_special(view, add_bos, &ids) : tok.encode(view, add_bos, &ids); !s.ok()) {
            return fail(s);
        }
        *n_tokens = ids.size();
        if (ids.size() > capacity) {
            return fail(make_error(H2O_ERR_BUFFER_TOO_SMALL,
                                   "the text needs " + std::to_string(ids.size()) + " tokens; capacity is " + std::to_string(capacity)));
        }
        if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
        return succeed();
    });
}

H2O_API h2o_status h2o_detokenize(const h2o_model *model, const int32_t *tokens, size_t n_tokens, char *text, size_t capacity,
                                  size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_detokenize: model is NULL");
        if (!tokens && n_tokens > 0) return invalid("h2o_detokenize: tokens is NULL");
        if (!text && capacity > 0) return invalid("h2o_detokenize: text is NULL but capacity is not 0");
        if (!n_bytes) return invalid("h2o_detokenize: n_bytes is NULL");
        std::string out;
        if (Status s = model->impl->tokenizer().decode(tokens, n_tokens, &out); !s.ok()) return fail(s);
        if (Status s = write_text(out, text, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API h2o_status h2o_token_to_piece(const h2o_model *model, int32_t token, char *text, size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_token_to_piece: model is NULL");
        if (!text && capacity > 0) return invalid("h2o_token_to_piece: text is NULL but capacity is not 0");
        if (!n_bytes) return invalid("h2o_token_to_piece: n_bytes is NULL");
        const h2o::Tokenizer &tok = model->impl->tokenizer();
        if (token < 0 || token >= tok.n_vocab()) {
            return invalid("token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(tok.n_vocab()) +
                           " tokens");
        }
        std::string piece;
        if (tok.type(token) == h2o::TOKEN_CONTROL) {
            piece = tok.piece(token);  // spelled out, where text rendering leaves it out
        } else {
            tok.append_piece(token, false, &piece);
        }
        if (Status s = write_text(piece, text, capacity, n_bytes, /*terminate=*/false); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API int h2o_token_is_end_of_generation(const h2o_model *model, int32_t token) {
    return model && model->impl->tokenizer().is_end_of_generation(token) ? 1 : 0;
}

namespace {

// The format a name gives, or the model's template when the name is NULL.
Status resolve_chat_format(const h2o_model *model, const char *format_name, h2o::ChatFormat *format) {
    return format_name ? h2o::chat_format_from_name(format_name, format)
                       : h2o::chat_format_from_template(model->impl->chat_template(), format);
}

}  // namespace

H2O_API h2o_status h2o_chat_format(const h2o_model *model, const char *format_name, const h2o_chat_message *messages, size_t n_messages,
                                   int add_assistant_prefix, char *text, size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_chat_format: model is NULL");
        if (!messages && n_messages > 0) return invalid("h2o_chat_format: messages is NULL");
        if (!text && capacity > 0) return invalid("h2o_chat_format: text is NULL but capacity is not 0");
        if (!n_bytes) return invalid("h2o_chat_format: n_bytes is NULL");
        h2o::ChatFormat format;
        Status s = resolve_chat_format(model, format_name, &format);
        if (!s.ok()) return fail(s);
        std::vector<h2o::ChatMessage> list;
        for (size_t i = 0; i < n_messages; ++i) {
            const h2o_chat_message &m = messages[i];
            if ((!m.role && m.role_len) || (!m.content && m.content_len))
                return invalid("message " + std::to_string(i) + " has a NULL role or content");
            const std::string_view role(m.role ? m.role : "", m.role_len), content(m.content ? m.content : "", m.content_len);
            if (!h2o::is_valid_utf8(role) || !h2o::is_valid_utf8(content)) {
                return fail(make_error(H2O_ERR_INVALID_TEXT, "message " + std::to_string(i) + " is not valid UTF-8"));
            }
            list.push_back({role, content});
        }
        const h2o::Tokenizer &tok = model->impl->tokenizer();
        std::string out;
        if (s = h2o::format_chat(format, list, add_assistant_prefix != 0, tok.piece(tok.bos()), tok.piece(tok.eos()), &out); !s.ok())
            return fail(s);
        if (s = write_text(out, text, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

// ---- tool calls ------------------------------------------------------------------------------

namespace {

// The model's chat format (named, or its template's) and the tool syntax it implies.
Status tool_syntax_of(const h2o_model *model, const char *format_name, const char *what, h2o::ToolSyntax *syntax,
                      h2o::ChatFormat *format_out = nullptr) {
    if (!model) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": model is NULL");
    h2o::ChatFormat format;
    H2O_TRY(resolve_chat_format(model, format_name, &format));
    // Mistral's own syntax where its vocabulary has the control token that opens a call.
    const h2o::Tokenizer &tok = model->impl->tokenizer();
    std::vector<int32_t> opener;
    const bool mistral_tokens = format == h2o::ChatFormat::Mistral && tok.encode_special("[TOOL_CALLS]", false, &opener).ok() &&
                                opener.size() == 1 && tok.is_control(opener[0]);
    *syntax = h2o::tool_syntax_for(format, mistral_tokens);
    if (format_out) *format_out = format;
    return Status::Ok();
}

Status text_argument(const char *text, size_t length, const char *what, std::string_view *out) {
    if (!text && length > 0) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL but its length is not 0");
    *out = std::string_view(text ? text : "", length);
    if (!h2o::is_valid_utf8(*out)) return make_error(H2O_ERR_INVALID_TEXT, std::string(what) + " is not valid UTF-8");
    return Status::Ok();
}

Status check_output(const char *text, size_t capacity, const size_t *n_bytes, const char *what) {
    if (!text && capacity > 0)
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": the output is NULL but capacity is not 0");
    if (!n_bytes) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": n_bytes is NULL");
    return Status::Ok();
}

std::string json_string_text(const std::string &text) {
    h2o::JsonValue v;
    v.kind = h2o::JsonValue::kString;
    v.text = text;
    return h2o::json_text(v);
}

}  // namespace

H2O_API h2o_status h2o_chat_format_tools(const h2o_model *model, const char *format_name, const char *messages_json, size_t messages_len,
                                         const char *tools_json, size_t tools_len, int add_assistant_prefix, char *text, size_t capacity,
                                         size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        h2o::ToolSyntax syntax;
        h2o::ChatFormat format;
        std::string_view messages_text, tools_text;
        if (Status s = tool_syntax_of(model, format_name, "h2o_chat_format_tools", &syntax, &format); !s.ok()) return fail(s);
        if (Status s = text_argument(messages_json, messages_len, "messages_json", &messages_text); !s.ok()) return fail(s);
        if (Status s = text_argument(tools_json, tools_len, "tools_json", &tools_text); !s.ok()) return fail(s);
        if (Status s = check_output(text, capacity, n_bytes, "h2o_chat_format_tools"); !s.ok()) return fail(s);
        std::vector<h2o::ToolMessage> messages;
        std::vector<h2o::ToolFunction> tools;
        if (Status s = h2o::parse_tool_messages(messages_text, &messages); !s.ok()) return fail(s);
        if (!tools_text.empty()) {
            if (Status s = h2o::parse_tools(tools_text, &tools); !s.ok()) return fail(s);
        }
        std::vector<std::pair<std::string, std::string>> lowered;
        if (Status s = h2o::lower_tool_conversation(syntax, tools, messages, &lowered); !s.ok()) return fail(s);
        std::vector<h2o::ChatMessage> list;
        for (const auto &[role, content] : lowered) list.push_back({role, content});
        const h2o::Tokenizer &tok = model->impl->tokenizer();
        std::string out;
        if (Status s = h2o::format_chat(format, list, add_assistant_prefix != 0, tok.piece(tok.bos()), tok.piece(tok.eos()), &out); !s.ok())
            return fail(s);
        if (Status s = write_text(out, text, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API h2o_status h2o_tool_call_grammar(const h2o_model *model, const char *format_name, const char *tools_json, size_t tools_len,
                                         const char *tool_choice, int parallel, char *grammar, size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        h2o::ToolSyntax syntax;
        std::string_view tools_text;
        if (Status s = tool_syntax_of(model, format_name, "h2o_tool_call_grammar", &syntax); !s.ok()) return fail(s);
        if (Status s = text_argument(tools_json, tools_len, "tools_json", &tools_text); !s.ok()) return fail(s);
        if (Status s = check_output(grammar, capacity, n_bytes, "h2o_tool_call_grammar"); !s.ok()) return fail(s);
        if (!tool_choice) return invalid("h2o_tool_call_grammar: tool_choice is NULL (auto, required, or a function's name)");
        const std::string_view choice_text = tool_choice;
        const h2o::ToolChoice choice = choice_text == "auto"       ? h2o::ToolChoice::Auto
                                       : choice_text == "required" ? h2o::ToolChoice::Required
                                                                   : h2o::ToolChoice::Named;
        std::vector<h2o::ToolFunction> tools;
        if (Status s = h2o::parse_tools(tools_text, &tools); !s.ok()) return fail(s);
        std::string out;
        if (Status s = h2o::tool_call_grammar(syntax, tools, choice, choice_text, parallel != 0, &out); !s.ok()) return fail(s);
        if (Status s = write_text(out, grammar, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API h2o_status h2o_tool_reply_kind(const h2o_model *model, const char *format_name, const char *reply, size_t reply_len, int *kind) {
    return guarded(nullptr, [&]() -> h2o_status {
        h2o::ToolSyntax syntax;
        std::string_view text;
        if (Status s = tool_syntax_of(model, format_name, "h2o_tool_reply_kind", &syntax); !s.ok()) return fail(s);
        if (!reply && reply_len > 0) return invalid("h2o_tool_reply_kind: reply is NULL but reply_len is not 0");
        if (!kind) return invalid("h2o_tool_reply_kind: kind is NULL");
        text = std::string_view(reply ? reply : "", reply_len);
        *kind = h2o::tool_reply_kind(syntax, text);
        return succeed();
    });
}

H2O_API h2o_status h2o_parse_tool_calls(const h2o_model *model, const char *format_name, const char *reply, size_t reply_len,
                                        uint64_t id_salt, char *json, size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        h2o::ToolSyntax syntax;
        std::string_view text;
        if (Status s = tool_syntax_of(model, format_name, "h2o_parse_tool_calls", &syntax); !s.ok()) return fail(s);
        if (Status s = text_argument(reply, reply_len, "reply", &text); !s.ok()) return fail(s);
        if (Status s = check_output(json, capacity, n_bytes, "h2o_parse_tool_calls"); !s.ok()) return fail(s);
        std::string content;
        std::vector<h2o::ToolCall> calls;
        if (Status s = h2o::parse_tool_reply(syntax, text, id_salt, &content, &calls); !s.ok()) return fail(s);
        std::string out = "{\"content\": " + (calls.empty() ? json_string_text(content) : std::string("null")) + ", \"tool_calls\": [";
        for (size_t i = 0; i < calls.size(); ++i) {
            if (i > 0) out += ", ";
            out += "{\"id\": " + json_string_text(calls[i].id) +
                   ", \"type\": \"function\", \"function\": {\"name\": " + json_string_text(calls[i].name) +
                   ", \"arguments\": " + json_string_text(calls[i].arguments) + "}}";
        }
        out += "]}";
        if (Status s = write_text(out, json, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

// ---- backends --------------------------------------------------------------------------------

namespace {

Status write_backend_info(const h2o::BackendDevice &d, h2o_backend_info *info, const char *what) {
    h2o_backend_info out{};
    out.kind = d.kind;
    out.device_index = d.device_index;
    std::snprintf(out.name, sizeof(out.name), "%s", d.name.c_str());
    std::snprintf(out.device_type, sizeof(out.device_type), "%s", d.type.c_str());
    out.memory_bytes = d.memory_bytes;
    return write_result(out, info, what);
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
        if (!info) return invalid("h2o_backend_get_info: info is NULL");
        const std::vector<h2o::BackendDevice> devices = h2o::list_backend_devices();
        if (index >= devices.size()) {
            return invalid("backend index " + std::to_string(index) + " is out of range (" + std::to_string(devices.size()) + " devices)");
        }
        if (Status s = write_backend_info(devices[index], info, "h2o_backend_get_info: info"); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API const char *h2o_backend_kind_name(uint32_t kind) { return kind < std::size(kBackendKindNames) ? kBackendKindNames[kind] : nullptr; }

H2O_API h2o_status h2o_backend_kind_from_name(const char *name, uint32_t *kind) {
    if (Status s = value_from_name(h2o_backend_kind_name, name, kind, "h2o_backend_kind_from_name"); !s.ok()) return fail(s);
    return succeed();
}

H2O_API const char *h2o_kv_policy_name(uint32_t policy) {
    return policy < h2o::kKvPolicyCount ? h2o::kv_policy_name(static_cast<h2o::KvPolicy>(policy)) : nullptr;
}

H2O_API h2o_status h2o_kv_policy_from_name(const char *name, uint32_t *policy) {
    if (Status s = value_from_name(h2o_kv_policy_name, name, policy, "h2o_kv_policy_from_name"); !s.ok()) return fail(s);
    return succeed();
}

H2O_API h2o_status h2o_kv_policy_get_info(uint32_t policy, h2o_kv_policy_info *info) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (policy >= h2o::kKvPolicyCount)
            return invalid("h2o_kv_policy_get_info: policy " + std::to_string(policy) + " is not a known policy");
        const h2o::KvPolicyTraits &t = h2o::kKvPolicyTraits[policy];
        h2o_kv_policy_info out{};
        out.policy = policy;
        out.name = t.name;
        out.gathers_statistics = h2o::kv_policy_uses_statistics(policy) ? 1 : 0;
        out.has_recent_window = t.has_recent_window ? 1 : 0;
        out.keeps_sinks = t.keeps_sinks ? 1 : 0;
        out.default_recent_ratio = t.default_recent_ratio;
        out.default_horizon = t.default_horizon;
        if (Status s = write_result(out, info, "h2o_kv_policy_get_info: info"); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API const char *h2o_kv_type_name(uint32_t type) {
    return type < h2o::kKvTypeCount ? h2o::kv_type_name(static_cast<h2o::KvType>(type)) : nullptr;
}

H2O_API h2o_status h2o_kv_type_from_name(const char *name, uint32_t *type) {
    if (Status s = value_from_name(h2o_kv_type_name, name, type, "h2o_kv_type_from_name"); !s.ok()) return fail(s);
    return succeed();
}

// ---- sessions --------------------------------------------------------------------------------

H2O_API h2o_status h2o_session_params_init(h2o_session_params *params, size_t struct_size) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (Status s = init_struct(params, struct_size, default_session_params(), "h2o_session_params"); !s.ok()) return fail(s);
        return succeed();
    });
}

namespace {

// Validates params (defaults merged in) and creates the session they describe.
// What resolving a session's settings needs to know of the model and the machine.
h2o::ResolveContext resolve_context(const h2o_model *model) {
    h2o::ResolveContext context;
    context.n_ctx_train = static_cast<int>(std::min<uint32_t>(model->impl->n_ctx_train(), 0x7FFFFFFFu));
    context.n_layer = model->impl->shape().n_layer;
    context.default_threads = h2o::default_thread_count();
    const h2o::ModelShape &shape = model->impl->shape();
    context.n_local_layers = static_cast<int>(std::count(shape.local_layers.begin(), shape.local_layers.end(), 1));
    return context;
}

Status create_session(h2o_model *model, const h2o_session_params &p, std::unique_ptr<h2o_session> *out) {
    const h2o::ResolveContext context = resolve_context(model);
    auto session = std::make_unique<h2o_session>();
    session->model = model->impl;
    H2O_TRY(h2o::resolve_session_settings(p, context, &session->settings));
    H2O_TRY(h2o::Session::create(*model->impl, session->settings, &session->impl));
    *out = std::move(session);
    return Status::Ok();
}

}  // namespace

H2O_API h2o_status h2o_session_create(h2o_model *model, const h2o_session_params *params, h2o_session **out_session) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_session_create: model is NULL");
        if (!out_session) return invalid("h2o_session_create: out_session is NULL");
        h2o_session_params p = default_session_params();
        if (Status s = read_params(params, "h2o_session_params", &p); !s.ok()) return fail(s);
        std::unique_ptr<h2o_session> session;
        if (Status s = create_session(model, p, &session); !s.ok()) return fail(s);
        *out_session = session.release();
        return succeed();
    });
}

H2O_API void h2o_session_free(h2o_session *session) { delete session; }

H2O_API h2o_status h2o_session_get_backend(const h2o_session *session, h2o_backend_info *info) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_backend: session is NULL");
        if (Status s = write_backend_info(session->impl->device(), info, "h2o_session_get_backend: info"); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_device_traffic(const h2o_session *session, h2o_device_traffic *traffic) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_device_traffic: session is NULL");
        const h2o::Backend::Traffic t = session->impl->backend().traffic();
        h2o_device_traffic out{};
        out.bytes_to_device = t.bytes_to_device;
        out.bytes_to_host = t.bytes_to_host;
        out.submissions = t.submissions;
        out.device_memory_bytes = t.device_memory_bytes;
        if (Status s = write_result(out, traffic, "h2o_session_get_device_traffic: traffic"); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_kv_layout(const h2o_session *session, h2o_kv_layout *layout) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_kv_layout: session is NULL");
        const h2o::SessionSettings &s = session->settings;
        h2o_kv_layout out{};
        out.budget = static_cast<uint32_t>(s.kv_budget);
        out.policy = static_cast<uint32_t>(s.policy.policy);
        out.recent = static_cast<uint32_t>(s.policy.recent);
        out.sinks = static_cast<uint32_t>(s.policy.sinks);
        const bool evicting = s.policy.policy != h2o::KvPolicy::Full;
        out.heavy = evicting ? static_cast<uint32_t>(std::max(0, s.kv_budget - s.policy.recent - s.policy.sinks)) : 0;
        out.position_rolling = s.rolling ? 1 : 0;
        out.type = static_cast<uint32_t>(s.kv_type);
        out.n_ctx = static_cast<uint32_t>(s.n_ctx);
        out.horizon = static_cast<uint32_t>(s.policy.horizon);
        const h2o::KvConfig &kv = session->impl->kv_config();
        out.min_layer_budget = static_cast<uint32_t>(kv.min_slots());
        out.max_layer_budget = static_cast<uint32_t>(kv.max_slots());
        out.min_head_budget = static_cast<uint32_t>(kv.min_cell_slots());
        if (Status st = write_result(out, layout, "h2o_session_get_kv_layout: layout"); !st.ok()) return fail(st, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_kv_usage(const h2o_session *session, h2o_kv_usage *usage) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_kv_usage: session is NULL");
        if (Status st = write_result(session->impl->kv_usage(), usage, "h2o_session_get_kv_usage: usage"); !st.ok())
            return fail(st, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_set_event_callback(h2o_session *session, h2o_session_event_callback callback, void *user_data) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_set_event_callback: session is NULL");
        session->impl->set_event_callback(callback, user_data);
        return succeed(session);
    });
}

// ---- research settings (h2o_experimental.h) --------------------------------------------------

H2O_API const char *h2o_experimental_name(uint32_t key) {
    const h2o::CacheSetting *row = h2o::experimental_setting(key);
    return row ? row->name : nullptr;
}

H2O_API h2o_status h2o_experimental_from_name(const char *name, uint32_t *key) {
    if (Status s = value_from_name(h2o_experimental_name, name, key, "h2o_experimental_from_name"); !s.ok()) return fail(s);
    return succeed();
}

H2O_API h2o_status h2o_experimental_bounds(uint32_t key, double *min, double *max) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!min || !max) return invalid("h2o_experimental_bounds: min and max must not be NULL");
        const h2o::CacheSetting *row = h2o::experimental_setting(key);
        if (!row)
            return fail(make_error(H2O_ERR_UNSUPPORTED,
                                   "h2o_experimental_bounds: key " + std::to_string(key) + " is not a research setting of this library"));
        *min = row->min;
        *max = row->max;
        return succeed();
    });
}

namespace {

// The row of a research key that a params struct of params->struct_size bytes holds.
Status experimental_row(const h2o_session_params *params, uint32_t key, const char *function, const h2o::CacheSetting **row) {
    if (!params) return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(function) + ": params is NULL");
    H2O_TRY(check_struct_size(params->struct_size, kFirstVersion<h2o_session_params>, (std::string(function) + ": params").c_str()));
    *row = h2o::experimental_setting(key);
    if (!*row)
        return make_error(H2O_ERR_UNSUPPORTED,
                          std::string(function) + ": key " + std::to_string(key) + " is not a research setting of this library");
    return Status::Ok();
}

}  // namespace

H2O_API h2o_status h2o_session_params_set_experimental(h2o_session_params *params, uint32_t key, double value) {
    return guarded(nullptr, [&]() -> h2o_status {
        const h2o::CacheSetting *row = nullptr;
        if (Status s = experimental_row(params, key, "h2o_session_params_set_experimental", &row); !s.ok()) return fail(s);
        if (Status s = h2o::check_research_value(*row, value); !s.ok()) return fail(s);
        params->experimental[key] = h2o::research_setting_value(*row, value);
        return succeed();
    });
}

H2O_API h2o_status h2o_session_params_get_experimental(const h2o_session_params *params, uint32_t key, double *value) {
    return guarded(nullptr, [&]() -> h2o_status {
        const h2o::CacheSetting *row = nullptr;
        if (Status s = experimental_row(params, key, "h2o_session_params_get_experimental", &row); !s.ok()) return fail(s);
        if (!value) return invalid("h2o_session_params_get_experimental: value is NULL");
        *value = params->experimental[key];
        return succeed();
    });
}

H2O_API h2o_status h2o_session_get_experimental(const h2o_session *session, uint32_t key, double *value) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_experimental: session is NULL");
        if (!value) return invalid("h2o_session_get_experimental: value is NULL", session);
        const h2o::CacheSetting *row = h2o::experimental_setting(key);
        if (!row) {
            return fail(make_error(H2O_ERR_UNSUPPORTED, "h2o_session_get_experimental: key " + std::to_string(key) +
                                                            " is not a research setting of this library"),
                        session);
        }
        *value = h2o::cache_setting_value(*row, session->settings);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_experimental_session_discard(h2o_session *session, uint64_t n_keep, uint64_t n_discard) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_experimental_session_discard: session is NULL");
        // Past these no cell holds that many tokens (nor a stream reaches that index).
        constexpr uint64_t kLimit = uint64_t{1} << 62;
        if (n_discard > kLimit || n_keep > kLimit) return invalid("h2o_experimental_session_discard: a count past 2^62", session);
        session->impl->begin_call();
        session->impl->abandon_generation();
        if (Status s = session->impl->discard_oldest(static_cast<int64_t>(n_keep), static_cast<int64_t>(n_discard)); !s.ok()) {
            return fail(s, session);
        }
        return succeed(session);
    });
}

// Whether n is one entry per slot (per_slot) or per (layer, kv head) of the session's cache.
static bool cache_entries(const h2o_session *session, size_t n, bool per_slot) {
    const h2o::KvConfig &kv = session->impl->kv_config();
    const int64_t expected = per_slot ? kv.total_slots() : static_cast<int64_t>(kv.n_layer) * kv.n_head_kv;
    return n == static_cast<uint64_t>(expected);
}

H2O_API h2o_status h2o_experimental_session_kv_attention(h2o_session *session, int64_t *stream_index, float *attention, size_t n) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_experimental_session_kv_attention: session is NULL");
        if (!stream_index) return invalid("h2o_experimental_session_kv_attention: stream_index is NULL", session);
        if (!cache_entries(session, n, true)) {
            return invalid("h2o_experimental_session_kv_attention: n is not n_layer * n_head_kv * capacity", session);
        }
        session->impl->begin_call();
        if (Status s = session->impl->kv_attention(stream_index, attention); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_experimental_session_evict(h2o_session *session, const int64_t *stream_index, size_t n) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_experimental_session_evict: session is NULL");
        if (!stream_index) return invalid("h2o_experimental_session_evict: stream_index is NULL", session);
        if (!cache_entries(session, n, false)) return invalid("h2o_experimental_session_evict: n is not n_layer * n_head_kv", session);
        session->impl->begin_call();
        session->impl->abandon_generation();
        if (Status s = session->impl->evict_tokens(stream_index); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_reset(h2o_session *session) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_reset: session is NULL");
        if (Status st = session->impl->reset(); !st.ok()) return fail(st, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_set_seed(h2o_session *session, uint64_t seed) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_set_seed: session is NULL");
        session->impl->set_seed(seed);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_cancel(h2o_session *session) {
    // No guarded() and no message: this runs beside the session's own thread, whose messages it
    // must not touch.
    if (!session) return fail(make_error(H2O_ERR_INVALID_ARGUMENT, "h2o_session_cancel: session is NULL"));
    session->impl->cancel();
    return H2O_OK;
}

// ---- session state ---------------------------------------------------------------------------

namespace {

using h2o::params_for;
using h2o::same_cache_settings;

// A new session with `settings` (from a snapshot) holding `state`, with the host's choices of
// `host` (already checked).
Status session_from_state(h2o_model *model, const h2o::SessionSettings &settings, const h2o_session_params &host,
                          const std::vector<uint8_t> &state, std::unique_ptr<h2o_session> *out, bool has_span_table = true) {
    std::unique_ptr<h2o_session> session;
    if (Status s = create_session(model, params_for(settings, host), &session); !s.ok()) {
        // The host's choices were valid, so the snapshot's settings are not.
        if (s.code != H2O_ERR_INVALID_ARGUMENT) return s;
        return make_error(H2O_ERR_STATE_FORMAT, "not a valid session snapshot: its settings are out of range (" + s.message + ")");
    }
    if (!same_cache_settings(session->settings, settings)) {
        return make_error(H2O_ERR_STATE_FORMAT, "not a valid session snapshot: its settings do not describe a session this library makes");
    }
    H2O_TRY(session->impl->load_state(state.data(), state.size(), has_span_table));
    *out = std::move(session);
    return Status::Ok();
}

// Checks the host's choices (threads, backend, device, memory cap) of a session made from a
// snapshot, so that a refusal of the snapshot's settings is the snapshot's fault.
Status check_host_params(const h2o_model *model, const h2o_session_params &host) {
    h2o::SessionSettings ignored;
    return h2o::resolve_session_settings(params_for(h2o::SessionSettings{}, host), resolve_context(model), &ignored);
}

// The most state a session with these settings can save: its KV cache and activations (a loose
// bound: activations are not saved), the logits and the token history, plus slack for scalars.
uint64_t snapshot_payload_limit(const h2o::Model &model, const h2o::SessionSettings &settings) {
    return h2o::Session::planned_bytes(model, settings) + static_cast<uint64_t>(model.shape().n_vocab) * sizeof(float) +
           h2o::TokenHistory::kCapacity * sizeof(int32_t) + 65536;
}

Status snapshot_bytes(h2o_session *session, std::vector<uint8_t> *out) {
    std::vector<uint8_t> state;
    H2O_TRY(session->impl->save_state(&state));
    return h2o::encode_snapshot(*session->impl, state, out);
}

Status load_snapshot(h2o_model *model, const uint8_t *data, size_t size, const h2o_session_params *params,
                     std::unique_ptr<h2o_session> *out) {
    h2o_session_params host = default_session_params();
    H2O_TRY(read_params(params, "h2o_session_params", &host));
    H2O_TRY(check_host_params(model, host));
    h2o::SnapshotHeader header;
    H2O_TRY(h2o::read_snapshot_header(data, size, model->impl->fingerprint(), &header));
    std::vector<uint8_t> state;
    H2O_TRY(h2o::read_snapshot_payload(data, header, snapshot_payload_limit(*model->impl, header.settings), &state));
    return session_from_state(model, header.settings, host, state, out, header.version >= 3);
}

}  // namespace

H2O_API h2o_status h2o_session_save(h2o_session *session, const char *path) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_save: session is NULL");
        if (!path || !*path) return invalid("h2o_session_save: path is NULL or empty", session);
        std::vector<uint8_t> bytes;
        if (Status s = snapshot_bytes(session, &bytes); !s.ok()) return fail(s, session);
        Status s = h2o::write_file_atomically(path, [&](const h2o::ByteSink &sink) { return sink(bytes.data(), bytes.size()); });
        if (!s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_load(h2o_model *model, const char *path, const h2o_session_params *params, h2o_session **out_session) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_session_load: model is NULL");
        if (!path) return invalid("h2o_session_load: path is NULL");
        if (!out_session) return invalid("h2o_session_load: out_session is NULL");
        // The header is read and checked first, so that the file is read whole only when its
        // length is what a session of its settings can need. (Read, not mapped: the bytes cannot
        // change after they are checked.)
        std::vector<uint8_t> bytes;
        uint64_t file_size = 0;
        h2o::SnapshotHeader header;
        Status s = h2o::read_file(path, h2o::snapshot_header_size(), &bytes, &file_size);
        if (s.ok())
            s = h2o::read_snapshot_header(bytes.data(), bytes.size() < h2o::snapshot_header_size() ? bytes.size() : file_size,
                                          model->impl->fingerprint(), &header);
        if (s.ok() && header.compressed_size > ZSTD_compressBound(snapshot_payload_limit(*model->impl, header.settings))) {
            s = make_error(H2O_ERR_STATE_FORMAT, "not a valid session snapshot: " + std::to_string(file_size) +
                                                     " bytes is more than a session of its settings can need");
        }
        if (s.ok()) s = h2o::read_file(path, file_size, &bytes, &file_size);
        if (!s.ok()) return fail(make_error(s.code, s.code == H2O_ERR_IO ? s.message : std::string(path) + ": " + s.message));
        std::unique_ptr<h2o_session> session;
        if (s = load_snapshot(model, bytes.data(), bytes.size(), params, &session); !s.ok()) {
            return fail(make_error(s.code, std::string(path) + ": " + s.message));
        }
        *out_session = session.release();
        return succeed();
    });
}

H2O_API h2o_status h2o_session_state_size(h2o_session *session, size_t *size) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_state_size: session is NULL");
        if (!size) return invalid("h2o_session_state_size: size is NULL", session);
        std::vector<uint8_t> state;
        if (Status s = session->impl->save_state(&state); !s.ok()) return fail(s, session);
        *size = h2o::snapshot_size_bound(state.size());
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_save_to_buffer(h2o_session *session, void *buffer, size_t capacity, size_t *size) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_save_to_buffer: session is NULL");
        if (!size) return invalid("h2o_session_save_to_buffer: size is NULL", session);
        if (!buffer && capacity > 0) return invalid("h2o_session_save_to_buffer: buffer is NULL but capacity is not 0", session);
        std::vector<uint8_t> bytes;
        if (Status s = snapshot_bytes(session, &bytes); !s.ok()) return fail(s, session);
        *size = bytes.size();
        if (bytes.size() > capacity) {
            return fail(make_error(H2O_ERR_BUFFER_TOO_SMALL, "the snapshot needs " + std::to_string(bytes.size()) + " bytes; capacity is " +
                                                                 std::to_string(capacity)),
                        session);
        }
        std::memcpy(buffer, bytes.data(), bytes.size());
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_load_from_buffer(h2o_model *model, const void *buffer, size_t size, const h2o_session_params *params,
                                                h2o_session **out_session) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_session_load_from_buffer: model is NULL");
        if (!buffer && size > 0) return invalid("h2o_session_load_from_buffer: buffer is NULL");
        if (!out_session) return invalid("h2o_session_load_from_buffer: out_session is NULL");
        std::unique_ptr<h2o_session> session;
        if (Status s = load_snapshot(model, static_cast<const uint8_t *>(buffer), size, params, &session); !s.ok()) return fail(s);
        *out_session = session.release();
        return succeed();
    });
}

H2O_API h2o_status h2o_session_fork(h2o_session *source, h2o_session **out_session) {
    return guarded(source, [&]() -> h2o_status {
        if (!source) return invalid("h2o_session_fork: source is NULL");
        if (!out_session) return invalid("h2o_session_fork: out_session is NULL", source);
        std::vector<uint8_t> state;
        if (Status s = source->impl->save_state(&state); !s.ok()) return fail(s, source);
        // The copy runs where the source runs, with its threads and memory cap.
        const h2o::SessionSettings &from = source->settings;
        h2o_session_params host = default_session_params();
        host.n_threads = static_cast<uint32_t>(from.n_threads);
        host.backend = source->impl->device().kind;
        host.device_index = source->impl->device().device_index;
        host.max_memory_bytes = from.max_memory_bytes;
        h2o_model handle{source->model};
        std::unique_ptr<h2o_session> session;
        if (Status s = session_from_state(&handle, from, host, state, &session); !s.ok()) return fail(s, source);
        *out_session = session.release();
        return succeed(source);
    });
}

H2O_API const char *h2o_session_last_error(const h2o_session *session) { return session ? session->last_error.c_str() : ""; }

// ---- generation ------------------------------------------------------------------------------

H2O_API h2o_status h2o_generate_params_init(h2o_generate_params *params, size_t struct_size) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (Status s = init_struct(params, struct_size, default_generate_params(), "h2o_generate_params"); !s.ok()) return fail(s);
        return succeed();
    });
}

namespace {

// A grammar from a GBNF text or a JSON schema (one of the two; neither: none).
Status compile_grammar(const char *grammar, size_t grammar_len, const char *schema, size_t schema_len, const char *what,
                       std::shared_ptr<const h2o::Grammar> *out) {
    auto bad = [&](const std::string &m) { return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + m); };
    if (!grammar && grammar_len > 0) return bad("grammar is NULL but grammar_len is not 0");
    if (!schema && schema_len > 0) return bad("json_schema is NULL but json_schema_len is not 0");
    out->reset();
    if (grammar_len == 0 && schema_len == 0) return Status::Ok();
    if (grammar_len > 0 && schema_len > 0) return bad("grammar and json_schema are both given (one of them at most)");
    std::string text;
    if (schema_len > 0) H2O_TRY(h2o::json_schema_to_grammar(std::string_view(schema, schema_len), &text));
    auto g = std::make_shared<h2o::Grammar>();
    H2O_TRY(h2o::parse_grammar(schema_len > 0 ? std::string_view(text) : std::string_view(grammar, grammar_len), g.get()));
    *out = std::move(g);
    return Status::Ok();
}

Status to_generate_settings(const h2o_generate_params &p, int32_t n_vocab, h2o::GenerateSettings *out) {
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
    if (p.stop_at_eos != 0 && p.stop_at_eos != 1) return bad("stop_at_eos must be 0 or 1");
    out->stop_strings.clear();
    for (size_t i = 0; i < p.n_stop_strings; ++i) {
        const char *stop = p.stop_strings[i];
        if (!stop || !*stop) return bad("stop_strings[" + std::to_string(i) + "] is NULL or empty");
        if (!h2o::is_valid_utf8(stop))
            return make_error(H2O_ERR_INVALID_TEXT, "stop_strings[" + std::to_string(i) + "] is not valid UTF-8");
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
    if (p.n_logit_bias > 0 && (!p.logit_bias_tokens || !p.logit_bias_values))
        return bad("logit_bias_tokens and logit_bias_values must not be NULL when n_logit_bias is not 0");
    if (p.n_logit_bias > static_cast<size_t>(n_vocab)) return bad("n_logit_bias exceeds the vocabulary");
    out->sampler.logit_bias.clear();
    for (size_t i = 0; i < p.n_logit_bias; ++i) {
        const int32_t token = p.logit_bias_tokens[i];
        const float bias = p.logit_bias_values[i];
        if (token < 0 || token >= n_vocab)
            return bad("logit_bias_tokens[" + std::to_string(i) + "] = " + std::to_string(token) + " is outside the vocabulary");
        if (std::isnan(bias) || bias == INFINITY) return bad("logit_bias_values[" + std::to_string(i) + "] must be a number or -infinity");
        out->sampler.logit_bias.emplace_back(token, bias);
    }
    return compile_grammar(p.grammar, p.grammar_len, p.json_schema, p.json_schema_len, "h2o_generate_params: ", &out->grammar);
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

namespace {

// The checks and conversions h2o_generate and h2o_generate_begin share.
Status read_generate_call(h2o_session *session, const char *prompt, size_t prompt_len, const h2o_generate_params *params,
                          const char *function, h2o::GenerateSettings *settings) {
    if (!prompt && prompt_len > 0) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(function) + ": prompt is NULL but prompt_len is not 0");
    }
    h2o_generate_params p = default_generate_params();
    H2O_TRY(read_params(params, "h2o_generate_params", &p));
    return to_generate_settings(p, session->impl->model().shape().n_vocab, settings);
}

std::string_view text_view(const char *text, size_t length) { return length ? std::string_view(text, length) : std::string_view(); }

}  // namespace

H2O_API h2o_status h2o_generate(h2o_session *session, const char *prompt, size_t prompt_len, const h2o_generate_params *params,
                                h2o_token_callback callback, void *user_data) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_generate: session is NULL");
        session->impl->begin_call();
        h2o::GenerateSettings settings;
        if (Status s = read_generate_call(session, prompt, prompt_len, params, "h2o_generate", &settings); !s.ok()) return fail(s, session);
        CallbackBridge bridge{callback, user_data};
        if (Status s = session->impl->generate(text_view(prompt, prompt_len), settings, call_token_callback, &bridge); !s.ok()) {
            return fail(s, session);
        }
        return succeed(session);
    });
}

H2O_API h2o_status h2o_generate_begin(h2o_session *session, const char *prompt, size_t prompt_len, const h2o_generate_params *params) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_generate_begin: session is NULL");
        session->impl->begin_call();
        h2o::GenerateSettings settings;
        if (Status s = read_generate_call(session, prompt, prompt_len, params, "h2o_generate_begin", &settings); !s.ok())
            return fail(s, session);
        if (Status s = session->impl->begin_generation(text_view(prompt, prompt_len), settings); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_generate_next(h2o_session *session, const char **text, size_t *length, uint32_t *stop_reason) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_generate_next: session is NULL");
        if (!text || !length || !stop_reason) return invalid("h2o_generate_next: text, length and stop_reason must not be NULL", session);
        // No begin_call(): a pull-style generation is one call from _begin to its end, so a cancel
        // that arrives between two _next calls stops the next one.
        h2o_stop_reason reason = H2O_STOP_NONE;
        if (Status s = session->impl->next_piece(&session->piece, &reason); !s.ok()) return fail(s, session);
        *text = session->piece.c_str();
        *length = session->piece.size();
        *stop_reason = reason;
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_stats(const h2o_session *session, h2o_generate_stats *stats) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_stats: session is NULL");
        h2o_generate_stats out = session->impl->stats();
        out.n_past = static_cast<uint64_t>(session->impl->n_past());
        if (Status s = write_result(out, stats, "h2o_session_get_stats: stats"); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_memory(const h2o_session *session, h2o_memory_report *report) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_memory: session is NULL");
        if (Status s = write_result(session->impl->memory(), report, "h2o_session_memory: report"); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_add_text(h2o_session *session, const char *text, size_t text_len, uint32_t flags) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_add_text: session is NULL");
        if (!text && text_len > 0) return invalid("h2o_session_add_text: text is NULL but text_len is not 0", session);
        if (flags & ~(H2O_TEXT_PIN | H2O_TEXT_SPECIAL))
            return invalid("h2o_session_add_text: unknown flags " + std::to_string(flags), session);
        session->impl->begin_call();
        session->impl->abandon_generation();
        if (Status s = session->impl->add_text(text_view(text, text_len), (flags & H2O_TEXT_PIN) != 0, (flags & H2O_TEXT_SPECIAL) != 0);
            !s.ok())
            return fail(s, session);
        return succeed(session);
    });
}

static_assert(H2O_MAX_SPANS == h2o::KV_MAX_SPANS, "the public span limit is the cache's");

H2O_API h2o_status h2o_session_add_span_text(h2o_session *session, uint32_t span_id, float min_share, const char *text, size_t text_len,
                                             uint32_t flags) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_add_span_text: session is NULL");
        if (!text && text_len > 0) return invalid("h2o_session_add_span_text: text is NULL but text_len is not 0", session);
        if (flags & ~(H2O_TEXT_PIN | H2O_TEXT_SPECIAL))
            return invalid("h2o_session_add_span_text: unknown flags " + std::to_string(flags), session);
        session->impl->begin_call();
        session->impl->abandon_generation();
        if (Status s = session->impl->add_span_text(span_id, min_share, text_view(text, text_len), (flags & H2O_TEXT_PIN) != 0,
                                                    (flags & H2O_TEXT_SPECIAL) != 0);
            !s.ok()) {
            return fail(s, session);
        }
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_span_info(h2o_session *session, uint32_t span_id, h2o_span_info *info) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_span_info: session is NULL");
        h2o::SpanReport report;
        if (Status s = session->impl->span_report(span_id, &report); !s.ok()) return fail(s, session);
        h2o_span_info out{};
        out.span_id = report.span.id;
        out.min_share = report.span.min_share;
        out.min_tokens = report.span.min_tokens;
        out.n_tokens = report.span.n_tokens;
        out.kept_min = report.kept_min;
        out.kept_max = report.kept_max;
        out.kept_mean = report.kept_mean;
        out.attention_share = report.attention_share;
        if (Status s = write_result(out, info, "h2o_session_get_span_info: info"); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_decode(h2o_session *session, const int32_t *tokens, size_t n_tokens) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_decode: session is NULL");
        if (!tokens && n_tokens > 0) return invalid("h2o_session_decode: tokens is NULL", session);
        if (n_tokens == 0) return invalid("h2o_session_decode: n_tokens is 0", session);
        session->impl->begin_call();
        session->impl->abandon_generation();
        if (Status s = session->impl->decode(tokens, n_tokens); !s.ok()) return fail(s, session);
        return succeed(session);
    });
}

H2O_API h2o_status h2o_session_get_logits(const h2o_session *session, float *logits, size_t capacity) {
    return guarded(session, [&]() -> h2o_status {
        if (!session) return invalid("h2o_session_get_logits: session is NULL");
        if (!logits) return invalid("h2o_session_get_logits: logits is NULL", session);
        if (Status st = session->impl->fetch_logits(); !st.ok()) return fail(st, session);
        const std::vector<float> &src = session->impl->logits();
        if (capacity < src.size()) {
            return fail(make_error(H2O_ERR_BUFFER_TOO_SMALL,
                                   "logits need " + std::to_string(src.size()) + " floats; capacity is " + std::to_string(capacity)),
                        session);
        }
        if (!session->impl->has_logits()) return invalid("no token has been processed yet", session);
        std::memcpy(logits, src.data(), src.size() * sizeof(float));
        return succeed(session);
    });
}

// ---- grammars for custom samplers ------------------------------------------------------------

struct h2o_grammar {
    std::shared_ptr<const h2o::Model> model;  // the vocabulary the matcher walks
    std::unique_ptr<h2o::GrammarMatcher> matcher;
    std::vector<uint8_t> allowed;
};

H2O_API h2o_status h2o_grammar_create(h2o_model *model, const char *grammar, size_t grammar_len, const char *json_schema,
                                      size_t json_schema_len, h2o_grammar **out_grammar) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!model) return invalid("h2o_grammar_create: model is NULL");
        if (!out_grammar) return invalid("h2o_grammar_create: out_grammar is NULL");
        *out_grammar = nullptr;
        std::shared_ptr<const h2o::Grammar> compiled;
        if (Status s = compile_grammar(grammar, grammar_len, json_schema, json_schema_len, "h2o_grammar_create: ", &compiled); !s.ok())
            return fail(s);
        if (!compiled) return invalid("h2o_grammar_create: give a grammar or a json_schema");
        auto g = std::make_unique<h2o_grammar>();
        g->model = model->impl;
        const h2o::Tokenizer &tok = model->impl->tokenizer();
        g->matcher = std::make_unique<h2o::GrammarMatcher>(
            compiled, h2o::TokenSurfaces::build(tok, h2o::TokenSurfaces::spelled_controls(tok, *compiled)));
        if (!g->matcher->failure().ok()) return fail(g->matcher->failure());
        *out_grammar = g.release();
        return succeed();
    });
}

H2O_API void h2o_grammar_free(h2o_grammar *grammar) { delete grammar; }

H2O_API h2o_status h2o_grammar_apply(h2o_grammar *grammar, float *logits, size_t n_logits) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!grammar || !logits) return invalid("h2o_grammar_apply: grammar and logits must not be NULL");
        const auto n_vocab = static_cast<size_t>(grammar->model->shape().n_vocab);
        if (n_logits != n_vocab)
            return invalid("h2o_grammar_apply: n_logits is " + std::to_string(n_logits) + ", the vocabulary has " +
                           std::to_string(n_vocab));
        grammar->matcher->mask(&grammar->allowed, 0);
        if (!grammar->matcher->failure().ok()) return fail(grammar->matcher->failure());
        for (size_t t = 0; t < n_vocab; ++t) {
            if (!grammar->allowed[t]) logits[t] = -INFINITY;
        }
        return succeed();
    });
}

H2O_API h2o_status h2o_grammar_accept(h2o_grammar *grammar, int32_t token) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!grammar) return invalid("h2o_grammar_accept: grammar is NULL");
        if (Status s = grammar->matcher->accept(token); !s.ok()) return fail(s);
        return succeed();
    });
}

H2O_API int32_t h2o_grammar_state(const h2o_grammar *grammar) {
    if (!grammar) return -1;
    return grammar->matcher->must_end() ? 2 : grammar->matcher->can_end() ? 1 : 0;
}

H2O_API h2o_status h2o_grammar_reset(h2o_grammar *grammar) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!grammar) return invalid("h2o_grammar_reset: grammar is NULL");
        grammar->matcher->reset();
        return succeed();
    });
}

H2O_API h2o_status h2o_json_schema_to_grammar(const char *schema, size_t schema_len, char *text, size_t capacity, size_t *n_bytes) {
    return guarded(nullptr, [&]() -> h2o_status {
        if (!schema || !n_bytes) return invalid("h2o_json_schema_to_grammar: schema and n_bytes must not be NULL");
        if (!text && capacity > 0) return invalid("h2o_json_schema_to_grammar: text is NULL but capacity is not 0");
        std::string grammar;
        if (Status s = h2o::json_schema_to_grammar(std::string_view(schema, schema_len), &grammar); !s.ok()) return fail(s);
        if (Status s = write_text(grammar, text, capacity, n_bytes); !s.ok()) return fail(s);
        return succeed();
    });
}

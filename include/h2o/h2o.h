/**
 * @file h2o.h
 * The public C API of h2o, an embeddable runtime for Llama-family language models that runs in
 * constant memory.
 *
 * If it is not in this file, it is not API. Everything here is plain C99.
 *
 * Conventions
 * -----------
 * - Objects are opaque handles: h2o_model (read-only weights + tokenizer) and h2o_session
 *   (one conversation: KV cache, sampler state, scratch).
 * - Every fallible call returns an h2o_status. H2O_OK is 0; other codes are stable small integers
 *   that will never be renumbered. New codes may be added in later versions, and so may new values
 *   of every enumeration below: treat an unknown value as "some other error/kind".
 *   h2o_status_string() names a code.
 * - The message of the most recent failure is available from h2o_last_error() (thread-local, for
 *   every call) and from h2o_session_last_error() (per session). Messages stay valid until the
 *   next h2o call on the same thread (respectively the same session).
 * - On failure, output pointers are left untouched unless documented otherwise, and the state of
 *   the objects involved is unchanged unless documented otherwise.
 * - Structs passed in either direction begin with `uint32_t struct_size`, the number of bytes the
 *   caller's version of the struct has, so that an older or newer caller and library agree:
 *   - parameter structs are filled with defaults by h2o_*_params_init(&params, sizeof params),
 *     which writes exactly that many bytes; change the fields you need afterwards. Passing NULL
 *     instead of a parameter struct means "all defaults";
 *   - output structs (h2o_*_info, h2o_*_stats, ...): set struct_size, and the library writes
 *     that many bytes: an older caller gets the prefix it knows, and a newer caller's fields that
 *     this library does not know are set to 0;
 *   - a struct_size smaller than the first published version of a struct is
 *     H2O_ERR_INVALID_ARGUMENT; a larger input struct than this library knows is accepted only
 *     when the bytes it does not know are all zero (that is, unused).
 *   Fields that hold one of this header's enumerations are uint32_t (or int32_t) so their size
 *   never depends on the compiler; the comment beside each names its enumeration.
 * - Text is passed as a pointer and a length in bytes (it need not be NUL-terminated) and must
 *   be UTF-8.
 * - Free functions accept NULL and do nothing.
 *
 * Threading contract
 * ------------------
 * - A model is immutable after h2o_model_load(). One model may be shared by any number of
 *   sessions used concurrently on different threads. Every session keeps its model alive:
 *   h2o_model_free() may be called while sessions still use the model (garbage-collected hosts
 *   cannot order their finalisers); the memory goes when the last of them is freed.
 * - A session is used by one thread at a time. Different sessions may run on different threads
 *   at the same time. Callbacks run on the thread that called into the library. The one call
 *   that may be made on a session from any thread, at any time, is h2o_session_cancel().
 * - The log callback is called without any lock of the library held: it may call any h2o
 *   function, including h2o_set_log_callback(). It may be called from several threads at once.
 */
#ifndef H2O_H2O_H
#define H2O_H2O_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(H2O_BUILDING_SHARED)
#define H2O_API __declspec(dllexport)
#elif defined(_WIN32) && defined(H2O_USING_SHARED)
#define H2O_API __declspec(dllimport)
#elif defined(__GNUC__) && defined(H2O_BUILDING_SHARED)
#define H2O_API __attribute__((visibility("default")))
#else
#define H2O_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define H2O_VERSION_MAJOR 0 /**< The version of the library this header belongs to: major, */
#define H2O_VERSION_MINOR 7 /**< minor, */
#define H2O_VERSION_PATCH 0 /**< and patch. */
/** The version as one number, MAJOR * 10000 + MINOR * 100 + PATCH (h2o_version_number()'s). */
#define H2O_VERSION_NUMBER (H2O_VERSION_MAJOR * 10000 + H2O_VERSION_MINOR * 100 + H2O_VERSION_PATCH)
/** The binary interface this header declares: the shared library's soname is libh2o-llm.so.N.
 * It changes only when a struct declared here changes other than by appending fields, or a
 * function is removed or changes its signature. Version 1 (library 0.7) moved the research
 * settings of the KV cache into h2o_experimental.h. What h2o_experimental.h declares is outside
 * this promise. */
#define H2O_ABI_VERSION 1

/** The library's version as "MAJOR.MINOR.PATCH". Compare h2o_version_number() with
 * H2O_VERSION_NUMBER to detect a header/library mismatch. */
H2O_API const char *h2o_version(void);
/** The library's version as one number (see H2O_VERSION_NUMBER). */
H2O_API uint32_t h2o_version_number(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------------------------- */

/** What a call did: H2O_OK, or why it failed. */
typedef enum h2o_status {
    H2O_OK = 0,                      /**< success */
    H2O_ERR_INVALID_ARGUMENT = 1,    /**< NULL handle, bad parameter, struct_size mismatch */
    H2O_ERR_OUT_OF_MEMORY = 2,       /**< an allocation failed; nothing was changed */
    H2O_ERR_IO = 3,                  /**< a file could not be opened, mapped or read */
    H2O_ERR_MODEL_FORMAT = 4,        /**< the model file is malformed, truncated or inconsistent */
    H2O_ERR_UNSUPPORTED = 5,         /**< well-formed, but uses an architecture/type we do not run */
    H2O_ERR_CONTEXT_FULL = 6,        /**< the session's KV cache cannot take more tokens */
    H2O_ERR_BACKEND_UNAVAILABLE = 7, /**< the requested compute backend or device is not present */
    H2O_ERR_INVALID_TEXT = 8,        /**< text is not valid UTF-8 */
    H2O_ERR_BUFFER_TOO_SMALL = 9,    /**< an output buffer is too small; the needed size is reported */
    H2O_ERR_TOKENIZER = 10,          /**< the tokenizer could not be built or failed */
    H2O_ERR_INTERNAL = 11,           /**< a bug in h2o; please report it with the message */
    H2O_ERR_CANCELLED = 12,          /**< h2o_session_cancel() or a progress callback stopped the call */
    H2O_ERR_STATE_FORMAT = 13,       /**< a saved session state is malformed, truncated or foreign */
    H2O_ERR_BACKEND_FAILED = 14      /**< the compute device failed while running (a lost device, a
                                      * failed submission or kernel launch): the session refuses
                                      * further work until h2o_session_reset() */
} h2o_status;

/** A constant English name for a status code, e.g. "invalid argument"; "unknown status" for a
 * code this library does not know. Never NULL. */
H2O_API const char *h2o_status_string(int32_t status);

/** The message of the most recent failed call made on this thread ("" if none). Valid until the
 * next h2o call on this thread. */
H2O_API const char *h2o_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------- */

/** How much a log message matters (h2o_set_log_callback). */
typedef enum h2o_log_level {
    H2O_LOG_DEBUG = 0, /**< details for developers */
    H2O_LOG_INFO = 1,  /**< what the library chose (backend, kernels, memory) */
    H2O_LOG_WARN = 2,  /**< something the caller may want to fix */
    H2O_LOG_ERROR = 3, /**< a failure (the failed call also returns it) */
    H2O_LOG_NONE = 4   /**< as a minimum level: no messages */
} h2o_log_level;

/** Receives one log message (a NUL-terminated line without its newline) and the user_data given
 * to h2o_set_log_callback. */
typedef void (*h2o_log_callback)(h2o_log_level level, const char *message, void *user_data);

/** Routes library log messages at or above min_level (an h2o_log_level) to callback (NULL
 * silences the library). The default writes WARN and above to stderr. A min_level outside
 * DEBUG..NONE is H2O_ERR_INVALID_ARGUMENT and changes nothing. A message being delivered on
 * another thread while this is called may still reach the previous callback. */
H2O_API h2o_status h2o_set_log_callback(h2o_log_callback callback, void *user_data, int32_t min_level);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

/** A loaded model: weights and tokenizer, read-only, shared by its sessions (see the threading
 * contract above). */
typedef struct h2o_model h2o_model;

/** Reports loading progress: fraction goes from 0 to 1. Return 0 to continue, non-zero to cancel
 * the load (h2o_model_load then returns H2O_ERR_CANCELLED and keeps nothing). */
typedef int (*h2o_progress_callback)(float fraction, void *user_data);

/** Which entries a bounded cache gives up first when it is full (h2o_model_params.
 * prefix_cache_policy; since 0.8). */
typedef enum h2o_cache_policy {
    /** The default: the lowest expected saving first. Each entry's probability of being used
     * again is estimated from how often entries used as often as it was were used again, and
     * after how long (learned as the cache runs), and from how long it has been idle; ties go
     * least recently used first. A prompt many sessions begin with outlasts a stream of prompts
     * used once, which plain LRU lets push it out. */
    H2O_CACHE_POLICY_REUSE = 0,
    /** The least recently used first. */
    H2O_CACHE_POLICY_LRU = 1,
} h2o_cache_policy;

/** How h2o_model_load loads a model (h2o_model_params_init writes the defaults). */
typedef struct h2o_model_params {
    uint32_t struct_size; /**< sizeof(h2o_model_params) of the caller (see the conventions above) */
    /** Optional path of a sentencepiece .model file to use instead of the vocabulary embedded in
     * the GGUF file. NULL or "" (the default): use the embedded vocabulary. */
    const char *tokenizer_path;
    /** Optional progress callback (default NULL) and its user_data. Loading reads every weight
     * page once, so that the first generated token does not wait for the disk; progress follows
     * the bytes read. */
    h2o_progress_callback progress;
    void *progress_user_data; /**< passed to progress */
    /** Bytes the model may keep of processed prompt prefixes (0, the default: no prefix cache).
     * When a fresh session's first text (h2o_session_add_text, h2o_generate or
     * h2o_session_decode; pinned or not) begins with tokens another session of this model already
     * processed as its first text, with the same cache-shaping settings (those a snapshot
     * stores), the session starts from that state instead of processing them again. Prompts of at
     * least 16 tokens are kept; prefix_cache_policy chooses which go when it is full. The numbers
     * equal those of a session that processed the same calls; only batching a prompt differently
     * changes them in the last bits, as it always does. CPU backend only (others process every
     * prompt). */
    uint64_t prefix_cache_bytes;
    /** Which prompts the prefix cache gives up first when it is full (h2o_cache_policy; since
     * 0.8). Default H2O_CACHE_POLICY_REUSE. */
    uint32_t prefix_cache_policy;
} h2o_model_params;

/** Writes the defaults into the first struct_size bytes of *params (struct_size = sizeof *params
 * for callers built against this header). Errors: H2O_ERR_INVALID_ARGUMENT (NULL, or a size
 * smaller than the first version of the struct). */
H2O_API h2o_status h2o_model_params_init(h2o_model_params *params, size_t struct_size);

/** Loads a GGUF (v2 or v3) Llama model. The file is memory-mapped and validated before any field
 * is used. params may be NULL (defaults). On success *out_model receives the model. Errors:
 * H2O_ERR_INVALID_ARGUMENT (NULL path or out pointer), H2O_ERR_IO (cannot open/map, or path is a
 * directory), H2O_ERR_MODEL_FORMAT (malformed or truncated file; the message names the key,
 * tensor or offset), H2O_ERR_UNSUPPORTED (architecture or tensor type), H2O_ERR_TOKENIZER,
 * H2O_ERR_OUT_OF_MEMORY, H2O_ERR_CANCELLED (the progress callback asked to stop). */
H2O_API h2o_status h2o_model_load(const char *path, const h2o_model_params *params, h2o_model **out_model);
/** Releases the caller's reference. Sessions created from the model keep it alive until they are
 * freed; after this call the handle must not be used again. */
H2O_API void h2o_model_free(h2o_model *model);

/** A model's shape (h2o_model_get_info). */
typedef struct h2o_model_info {
    uint32_t struct_size;  /**< sizeof(h2o_model_info) of the caller */
    uint32_t n_vocab;      /**< tokens in the vocabulary (the logits' count) */
    uint32_t n_ctx_train;  /**< context length from the metadata (validated: 1 .. 2^24) */
    uint32_t n_embd;       /**< width of the residual stream */
    uint32_t n_layer;      /**< transformer blocks */
    uint32_t n_head;       /**< query heads */
    uint32_t n_head_kv;    /**< key/value heads (fewer than n_head under grouped-query attention) */
    uint32_t n_ff;         /**< width of the feed-forward network */
    uint32_t head_dim;     /**< elements of one head of q, k and v */
    int32_t bos_token;     /**< -1 when the model has none */
    int32_t eos_token;     /**< -1 when the model has none */
    uint64_t n_params;     /**< number of weight elements */
    uint64_t weight_bytes; /**< bytes of all weight tensors as stored */
} h2o_model_info;

/** What the model's prefix cache holds and has done (set stats->struct_size first). */
typedef struct h2o_prefix_cache_stats {
    uint32_t struct_size; /**< sizeof(h2o_prefix_cache_stats) of the caller */
    uint32_t entries;     /**< processed prefixes held */
    uint64_t bytes;       /**< bytes held, at most h2o_model_params.prefix_cache_bytes */
    uint64_t hits;        /**< fresh sessions that started from a cached prefix */
    uint64_t misses;      /**< fresh sessions that found none */
} h2o_prefix_cache_stats;

/** Fills *stats with what the model's prefix cache holds (set stats->struct_size first). */
H2O_API h2o_status h2o_model_get_prefix_cache_stats(const h2o_model *model, h2o_prefix_cache_stats *stats);

/** Fills *info (set info->struct_size first: see the conventions above). */
H2O_API h2o_status h2o_model_get_info(const h2o_model *model, h2o_model_info *info);

/** What h2o_model_get_text describes (since 0.6). */
typedef enum h2o_model_text {
    H2O_MODEL_TEXT_NAME = 0, /**< general.name; "" when the file has none */
    /** The h2o_chat_format name of the format the model's tokenizer.chat_template describes (what
     * h2o_chat_format uses for a NULL format_name). A model without a template, or with one of no
     * known format, fails with H2O_ERR_UNSUPPORTED and the reason. */
    H2O_MODEL_TEXT_CHAT_FORMAT = 1,
    H2O_MODEL_TEXT_ARCHITECTURE = 2 /**< general.architecture: the graph the model runs ("llama", ...) */
} h2o_model_text;

/** Writes one text about the model (what: h2o_model_text) as h2o_detokenize writes text (needed
 * size in *n_bytes, the NUL when it fits; text may be NULL when capacity is 0). Errors:
 * H2O_ERR_INVALID_ARGUMENT (NULL model or n_bytes, an unknown `what`), H2O_ERR_BUFFER_TOO_SMALL,
 * H2O_ERR_UNSUPPORTED (see H2O_MODEL_TEXT_CHAT_FORMAT). */
H2O_API h2o_status h2o_model_get_text(const h2o_model *model, uint32_t what, char *text, size_t capacity, size_t *n_bytes);

/** Flags for h2o_tokenize. */
#define H2O_TOKENIZE_ADD_BOS 1u /**< prepend the BOS token (not doubled if the text begins with "<s>" parsed as special) */
#define H2O_TOKENIZE_SPECIAL 2u /**< the text of control tokens ("<s>", "</s>", "<|im_end|>", ...) becomes those tokens */
/** Prepend the BOS token when the vocabulary asks for one (tokenizer.ggml.add_bos_token, else the
 * default of its kind: sentencepiece vocabularies do, most byte-level BPE ones do not), as a fresh
 * session's text does and llama.cpp's add_special; H2O_TOKENIZE_ADD_BOS prepends it always (since 0.8). */
#define H2O_TOKENIZE_VOCAB_BOS 4u

/** Tokenizes UTF-8 text (text_len bytes; text need not be NUL-terminated). A leading space is
 * added as sentencepiece does (with H2O_TOKENIZE_SPECIAL, to each stretch of text between special
 * tokens, as llama.cpp does). flags: H2O_TOKENIZE_*. Writes at most capacity ids;
 * *n_tokens always receives the number of ids the text needs. Errors: H2O_ERR_BUFFER_TOO_SMALL
 * (nothing useful written beyond capacity), H2O_ERR_INVALID_TEXT. tokens may be NULL when
 * capacity is 0, to ask for the size. */
H2O_API h2o_status h2o_tokenize(const h2o_model *model, const char *text, size_t text_len, uint32_t flags, int32_t *tokens, size_t capacity,
                                size_t *n_tokens);

/** Converts ids back to UTF-8 text (the leading space of the first piece is removed, special
 * tokens render as nothing). *n_bytes receives the needed size, excluding the NUL terminator that
 * is written when it fits. text may be NULL when capacity is 0, to ask for the size. Errors:
 * H2O_ERR_BUFFER_TOO_SMALL, H2O_ERR_INVALID_ARGUMENT (an id outside the vocabulary). */
H2O_API h2o_status h2o_detokenize(const h2o_model *model, const int32_t *tokens, size_t n_tokens, char *text, size_t capacity,
                                  size_t *n_bytes);

/** The vocabulary string of one token, with special tokens spelled out ("</s>", "<|im_end|>"),
 * U+2581 shown as a space and byte tokens as their byte: what h2o_detokenize leaves out for
 * control tokens. *n_bytes receives the size (no NUL is written). Errors:
 * H2O_ERR_INVALID_ARGUMENT (id outside the vocabulary), H2O_ERR_BUFFER_TOO_SMALL. */
H2O_API h2o_status h2o_token_to_piece(const h2o_model *model, int32_t token, char *text, size_t capacity, size_t *n_bytes);

/** 1 when generation ends at this token: EOS, the end-of-turn tokens the vocabulary names
 * (tokenizer.ggml.eot_token_id, eom_token_id), and control tokens that end a chat turn
 * ("</s>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>"); else 0. */
H2O_API int h2o_token_is_end_of_generation(const h2o_model *model, int32_t token);

/* ---------------------------------------------------------------------------------------------
 * Chat formatting
 * ------------------------------------------------------------------------------------------- */

/** One message of a conversation (h2o_chat_format): text as pointer and length, UTF-8. */
typedef struct h2o_chat_message {
    const char *role;    /**< "system", "user" or "assistant" ("ipython": Llama 3's tool results) */
    size_t role_len;     /**< bytes of role */
    const char *content; /**< the message's text */
    size_t content_len;  /**< bytes of content */
} h2o_chat_message;

/** Writes a conversation as the model's chat format expects it. format_name: "llama2" (Llama-2
 * chat: "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>"), "zephyr"
 * (Zephyr, TinyLlama chat: "<|{role}|>\n{content}</s>\n"), "chatml" ("<|im_start|>{role}\n
 * {content}<|im_end|>\n"; Qwen 2/2.5/3, SmolLM2), "llama3" (Llama 3.x: "<|start_header_id|>{role}
 * <|end_header_id|>\n\n{content}<|eot_id|>"; the BOS is the tokenizer's), "phi3" (Phi-3, Phi-3.5,
 * Phi-4-mini: "<|{role}|>\n{content}<|end|>\n"), "mistral" (Mistral Instruct: "[INST] {system}\n\n
 * {user}[/INST] {assistant}</s>"; the BOS is the tokenizer's), "gemma" (Gemma 2 and 3:
 * "<start_of_turn>{user|model}\n{content}<end_of_turn>\n", the system message opening the first
 * user turn; the BOS is the tokenizer's), or NULL for the format the model's
 * tokenizer.chat_template describes. add_assistant_prefix != 0 ends the text with what opens the
 * assistant's reply ("<|assistant|>\n", "<|im_start|>assistant\n",
 * "<|start_header_id|>assistant<|end_header_id|>\n\n", "<start_of_turn>model\n"; Llama-2 and Mistral prompts already end with
 * "[/INST]"). Feed the text with
 * h2o_session_add_text(..., H2O_TEXT_SPECIAL) so its control tokens become tokens, then
 * h2o_generate with an empty prompt: generation stops at the end-of-turn token. The text is
 * written as h2o_detokenize writes (needed size in *n_bytes, NUL when it fits). Errors:
 * H2O_ERR_INVALID_ARGUMENT (unknown format name or role, turns out of order for llama2 and gemma),
 * H2O_ERR_UNSUPPORTED (NULL format and the model has no known template),
 * H2O_ERR_BUFFER_TOO_SMALL. */
H2O_API h2o_status h2o_chat_format(const h2o_model *model, const char *format_name, const h2o_chat_message *messages, size_t n_messages,
                                   int add_assistant_prefix, char *text, size_t capacity, size_t *n_bytes);

/* ---------------------------------------------------------------------------------------------
 * Tool calls (since 0.8)
 *
 * The functions a conversation offers are written into the prompt as the model's family was
 * trained to read them, a grammar constrains the reply to calls of them, and the reply is read
 * back into calls. The chat format (format_name, or NULL for the model's template) decides the
 * syntax: "chatml" (Qwen 2.5/3, SmolLM2, Hermes): "<tool_call>\n{"name": N, "arguments": A}\n
 * </tool_call>" per call, one per line, the tools in the system message; "llama3" (Llama 3.1 to
 * 3.3): one call {"name": N, "parameters": A}, the tools in the first user message, results in
 * "ipython" turns; "mistral" with a vocabulary that has the control token [TOOL_CALLS] (v0.3 and
 * later): "[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]" before the last user turn, calls as
 * "[TOOL_CALLS] [{"name": N, "arguments": A, "id": ID}, ...]" with the 9-character ids the model
 * writes, results in [TOOL_RESULTS] blocks; every other format (its template has no tools): the
 * tools described in the system message and calls as {"tool_calls": [{"name": N, "arguments": A},
 * ...]}. Tools, messages and calls are OpenAI's JSON shapes. A control token a grammar spells out
 * (as these grammars spell [TOOL_CALLS]) may be generated, and is delivered as that text. Use:
 *   h2o_chat_format_tools(...) -> h2o_session_add_text(..., H2O_TEXT_SPECIAL);
 *   h2o_tool_call_grammar(...) -> h2o_generate_params.grammar; h2o_generate(...);
 *   h2o_parse_tool_calls(reply) -> the calls; run them; append role "tool" messages; repeat.
 * A call is written in one exact layout and its arguments keep the JSON text generated, so the
 * history written again holds the text the session already has.
 * ------------------------------------------------------------------------------------------- */

/** h2o_chat_format for a conversation with tools. messages_json: an array of {"role": "system",
 * "developer", "user", "assistant" or "tool", "content": a string, null or text parts}, an
 * assistant's "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": a
 * string of JSON}}], a tool message's "tool_call_id". tools_json: [{"type": "function",
 * "function": {"name" (1-64 of A-Z a-z 0-9 _ -), "description"?, "parameters"? (a JSON schema)}}]
 * (at most 128), or NULL/0 for none. Output and errors as h2o_chat_format's, and
 * H2O_ERR_INVALID_ARGUMENT naming the field of malformed JSON. */
H2O_API h2o_status h2o_chat_format_tools(const h2o_model *model, const char *format_name, const char *messages_json, size_t messages_len,
                                         const char *tools_json, size_t tools_len, int add_assistant_prefix, char *text, size_t capacity,
                                         size_t *n_bytes);

/** The GBNF grammar (for h2o_generate_params.grammar) of a reply under tool_choice: "auto" (calls,
 * or text that does not begin as a call does), "required" (calls) or a function's name (calls
 * of it). parallel != 0: one or more calls (the llama3 syntax makes one whatever it says), else
 * one. The arguments follow each function's parameters (the subset of h2o_json_schema_to_grammar;
 * a schema outside it is H2O_ERR_INVALID_ARGUMENT naming the tool). For tool_choice "none" give no
 * grammar. Output as h2o_chat_format's. */
H2O_API h2o_status h2o_tool_call_grammar(const h2o_model *model, const char *format_name, const char *tools_json, size_t tools_len,
                                         const char *tool_choice, int parallel, char *grammar, size_t capacity, size_t *n_bytes);

/** What a reply that begins with `reply` is, for streaming: *kind 1 tool calls, 0 text, -1 not
 * known yet (it is a prefix of what opens a call: hold the text back). */
H2O_API h2o_status h2o_tool_reply_kind(const h2o_model *model, const char *format_name, const char *reply, size_t reply_len, int *kind);

/** Reads a reply back: writes {"content": the text or null, "tool_calls": [{"id", "type":
 * "function", "function": {"name", "arguments"}}]} (an empty array for a text reply). Ids are
 * "call_" and 24 letters and digits made from the reply, the call's place and id_salt (give each
 * turn its own, such as its message count). A reply that opens a call but is not one in the
 * syntax's layout is H2O_ERR_INVALID_ARGUMENT naming the byte. Output as h2o_chat_format's. */
H2O_API h2o_status h2o_parse_tool_calls(const h2o_model *model, const char *format_name, const char *reply, size_t reply_len,
                                        uint64_t id_salt, char *json, size_t capacity, size_t *n_bytes);

/* ---------------------------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------------------------- */

/** One conversation: a KV cache of fixed size, the sampler's state and scratch memory. */
typedef struct h2o_session h2o_session;

/** Compute backends. The CPU backend is the reference; every other backend is tested against it. */
typedef enum h2o_backend_kind {
    /** A GPU through Vulkan when one is present and runs the model (its weight types, KV format,
     * memory), else the CPU. The session's backend info (and the log, at INFO level) says which
     * was chosen and why the others were passed over. */
    H2O_BACKEND_AUTO = 0,
    H2O_BACKEND_CPU = 1,    /**< the CPU (the reference backend) */
    H2O_BACKEND_VULKAN = 2, /**< a GPU (or a software device) through Vulkan */
    H2O_BACKEND_CUDA = 3    /**< an NVIDIA GPU through CUDA */
} h2o_backend_kind;

/** One backend device. */
typedef struct h2o_backend_info {
    uint32_t struct_size;  /**< sizeof(h2o_backend_info) of the caller */
    uint32_t kind;         /**< h2o_backend_kind */
    int32_t device_index;  /**< the device_index to pass in h2o_session_params */
    char name[128];        /**< e.g. "cpu (avx2)" or the Vulkan device name */
    char device_type[16];  /**< "cpu", "discrete", "integrated", "virtual", "other" */
    uint64_t memory_bytes; /**< device-local memory (0 for the CPU: host memory) */
} h2o_backend_info;

/** Number of usable backend devices: the CPU first, then each Vulkan device. A missing Vulkan
 * loader or driver is not an error: those devices are simply absent. */
H2O_API h2o_status h2o_backend_count(size_t *count);
/** Fills *info for device index (0 <= index < count; set info->struct_size first). */
H2O_API h2o_status h2o_backend_get_info(size_t index, h2o_backend_info *info);

/** Names of backend kinds ("auto", "cpu", "vulkan", "cuda"): NULL for a value this library does
 * not know, so iterating from 0 until NULL lists them all. */
H2O_API const char *h2o_backend_kind_name(uint32_t kind);
/** Parses such a name. Errors: H2O_ERR_INVALID_ARGUMENT (NULL arguments or an unknown name). */
H2O_API h2o_status h2o_backend_kind_from_name(const char *name, uint32_t *kind);

/** KV eviction policies: which cached token of a (layer, kv head) gives up its slot when the KV
 * cache is full. Eviction is decided per (layer, kv head) from attention statistics that the
 * attention computation gathers as a by-product; under grouped-query attention the query heads
 * of a group add up. Pinned tokens are never evicted by any policy. */
typedef enum h2o_kv_policy {
    /** No eviction, whatever kv_overflow says: when the budget is used up, calls return
     * H2O_ERR_CONTEXT_FULL. */
    H2O_KV_FULL = 0,
    /** Heavy-Hitter Oracle: keep a recent window plus the tokens with the largest attention
     * accumulated since they entered. Window: kv_recent (or kv_recent_ratio of the budget). */
    H2O_KV_H2O = 1,
    /** Keep the most recent tokens only. */
    H2O_KV_WINDOW = 2,
    /** StreamingLLM: keep the first kv_sinks tokens of the stream (default 4) plus the most recent. */
    H2O_KV_SINK_WINDOW = 3,
    /** Scissorhands: recent window plus the tokens that were most persistently important (received
     * more than a uniform share of attention), counted with an exponential decay of 0.9 per step;
     * by default no token is kept 1.5 budgets or more behind the newest (kv_horizon). */
    H2O_KV_SCISSORHANDS = 4,
    /** TOVA: evict the token with the lowest attention at the latest step (no recent window). */
    H2O_KV_TOVA = 5,
    /** RoCo-style: recent window plus the tokens with the highest mean attention since they
     * entered; the standard deviation breaks ties. */
    H2O_KV_ROCO = 6,
    /** A uniformly random unprotected token: a sanity baseline. */
    H2O_KV_RANDOM = 7,
    /** Sinks + recent window + heavy hitters by mean (not accumulated) attention since entry. */
    H2O_KV_MEAN_H2O = 8,
    /** Recent window plus the tokens whose keys have the smallest L2 norm (keys of small norm draw
     * the most attention). Query-agnostic: ranks by the stored keys, gathers no statistics. */
    H2O_KV_KEY_NORM = 9,
    /** KeyDiff: recent window plus the tokens whose keys are least similar (by cosine) to the
     * mean direction of their (layer, kv head)'s keys. Query-agnostic. */
    H2O_KV_KEY_DIFF = 10,
    /** Expected Attention: recent window plus the tokens future queries are expected to
     * attend to most, in closed form from the running mean and variance of the recent queries of
     * each (layer, kv head), weighted by the norm of the token's value. */
    H2O_KV_EXPECTED_ATTENTION = 11
} h2o_kv_policy;

/** Names of policies as tools print them ("full", "h2o", "window", "sink_window",
 * "scissorhands", "tova", "roco", "random", "mean_h2o", "key_norm", "key_diff",
 * "expected_attention"): NULL for a value this library does not
 * know, so iterating from 0 until NULL lists them all. */
H2O_API const char *h2o_kv_policy_name(uint32_t policy);
/** Parses such a name. Errors: H2O_ERR_INVALID_ARGUMENT (NULL arguments or an unknown name). */
H2O_API h2o_status h2o_kv_policy_from_name(const char *name, uint32_t *policy);

/** What a policy keeps, and so which session settings apply to it (since 0.7). */
typedef struct h2o_kv_policy_info {
    uint32_t struct_size;       /**< sizeof(h2o_kv_policy_info) of the caller */
    uint32_t policy;            /**< h2o_kv_policy */
    const char *name;           /**< h2o_kv_policy_name's */
    int32_t gathers_statistics; /**< ranks tokens by attention: kv_horizon and the research settings of
                                    h2o_experimental.h that move budgets by attention apply (kv_horizon
                                    also applies to the query-agnostic scorers, which gather none) */
    int32_t has_recent_window;  /**< protects a recent window: kv_recent and kv_recent_ratio apply */
    int32_t keeps_sinks;        /**< always protects the first kv_sinks tokens of the stream */
    float default_recent_ratio; /**< the window's share of the budget when kv_recent_ratio is negative */
    float default_horizon;      /**< kv_horizon's default, in budgets; 0: none */
} h2o_kv_policy_info;

/** Fills *info for a policy (set info->struct_size first). Errors: H2O_ERR_INVALID_ARGUMENT (NULL
 * info, a struct_size too small, or a policy this library does not know). */
H2O_API h2o_status h2o_kv_policy_get_info(uint32_t policy, h2o_kv_policy_info *info);

/** Element format of the KV cache. Each stored key or value vector (one head of one token) has its
 * own scale, so any head size works. Attention reads the stored form directly. Bytes per vector
 * of d elements: F32 4d, F16 2d, 8-bit d + 4, 4-bit d/2 + 4 (d even). */
typedef enum h2o_kv_type {
    H2O_KV_TYPE_F32 = 0, /**< 32-bit floats */
    H2O_KV_TYPE_F16 = 1, /**< 16-bit floats (the default) */
    H2O_KV_TYPE_Q8 = 2,  /**< symmetric 8-bit with a float scale */
    H2O_KV_TYPE_Q4 = 3,  /**< 4-bit with a half-precision scale and minimum: lossy for keys */
    /** Keys 8-bit, values 4-bit: the recommended small cache. Keys carry outlier channels that a
     * 4-bit grid destroys; values average out in the attention-weighted sum (docs/SESSIONS.md
     * and docs/EVALUATION.md give the figures). */
    H2O_KV_TYPE_K8V4 = 4
} h2o_kv_type;

/** Names of KV types ("f32", "f16", "q8", "q4", "k8v4"): NULL for an unknown value. */
H2O_API const char *h2o_kv_type_name(uint32_t type);
/** Parses such a name. Errors: H2O_ERR_INVALID_ARGUMENT (NULL arguments or an unknown name). */
H2O_API h2o_status h2o_kv_type_from_name(const char *name, uint32_t *type);

/** What a session does when its cache is full (h2o_session_params.kv_overflow; since 0.8). */
typedef enum h2o_kv_overflow {
    /** The default: the session never runs out. Until its slots are full it computes what a full
     * cache computes (the same logits, bit for bit); from then on each (layer, kv head) evicts by
     * kv_policy and rotary positions roll (position_rolling is implied), so decoding and adding
     * text never fail with H2O_ERR_CONTEXT_FULL, in the memory allocated at creation.
     * h2o_session_get_kv_usage and h2o_session_set_event_callback say when eviction began. */
    H2O_KV_OVERFLOW_EVICT = 0,
    /** The contract of a plain full cache: without position_rolling the stream ends at n_ctx
     * tokens, and calls that would pass it return H2O_ERR_CONTEXT_FULL (a kv_budget below n_ctx
     * still evicts within those n_ctx positions). */
    H2O_KV_OVERFLOW_ERROR = 1
} h2o_kv_overflow;

/** Room for research settings in h2o_session_params (h2o_experimental.h's keys are below it). */
#define H2O_EXPERIMENTAL_CAPACITY 16

/** How h2o_session_create makes a session (h2o_session_params_init writes the defaults). */
typedef struct h2o_session_params {
    uint32_t struct_size; /**< sizeof(h2o_session_params) of the caller (see the conventions above) */
    /** The session's context: its cache has n_ctx slots per (layer, kv head) unless kv_budget is
     * smaller, and rotary positions stay below it. 0 (the default): the model's context length,
     * but at most 4096, so that a default session's memory never follows a file's word alone. At
     * least 2. With kv_overflow = H2O_KV_OVERFLOW_ERROR and no position rolling it is also the
     * longest stream the session accepts. */
    uint32_t n_ctx;
    /** Worker threads for compute. 0: the number of online cores (at most 8). */
    uint32_t n_threads;
    /** Prompt tokens processed per batch. 0: 256. */
    uint32_t n_batch;
    /** Seed of the sampler's random generator (and of the random eviction policy). The same seed,
     * model, parameters and input give the same text. */
    uint64_t seed;
    /** KV slots per (layer, kv head), allocated once at creation: the session's KV memory never
     * grows. 0 or >= n_ctx: n_ctx slots. A budget below n_ctx is a smaller cache that starts
     * evicting sooner. Either way the cache evicts once full (kv_overflow), except under
     * H2O_KV_FULL or with kv_overflow = H2O_KV_OVERFLOW_ERROR and n_ctx slots, which never evict. */
    uint32_t kv_budget;
    /** Who is evicted once the cache is full. Default: H2O_KV_SCISSORHANDS, which
     * on our evaluation beats H2O, a window and StreamingLLM on short texts at every budget
     * measured, and H2O and a window on long streams (see docs/EVALUATION.md). */
    uint32_t kv_policy; /**< h2o_kv_policy */
    /** Recent window protected from eviction, in tokens; 0: kv_recent_ratio of the budget. */
    uint32_t kv_recent;
    /** Recent window as a fraction of the budget, when kv_recent is 0. Negative (the default): the
     * policy's own default, 0.875 for H2O_KV_SCISSORHANDS and 0.5 for the others. Window policies
     * and TOVA have no separate recent window. */
    float kv_recent_ratio;
    /** First tokens of the stream that are never evicted (attention sinks); used by
     * H2O_KV_SINK_WINDOW and H2O_KV_MEAN_H2O (and ignored by the other policies). Default 4. */
    uint32_t kv_sinks;
    /** Position rolling: rotary positions are the tokens' ranks in the cache (0..kv_budget-1),
     * not their positions in the stream, so a session can run without end, far past the model's
     * context length. Keys are stored rotated by their rank; evicting a token rotates the keys
     * after it back by one position (O(budget × head_dim) per layer and kv head per eviction).
     * Implied by kv_overflow = H2O_KV_OVERFLOW_EVICT (the default) unless kv_policy is
     * H2O_KV_FULL; with H2O_KV_OVERFLOW_ERROR, off means the stream ends at n_ctx tokens
     * (H2O_ERR_CONTEXT_FULL). Default 0 (rolling as kv_overflow implies). */
    int32_t position_rolling;
    /** Compute backend (h2o_backend_kind). Default H2O_BACKEND_AUTO. Asking for a backend this
     * build or machine does not have is H2O_ERR_BACKEND_UNAVAILABLE (auto never fails that way:
     * it falls back). */
    uint32_t backend;
    /** Device of that backend: an index from h2o_backend_get_info's device_index, or -1 (default)
     * for the best one (discrete GPU, then integrated, then virtual, then CPU implementations). */
    int32_t device_index;
    /** Element format of the KV cache (h2o_kv_type). Default H2O_KV_TYPE_F16: half the memory
     * of F32 at the same perplexity and no slower (the SIMD kernels read halves directly). Q8 is
     * smaller and, read by the same kernels, faster at depth, but not as accurate, so it is not
     * the default (docs/SESSIONS.md gives the figures). */
    uint32_t kv_type;
    /** The most memory the session may allocate for its KV cache, activations and scratch (the
     * kv_bytes + scratch_bytes of h2o_session_memory), in bytes; 0 (the default): no cap. A
     * session that would need more is refused before anything is allocated, with
     * H2O_ERR_OUT_OF_MEMORY and a message giving the needed and the allowed bytes. */
    uint64_t max_memory_bytes;
    /** Horizon of the policies that keep tokens for a score (h2o, scissorhands, tova, roco,
     * mean_h2o by attention; key_norm, key_diff, expected_attention by their keys; the others
     * ignore it): a token kv_horizon or more tokens behind the newest is stale and is evicted
     * before any other unprotected token, however high its score. Over a long stream this stops
     * the cache from filling with tokens of text the stream has moved past (see
     * docs/EVALUATION.md's long streams). 0 (the default): the policy's own, 1.5 × kv_budget for
     * H2O_KV_SCISSORHANDS and the three key scorers, none for the others; H2O_KV_HORIZON_NONE:
     * none. Otherwise at least kv_budget. */
    uint32_t kv_horizon;
    /** Research settings of the KV cache, by key (h2o_experimental.h): set and read them with
     * h2o_session_params_set_experimental and h2o_session_params_get_experimental, which check
     * the key and the value, rather than directly. h2o_session_params_init writes 0 to all of
     * them: every experiment off. (since 0.7) */
    double experimental[H2O_EXPERIMENTAL_CAPACITY];
    /** What the session does when its cache is full (h2o_kv_overflow). Default
     * H2O_KV_OVERFLOW_EVICT: it evicts and rolls, and never runs out. (since 0.8; a caller built
     * against an earlier header gets the default) */
    uint32_t kv_overflow;
} h2o_session_params;

/** kv_horizon: keep heavy hitters however far back they lie. */
#define H2O_KV_HORIZON_NONE 0xFFFFFFFFu

/** Writes the defaults into the first struct_size bytes of *params (see h2o_model_params_init). */
H2O_API h2o_status h2o_session_params_init(h2o_session_params *params, size_t struct_size);

/** Creates a session; params may be NULL (defaults). All memory of the session is allocated here.
 * The session keeps the model alive (see the threading contract). */
H2O_API h2o_status h2o_session_create(h2o_model *model, const h2o_session_params *params, h2o_session **out_session);
/** Frees the session and all its memory (NULL: nothing). */
H2O_API void h2o_session_free(h2o_session *session);

/** The KV cache layout a session runs with, after defaults are resolved. */
typedef struct h2o_kv_layout {
    uint32_t struct_size;      /**< sizeof(h2o_kv_layout) of the caller */
    uint32_t budget;           /**< slots per (layer, kv head); with a layer slope, their mean over layers */
    uint32_t policy;           /**< h2o_kv_policy; H2O_KV_FULL when the cache never needs to evict */
    uint32_t recent;           /**< protected recent window (tokens) */
    uint32_t sinks;            /**< protected first tokens of the stream */
    uint32_t heavy;            /**< slots left to the policy's choice: budget - recent - sinks */
    int32_t position_rolling;  /**< 1 when rotary positions roll (see h2o_session_params) */
    uint32_t type;             /**< h2o_kv_type */
    uint32_t n_ctx;            /**< longest stream without rolling, after defaults */
    uint32_t horizon;          /**< stale distance (see kv_horizon); 0: none */
    uint32_t min_layer_budget; /**< slots per kv head of the smallest layer (the global layers' of a model
                                    with sliding-window layers, whose local layers hold their window) */
    uint32_t max_layer_budget; /**< slots per kv head of the largest layer (local layers included) */
    uint32_t min_head_budget;  /**< the fewest slots a kv head of the smallest (global) layer keeps */
} h2o_kv_layout;

/** The backend device the session runs on (set info->struct_size first). */
H2O_API h2o_status h2o_session_get_backend(const h2o_session *session, h2o_backend_info *info);

/** What a device backend has moved since the session was created: bytes copied host -> device
 * and device -> host, command submissions, and device memory allocated. All zero on the CPU
 * backend, which works in host memory. The sessions of one model on one device share its weights
 * there: bytes_to_device counts the weights only for the session that uploaded them (the first),
 * and device_memory_bytes is the session's own memory (KV cache, activations, scratch), never the
 * shared weights. */
typedef struct h2o_device_traffic {
    uint32_t struct_size;         /**< sizeof(h2o_device_traffic) of the caller */
    uint64_t bytes_to_device;     /**< bytes copied from the host to the device */
    uint64_t bytes_to_host;       /**< bytes copied from the device to the host */
    uint64_t submissions;         /**< command submissions to the device */
    uint64_t device_memory_bytes; /**< device memory the session allocated */
} h2o_device_traffic;

/** Fills *traffic (set traffic->struct_size first). */
H2O_API h2o_status h2o_session_get_device_traffic(const h2o_session *session, h2o_device_traffic *traffic);

/** Fills *layout (set layout->struct_size first). */
H2O_API h2o_status h2o_session_get_kv_layout(const h2o_session *session, h2o_kv_layout *layout);

/** Where the session's stream stands against its cache (h2o_session_get_kv_usage; since 0.8). */
typedef struct h2o_kv_usage {
    uint32_t struct_size; /**< sizeof(h2o_kv_usage) of the caller */
    uint32_t capacity;    /**< slots per (layer, kv head) of the layers with the most */
    uint64_t n_past;      /**< tokens the stream has had */
    uint64_t n_held;      /**< of them, the tokens each (layer, kv head) of those layers holds */
    uint64_t n_evicted;   /**< n_past - n_held: tokens the cache no longer holds */
    uint64_t n_pinned;    /**< pinned tokens (never evicted) */
    /** The stream's length when eviction began: the cells with the fewest slots were full and the
     * next token evicted one (with a layer slope or moving budgets, before the largest cells);
     * 0: nothing was evicted yet. */
    uint64_t evicting_since;
    int32_t evicts; /**< 1 when a full cache evicts (kv_overflow, the policy), 0 when it refuses */
} h2o_kv_usage;

/** Fills *usage (set usage->struct_size first). */
H2O_API h2o_status h2o_session_get_kv_usage(const h2o_session *session, h2o_kv_usage *usage);

/** Events a session reports (h2o_session_set_event_callback; since 0.8). New kinds may be added:
 * ignore the ones you do not know. */
typedef enum h2o_session_event {
    /** The cache is full and begins to evict, once per conversation: after a reset (or a snapshot
     * loaded before its cache filled) the next fill reports it again. The library also logs it at
     * H2O_LOG_INFO. */
    H2O_EVENT_KV_FULL = 1
} h2o_session_event;

/** Receives an event; usage is the session's h2o_kv_usage as the event happens (valid during the
 * call). Called on the thread running the session, inside the call that caused it: it must not
 * call functions on that session (other sessions and models are fine). */
typedef void (*h2o_session_event_callback)(uint32_t event, const h2o_kv_usage *usage, void *user_data);

/** Sets the session's event callback (NULL: none, the default). Snapshots and forks do not carry
 * it. Errors: H2O_ERR_INVALID_ARGUMENT (NULL session). */
H2O_API h2o_status h2o_session_set_event_callback(h2o_session *session, h2o_session_event_callback callback, void *user_data);

/** Forgets the conversation (KV cache, positions, sampler history) and reseeds the sampler with
 * the session's seed. No memory is allocated or freed, except after a call failed with
 * H2O_ERR_BACKEND_FAILED: then the session's backend is made anew, on the same device (its
 * weights uploaded again), and the errors of h2o_session_create are possible; while that fails,
 * the session keeps refusing work with H2O_ERR_BACKEND_FAILED. */
H2O_API h2o_status h2o_session_reset(h2o_session *session);

/** Asks the call running on the session (h2o_generate, h2o_generate_begin/_next,
 * h2o_session_add_text, h2o_session_decode) to stop: it returns H2O_ERR_CANCELLED at its next
 * batch boundary (between prompt batches, between generated tokens). Tokens processed before
 * that boundary stay in the session, which remains usable: the conversation continues from
 * there. Batches are not interrupted between layers, because a half-stored batch would leave
 * the KV cache and its evictions inconsistent. May be called from any thread while another
 * thread runs the session, and from a signal handler (with a valid session it is one lock-free
 * atomic store). A cancel that arrives when no call is running has no effect, except during a
 * pull-style generation, which counts as running from h2o_generate_begin to the h2o_generate_next
 * that ends it: a cancel between two _next calls makes the next one return H2O_ERR_CANCELLED.
 * NULL: H2O_ERR_INVALID_ARGUMENT. */
H2O_API h2o_status h2o_session_cancel(h2o_session *session);

/** Restarts the sampler's random generator from seed, as a session created with that seed starts
 * it, and keeps the conversation: the same state, seed and generate params give the same text
 * (what a server's per-request seed needs). The new generator state is part of snapshots and
 * forks; h2o_session_reset goes back to the seed of h2o_session_params. The random eviction policy
 * keeps its own generator. NULL: H2O_ERR_INVALID_ARGUMENT. */
H2O_API h2o_status h2o_session_set_seed(h2o_session *session, uint64_t seed);

/** The message of the session's most recent failed call ("" if none); valid until the next call
 * on this session. NULL session: "". */
H2O_API const char *h2o_session_last_error(const h2o_session *session);

/** Bytes of memory a session uses, by part. Everything is allocated in h2o_session_create; these
 * numbers do not change afterwards. */
typedef struct h2o_memory_report {
    uint32_t struct_size;   /**< sizeof(h2o_memory_report) of the caller */
    uint64_t weight_bytes;  /**< model weights (shared by all sessions of the model) */
    uint64_t kv_bytes;      /**< keys, values and per-slot eviction statistics */
    uint64_t scratch_bytes; /**< activations and kernel scratch of this session */
} h2o_memory_report;

/** Fills *report (set report->struct_size first). */
H2O_API h2o_status h2o_session_memory(const h2o_session *session, h2o_memory_report *report);

/** Flags for h2o_session_add_text. */
#define H2O_TEXT_PIN 1u     /**< the text's tokens are never evicted (system prompts, instructions) */
#define H2O_TEXT_SPECIAL 2u /**< parse special tokens in the text, as H2O_TOKENIZE_SPECIAL (chat formats) */

/** Appends text_len bytes of UTF-8 text to the session without generating (the first text of a
 * session starts with BOS). With H2O_TEXT_PIN the tokens are pinned: they count against
 * kv_budget and survive every eviction. Pinning more than kv_budget - 1 tokens in total (with a
 * kv_layer_slope: the smallest layer's budget - 1; less the retention spans' minimums, below) is
 * H2O_ERR_INVALID_ARGUMENT and adds nothing. Text longer than the free slots is processed in
 * chunks with eviction between them. H2O_ERR_CANCELLED: see h2o_session_cancel. */
H2O_API h2o_status h2o_session_add_text(h2o_session *session, const char *text, size_t text_len, uint32_t flags);

/* ---- Retention spans: a minimum share of the cache instead of all-or-nothing pinning ----------
 * Text added with h2o_session_add_span_text belongs to the span `span_id` (any nonzero id the
 * caller chooses; up to H2O_MAX_SPANS spans a session; the same id again appends to the span).
 * Each (layer, kv head) evicts as its policy says, except that while it holds no more than
 * min_tokens = floor(min_share * kv_budget) (with a kv_layer_slope: of the smallest layer's
 * budget) of the span's tokens it evicts none of them: a span
 * keeps at least that many tokens in every (layer, kv head), the ones its policy ranks highest,
 * and competes for the rest of the cache like any other text. Several instructions can so each
 * keep a share, where pinning keeps all of one and, past its budget, refuses the next.
 *
 * Pinning and minimums combine: pinned tokens (H2O_TEXT_PIN, in a span or not) are never
 * evicted and count in their span's held tokens; pinned tokens plus every span's min_tokens may
 * not exceed kv_budget - 1 (the smallest layer's). A call that would break this, gives min_share outside [0, 1] or
 * span_id 0, would make more than H2O_MAX_SPANS spans, or asks a minimum of a session whose
 * policy is 'full' is H2O_ERR_INVALID_ARGUMENT and changes nothing. Each call sets the span's min_share (0 leaves
 * its tokens to the policy alone). Spans and their minimums are part of snapshots and forks, and
 * end with h2o_session_reset. Flags as for h2o_session_add_text. */
#define H2O_MAX_SPANS 32 /**< the most retention spans a session may have */
/** Appends text to retention span span_id with the minimum share min_share (see above). */
H2O_API h2o_status h2o_session_add_span_text(h2o_session *session, uint32_t span_id, float min_share, const char *text, size_t text_len,
                                             uint32_t flags);

/** A retention span's definition and where its tokens stand in the cache. */
typedef struct h2o_span_info {
    uint32_t struct_size;   /**< sizeof(h2o_span_info) of the caller */
    uint32_t span_id;       /**< the span's id */
    float min_share;        /**< its minimum share of the budget, as last set */
    int32_t min_tokens;     /**< per (layer, kv head): floor(min_share * the smallest layer budget) */
    int64_t n_tokens;       /**< tokens added to the span */
    int32_t kept_min;       /**< the span's tokens held by the (layer, kv head) holding fewest, */
    int32_t kept_max;       /**< by the one holding most, */
    double kept_mean;       /**< and on average */
    double attention_share; /**< of the attention accumulated by the cached tokens, the share on
                                the span's (-1 when the policy gathers no statistics) */
} h2o_span_info;

/** Fills *info for the span `span_id` (set info->struct_size first). It reads the whole cache's
 * bookkeeping (from the device on a GPU backend): a diagnostic, not for every token.
 * H2O_ERR_INVALID_ARGUMENT when the session has no such span. */
H2O_API h2o_status h2o_session_get_span_info(h2o_session *session, uint32_t span_id, h2o_span_info *info);

/* ---------------------------------------------------------------------------------------------
 * Session state: save, load, fork
 *
 * A snapshot holds the whole conversation: the KV cache slot by slot in its stored format
 * (positions, statistics, pinned flags, rolling ranks), the stream position, the sampler's
 * generator and history, the settings that shape the cache, and the logits of the last token,
 * so that h2o_session_get_logits and an empty-prompt h2o_generate continue at once. Resuming is
 * exact: a loaded session generates token for token what the saved one would have. Snapshots are
 * zstd-compressed, carry a fingerprint of the model (its tensor table and vocabulary) and a
 * checksum; a truncated, corrupted, foreign or hostile snapshot is H2O_ERR_STATE_FORMAT (a newer
 * format version: H2O_ERR_UNSUPPORTED) with a message, and nothing is created. A pull-style
 * generation in progress is not part of the state. The format does not depend on the backend: a
 * snapshot saved on one backend loads on any (the CPU, Vulkan and CUDA backends implement them).
 * ------------------------------------------------------------------------------------------- */

/** Writes a snapshot to path: to a temporary file beside it, synced, then renamed, so that path
 * holds either its previous content or the whole snapshot, even if the process is killed. */
H2O_API h2o_status h2o_session_save(h2o_session *session, const char *path);

/** Creates a session from a snapshot file. The cache-shaping settings (n_ctx, kv_budget, the
 * policy and its windows, kv_type, position_rolling, n_batch, seed) come from the snapshot;
 * params (NULL: defaults) gives the rest: n_threads, backend, device_index, max_memory_bytes.
 * Errors: H2O_ERR_IO, H2O_ERR_STATE_FORMAT, H2O_ERR_UNSUPPORTED, and those of h2o_session_create. */
H2O_API h2o_status h2o_session_load(h2o_model *model, const char *path, const h2o_session_params *params, h2o_session **out_session);

/** An upper bound of the bytes h2o_session_save_to_buffer needs for the session as it is now. */
H2O_API h2o_status h2o_session_state_size(h2o_session *session, size_t *size);
/** Writes a snapshot into buffer; *size receives its exact length (also when the buffer is too
 * small: H2O_ERR_BUFFER_TOO_SMALL, nothing useful written). */
H2O_API h2o_status h2o_session_save_to_buffer(h2o_session *session, void *buffer, size_t capacity, size_t *size);
/** h2o_session_load from memory. */
H2O_API h2o_status h2o_session_load_from_buffer(h2o_model *model, const void *buffer, size_t size, const h2o_session_params *params,
                                                h2o_session **out_session);

/** Creates a new session in the state of source, without processing anything again: a processed
 * (pinned) system prompt can start any number of conversations. The copy has source's settings,
 * backend and device; the two are independent afterwards. */
H2O_API h2o_status h2o_session_fork(h2o_session *source, h2o_session **out_session);

/* ---------------------------------------------------------------------------------------------
 * Generation
 * ------------------------------------------------------------------------------------------- */

/** Receives generated text. Each call carries complete UTF-8 characters (a character split across
 * tokens is held back until it is complete). Return 0 to continue, non-zero to stop generation;
 * stopping this way is not an error. */
typedef int (*h2o_token_callback)(const char *text, size_t length, void *user_data);

/** How h2o_generate samples and when it stops (h2o_generate_params_init writes the defaults). */
typedef struct h2o_generate_params {
    uint32_t struct_size;   /**< sizeof(h2o_generate_params) of the caller */
    uint32_t max_tokens;    /**< tokens to generate at most; must be > 0. Default 256. */
    float temperature;      /**< 0: greedy (argmax). Default 0.8. */
    uint32_t top_k;         /**< 0: disabled. Default 40. */
    float top_p;            /**< 1: disabled. Default 0.95. */
    float min_p;            /**< 0: disabled. Default 0.05. */
    float repeat_penalty;   /**< 1: disabled. Default 1.0. */
    uint32_t repeat_last_n; /**< window of recent tokens the penalty looks at. Default 64. */
    /** Generation stops when the generated text contains one of these strings; the stop string
     * itself is not delivered to the callback. NULL/0: none. */
    const char *const *stop_strings;
    size_t n_stop_strings; /**< entries of stop_strings */
    /** Stop at an end-of-generation token (h2o_token_is_end_of_generation). Default 1. */
    int32_t stop_at_eos;
    /** Constrains the reply to a grammar in GBNF (docs/STRUCTURED_OUTPUT.md; the rule
     * "root" is the reply): grammar_len bytes, or NULL/0 for none. Every token whose text cannot
     * continue it is masked after the logits and before temperature, top-k, top-p and min-p, so
     * the reply is drawn from the model's distribution over what the grammar allows;
     * end-of-generation tokens are allowed only where the grammar may end, and generation stops
     * (H2O_STOP_GRAMMAR) when nothing more may follow. A malformed grammar is
     * H2O_ERR_INVALID_ARGUMENT naming the byte and the reason. (since 0.8) */
    const char *grammar;
    size_t grammar_len; /**< bytes of grammar */
    /** Or a JSON schema the reply must satisfy (h2o_json_schema_to_grammar says which subset),
     * json_schema_len bytes; at most one of grammar and json_schema. (since 0.8) */
    const char *json_schema;
    size_t json_schema_len; /**< bytes of json_schema */
    /** Added to the logits of these n_logit_bias tokens before sampling (OpenAI's logit_bias:
     * -INFINITY bans a token). Token ids are checked against the vocabulary. (since 0.8) */
    const int32_t *logit_bias_tokens;
    const float *logit_bias_values; /**< the bias of each of logit_bias_tokens */
    size_t n_logit_bias;            /**< entries of logit_bias_tokens and logit_bias_values */
} h2o_generate_params;

/** Writes the defaults into the first struct_size bytes of *params (see h2o_model_params_init). */
H2O_API h2o_status h2o_generate_params_init(h2o_generate_params *params, size_t struct_size);

/** Why a generation stopped (h2o_generate_next, h2o_generate_stats). */
typedef enum h2o_stop_reason {
    H2O_STOP_NONE = 0,       /**< it has not: generation goes on */
    H2O_STOP_MAX_TOKENS = 1, /**< max_tokens were generated */
    H2O_STOP_EOS = 2,        /**< an end-of-generation token (stop_at_eos) */
    H2O_STOP_STRING = 3,     /**< a stop string was generated */
    H2O_STOP_CALLBACK = 4,   /**< the token callback returned non-zero */
    H2O_STOP_GRAMMAR = 5     /**< the grammar (or schema) is complete and nothing may follow (since 0.8) */
} h2o_stop_reason;

/** Appends prompt (prompt_len bytes of UTF-8; may be empty) to the session and generates up to
 * params->max_tokens tokens, streaming text to callback (which may be NULL); params may be NULL
 * (defaults). The first text of a session (or after a reset) starts with the BOS token. Calling
 * it again continues the same conversation. Errors: H2O_ERR_INVALID_ARGUMENT,
 * H2O_ERR_INVALID_TEXT (prompt is not UTF-8; nothing is added), H2O_ERR_CONTEXT_FULL (the cache
 * is full; tokens processed before are kept), H2O_ERR_CANCELLED (see h2o_session_cancel; the
 * text delivered so far stays in the session). */
H2O_API h2o_status h2o_generate(h2o_session *session, const char *prompt, size_t prompt_len, const h2o_generate_params *params,
                                h2o_token_callback callback, void *user_data);

/** Pull-style generation, for iterators: h2o_generate_begin appends the prompt exactly as
 * h2o_generate does, then each h2o_generate_next produces the next piece of text. A piece is
 * one or more complete UTF-8 characters; *text points into the session and stays valid until the
 * next call on the session. While generation goes on, *stop_reason is H2O_STOP_NONE; the call
 * that ends it sets the reason (the piece it returns may be empty), and a later _next is
 * H2O_ERR_INVALID_ARGUMENT until the next _begin. h2o_generate is _begin plus _next until the
 * end, so both produce the same text. Errors of _next: those of h2o_generate. */
H2O_API h2o_status h2o_generate_begin(h2o_session *session, const char *prompt, size_t prompt_len, const h2o_generate_params *params);
/** The next piece of a pull-style generation (see h2o_generate_begin). */
H2O_API h2o_status h2o_generate_next(h2o_session *session, const char **text, size_t *length, uint32_t *stop_reason);

/** What the session's last generation did (h2o_session_get_stats). */
typedef struct h2o_generate_stats {
    uint32_t struct_size;        /**< sizeof(h2o_generate_stats) of the caller */
    uint32_t n_prompt_tokens;    /**< tokens of the last generation's prompt (with BOS) */
    uint32_t n_generated_tokens; /**< tokens sampled by the last generation */
    uint32_t stop_reason;        /**< h2o_stop_reason */
    uint64_t n_past;             /**< tokens the session has processed in total */
    double prompt_seconds;       /**< wall time of prompt processing */
    double generate_seconds;     /**< wall time of generation (sampling included) */
} h2o_generate_stats;

/** Statistics of the session's last generation (set stats->struct_size first). */
H2O_API h2o_status h2o_session_get_stats(const h2o_session *session, h2o_generate_stats *stats);

/* ---------------------------------------------------------------------------------------------
 * Lower level: feed tokens, read logits (for evaluation tools and custom samplers)
 * ------------------------------------------------------------------------------------------- */

/** Runs the model over n_tokens ids appended to the session (batched). Afterwards the logits of
 * the last token are available through h2o_session_get_logits. Ids are validated against the
 * vocabulary before anything is processed. H2O_ERR_CANCELLED: see h2o_session_cancel. */
H2O_API h2o_status h2o_session_decode(h2o_session *session, const int32_t *tokens, size_t n_tokens);

/** Copies the logits (n_vocab floats) of the last processed token into logits. */
H2O_API h2o_status h2o_session_get_logits(const h2o_session *session, float *logits, size_t capacity);

/* ---------------------------------------------------------------------------------------------
 * Grammars for custom samplers (h2o_generate_params.grammar does this inside h2o_generate)
 * ------------------------------------------------------------------------------------------- */

/** A grammar's state over a model's vocabulary (since 0.8). It keeps the model alive; one thread
 * at a time. */
typedef struct h2o_grammar h2o_grammar;

/** Makes one from a GBNF grammar or a JSON schema (exactly one of the two non-NULL), at its start.
 * Errors: H2O_ERR_INVALID_ARGUMENT (the parse error, with its byte offset). */
H2O_API h2o_status h2o_grammar_create(h2o_model *model, const char *grammar, size_t grammar_len, const char *json_schema,
                                      size_t json_schema_len, h2o_grammar **out_grammar);
/** Frees a grammar (NULL is allowed). */
H2O_API void h2o_grammar_free(h2o_grammar *grammar);
/** Sets to -INFINITY the logits (n_logits = the vocabulary's size) of every token that cannot come
 * next. Walks the whole vocabulary: use it once per sampled token. */
H2O_API h2o_status h2o_grammar_apply(h2o_grammar *grammar, float *logits, size_t n_logits);
/** Takes the token chosen next. Errors: H2O_ERR_INVALID_ARGUMENT (the grammar does not allow it:
 * the state is kept). */
H2O_API h2o_status h2o_grammar_accept(h2o_grammar *grammar, int32_t token);
/** 0: the text so far cannot end here; 1: it may end (or go on); 2: it must end (nothing may
 * follow). -1: NULL grammar. */
H2O_API int32_t h2o_grammar_state(const h2o_grammar *grammar);
/** Back to the start. */
H2O_API h2o_status h2o_grammar_reset(h2o_grammar *grammar);

/** The GBNF grammar of a JSON schema's texts, as h2o_generate_params.json_schema uses it, into
 * text (capacity bytes; *n_bytes: its length; NUL-terminated when there is room). The subset:
 * type (or a list of types), properties with required and additionalProperties (false, the
 * default here, or true or a schema), enum, const, anyOf, oneOf, items with minItems and
 * maxItems, minLength and maxLength, the formats date, time, date-time and uuid, local $ref
 * (#/$defs/..., #/definitions/...). Required properties come first, then the optional ones.
 * Keywords it cannot enforce (pattern, minimum, maximum, multipleOf, allOf, not, uniqueItems,
 * ...) are refused, never ignored. Errors: H2O_ERR_INVALID_ARGUMENT (naming the keyword and where
 * it is, or the JSON error's offset), H2O_ERR_BUFFER_TOO_SMALL. (since 0.8) */
H2O_API h2o_status h2o_json_schema_to_grammar(const char *schema, size_t schema_len, char *text, size_t capacity, size_t *n_bytes);

#ifdef __cplusplus
}
#endif

#endif /**< H2O_H2O_H */

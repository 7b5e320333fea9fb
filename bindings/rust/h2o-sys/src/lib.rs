//! Raw declarations of the h2o C API, written by hand from `include/h2o/h2o.h` and
//! `include/h2o/h2o_experimental.h` (library 0.7, ABI 1).
//!
//! Everything here is `unsafe` to use and follows the header's conventions; the `h2o` crate is
//! the safe interface. `tests/layout.rs` compiles a C program against the header and checks that
//! every struct below has the header's size and field offsets.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub const H2O_VERSION_NUMBER: u32 = 700;
/// The binary interface these declarations follow (the soname's number).
pub const H2O_ABI_VERSION: u32 = 1;
/// Room for research settings in `h2o_session_params::experimental`.
pub const H2O_EXPERIMENTAL_CAPACITY: usize = 16;
/// kv_horizon: keep heavy hitters however far back they lie.
pub const H2O_KV_HORIZON_NONE: u32 = 0xFFFF_FFFF;

/// `h2o_status` codes. New codes may appear in later versions: treat others as "some error".
pub type h2o_status = i32;
pub const H2O_OK: h2o_status = 0;
pub const H2O_ERR_INVALID_ARGUMENT: h2o_status = 1;
pub const H2O_ERR_OUT_OF_MEMORY: h2o_status = 2;
pub const H2O_ERR_IO: h2o_status = 3;
pub const H2O_ERR_MODEL_FORMAT: h2o_status = 4;
pub const H2O_ERR_UNSUPPORTED: h2o_status = 5;
pub const H2O_ERR_CONTEXT_FULL: h2o_status = 6;
pub const H2O_ERR_BACKEND_UNAVAILABLE: h2o_status = 7;
pub const H2O_ERR_INVALID_TEXT: h2o_status = 8;
pub const H2O_ERR_BUFFER_TOO_SMALL: h2o_status = 9;
pub const H2O_ERR_TOKENIZER: h2o_status = 10;
pub const H2O_ERR_INTERNAL: h2o_status = 11;
pub const H2O_ERR_CANCELLED: h2o_status = 12;
pub const H2O_ERR_STATE_FORMAT: h2o_status = 13;
pub const H2O_ERR_BACKEND_FAILED: h2o_status = 14;

pub const H2O_LOG_DEBUG: i32 = 0;
pub const H2O_LOG_INFO: i32 = 1;
pub const H2O_LOG_WARN: i32 = 2;
pub const H2O_LOG_ERROR: i32 = 3;
pub const H2O_LOG_NONE: i32 = 4;

pub const H2O_STOP_NONE: u32 = 0;
pub const H2O_STOP_MAX_TOKENS: u32 = 1;
pub const H2O_STOP_EOS: u32 = 2;
pub const H2O_STOP_STRING: u32 = 3;
pub const H2O_STOP_CALLBACK: u32 = 4;
pub const H2O_STOP_GRAMMAR: u32 = 5;

pub const H2O_TEXT_PIN: u32 = 1;
pub const H2O_TEXT_SPECIAL: u32 = 2;
/// Retention spans a session may hold (h2o_session_add_span_text).
pub const H2O_MAX_SPANS: u32 = 32;

/// Opaque handles.
#[repr(C)]
pub struct h2o_model {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct h2o_session {
    _opaque: [u8; 0],
}

// The C enum h2o_log_level is passed as an int-sized value.
pub type h2o_log_callback = Option<unsafe extern "C" fn(level: c_int, message: *const c_char, user_data: *mut c_void)>;
pub type h2o_progress_callback = Option<unsafe extern "C" fn(fraction: f32, user_data: *mut c_void) -> c_int>;
pub type h2o_token_callback =
    Option<unsafe extern "C" fn(text: *const c_char, length: usize, user_data: *mut c_void) -> c_int>;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct h2o_model_params {
    pub struct_size: u32,
    pub tokenizer_path: *const c_char,
    pub progress: h2o_progress_callback,
    pub progress_user_data: *mut c_void,
    pub prefix_cache_bytes: u64,
    /// Which prompts the prefix cache gives up first (an h2o_cache_policy; since 0.8).
    pub prefix_cache_policy: u32,
}

/// h2o_cache_policy.
pub const H2O_CACHE_POLICY_REUSE: u32 = 0;
pub const H2O_CACHE_POLICY_LRU: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_model_info {
    pub struct_size: u32,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_ff: u32,
    pub head_dim: u32,
    pub bos_token: i32,
    pub eos_token: i32,
    pub n_params: u64,
    pub weight_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_prefix_cache_stats {
    pub struct_size: u32,
    pub entries: u32,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
}

/// One message of h2o_chat_format: UTF-8 text as pointer and length.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct h2o_chat_message {
    pub role: *const c_char,
    pub role_len: usize,
    pub content: *const c_char,
    pub content_len: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct h2o_backend_info {
    pub struct_size: u32,
    pub kind: u32,
    pub device_index: i32,
    pub name: [c_char; 128],
    pub device_type: [c_char; 16],
    pub memory_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_session_params {
    pub struct_size: u32,
    pub n_ctx: u32,
    pub n_threads: u32,
    pub n_batch: u32,
    pub seed: u64,
    pub kv_budget: u32,
    pub kv_policy: u32,
    pub kv_recent: u32,
    pub kv_recent_ratio: f32,
    pub kv_sinks: u32,
    pub position_rolling: i32,
    pub backend: u32,
    pub device_index: i32,
    pub kv_type: u32,
    pub max_memory_bytes: u64,
    pub kv_horizon: u32,
    /// Research settings by key (h2o_experimental.h): use `h2o_session_params_set_experimental`.
    pub experimental: [f64; H2O_EXPERIMENTAL_CAPACITY],
    /// What a full cache does: H2O_KV_OVERFLOW_EVICT (the default) or H2O_KV_OVERFLOW_ERROR.
    pub kv_overflow: u32,
}

/// h2o_kv_overflow.
pub const H2O_KV_OVERFLOW_EVICT: u32 = 0;
pub const H2O_KV_OVERFLOW_ERROR: u32 = 1;

/// h2o_session_event.
pub const H2O_EVENT_KV_FULL: u32 = 1;

/// h2o_model_text: what h2o_model_get_text reads.
pub const H2O_MODEL_TEXT_NAME: u32 = 0;
pub const H2O_MODEL_TEXT_CHAT_FORMAT: u32 = 1;
pub const H2O_MODEL_TEXT_ARCHITECTURE: u32 = 2;

/// h2o_backend_kind.
pub const H2O_BACKEND_AUTO: u32 = 0;
pub const H2O_BACKEND_CPU: u32 = 1;
pub const H2O_BACKEND_VULKAN: u32 = 2;
pub const H2O_BACKEND_CUDA: u32 = 3;

/// h2o_kv_policy.
pub const H2O_KV_FULL: u32 = 0;
pub const H2O_KV_H2O: u32 = 1;
pub const H2O_KV_WINDOW: u32 = 2;
pub const H2O_KV_SINK_WINDOW: u32 = 3;
pub const H2O_KV_SCISSORHANDS: u32 = 4;
pub const H2O_KV_TOVA: u32 = 5;
pub const H2O_KV_ROCO: u32 = 6;
pub const H2O_KV_RANDOM: u32 = 7;
pub const H2O_KV_MEAN_H2O: u32 = 8;
pub const H2O_KV_KEY_NORM: u32 = 9;
pub const H2O_KV_KEY_DIFF: u32 = 10;
pub const H2O_KV_EXPECTED_ATTENTION: u32 = 11;

/// h2o_kv_type.
pub const H2O_KV_TYPE_F32: u32 = 0;
pub const H2O_KV_TYPE_F16: u32 = 1;
pub const H2O_KV_TYPE_Q8: u32 = 2;
pub const H2O_KV_TYPE_Q4: u32 = 3;
pub const H2O_KV_TYPE_K8V4: u32 = 4;

/// h2o_experimental_key (h2o_experimental.h): the research settings' keys.
pub const H2O_EXP_KV_LAYER_SLOPE: u32 = 0;
pub const H2O_EXP_KV_PROMPT_PROXY: u32 = 1;
pub const H2O_EXP_KV_PROMPT_RANDOM_SHARE: u32 = 2;
pub const H2O_EXP_KV_HEAD_SHARE: u32 = 3;
pub const H2O_EXP_KV_SHARE_ACROSS_LAYERS: u32 = 4;
pub const H2O_EXP_KV_SINKS_EVERY_POLICY: u32 = 5;
pub const H2O_EXP_KV_REBALANCE_INTERVAL: u32 = 6;
/// H2O_EXP_KV_REBALANCE_INTERVAL's default.
pub const H2O_KV_REBALANCE_INTERVAL_DEFAULT: u32 = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_kv_usage {
    pub struct_size: u32,
    pub capacity: u32,
    pub n_past: u64,
    pub n_held: u64,
    pub n_evicted: u64,
    pub n_pinned: u64,
    pub evicting_since: u64,
    pub evicts: i32,
}

pub type h2o_session_event_callback =
    Option<unsafe extern "C" fn(event: u32, usage: *const h2o_kv_usage, user_data: *mut c_void)>;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_kv_layout {
    pub struct_size: u32,
    pub budget: u32,
    pub policy: u32,
    pub recent: u32,
    pub sinks: u32,
    pub heavy: u32,
    pub position_rolling: i32,
    pub type_: u32,
    pub n_ctx: u32,
    pub horizon: u32,
    pub min_layer_budget: u32,
    pub max_layer_budget: u32,
    pub min_head_budget: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct h2o_kv_policy_info {
    pub struct_size: u32,
    pub policy: u32,
    pub name: *const c_char,
    pub gathers_statistics: i32,
    pub has_recent_window: i32,
    pub keeps_sinks: i32,
    pub default_recent_ratio: f32,
    pub default_horizon: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_device_traffic {
    pub struct_size: u32,
    pub bytes_to_device: u64,
    pub bytes_to_host: u64,
    pub submissions: u64,
    pub device_memory_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_memory_report {
    pub struct_size: u32,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub scratch_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_span_info {
    pub struct_size: u32,
    pub span_id: u32,
    pub min_share: f32,
    pub min_tokens: i32,
    pub n_tokens: i64,
    pub kept_min: i32,
    pub kept_max: i32,
    pub kept_mean: f64,
    pub attention_share: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct h2o_generate_params {
    pub struct_size: u32,
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: u32,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub stop_at_eos: i32,
    pub grammar: *const c_char,
    pub grammar_len: usize,
    pub json_schema: *const c_char,
    pub json_schema_len: usize,
    pub logit_bias_tokens: *const i32,
    pub logit_bias_values: *const f32,
    pub n_logit_bias: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct h2o_generate_stats {
    pub struct_size: u32,
    pub n_prompt_tokens: u32,
    pub n_generated_tokens: u32,
    pub stop_reason: u32,
    pub n_past: u64,
    pub prompt_seconds: f64,
    pub generate_seconds: f64,
}

/// Flags of h2o_tokenize and h2o_session_add_text.
pub const H2O_TOKENIZE_ADD_BOS: u32 = 1;
pub const H2O_TOKENIZE_SPECIAL: u32 = 2;
pub const H2O_TOKENIZE_VOCAB_BOS: u32 = 4;

extern "C" {
    pub fn h2o_version() -> *const c_char;
    pub fn h2o_version_number() -> u32;
    pub fn h2o_status_string(status: i32) -> *const c_char;
    pub fn h2o_last_error() -> *const c_char;
    pub fn h2o_set_log_callback(callback: h2o_log_callback, user_data: *mut c_void, min_level: i32) -> h2o_status;

    pub fn h2o_model_params_init(params: *mut h2o_model_params, struct_size: usize) -> h2o_status;
    pub fn h2o_model_load(
        path: *const c_char,
        params: *const h2o_model_params,
        out_model: *mut *mut h2o_model,
    ) -> h2o_status;
    pub fn h2o_model_free(model: *mut h2o_model);
    pub fn h2o_model_get_prefix_cache_stats(model: *const h2o_model, stats: *mut h2o_prefix_cache_stats) -> h2o_status;
    pub fn h2o_model_get_info(model: *const h2o_model, info: *mut h2o_model_info) -> h2o_status;
    pub fn h2o_tokenize(
        model: *const h2o_model,
        text: *const c_char,
        text_len: usize,
        flags: u32,
        tokens: *mut i32,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> h2o_status;
    pub fn h2o_detokenize(
        model: *const h2o_model,
        tokens: *const i32,
        n_tokens: usize,
        text: *mut c_char,
        capacity: usize,
        n_bytes: *mut usize,
    ) -> h2o_status;

    pub fn h2o_backend_count(count: *mut usize) -> h2o_status;
    pub fn h2o_backend_get_info(index: usize, info: *mut h2o_backend_info) -> h2o_status;
    pub fn h2o_backend_kind_name(kind: u32) -> *const c_char;
    pub fn h2o_backend_kind_from_name(name: *const c_char, kind: *mut u32) -> h2o_status;
    pub fn h2o_kv_policy_name(policy: u32) -> *const c_char;
    pub fn h2o_kv_policy_from_name(name: *const c_char, policy: *mut u32) -> h2o_status;
    pub fn h2o_kv_policy_get_info(policy: u32, info: *mut h2o_kv_policy_info) -> h2o_status;
    pub fn h2o_kv_type_name(type_: u32) -> *const c_char;
    pub fn h2o_kv_type_from_name(name: *const c_char, type_: *mut u32) -> h2o_status;

    pub fn h2o_session_params_init(params: *mut h2o_session_params, struct_size: usize) -> h2o_status;
    pub fn h2o_session_create(
        model: *mut h2o_model,
        params: *const h2o_session_params,
        out_session: *mut *mut h2o_session,
    ) -> h2o_status;
    pub fn h2o_session_free(session: *mut h2o_session);
    pub fn h2o_session_get_backend(session: *const h2o_session, info: *mut h2o_backend_info) -> h2o_status;
    pub fn h2o_session_get_device_traffic(session: *const h2o_session, traffic: *mut h2o_device_traffic) -> h2o_status;
    pub fn h2o_session_get_kv_layout(session: *const h2o_session, layout: *mut h2o_kv_layout) -> h2o_status;
    pub fn h2o_json_schema_to_grammar(schema: *const c_char, schema_len: usize, text: *mut c_char, capacity: usize,
                                      n_bytes: *mut usize) -> h2o_status;
    pub fn h2o_chat_format_tools(model: *const h2o_model, format_name: *const c_char, messages_json: *const c_char,
                                 messages_len: usize, tools_json: *const c_char, tools_len: usize, add_assistant_prefix: c_int,
                                 text: *mut c_char, capacity: usize, n_bytes: *mut usize) -> h2o_status;
    pub fn h2o_tool_call_grammar(model: *const h2o_model, format_name: *const c_char, tools_json: *const c_char, tools_len: usize,
                                 tool_choice: *const c_char, parallel: c_int, grammar: *mut c_char, capacity: usize,
                                 n_bytes: *mut usize) -> h2o_status;
    pub fn h2o_tool_reply_kind(model: *const h2o_model, format_name: *const c_char, reply: *const c_char, reply_len: usize,
                               kind: *mut c_int) -> h2o_status;
    pub fn h2o_parse_tool_calls(model: *const h2o_model, format_name: *const c_char, reply: *const c_char, reply_len: usize,
                                id_salt: u64, json: *mut c_char, capacity: usize, n_bytes: *mut usize) -> h2o_status;
    pub fn h2o_session_get_kv_usage(session: *const h2o_session, usage: *mut h2o_kv_usage) -> h2o_status;
    pub fn h2o_session_set_event_callback(session: *mut h2o_session, callback: h2o_session_event_callback,
                                          user_data: *mut c_void) -> h2o_status;

    // h2o_experimental.h: research settings by key, outside the stable interface.
    pub fn h2o_experimental_name(key: u32) -> *const c_char;
    pub fn h2o_experimental_from_name(name: *const c_char, key: *mut u32) -> h2o_status;
    pub fn h2o_experimental_bounds(key: u32, min: *mut f64, max: *mut f64) -> h2o_status;
    pub fn h2o_session_params_set_experimental(params: *mut h2o_session_params, key: u32, value: f64) -> h2o_status;
    pub fn h2o_session_params_get_experimental(params: *const h2o_session_params, key: u32, value: *mut f64) -> h2o_status;
    pub fn h2o_session_get_experimental(session: *const h2o_session, key: u32, value: *mut f64) -> h2o_status;
    pub fn h2o_session_reset(session: *mut h2o_session) -> h2o_status;
    pub fn h2o_session_set_seed(session: *mut h2o_session, seed: u64) -> h2o_status;
    pub fn h2o_session_cancel(session: *mut h2o_session) -> h2o_status;
    pub fn h2o_session_last_error(session: *const h2o_session) -> *const c_char;
    pub fn h2o_session_memory(session: *const h2o_session, report: *mut h2o_memory_report) -> h2o_status;
    pub fn h2o_session_add_text(
        session: *mut h2o_session,
        text: *const c_char,
        text_len: usize,
        flags: u32,
    ) -> h2o_status;
    pub fn h2o_session_add_span_text(
        session: *mut h2o_session,
        span_id: u32,
        min_share: f32,
        text: *const c_char,
        text_len: usize,
        flags: u32,
    ) -> h2o_status;
    pub fn h2o_session_get_span_info(session: *mut h2o_session, span_id: u32, info: *mut h2o_span_info) -> h2o_status;

    pub fn h2o_session_save(session: *mut h2o_session, path: *const c_char) -> h2o_status;
    pub fn h2o_session_load(
        model: *mut h2o_model,
        path: *const c_char,
        params: *const h2o_session_params,
        out_session: *mut *mut h2o_session,
    ) -> h2o_status;
    pub fn h2o_session_state_size(session: *mut h2o_session, size: *mut usize) -> h2o_status;
    pub fn h2o_session_save_to_buffer(
        session: *mut h2o_session,
        buffer: *mut c_void,
        capacity: usize,
        size: *mut usize,
    ) -> h2o_status;
    pub fn h2o_session_load_from_buffer(
        model: *mut h2o_model,
        buffer: *const c_void,
        size: usize,
        params: *const h2o_session_params,
        out_session: *mut *mut h2o_session,
    ) -> h2o_status;
    pub fn h2o_session_fork(source: *mut h2o_session, out_session: *mut *mut h2o_session) -> h2o_status;

    pub fn h2o_generate_params_init(params: *mut h2o_generate_params, struct_size: usize) -> h2o_status;
    pub fn h2o_generate(
        session: *mut h2o_session,
        prompt: *const c_char,
        prompt_len: usize,
        params: *const h2o_generate_params,
        callback: h2o_token_callback,
        user_data: *mut c_void,
    ) -> h2o_status;
    pub fn h2o_generate_begin(
        session: *mut h2o_session,
        prompt: *const c_char,
        prompt_len: usize,
        params: *const h2o_generate_params,
    ) -> h2o_status;
    pub fn h2o_generate_next(
        session: *mut h2o_session,
        text: *mut *const c_char,
        length: *mut usize,
        stop_reason: *mut u32,
    ) -> h2o_status;
    pub fn h2o_session_get_stats(session: *const h2o_session, stats: *mut h2o_generate_stats) -> h2o_status;
    pub fn h2o_session_decode(session: *mut h2o_session, tokens: *const i32, n_tokens: usize) -> h2o_status;
    pub fn h2o_session_get_logits(session: *const h2o_session, logits: *mut f32, capacity: usize) -> h2o_status;
}

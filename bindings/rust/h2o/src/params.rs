//! Builders for session and generation parameters. Each starts from the library's defaults
//! (h2o_*_params_init) and changes only what is asked for; the library validates the values
//! when they are used.
use crate::error::{c_string, check, cstr, Result};
use crate::names::{Backend, KvOverflow, KvPolicy, KvType};
use std::ffi::CString;
use std::os::raw::c_char;

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty => $field:ident $(as $conv:ident)?;)*) => {
        $($(#[$doc])* pub fn $name(mut self, value: $ty) -> Self {
            self.raw.$field = setters!(@conv value $(, $conv)?);
            self
        })*
    };
    (@conv $v:ident) => { $v };
    (@conv $v:ident, raw) => { $v.to_raw() };
    (@conv $v:ident, flag) => { $v as i32 };
}

/// How a session is created (h2o_session_params); see the header for every field.
#[derive(Clone, Copy, Debug)]
pub struct SessionParams {
    pub(crate) raw: h2o_sys::h2o_session_params,
}

impl Default for SessionParams {
    fn default() -> Self {
        let mut raw = h2o_sys::h2o_session_params::default();
        // SAFETY: a valid struct of the size passed; with those the call cannot fail.
        unsafe { h2o_sys::h2o_session_params_init(&mut raw, std::mem::size_of_val(&raw)) };
        SessionParams { raw }
    }
}

impl SessionParams {
    /// The library's defaults (h2o_session_params_init).
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The context: slots per (layer, kv head) unless `kv_budget` is smaller; 0: the model's
        /// (at most 4096).
        n_ctx: u32 => n_ctx;
        /// What a full cache does (default Evict: the session evicts, rolls and never runs out).
        kv_overflow: KvOverflow => kv_overflow as raw;
        /// Compute threads; 0: the online cores (at most 8).
        threads: u32 => n_threads;
        /// Prompt tokens per batch; 0: 256.
        batch: u32 => n_batch;
        /// The sampler's (and the random policy's) seed.
        seed: u64 => seed;
        /// KV slots per (layer, kv head), allocated once: the session's memory never grows.
        kv_budget: u32 => kv_budget;
        /// The eviction policy (default Scissorhands).
        kv_policy: KvPolicy => kv_policy as raw;
        /// Protected recent window in tokens; 0: `kv_recent_ratio` of the budget.
        kv_recent: u32 => kv_recent;
        /// The recent window's share of the budget; negative: the policy's default.
        kv_recent_ratio: f32 => kv_recent_ratio;
        /// First tokens of the stream never evicted, for the policies with sinks (default 4).
        kv_sinks: u32 => kv_sinks;
        /// Rotary positions from cache ranks: a stream without end (implied by `KvOverflow::Evict`).
        position_rolling: bool => position_rolling as flag;
        /// The compute backend (default Auto).
        backend: Backend => backend as raw;
        /// The device of that backend; -1: the best one.
        device_index: i32 => device_index;
        /// The KV cache's element format (default F16).
        kv_type: KvType => kv_type as raw;
        /// Refuse to create a session needing more bytes than this; 0: no cap.
        max_memory_bytes: u64 => max_memory_bytes;
        /// Heavy hitters this many tokens or more behind the newest are evicted first; 0: the
        /// policy's default, `h2o_sys::H2O_KV_HORIZON_NONE`: none.
        kv_horizon: u32 => kv_horizon;
    }

    /// Sets a research setting of h2o_experimental.h by its name (`experimental_names()` lists
    /// them, e.g. "kv_head_share"). These are outside the library's stable interface: a later
    /// version may change or remove one, which is then an error here, not a silent change.
    /// Errors: an unknown name, or a value outside the setting's range.
    pub fn experimental(mut self, name: &str, value: f64) -> Result<Self> {
        let key = experimental_key(name)?;
        // SAFETY: a valid params struct, initialised by h2o_session_params_init.
        check(unsafe { h2o_sys::h2o_session_params_set_experimental(&mut self.raw, key, value) })?;
        Ok(self)
    }

    /// A research setting's value in these parameters (0: off).
    pub fn get_experimental(&self, name: &str) -> Result<f64> {
        let key = experimental_key(name)?;
        let mut value = 0.0;
        // SAFETY: valid pointers for the call.
        check(unsafe { h2o_sys::h2o_session_params_get_experimental(&self.raw, key, &mut value) })?;
        Ok(value)
    }
}

/// The key of a research setting's name (h2o_experimental_from_name).
pub(crate) fn experimental_key(name: &str) -> Result<u32> {
    let c_name = c_string("research setting name", name)?;
    let mut key = 0u32;
    // SAFETY: both pointers are valid for the call.
    check(unsafe { h2o_sys::h2o_experimental_from_name(c_name.as_ptr(), &mut key) })?;
    Ok(key)
}

/// The names of the research settings this library has (h2o_experimental_name).
pub fn experimental_names() -> Vec<String> {
    (0u32..)
        .map(|key| unsafe { h2o_sys::h2o_experimental_name(key) })
        .take_while(|p| !p.is_null())
        // SAFETY: a constant string of the library.
        .map(|p| unsafe { cstr(p) })
        .collect()
}

/// The values a research setting accepts, `(min, max)`, as `SessionParams::experimental` checks
/// them (h2o_experimental_bounds). Errors: a name this library does not know.
pub fn experimental_bounds(name: &str) -> Result<(f64, f64)> {
    let key = experimental_key(name)?;
    let (mut min, mut max) = (0.0f64, 0.0f64);
    // SAFETY: both pointers are valid for the call.
    check(unsafe { h2o_sys::h2o_experimental_bounds(key, &mut min, &mut max) })?;
    Ok((min, max))
}

/// How text is generated (h2o_generate_params); see the header for every field.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    raw: h2o_sys::h2o_generate_params,
    stop_strings: Vec<String>,
    grammar: Option<String>,
    json_schema: Option<String>,
    logit_bias: Vec<(i32, f32)>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        let mut raw = unsafe { std::mem::zeroed::<h2o_sys::h2o_generate_params>() };
        // SAFETY: as for SessionParams.
        unsafe { h2o_sys::h2o_generate_params_init(&mut raw, std::mem::size_of_val(&raw)) };
        GenerateParams { raw, stop_strings: Vec::new(), grammar: None, json_schema: None, logit_bias: Vec::new() }
    }
}

impl GenerateParams {
    /// The library's defaults (h2o_generate_params_init).
    pub fn new() -> Self {
        Self::default()
    }

    /// Greedy decoding (temperature 0): the same input always gives the same text.
    pub fn greedy(self) -> Self {
        self.temperature(0.0)
    }

    setters! {
        /// Tokens to generate at most (default 256).
        max_tokens: u32 => max_tokens;
        /// Sampling temperature; 0: greedy (default 0.8).
        temperature: f32 => temperature;
        /// Sample among the k most likely tokens; 0: off (default 40).
        top_k: u32 => top_k;
        /// Nucleus sampling's probability mass; 1: off (default 0.95).
        top_p: f32 => top_p;
        /// Drop tokens below this share of the top probability; 0: off (default 0.05).
        min_p: f32 => min_p;
        /// Penalty of recently seen tokens; 1: off (the default).
        repeat_penalty: f32 => repeat_penalty;
        /// How many recent tokens the penalty looks at (default 64).
        repeat_last_n: u32 => repeat_last_n;
        /// Stop at an end-of-generation token (default true).
        stop_at_eos: bool => stop_at_eos as flag;
    }

    /// Generation stops when the text contains one of these (which is not delivered).
    pub fn stop_strings<S: Into<String>>(mut self, stops: impl IntoIterator<Item = S>) -> Self {
        self.stop_strings = stops.into_iter().map(Into::into).collect();
        self
    }

    /// Constrains the reply to a GBNF grammar (its rule `root`); generation ends with
    /// `StopReason::Grammar` when nothing more may follow. The library checks it when generating.
    pub fn grammar(mut self, gbnf: impl Into<String>) -> Self {
        self.grammar = Some(gbnf.into());
        self
    }

    /// Constrains the reply to JSON the schema accepts (the subset `json_schema_to_grammar`
    /// documents); at most one of a grammar and a schema.
    pub fn json_schema(mut self, schema: impl Into<String>) -> Self {
        self.json_schema = Some(schema.into());
        self
    }

    /// Adds each bias to its token's logit before sampling (`f32::NEG_INFINITY` bans a token).
    pub fn logit_bias(mut self, bias: impl IntoIterator<Item = (i32, f32)>) -> Self {
        self.logit_bias = bias.into_iter().collect();
        self
    }

    /// The C struct with the stop strings it points to; valid while the result lives.
    pub(crate) fn to_c(&self) -> Result<CGenerateParams> {
        let strings = self.stop_strings.iter().map(|s| c_string("stop string", s)).collect::<Result<Vec<_>>>()?;
        let pointers: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let mut raw = self.raw;
        raw.stop_strings = if pointers.is_empty() { std::ptr::null() } else { pointers.as_ptr() };
        raw.n_stop_strings = pointers.len();
        if let Some(g) = &self.grammar {
            raw.grammar = g.as_ptr() as *const c_char;
            raw.grammar_len = g.len();
        }
        if let Some(s) = &self.json_schema {
            raw.json_schema = s.as_ptr() as *const c_char;
            raw.json_schema_len = s.len();
        }
        let tokens: Vec<i32> = self.logit_bias.iter().map(|b| b.0).collect();
        let values: Vec<f32> = self.logit_bias.iter().map(|b| b.1).collect();
        raw.logit_bias_tokens = tokens.as_ptr();
        raw.logit_bias_values = values.as_ptr();
        raw.n_logit_bias = tokens.len();
        // The grammar and schema texts are self's, which outlives the call through `&self`.
        Ok(CGenerateParams { raw, _strings: strings, _pointers: pointers, _bias: (tokens, values) })
    }
}

pub(crate) struct CGenerateParams {
    pub(crate) raw: h2o_sys::h2o_generate_params,
    // Owned here so that raw's pointers stay valid (moving a Vec does not move its buffer).
    _strings: Vec<CString>,
    _pointers: Vec<*const c_char>,
    _bias: (Vec<i32>, Vec<f32>),
}

/// The GBNF grammar the library makes of a JSON schema (h2o_json_schema_to_grammar: types,
/// properties with required and additionalProperties, enum, const, anyOf, oneOf, items with
/// minItems and maxItems, string lengths and formats, local $ref; what it cannot enforce is
/// refused by name). Errors: the keyword refused, or the JSON error's offset.
pub fn json_schema_to_grammar(schema: &str) -> Result<String> {
    // SAFETY: a valid text; text_out passes a buffer of the capacity it gives.
    crate::model::text_out(|text, capacity, n| unsafe {
        h2o_sys::h2o_json_schema_to_grammar(schema.as_ptr() as *const c_char, schema.len(), text, capacity, n)
    })
}

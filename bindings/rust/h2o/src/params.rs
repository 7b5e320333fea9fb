//! Builders for session and generation parameters. Each starts from the library's defaults
//! (h2o_*_params_init) and changes only what is asked for; the library validates the values
//! when they are used.
use crate::error::{c_string, Result};
use crate::names::{Backend, KvPolicy, KvType};
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
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Longest stream without position rolling; 0: the model's (at most 4096).
        n_ctx: u32 => n_ctx;
        /// Compute threads; 0: the online cores (at most 8).
        threads: u32 => n_threads;
        batch: u32 => n_batch;
        seed: u64 => seed;
        /// KV slots per (layer, kv head), allocated once: the session's memory never grows.
        kv_budget: u32 => kv_budget;
        kv_policy: KvPolicy => kv_policy as raw;
        kv_recent: u32 => kv_recent;
        kv_recent_ratio: f32 => kv_recent_ratio;
        kv_sinks: u32 => kv_sinks;
        /// Rotary positions from cache ranks: a stream without end.
        position_rolling: bool => position_rolling as flag;
        backend: Backend => backend as raw;
        device_index: i32 => device_index;
        kv_type: KvType => kv_type as raw;
        /// Refuse to create a session needing more bytes than this; 0: no cap.
        max_memory_bytes: u64 => max_memory_bytes;
        /// Heavy hitters this many tokens or more behind the newest are evicted first; 0: the
        /// policy's default, `h2o_sys::H2O_KV_HORIZON_NONE`: none.
        kv_horizon: u32 => kv_horizon;
        /// The budget's slope across layers in [-0.9, 0.9], the same memory: positive gives upper
        /// layers more slots than lower ones; 0: every layer `kv_budget`.
        kv_layer_slope: f32 => kv_layer_slope;
        /// One-shot prompt eviction (as NACL): a prompt batch's victims are ranked by the attention
        /// of the previous batch's last N queries, at most 4096; 0: by every query read so far.
        /// Only with the policies that gather statistics (h2o, scissorhands, tova, roco, mean_h2o).
        kv_prompt_proxy: u32 => kv_prompt_proxy;
        /// The share of tokens in [0, 1] whose proxy attention gets a random factor in [0, 2) drawn
        /// from the seed, when `kv_prompt_proxy` > 0; 0: none.
        kv_prompt_random_share: f32 => kv_prompt_random_share;
        /// Budgets per kv head (as Ada-KV, the same memory), in [0, 0.9]: the share of each layer's
        /// slots that moves between its kv heads by their attention; each head keeps at least
        /// (1 - share) of its layer's budget. Only with the policies that gather statistics (h2o,
        /// scissorhands, tova, roco, mean_h2o); with `position_rolling` (since 0.5.1) each head's
        /// positions are ranks among its own tokens; 0: every head its layer's budget.
        kv_head_share: f32 => kv_head_share;
        /// Budgets across layers (since 0.6): `kv_head_share`'s slots move between the kv heads of
        /// every layer, not only within each layer, so a layer whose heads attend to few tokens
        /// gives slots to one whose heads attend to many. Needs a `kv_head_share` above 0.
        kv_share_across_layers: bool => kv_share_across_layers as flag;
    }
}

/// How text is generated (h2o_generate_params); see the header for every field.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    raw: h2o_sys::h2o_generate_params,
    stop_strings: Vec<String>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        let mut raw = unsafe { std::mem::zeroed::<h2o_sys::h2o_generate_params>() };
        // SAFETY: as for SessionParams.
        unsafe { h2o_sys::h2o_generate_params_init(&mut raw, std::mem::size_of_val(&raw)) };
        GenerateParams { raw, stop_strings: Vec::new() }
    }
}

impl GenerateParams {
    pub fn new() -> Self {
        Self::default()
    }

    /// Greedy decoding (temperature 0): the same input always gives the same text.
    pub fn greedy(self) -> Self {
        self.temperature(0.0)
    }

    setters! {
        max_tokens: u32 => max_tokens;
        temperature: f32 => temperature;
        top_k: u32 => top_k;
        top_p: f32 => top_p;
        min_p: f32 => min_p;
        repeat_penalty: f32 => repeat_penalty;
        repeat_last_n: u32 => repeat_last_n;
        stop_at_eos: bool => stop_at_eos as flag;
    }

    /// Generation stops when the text contains one of these (which is not delivered).
    pub fn stop_strings<S: Into<String>>(mut self, stops: impl IntoIterator<Item = S>) -> Self {
        self.stop_strings = stops.into_iter().map(Into::into).collect();
        self
    }

    /// The C struct with the stop strings it points to; valid while the result lives.
    pub(crate) fn to_c(&self) -> Result<CGenerateParams> {
        let strings = self.stop_strings.iter().map(|s| c_string("stop string", s)).collect::<Result<Vec<_>>>()?;
        let pointers: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let mut raw = self.raw;
        raw.stop_strings = if pointers.is_empty() { std::ptr::null() } else { pointers.as_ptr() };
        raw.n_stop_strings = pointers.len();
        Ok(CGenerateParams { raw, _strings: strings, _pointers: pointers })
    }
}

pub(crate) struct CGenerateParams {
    pub(crate) raw: h2o_sys::h2o_generate_params,
    // Owned here so that raw's pointers stay valid (moving a Vec does not move its buffer).
    _strings: Vec<CString>,
    _pointers: Vec<*const c_char>,
}

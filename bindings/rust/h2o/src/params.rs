//! Builders for session and generation parameters. Each starts from the library's defaults
//! (h2o_*_params_init) and changes only what is asked for; the library validates the values
//! when they are used.
use crate::error::{c_string, check, cstr, Result};
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

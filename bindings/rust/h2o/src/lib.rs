#![warn(missing_docs)]
//! Safe Rust interface to h2o, which runs Llama-family models in constant memory.
//!
//! ```no_run
//! use h2o::{GenerateParams, Model, Session, SessionParams};
//! let model = Model::load("stories260K.gguf")?;
//! let mut session = Session::new(&model, &SessionParams::new().kv_budget(128).position_rolling(true))?;
//! for piece in session.stream("Once upon a time", &GenerateParams::new().max_tokens(32))? {
//!     print!("{}", piece?);
//! }
//! # Ok::<(), h2o::Error>(())
//! ```
mod callback;
mod error;
mod model;
mod names;
mod params;
mod session;

pub use error::{Error, Result, Status};
pub use model::{Model, ModelInfo, ModelLoader, PrefixCacheStats};
pub use names::{Backend, CachePolicy, KvOverflow, KvPolicy, KvPolicyInfo, KvType, SessionEvent, StopReason};
pub use params::{experimental_bounds, experimental_names, json_schema_to_grammar, GenerateParams, SessionParams};
pub use session::{BackendInfo, CancelHandle, GenerateStats, KvLayout, KvUsage, MemoryReport, Session, SpanInfo, Stream};

/// Retention spans a session may hold (`Session::add_span_text`).
pub const MAX_SPANS: u32 = h2o_sys::H2O_MAX_SPANS;

/// The library's version, e.g. "0.7.0".
pub fn version() -> String {
    // SAFETY: a constant string.
    unsafe { error::cstr(h2o_sys::h2o_version()) }
}

/// True when the loaded library has the ABI these bindings were written for: the same major and
/// minor version (before 1.0 a minor version may change the ABI), and a patch at least theirs
/// (a patch may lift a refusal these bindings' callers rely on).
pub fn version_matches() -> bool {
    let number = unsafe { h2o_sys::h2o_version_number() };
    number / 100 == h2o_sys::H2O_VERSION_NUMBER / 100 && number >= h2o_sys::H2O_VERSION_NUMBER
}

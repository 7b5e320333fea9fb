//! Backends, KV eviction policies and KV element types as Rust enums. Their names come from the
//! library (h2o_*_name / h2o_*_from_name), so they are the names its tools print.
use crate::error::{c_string, check, cstr, Result};
use std::fmt;
use std::os::raw::c_char;
use std::str::FromStr;

macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident, $to_name:ident, $from_name:ident {
        $($(#[$variant_doc:meta])* $variant:ident = $value:expr),* $(,)?
    }) => {
        $(#[$doc])*
        /// `Other` holds a value that a newer library reports and this crate does not know.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_doc])* $variant,)*
            /// A value of a newer library.
            Other(u32),
        }

        impl $name {
            /// The value of the C enumeration's number.
            pub fn from_raw(value: u32) -> Self {
                match value { $($value => $name::$variant,)* other => $name::Other(other) }
            }
            /// The C enumeration's number.
            pub fn to_raw(self) -> u32 {
                match self { $($name::$variant => $value,)* $name::Other(v) => v }
            }
            /// The library's name; None for a value it does not know.
            pub fn name(self) -> Option<String> {
                // SAFETY: the name functions return NULL or a constant string.
                let p: *const c_char = unsafe { h2o_sys::$to_name(self.to_raw()) };
                (!p.is_null()).then(|| unsafe { cstr(p) })
            }
        }

        impl FromStr for $name {
            type Err = crate::Error;
            fn from_str(s: &str) -> Result<Self> {
                let name = c_string("name", s)?;
                let mut value = 0u32;
                // SAFETY: both pointers are valid for the call.
                check(unsafe { h2o_sys::$from_name(name.as_ptr(), &mut value) })?;
                Ok($name::from_raw(value))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(&n),
                    None => write!(f, "unknown ({})", self.to_raw()),
                }
            }
        }
    };
}

named_enum!(
    /// Compute backend (h2o_backend_kind).
    Backend, h2o_backend_kind_name, h2o_backend_kind_from_name {
        /// A GPU when one runs the model, else the CPU.
        Auto = 0,
        /// The CPU (the reference backend).
        Cpu = 1,
        /// A GPU (or a software device) through Vulkan.
        Vulkan = 2,
        /// An NVIDIA GPU through CUDA.
        Cuda = 3,
    }
);

named_enum!(
    /// KV eviction policy (h2o_kv_policy); the header documents each.
    KvPolicy, h2o_kv_policy_name, h2o_kv_policy_from_name {
        /// No eviction: a full cache refuses more tokens.
        Full = 0,
        /// Heavy-Hitter Oracle: a recent window and the most attended tokens.
        H2o = 1,
        /// The most recent tokens only.
        Window = 2,
        /// StreamingLLM: the first tokens (sinks) and the most recent.
        SinkWindow = 3,
        /// Scissorhands: a recent window and the most persistently important tokens (the default).
        Scissorhands = 4,
        /// TOVA: evicts the token with the least attention at the latest step.
        Tova = 5,
        /// RoCo: a recent window and the tokens of highest mean attention.
        Roco = 6,
        /// A random unprotected token: a baseline.
        Random = 7,
        /// Sinks, a recent window and heavy hitters by mean attention.
        MeanH2o = 8,
        /// A recent window and the keys of smallest norm (query-agnostic).
        KeyNorm = 9,
        /// KeyDiff: a recent window and the keys least like the others (query-agnostic).
        KeyDiff = 10,
        /// Expected Attention: a recent window and the tokens future queries are expected to attend to.
        ExpectedAttention = 11,
    }
);

/// What a policy keeps, and so which settings apply to it (h2o_kv_policy_info).
#[derive(Clone, Debug, PartialEq)]
pub struct KvPolicyInfo {
    /// The policy's name, e.g. "scissorhands".
    pub name: String,
    /// Ranks tokens by attention: the horizon and the research settings that move budgets apply.
    pub gathers_statistics: bool,
    /// Protects a recent window: `kv_recent` and `kv_recent_ratio` apply.
    pub has_recent_window: bool,
    /// Always keeps the first `kv_sinks` tokens of the stream.
    pub keeps_sinks: bool,
    /// The window's share of the budget when `kv_recent_ratio` is negative.
    pub default_recent_ratio: f32,
    /// The horizon's default, in budgets (0: none).
    pub default_horizon: f32,
}

impl KvPolicy {
    /// The library's description of this policy. Errors: a policy it does not know.
    pub fn info(self) -> Result<KvPolicyInfo> {
        // SAFETY: plain data; the library fills it when struct_size allows.
        let mut raw = h2o_sys::h2o_kv_policy_info {
            struct_size: std::mem::size_of::<h2o_sys::h2o_kv_policy_info>() as u32,
            policy: 0,
            name: std::ptr::null(),
            gathers_statistics: 0,
            has_recent_window: 0,
            keeps_sinks: 0,
            default_recent_ratio: 0.0,
            default_horizon: 0.0,
        };
        // SAFETY: a valid output struct.
        check(unsafe { h2o_sys::h2o_kv_policy_get_info(self.to_raw(), &mut raw) })?;
        Ok(KvPolicyInfo {
            // SAFETY: a constant string of the library.
            name: unsafe { cstr(raw.name) },
            gathers_statistics: raw.gathers_statistics != 0,
            has_recent_window: raw.has_recent_window != 0,
            keeps_sinks: raw.keeps_sinks != 0,
            default_recent_ratio: raw.default_recent_ratio,
            default_horizon: raw.default_horizon,
        })
    }
}

named_enum!(
    /// Element format of the KV cache (h2o_kv_type).
    KvType, h2o_kv_type_name, h2o_kv_type_from_name {
        /// 32-bit floats.
        F32 = 0,
        /// 16-bit floats (the default).
        F16 = 1,
        /// 8 bits with a scale per row.
        Q8 = 2,
        /// 4 bits with a scale and minimum per row (lossy for keys).
        Q4 = 3,
        /// Keys in 8 bits, values in 4: the recommended small cache.
        K8V4 = 4,
    }
);

/// Why a generation ended (h2o_stop_reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// It has not stopped.
    None,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// An end-of-generation token.
    Eos,
    /// A stop string was generated.
    StopString,
    /// The callback asked to stop.
    Callback,
    /// The grammar or schema is complete and nothing may follow.
    Grammar,
    /// A value of a newer library.
    Other(u32),
}

impl StopReason {
    /// The value of the C enumeration's number.
    pub fn from_raw(value: u32) -> StopReason {
        match value {
            h2o_sys::H2O_STOP_NONE => StopReason::None,
            h2o_sys::H2O_STOP_MAX_TOKENS => StopReason::MaxTokens,
            h2o_sys::H2O_STOP_EOS => StopReason::Eos,
            h2o_sys::H2O_STOP_STRING => StopReason::StopString,
            h2o_sys::H2O_STOP_CALLBACK => StopReason::Callback,
            h2o_sys::H2O_STOP_GRAMMAR => StopReason::Grammar,
            other => StopReason::Other(other),
        }
    }
}

/// What a session does when its cache is full (h2o_kv_overflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvOverflow {
    /// Evict by the policy and roll positions: the session never runs out (the default).
    Evict,
    /// A plain full cache: the stream ends at the context (`Status::ContextFull`).
    Error,
}

impl KvOverflow {
    /// The C enumeration's number.
    pub fn to_raw(self) -> u32 {
        match self {
            KvOverflow::Evict => h2o_sys::H2O_KV_OVERFLOW_EVICT,
            KvOverflow::Error => h2o_sys::H2O_KV_OVERFLOW_ERROR,
        }
    }
}

/// Which prompts a model's prefix cache gives up first when it is full (h2o_cache_policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// The lowest expected saving first: reuse learned from the cache's own history (the default).
    #[default]
    Reuse = 0,
    /// The least recently used first.
    Lru = 1,
}

impl CachePolicy {
    /// The C enumeration's number.
    pub fn to_raw(self) -> u32 {
        match self {
            CachePolicy::Reuse => h2o_sys::H2O_CACHE_POLICY_REUSE,
            CachePolicy::Lru => h2o_sys::H2O_CACHE_POLICY_LRU,
        }
    }
}

/// Events a session reports (h2o_session_event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// The cache is full and begins to evict (once per conversation).
    KvFull,
    /// A value of a newer library.
    Other(u32),
}

impl SessionEvent {
    /// The value of the C enumeration's number.
    pub fn from_raw(value: u32) -> SessionEvent {
        match value {
            h2o_sys::H2O_EVENT_KV_FULL => SessionEvent::KvFull,
            other => SessionEvent::Other(other),
        }
    }
}

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

/// An h2o status code. `Other` holds codes that a newer library may return and this crate does
/// not know yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// A null handle, a bad parameter or a struct_size mismatch.
    InvalidArgument,
    /// An allocation failed; nothing was changed.
    OutOfMemory,
    /// A file could not be opened, mapped or read.
    Io,
    /// The model file is malformed, truncated or inconsistent.
    ModelFormat,
    /// Well-formed, but of an architecture or type this library does not run.
    Unsupported,
    /// The session's KV cache cannot take more tokens.
    ContextFull,
    /// The requested backend or device is not present.
    BackendUnavailable,
    /// Text is not valid UTF-8.
    InvalidText,
    /// An output buffer was too small (the binding retries with the needed size).
    BufferTooSmall,
    /// The tokenizer could not be built or failed.
    Tokenizer,
    /// A bug in h2o: please report it with the message.
    Internal,
    /// `Session::cancel` or a progress callback stopped the call.
    Cancelled,
    /// A saved session state is malformed, truncated or foreign.
    StateFormat,
    /// The compute device failed while running; `Session::reset` recovers.
    BackendFailed,
    /// A code newer than this crate.
    Other(i32),
}

const KNOWN: [Status; 14] = [
    Status::InvalidArgument,
    Status::OutOfMemory,
    Status::Io,
    Status::ModelFormat,
    Status::Unsupported,
    Status::ContextFull,
    Status::BackendUnavailable,
    Status::InvalidText,
    Status::BufferTooSmall,
    Status::Tokenizer,
    Status::Internal,
    Status::Cancelled,
    Status::StateFormat,
    Status::BackendFailed,
];

impl Status {
    /// The status of a non-zero code (the known ones are 1..=14, in the header's order).
    pub fn from_code(code: i32) -> Status {
        usize::try_from(code - 1).ok().and_then(|i| KNOWN.get(i).copied()).unwrap_or(Status::Other(code))
    }

    /// The library's integer code.
    pub fn code(self) -> i32 {
        match self {
            Status::Other(code) => code,
            known => KNOWN.iter().position(|&s| s == known).unwrap() as i32 + 1,
        }
    }

    /// The library's English name of the code, e.g. "invalid argument".
    pub fn name(self) -> String {
        // SAFETY: h2o_status_string never returns NULL and its strings are constant.
        unsafe { cstr(h2o_sys::h2o_status_string(self.code())) }
    }
}

/// A failed h2o call (with the library's status and message), or a panic in a callback that the
/// binding caught at the C boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A call failed.
    H2o {
        /// How.
        status: Status,
        /// What, as the library wrote it.
        message: String,
    },
    /// A callback panicked; the panic was caught at the C boundary.
    CallbackPanicked {
        /// The panic's message.
        message: String,
    },
}

impl Error {
    /// The h2o status; None for a panicked callback.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::H2o { status, .. } => Some(*status),
            Error::CallbackPanicked { .. } => None,
        }
    }

    /// The library's message, or the panic's.
    pub fn message(&self) -> &str {
        match self {
            Error::H2o { message, .. } | Error::CallbackPanicked { message } => message,
        }
    }

    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error::H2o { status, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::H2o { status, message } => write!(f, "h2o: {}: {}", status.name(), message),
            Error::CallbackPanicked { message } => write!(f, "h2o: a callback panicked: {message}"),
        }
    }
}

impl std::error::Error for Error {}

/// The result of an h2o call.
pub type Result<T> = std::result::Result<T, Error>;

/// Copies a C string the library returned ("" for NULL).
pub(crate) unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Ok for H2O_OK; otherwise the error with the thread's last message.
pub(crate) fn check(code: i32) -> Result<()> {
    if code == h2o_sys::H2O_OK {
        return Ok(());
    }
    // SAFETY: the message stays valid until the next h2o call on this thread; it is copied now.
    Err(Error::new(Status::from_code(code), unsafe { cstr(h2o_sys::h2o_last_error()) }))
}

/// A text argument that must become a C string (a path, a name): NUL inside is refused the way
/// h2o refuses a bad argument.
pub(crate) fn c_string(what: &str, text: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(text)
        .map_err(|_| Error::new(Status::InvalidArgument, format!("{what} contains a NUL byte: {text:?}")))
}

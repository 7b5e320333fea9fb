use crate::callback::Guarded;
use crate::error::{c_string, check, Error, Result, Status};
use crate::names::CachePolicy;
use std::os::raw::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// A loaded model: read-only weights and tokenizer. Share it between threads with `Arc<Model>`;
/// sessions keep the library's model alive, so a Model may be dropped before its sessions.
pub struct Model {
    raw: NonNull<h2o_sys::h2o_model>,
}

// SAFETY: the header's threading contract: a model is immutable after loading and may be used by
// any number of threads at once; freeing it is reference counted against its sessions.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

/// The model's hyperparameters (h2o_model_info).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// Tokens in the vocabulary (the logits' count).
    pub n_vocab: u32,
    /// The context length the model was trained with.
    pub n_ctx_train: u32,
    /// Width of the residual stream.
    pub n_embd: u32,
    /// Transformer blocks.
    pub n_layer: u32,
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Width of the feed-forward network.
    pub n_ff: u32,
    /// Elements of one head.
    pub head_dim: u32,
    /// The beginning-of-text token; None when the model has none.
    pub bos_token: Option<i32>,
    /// The end-of-text token; None when the model has none.
    pub eos_token: Option<i32>,
    /// Weight elements.
    pub n_params: u64,
    /// Bytes of the weights as stored.
    pub weight_bytes: u64,
}

/// What the model's prefix cache holds and has done (h2o_prefix_cache_stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Processed prefixes held.
    pub entries: u32,
    /// Bytes held, at most the loader's `prefix_cache_bytes`.
    pub bytes: u64,
    /// Fresh sessions that started from a cached prefix.
    pub hits: u64,
    /// Fresh sessions that found none.
    pub misses: u64,
}

/// Options for loading a model: `ModelLoader::new(path).tokenizer(..).progress(..).load()`.
pub struct ModelLoader<'a> {
    path: PathBuf,
    tokenizer: Option<PathBuf>,
    progress: Option<Box<dyn FnMut(f32) -> bool + 'a>>,
    prefix_cache_bytes: u64,
    prefix_cache_policy: CachePolicy,
}

impl<'a> ModelLoader<'a> {
    /// Loads the GGUF file at `path`, with the defaults until the other methods change them.
    pub fn new(path: impl AsRef<Path>) -> Self {
        ModelLoader {
            path: path.as_ref().to_owned(),
            tokenizer: None,
            progress: None,
            prefix_cache_bytes: 0,
            prefix_cache_policy: CachePolicy::Reuse,
        }
    }

    /// A sentencepiece .model file to use instead of the vocabulary inside the GGUF file.
    pub fn tokenizer(mut self, path: impl AsRef<Path>) -> Self {
        self.tokenizer = Some(path.as_ref().to_owned());
        self
    }

    /// Called with the fraction loaded (0 to 1); return false to cancel (Status::Cancelled).
    pub fn progress(mut self, f: impl FnMut(f32) -> bool + 'a) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// Bytes the model may keep of processed prompt prefixes, so that a fresh session whose first
    /// text begins like another's starts from that state (0, the default: no cache; CPU only).
    pub fn prefix_cache_bytes(mut self, bytes: u64) -> Self {
        self.prefix_cache_bytes = bytes;
        self
    }

    /// Which prompts the prefix cache gives up first when it is full (default `CachePolicy::Reuse`).
    pub fn prefix_cache_policy(mut self, policy: CachePolicy) -> Self {
        self.prefix_cache_policy = policy;
        self
    }

    /// Loads the model (its errors: `h2o_model_load`'s).
    pub fn load(self) -> Result<Model> {
        let path = c_string("model path", &path_text(&self.path)?)?;
        let tokenizer = self.tokenizer.as_deref().map(|t| c_string("tokenizer path", &path_text(t)?)).transpose()?;
        let mut params = unsafe { std::mem::zeroed::<h2o_sys::h2o_model_params>() };
        // SAFETY: params is a valid struct of the size passed.
        check(unsafe { h2o_sys::h2o_model_params_init(&mut params, std::mem::size_of_val(&params)) })?;
        params.tokenizer_path = tokenizer.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
        params.prefix_cache_bytes = self.prefix_cache_bytes;
        params.prefix_cache_policy = self.prefix_cache_policy.to_raw();

        type Progress<'b> = Guarded<Box<dyn FnMut(f32) -> bool + 'b>>;
        unsafe extern "C" fn on_progress(fraction: f32, user: *mut c_void) -> c_int {
            // SAFETY: user is the &mut Progress below, alive for the whole load call.
            let guarded = &mut *(user as *mut Progress);
            guarded.call(1, |f| if f(fraction) { 0 } else { 1 })
        }
        let mut guarded = self.progress.map(Guarded::new);
        if let Some(g) = guarded.as_mut() {
            params.progress = Some(on_progress);
            params.progress_user_data = g as *mut Progress as *mut c_void;
        }

        let mut raw = std::ptr::null_mut();
        // SAFETY: every pointer in params outlives the call.
        let result = check(unsafe { h2o_sys::h2o_model_load(path.as_ptr(), &params, &mut raw) });
        let result = match guarded {
            Some(g) => g.finish(result),
            None => result,
        };
        if result.is_err() && !raw.is_null() {
            // Only reachable when a callback panicked after the load had succeeded.
            unsafe { h2o_sys::h2o_model_free(raw) };
        }
        result?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "h2o_model_load returned no model"))?;
        Ok(Model { raw })
    }
}

pub(crate) fn path_text(path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::new(Status::InvalidArgument, format!("path is not UTF-8: {}", path.display())))
}

/// The text a C call writes the h2o way: asked for its size (`BUFFER_TOO_SMALL` with the size),
/// then written into a buffer of that size.
pub(crate) fn text_out(call: impl Fn(*mut c_char, usize, *mut usize) -> i32) -> Result<String> {
    let mut n = 0usize;
    let code = call(std::ptr::null_mut(), 0, &mut n);
    if code != h2o_sys::H2O_ERR_BUFFER_TOO_SMALL {
        check(code)?;
    }
    let mut buffer = vec![0u8; n + 1];
    check(call(buffer.as_mut_ptr() as *mut c_char, buffer.len(), &mut n))?;
    buffer.truncate(n);
    String::from_utf8(buffer).map_err(|_| Error::new(Status::Internal, "the library wrote text that is not UTF-8"))
}

// A format name for the C API: None is the model's own template.
fn format_name(format: Option<&str>) -> Result<Option<std::ffi::CString>> {
    format.map(|f| c_string("the format name", f)).transpose()
}

impl Model {
    /// Writes a conversation with tools as the model's family reads them (h2o_chat_format_tools):
    /// `messages_json` and `tools_json` are OpenAI's JSON shapes (an assistant's `tool_calls`,
    /// role `tool` results with `tool_call_id`); `format` None is the model's own template.
    pub fn format_chat_with_tools(&self, messages_json: &str, tools_json: Option<&str>, format: Option<&str>,
                                  add_assistant_prefix: bool) -> Result<String> {
        let name = format_name(format)?;
        let name_ptr = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
        let tools = tools_json.unwrap_or("");
        // SAFETY: texts with their lengths; text_out passes a buffer of the capacity it gives.
        text_out(|text, capacity, n| unsafe {
            h2o_sys::h2o_chat_format_tools(self.as_ptr(), name_ptr, messages_json.as_ptr() as *const c_char, messages_json.len(),
                                           tools.as_ptr() as *const c_char, tools.len(), add_assistant_prefix as c_int, text, capacity, n)
        })
    }

    /// The grammar (`GenerateParams::grammar`) of a reply under `tool_choice`: "auto",
    /// "required" or a function's name; `parallel` false: one call (h2o_tool_call_grammar).
    pub fn tool_call_grammar(&self, tools_json: &str, tool_choice: &str, parallel: bool, format: Option<&str>) -> Result<String> {
        let name = format_name(format)?;
        let name_ptr = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
        let choice = c_string("tool_choice", tool_choice)?;
        // SAFETY: as above.
        text_out(|text, capacity, n| unsafe {
            h2o_sys::h2o_tool_call_grammar(self.as_ptr(), name_ptr, tools_json.as_ptr() as *const c_char, tools_json.len(), choice.as_ptr(),
                                           parallel as c_int, text, capacity, n)
        })
    }

    /// A reply read back, as JSON: {"content": text or null, "tool_calls": [{"id", "type",
    /// "function": {"name", "arguments"}}]} (h2o_parse_tool_calls; ids from the reply and id_salt).
    pub fn parse_tool_calls(&self, reply: &str, id_salt: u64, format: Option<&str>) -> Result<String> {
        let name = format_name(format)?;
        let name_ptr = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
        // SAFETY: as above.
        text_out(|text, capacity, n| unsafe {
            h2o_sys::h2o_parse_tool_calls(self.as_ptr(), name_ptr, reply.as_ptr() as *const c_char, reply.len(), id_salt, text, capacity, n)
        })
    }

    /// Loads a GGUF model with default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        ModelLoader::new(path).load()
    }

    pub(crate) fn as_ptr(&self) -> *mut h2o_sys::h2o_model {
        self.raw.as_ptr()
    }

    /// The model's shape.
    pub fn info(&self) -> ModelInfo {
        let mut i = h2o_sys::h2o_model_info {
            struct_size: std::mem::size_of::<h2o_sys::h2o_model_info>() as u32,
            ..Default::default()
        };
        // SAFETY: a valid model and a struct of the declared size; cannot fail with those.
        let status = unsafe { h2o_sys::h2o_model_get_info(self.as_ptr(), &mut i) };
        assert_eq!(status, h2o_sys::H2O_OK, "h2o_model_get_info failed on a valid model");
        let token = |t: i32| (t >= 0).then_some(t);
        ModelInfo {
            n_vocab: i.n_vocab,
            n_ctx_train: i.n_ctx_train,
            n_embd: i.n_embd,
            n_layer: i.n_layer,
            n_head: i.n_head,
            n_head_kv: i.n_head_kv,
            n_ff: i.n_ff,
            head_dim: i.head_dim,
            bos_token: token(i.bos_token),
            eos_token: token(i.eos_token),
            n_params: i.n_params,
            weight_bytes: i.weight_bytes,
        }
    }

    /// What the model's prefix cache holds and has done.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        let mut s = h2o_sys::h2o_prefix_cache_stats {
            struct_size: std::mem::size_of::<h2o_sys::h2o_prefix_cache_stats>() as u32,
            ..Default::default()
        };
        // SAFETY: as in info.
        let status = unsafe { h2o_sys::h2o_model_get_prefix_cache_stats(self.as_ptr(), &mut s) };
        assert_eq!(status, h2o_sys::H2O_OK, "h2o_model_get_prefix_cache_stats failed on a valid model");
        PrefixCacheStats { entries: s.entries, bytes: s.bytes, hits: s.hits, misses: s.misses }
    }

    /// Token ids of `text` (with a leading BOS when `add_bos`).
    pub fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<i32>> {
        let (ptr, len) = (text.as_ptr() as *const c_char, text.len());
        let mut needed = 0usize;
        // SAFETY: a size query (NULL buffer, capacity 0), then a buffer of the size asked for.
        let status = unsafe {
            h2o_sys::h2o_tokenize(self.as_ptr(), ptr, len, if add_bos { h2o_sys::H2O_TOKENIZE_ADD_BOS } else { 0 }, std::ptr::null_mut(), 0, &mut needed)
        };
        if status != h2o_sys::H2O_ERR_BUFFER_TOO_SMALL {
            check(status)?;
        }
        let mut tokens = vec![0i32; needed];
        check(unsafe {
            h2o_sys::h2o_tokenize(self.as_ptr(), ptr, len, if add_bos { h2o_sys::H2O_TOKENIZE_ADD_BOS } else { 0 }, tokens.as_mut_ptr(), needed, &mut needed)
        })?;
        tokens.truncate(needed);
        Ok(tokens)
    }

    /// The text of token ids.
    pub fn detokenize(&self, tokens: &[i32]) -> Result<String> {
        let mut needed = 0usize;
        // SAFETY: as in tokenize; the buffer has room for the NUL the library writes.
        let status = unsafe {
            h2o_sys::h2o_detokenize(self.as_ptr(), tokens.as_ptr(), tokens.len(), std::ptr::null_mut(), 0, &mut needed)
        };
        if status != h2o_sys::H2O_ERR_BUFFER_TOO_SMALL {
            check(status)?;
        }
        let mut bytes = vec![0u8; needed + 1];
        check(unsafe {
            h2o_sys::h2o_detokenize(
                self.as_ptr(),
                tokens.as_ptr(),
                tokens.len(),
                bytes.as_mut_ptr() as *mut c_char,
                bytes.len(),
                &mut needed,
            )
        })?;
        bytes.truncate(needed);
        String::from_utf8(bytes).map_err(|_| Error::new(Status::Internal, "h2o_detokenize returned invalid UTF-8"))
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the pointer came from h2o_model_load and is freed once.
        unsafe { h2o_sys::h2o_model_free(self.raw.as_ptr()) }
    }
}

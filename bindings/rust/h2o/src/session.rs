use crate::callback::Guarded;
use crate::error::{c_string, check, cstr, Error, Result, Status};
use crate::model::{path_text, Model};
use crate::names::{Backend, KvPolicy, KvType, SessionEvent, StopReason};
use crate::params::{GenerateParams, SessionParams};
use std::cell::Cell;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_void};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

/// The session pointer, shared by the Session and its CancelHandles: the library's session is
/// freed when the last of them is dropped, so a handle never cancels a freed session.
struct RawSession(NonNull<h2o_sys::h2o_session>);

// SAFETY: what crosses threads through RawSession is h2o_session_cancel (callable from any
// thread by the header's contract) and the final h2o_session_free; every other call goes through
// Session, which is not Sync.
unsafe impl Send for RawSession {}
unsafe impl Sync for RawSession {}

impl Drop for RawSession {
    fn drop(&mut self) {
        // SAFETY: created by h2o_session_create, freed once, when nothing else can use it.
        unsafe { h2o_sys::h2o_session_free(self.0.as_ptr()) }
    }
}

/// One conversation: KV cache, sampler state and scratch, all allocated at creation. A session
/// may move between threads but is used by one at a time (Send, not Sync).
pub struct Session {
    raw: Arc<RawSession>,
    n_vocab: usize,
    events: EventSlot,
    _not_sync: PhantomData<Cell<()>>,
}

/// The closure `Session::set_event_callback` gave, behind the C callback's user data.
type EventHandler = Box<dyn FnMut(SessionEvent, KvUsage) + Send>;

/// Owns the boxed handler (null: none); freed with the session or when replaced.
struct EventSlot(*mut Guarded<EventHandler>);

// SAFETY: the handler is Send, and the library calls it only on the thread running the session.
unsafe impl Send for EventSlot {}

impl Drop for EventSlot {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: made by Box::into_raw in set_event_callback; the session no longer calls it.
            drop(unsafe { Box::from_raw(self.0) });
        }
    }
}

unsafe extern "C" fn on_event(event: u32, usage: *const h2o_sys::h2o_kv_usage, user_data: *mut c_void) {
    // SAFETY: user_data is the live handler set_event_callback registered; usage is valid for the call.
    let handler = &mut *(user_data as *mut Guarded<EventHandler>);
    let usage = KvUsage::from_raw(&*usage);
    handler.call((), |f| f(SessionEvent::from_raw(event), usage));
}

impl Drop for Session {
    fn drop(&mut self) {
        // A CancelHandle may keep the native session: it must not call a freed handler.
        if !self.events.0.is_null() {
            // SAFETY: a live session.
            unsafe { h2o_sys::h2o_session_set_event_callback(self.ptr(), None, std::ptr::null_mut()) };
        }
    }
}

/// Cancels what a session is running, from any thread; see `Session::cancel_handle`.
#[derive(Clone)]
pub struct CancelHandle {
    raw: Arc<RawSession>,
}

impl CancelHandle {
    /// The running call returns Status::Cancelled at its next batch boundary; the session stays
    /// usable. Without a running call this does nothing.
    pub fn cancel(&self) {
        // SAFETY: the pointer is alive (held by the Arc); the call is thread-safe by contract and
        // fails only for NULL.
        unsafe { h2o_sys::h2o_session_cancel(self.raw.0.as_ptr()) };
    }
}

/// The KV cache layout after defaults are resolved (h2o_kv_layout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvLayout {
    /// Slots per (layer, kv head); with a layer slope, their mean over layers.
    pub budget: u32,
    /// The policy (Full when the cache never needs to evict).
    pub policy: KvPolicy,
    /// Protected recent window in tokens.
    pub recent: u32,
    /// Protected first tokens of the stream.
    pub sinks: u32,
    /// Slots left to the policy's choice.
    pub heavy: u32,
    /// Whether rotary positions roll.
    pub position_rolling: bool,
    /// The element format.
    pub kv_type: KvType,
    /// Longest stream without rolling.
    pub n_ctx: u32,
    /// Stale distance: heavy hitters this far back are evicted first; 0: none.
    pub horizon: u32,
    /// Slots per kv head of the smallest and largest layer (they differ with a layer slope).
    pub min_layer_budget: u32,
    /// Slots per kv head of the largest layer.
    pub max_layer_budget: u32,
    /// The fewest slots a kv head of the smallest layer keeps (less than its layer's budget when
    /// budgets move between kv heads).
    pub min_head_budget: u32,
}

/// Where the stream stands against the cache (h2o_kv_usage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvUsage {
    /// Slots per (layer, kv head) of the layers with the most.
    pub capacity: u32,
    /// Tokens the stream has had.
    pub n_past: u64,
    /// Of them, the tokens each (layer, kv head) of those layers holds.
    pub n_held: u64,
    /// Tokens the cache no longer holds.
    pub n_evicted: u64,
    /// Pinned tokens.
    pub n_pinned: u64,
    /// The stream's length when eviction began; 0: nothing evicted yet.
    pub evicting_since: u64,
    /// Whether a full cache evicts (false: it refuses more tokens).
    pub evicts: bool,
}

impl KvUsage {
    fn from_raw(u: &h2o_sys::h2o_kv_usage) -> KvUsage {
        KvUsage {
            capacity: u.capacity,
            n_past: u.n_past,
            n_held: u.n_held,
            n_evicted: u.n_evicted,
            n_pinned: u.n_pinned,
            evicting_since: u.evicting_since,
            evicts: u.evicts != 0,
        }
    }
}

/// Bytes the session uses, by part (h2o_memory_report); fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    /// Model weights (shared by the model's sessions).
    pub weight_bytes: u64,
    /// Keys, values and per-slot eviction statistics.
    pub kv_bytes: u64,
    /// Activations and kernel scratch.
    pub scratch_bytes: u64,
}

/// A retention span's definition and where its tokens stand in the cache (h2o_span_info). The
/// counts keep the header's integer types.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpanInfo {
    /// The span's id.
    pub span_id: u32,
    /// Its minimum share of the budget, as last set.
    pub min_share: f32,
    /// Tokens of the span every (layer, kv head) keeps at least: floor(min_share * kv_budget).
    pub min_tokens: i32,
    /// Tokens added to the span.
    pub n_tokens: i64,
    /// The span's tokens held by the (layer, kv head) holding fewest, by the one holding most,
    /// and on average.
    pub kept_min: i32,
    /// The span's tokens held by the (layer, kv head) holding most.
    pub kept_max: i32,
    /// The span's tokens held per (layer, kv head), on average.
    pub kept_mean: f64,
    /// The span's share of the attention accumulated by the cached tokens; None when the
    /// session's policy gathers no statistics (window, random).
    pub attention_share: Option<f64>,
}

/// Statistics of the last generation (h2o_generate_stats).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenerateStats {
    /// Tokens of its prompt (with BOS).
    pub n_prompt_tokens: u32,
    /// Tokens it sampled.
    pub n_generated_tokens: u32,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Tokens the session has processed in all.
    pub n_past: u64,
    /// Wall time of prompt processing, in seconds.
    pub prompt_seconds: f64,
    /// Wall time of generation, in seconds.
    pub generate_seconds: f64,
}

/// The device a session runs on (h2o_backend_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// The backend.
    pub kind: Backend,
    /// The device's index among that backend's (`SessionParams::device_index`).
    pub device_index: i32,
    /// The device's name, e.g. "cpu (avx2 kernels, 4 threads)".
    pub name: String,
    /// "cpu", "discrete", "integrated", "virtual" or "other".
    pub device_type: String,
    /// Device-local memory (0 for the CPU).
    pub memory_bytes: u64,
}

/// Fills an output struct whose first field is struct_size.
macro_rules! output {
    ($ty:ty, $call:expr) => {{
        let mut out = <$ty>::default();
        out.struct_size = std::mem::size_of::<$ty>() as u32;
        ($call)(&mut out as *mut $ty).map(|_| out)
    }};
}

impl Session {
    /// Creates a session of `model` (which it keeps alive: the model may be dropped first).
    pub fn new(model: &Model, params: &SessionParams) -> Result<Session> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid model and params; the output pointer is written on success only.
        check(unsafe { h2o_sys::h2o_session_create(model.as_ptr(), &params.raw, &mut raw) })?;
        Session::wrap(raw, model.info().n_vocab as usize, "h2o_session_create")
    }

    /// Creates a session from a snapshot file written by `save`. The cache-shaping settings come
    /// from the snapshot; `params` gives the rest (threads, backend, device, memory cap).
    pub fn load(model: &Model, path: impl AsRef<Path>, params: &SessionParams) -> Result<Session> {
        let path = c_string("snapshot path", &path_text(path.as_ref())?)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid model, path and params; the output pointer is written on success only.
        check(unsafe { h2o_sys::h2o_session_load(model.as_ptr(), path.as_ptr(), &params.raw, &mut raw) })?;
        Session::wrap(raw, model.info().n_vocab as usize, "h2o_session_load")
    }

    /// Creates a session from a snapshot made by `to_bytes`, as `load` does from a file.
    pub fn from_bytes(model: &Model, bytes: &[u8], params: &SessionParams) -> Result<Session> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: bytes is valid for its length; the rest as in load.
        check(unsafe {
            h2o_sys::h2o_session_load_from_buffer(
                model.as_ptr(),
                bytes.as_ptr() as *const c_void,
                bytes.len(),
                &params.raw,
                &mut raw,
            )
        })?;
        Session::wrap(raw, model.info().n_vocab as usize, "h2o_session_load_from_buffer")
    }

    fn wrap(raw: *mut h2o_sys::h2o_session, n_vocab: usize, call: &str) -> Result<Session> {
        let raw =
            NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, format!("{call} returned no session")))?;
        Ok(Session { raw: Arc::new(RawSession(raw)), n_vocab, events: EventSlot(std::ptr::null_mut()), _not_sync: PhantomData })
    }

    /// Writes a snapshot of the whole conversation to `path` (atomically: the file holds its old
    /// content or the whole snapshot). `Session::load` resumes it exactly.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = c_string("snapshot path", &path_text(path.as_ref())?)?;
        // SAFETY: a live session and a NUL-terminated path.
        self.check(unsafe { h2o_sys::h2o_session_save(self.ptr(), path.as_ptr()) })
    }

    /// A snapshot of the whole conversation in memory; `Session::from_bytes` resumes it exactly.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut bound = 0usize;
        // SAFETY: a live session; the buffer has the capacity passed.
        self.check(unsafe { h2o_sys::h2o_session_state_size(self.ptr(), &mut bound) })?;
        let mut bytes = vec![0u8; bound];
        let mut size = 0usize;
        self.check(unsafe {
            h2o_sys::h2o_session_save_to_buffer(self.ptr(), bytes.as_mut_ptr() as *mut c_void, bytes.len(), &mut size)
        })?;
        bytes.truncate(size);
        Ok(bytes)
    }

    /// A new, independent session in this one's state and with its settings, without processing
    /// anything again (a pinned system prompt can start many conversations). It keeps the model
    /// alive like any session.
    pub fn fork(&self) -> Result<Session> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live session; the output pointer is written on success only.
        self.check(unsafe { h2o_sys::h2o_session_fork(self.ptr(), &mut raw) })?;
        Session::wrap(raw, self.n_vocab, "h2o_session_fork")
    }

    fn ptr(&self) -> *mut h2o_sys::h2o_session {
        self.raw.0.as_ptr()
    }

    /// Ok, or the error with the session's own message.
    fn check(&self, code: i32) -> Result<()> {
        // A panic of the event handler comes out of the call that raised the event.
        if !self.events.0.is_null() {
            // SAFETY: the live handler; no library call is running, so nothing else reaches it.
            if let Some(message) = unsafe { (*self.events.0).take_panic() } {
                return Err(Error::CallbackPanicked { message });
            }
        }
        if code == h2o_sys::H2O_OK {
            return Ok(());
        }
        // SAFETY: a live session; the message is copied before the next call.
        Err(Error::new(Status::from_code(code), unsafe { cstr(h2o_sys::h2o_session_last_error(self.ptr())) }))
    }

    /// A handle that cancels this session's running call from any thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle { raw: Arc::clone(&self.raw) }
    }

    /// Appends text without generating; `pin`: its tokens are never evicted (system prompts).
    pub fn add_text(&mut self, text: &str, pin: bool) -> Result<()> {
        let flags = if pin { h2o_sys::H2O_TEXT_PIN } else { 0 };
        // SAFETY: text is valid for its length; the session is ours (&mut self).
        self.check(unsafe {
            h2o_sys::h2o_session_add_text(self.ptr(), text.as_ptr() as *const c_char, text.len(), flags)
        })
    }

    /// Appends chat-formatted text (`Model::format_chat_with_tools`): the spellings of control
    /// tokens ("<|im_start|>", ...) become those tokens; `pin` as in `add_text`.
    pub fn add_chat_text(&mut self, text: &str, pin: bool) -> Result<()> {
        let flags = h2o_sys::H2O_TEXT_SPECIAL | if pin { h2o_sys::H2O_TEXT_PIN } else { 0 };
        // SAFETY: as in add_text.
        self.check(unsafe {
            h2o_sys::h2o_session_add_text(self.ptr(), text.as_ptr() as *const c_char, text.len(), flags)
        })
    }

    /// Appends text to the retention span `span_id` (any nonzero id; the same id again appends to
    /// the span, up to `MAX_SPANS` spans). Every (layer, kv head) keeps at least
    /// floor(min_share * kv_budget) of the span's tokens, those its policy ranks highest; the
    /// rest compete like any text. Each call sets the span's share anew (0: the policy decides
    /// alone); `pin` as in `add_text`. Pinned tokens plus every span's minimum may not exceed
    /// kv_budget - 1: a call that would break this, a share outside [0, 1], id 0, one span too
    /// many, or a minimum under the 'full' policy is Status::InvalidArgument and changes nothing.
    /// Spans travel with snapshots and forks; `reset` ends them.
    pub fn add_span_text(&mut self, span_id: u32, min_share: f32, text: &str, pin: bool) -> Result<()> {
        let flags = if pin { h2o_sys::H2O_TEXT_PIN } else { 0 };
        // SAFETY: text is valid for its length; the session is ours (&mut self).
        self.check(unsafe {
            h2o_sys::h2o_session_add_span_text(
                self.ptr(),
                span_id,
                min_share,
                text.as_ptr() as *const c_char,
                text.len(),
                flags,
            )
        })
    }

    /// The span `span_id` and what the cache holds of it; Status::InvalidArgument when the
    /// session has no such span. It reads the whole cache's bookkeeping (from the device on a GPU
    /// backend): a diagnostic, not a per-token call.
    pub fn span_info(&self, span_id: u32) -> Result<SpanInfo> {
        let s = output!(h2o_sys::h2o_span_info, |p| self
            .check(unsafe { h2o_sys::h2o_session_get_span_info(self.ptr(), span_id, p) }))?;
        Ok(SpanInfo {
            span_id: s.span_id,
            min_share: s.min_share,
            min_tokens: s.min_tokens,
            n_tokens: s.n_tokens,
            kept_min: s.kept_min,
            kept_max: s.kept_max,
            kept_mean: s.kept_mean,
            // The header's "no statistics" value is -1; any negative share means none.
            attention_share: (s.attention_share >= 0.0).then_some(s.attention_share),
        })
    }

    /// Forgets the conversation and reseeds the sampler; no memory changes hands.
    pub fn reset(&mut self) -> Result<()> {
        self.check(unsafe { h2o_sys::h2o_session_reset(self.ptr()) })
    }

    /// Restarts the sampler's random generator from `seed`, as a session created with that seed
    /// starts it, and keeps the conversation (a per-request seed). reset() goes back to the
    /// session's own seed.
    pub fn set_seed(&mut self, seed: u64) -> Result<()> {
        self.check(unsafe { h2o_sys::h2o_session_set_seed(self.ptr(), seed) })
    }

    /// Appends `prompt` and generates, passing each piece of text to `on_text`, which returns
    /// false to stop (not an error). A panic in `on_text` stops generation and is returned as
    /// Error::CallbackPanicked.
    pub fn generate(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<StopReason> {
        type OnText<'a> = Guarded<&'a mut dyn FnMut(&str) -> bool>;
        unsafe extern "C" fn trampoline(text: *const c_char, len: usize, user: *mut c_void) -> c_int {
            // SAFETY: user is the OnText below, alive for the whole call; the library passes
            // complete UTF-8 characters.
            let guarded = &mut *(user as *mut OnText);
            let bytes = std::slice::from_raw_parts(text as *const u8, len);
            guarded.call(1, |f| match std::str::from_utf8(bytes) {
                Ok(s) => (!f(s)) as c_int,
                Err(_) => panic!("h2o delivered text that is not UTF-8"),
            })
        }
        let c = params.to_c()?;
        let mut on_text = on_text;
        let mut guarded: OnText = Guarded::new(&mut on_text);
        // SAFETY: every pointer outlives the call; the callback does not unwind.
        let code = unsafe {
            h2o_sys::h2o_generate(
                self.ptr(),
                prompt.as_ptr() as *const c_char,
                prompt.len(),
                &c.raw,
                Some(trampoline),
                &mut guarded as *mut OnText as *mut c_void,
            )
        };
        let result = self.check(code);
        guarded.finish(result)?;
        Ok(self.stats()?.stop_reason)
    }

    /// Appends `prompt` and returns an iterator over the generated pieces of text. Dropping it
    /// early simply leaves the generation unfinished; the next prompt starts a new one.
    pub fn stream(&mut self, prompt: &str, params: &GenerateParams) -> Result<Stream<'_>> {
        let c = params.to_c()?;
        // SAFETY: the params (and stop strings) are copied by the library during _begin.
        self.check(unsafe {
            h2o_sys::h2o_generate_begin(self.ptr(), prompt.as_ptr() as *const c_char, prompt.len(), &c.raw)
        })?;
        Ok(Stream { session: self, done: false, stop_reason: StopReason::None })
    }

    /// Runs the model over token ids (for custom samplers and evaluation).
    pub fn decode(&mut self, tokens: &[i32]) -> Result<()> {
        self.check(unsafe { h2o_sys::h2o_session_decode(self.ptr(), tokens.as_ptr(), tokens.len()) })
    }

    /// Logits of the last processed token (one per vocabulary entry).
    pub fn logits(&self) -> Result<Vec<f32>> {
        let mut logits = vec![0f32; self.n_vocab];
        self.check(unsafe { h2o_sys::h2o_session_get_logits(self.ptr(), logits.as_mut_ptr(), logits.len()) })?;
        Ok(logits)
    }

    /// Statistics of the last generation.
    pub fn stats(&self) -> Result<GenerateStats> {
        let s = output!(h2o_sys::h2o_generate_stats, |p| self
            .check(unsafe { h2o_sys::h2o_session_get_stats(self.ptr(), p) }))?;
        Ok(GenerateStats {
            n_prompt_tokens: s.n_prompt_tokens,
            n_generated_tokens: s.n_generated_tokens,
            stop_reason: StopReason::from_raw(s.stop_reason),
            n_past: s.n_past,
            prompt_seconds: s.prompt_seconds,
            generate_seconds: s.generate_seconds,
        })
    }

    /// How many tokens the stream has had, the cache holds and has evicted, and since when.
    pub fn kv_usage(&self) -> Result<KvUsage> {
        let u = output!(h2o_sys::h2o_kv_usage, |p| self.check(unsafe { h2o_sys::h2o_session_get_kv_usage(self.ptr(), p) }))?;
        Ok(KvUsage::from_raw(&u))
    }

    /// Calls `handler(event, usage)` when the session reports an event: `SessionEvent::KvFull`
    /// once per conversation, when its cache fills and starts to evict. It runs inside the call
    /// that caused it (which cannot be using the session from elsewhere: the session is borrowed);
    /// a panic in it is caught and makes that call return `Error::CallbackPanicked`. None removes it.
    pub fn set_event_callback(&mut self, handler: Option<impl FnMut(SessionEvent, KvUsage) + Send + 'static>) -> Result<()> {
        let slot = match handler {
            Some(f) => EventSlot(Box::into_raw(Box::new(Guarded::new(Box::new(f) as EventHandler)))),
            None => EventSlot(std::ptr::null_mut()),
        };
        let callback: h2o_sys::h2o_session_event_callback = if slot.0.is_null() { None } else { Some(on_event) };
        // SAFETY: a live session; the handler lives until replaced or the session is dropped.
        self.check(unsafe { h2o_sys::h2o_session_set_event_callback(self.ptr(), callback, slot.0 as *mut c_void) })?;
        self.events = slot;  // the previous handler is freed here, no longer registered
        Ok(())
    }

    /// The KV cache the session runs with.
    pub fn kv_layout(&self) -> Result<KvLayout> {
        let l = output!(h2o_sys::h2o_kv_layout, |p| self
            .check(unsafe { h2o_sys::h2o_session_get_kv_layout(self.ptr(), p) }))?;
        Ok(KvLayout {
            budget: l.budget,
            policy: KvPolicy::from_raw(l.policy),
            recent: l.recent,
            sinks: l.sinks,
            heavy: l.heavy,
            position_rolling: l.position_rolling != 0,
            kv_type: KvType::from_raw(l.type_),
            n_ctx: l.n_ctx,
            horizon: l.horizon,
            min_layer_budget: l.min_layer_budget,
            max_layer_budget: l.max_layer_budget,
            min_head_budget: l.min_head_budget,
        })
    }

    /// The value of a research setting (h2o_experimental.h) the session runs with, after
    /// resolution (0 where the session ignores it).
    pub fn experimental(&self, name: &str) -> Result<f64> {
        let key = crate::params::experimental_key(name)?;
        let mut value = 0.0;
        // SAFETY: a live session and a valid output pointer.
        self.check(unsafe { h2o_sys::h2o_session_get_experimental(self.ptr(), key, &mut value) })?;
        Ok(value)
    }

    /// The session's memory, by part.
    pub fn memory(&self) -> Result<MemoryReport> {
        let m =
            output!(h2o_sys::h2o_memory_report, |p| self.check(unsafe { h2o_sys::h2o_session_memory(self.ptr(), p) }))?;
        Ok(MemoryReport { weight_bytes: m.weight_bytes, kv_bytes: m.kv_bytes, scratch_bytes: m.scratch_bytes })
    }

    /// The device the session runs on.
    pub fn backend(&self) -> Result<BackendInfo> {
        let mut b: h2o_sys::h2o_backend_info = unsafe { std::mem::zeroed() };
        b.struct_size = std::mem::size_of_val(&b) as u32;
        self.check(unsafe { h2o_sys::h2o_session_get_backend(self.ptr(), &mut b) })?;
        // SAFETY: the library writes NUL-terminated names into the fixed arrays.
        let text = |a: &[c_char]| unsafe { cstr(a.as_ptr()) };
        Ok(BackendInfo {
            kind: Backend::from_raw(b.kind),
            device_index: b.device_index,
            name: text(&b.name),
            device_type: text(&b.device_type),
            memory_bytes: b.memory_bytes,
        })
    }
}

/// Pieces of generated text, pulled one at a time (h2o_generate_next). Ends after the last piece
/// or after the first error; `stop_reason` then says why it ended.
pub struct Stream<'a> {
    session: &'a mut Session,
    done: bool,
    stop_reason: StopReason,
}

impl Stream<'_> {
    /// Why the generation stopped (`StopReason::None` while it goes on).
    pub fn stop_reason(&self) -> StopReason {
        self.stop_reason
    }

    /// A handle to cancel this generation from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.session.cancel_handle()
    }
}

impl Iterator for Stream<'_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        while !self.done {
            let (mut text, mut len, mut reason) = (std::ptr::null(), 0usize, 0u32);
            // SAFETY: the session is borrowed mutably for the stream's life; text is copied
            // before the next call.
            let code = unsafe { h2o_sys::h2o_generate_next(self.session.ptr(), &mut text, &mut len, &mut reason) };
            if let Err(e) = self.session.check(code) {
                self.done = true;
                return Some(Err(e));
            }
            self.stop_reason = StopReason::from_raw(reason);
            self.done = self.stop_reason != StopReason::None;
            if len > 0 {
                let bytes = unsafe { std::slice::from_raw_parts(text as *const u8, len) };
                return Some(
                    String::from_utf8(bytes.to_vec())
                        .map_err(|_| Error::new(Status::Internal, "h2o delivered text that is not UTF-8")),
                );
            }
        }
        None
    }
}

using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace H2o
{
    /// <summary>The KV cache a session runs with, after defaults (h2o_kv_layout).</summary>
    public struct KvLayout
    {
        /// <summary>Slots per (layer, kv head); with a layer slope, their mean over layers.</summary>
        public uint Budget;
        /// <summary>Protected recent window in tokens.</summary>
        public uint Recent;
        /// <summary>Protected first tokens of the stream.</summary>
        public uint Sinks;
        /// <summary>Slots left to the policy's choice.</summary>
        public uint Heavy;
        /// <summary>Longest stream without rolling.</summary>
        public uint NCtx;
        /// <summary>Stale distance: heavy hitters this far back are evicted first; 0: none.</summary>
        public uint Horizon;
        /// <summary>Slots per kv head of the smallest and largest layer (they differ with a layer slope).</summary>
        public uint MinLayerBudget;
        /// <summary>Slots per kv head of the largest layer.</summary>
        public uint MaxLayerBudget;
        /// <summary>The fewest slots a kv head of the smallest layer keeps (less than its layer's
        /// budget when budgets move between kv heads).</summary>
        public uint MinHeadBudget;
        /// <summary>The policy (Full when the cache never needs to evict).</summary>
        public KvPolicy Policy;
        /// <summary>The element format.</summary>
        public KvType Type;
        /// <summary>Whether rotary positions roll.</summary>
        public bool PositionRolling;
    }

    /// <summary>Where the stream stands against the cache (h2o_kv_usage).</summary>
    public struct KvUsage
    {
        /// <summary>Slots per (layer, kv head) of the layers with the most.</summary>
        public uint Capacity;
        /// <summary>Tokens the stream has had.</summary>
        public ulong NPast;
        /// <summary>Of them, the tokens each (layer, kv head) of those layers holds.</summary>
        public ulong NHeld;
        /// <summary>Tokens the cache no longer holds.</summary>
        public ulong NEvicted;
        /// <summary>Pinned tokens.</summary>
        public ulong NPinned;
        /// <summary>The stream's length when eviction began; 0: nothing evicted yet.</summary>
        public ulong EvictingSince;
        /// <summary>Whether a full cache evicts (false: it refuses more tokens).</summary>
        public bool Evicts;

        internal static KvUsage From(NativeKvUsage u) => new KvUsage
        {
            Capacity = u.capacity, NPast = u.n_past, NHeld = u.n_held, NEvicted = u.n_evicted, NPinned = u.n_pinned,
            EvictingSince = u.evicting_since, Evicts = u.evicts != 0,
        };
    }

    /// <summary>Bytes of memory a session uses, by part (h2o_memory_report).</summary>
    public struct MemoryReport
    {
        /// <summary>Model weights (shared by the model's sessions).</summary>
        public ulong WeightBytes;
        /// <summary>Keys, values and per-slot eviction statistics.</summary>
        public ulong KvBytes;
        /// <summary>Activations and kernel scratch.</summary>
        public ulong ScratchBytes;
    }

    /// <summary>A retention span's definition and where its tokens stand in the cache
    /// (h2o_span_info). The counts keep the header's integer types.</summary>
    public struct SpanInfo
    {
        /// <summary>The span's id.</summary>
        public uint SpanId;
        /// <summary>Its minimum share of the budget, as last set.</summary>
        public float MinShare;
        /// <summary>Tokens of the span every (layer, kv head) keeps at least:
        /// floor(MinShare * kv_budget).</summary>
        public int MinTokens;
        /// <summary>Tokens added to the span.</summary>
        public long NTokens;
        /// <summary>The span's tokens held by the (layer, kv head) holding fewest, by the one
        /// holding most, and on average.</summary>
        public int KeptMin;
        /// <summary>The span's tokens held by the (layer, kv head) holding most.</summary>
        public int KeptMax;
        /// <summary>The span's tokens held per (layer, kv head), on average.</summary>
        public double KeptMean;
        /// <summary>The span's share of the attention accumulated by the cached tokens; null when
        /// the session's policy gathers no statistics (window, random).</summary>
        public double? AttentionShare;
    }

    /// <summary>What the last generation did (h2o_generate_stats).</summary>
    public struct GenerateStats
    {
        /// <summary>Tokens of its prompt (with BOS).</summary>
        public uint NPromptTokens;
        /// <summary>Tokens it sampled.</summary>
        public uint NGeneratedTokens;
        /// <summary>Why it stopped.</summary>
        public StopReason StopReason;
        /// <summary>Tokens the session has processed in all.</summary>
        public ulong NPast;
        /// <summary>Wall time of prompt processing.</summary>
        public double PromptSeconds;
        /// <summary>Wall time of generation.</summary>
        public double GenerateSeconds;
    }

    /// <summary>One conversation: KV cache, sampler and scratch, all allocated at creation. Used by
    /// one thread at a time, except Cancel, which any thread may call.</summary>
    public sealed class Session : IDisposable
    {
        private readonly SessionHandle handle;

        /// <summary>A new session of the model (null parameters: the defaults).</summary>
        public Session(Model model, SessionParams parameters = null)
        {
            if (model == null) throw new ArgumentNullException(nameof(model));
            var p = (parameters ?? new SessionParams()).Raw;
            H2o.Check.Status(Native.h2o_session_create(model.Handle, ref p, out IntPtr raw));
            handle = SessionHandle.From(raw, model.Handle);
        }

        private Session(SessionHandle handle) { this.handle = handle; }

        /// <summary>Creates a session from a snapshot file written by Save. The cache-shaping
        /// settings come from the snapshot; parameters gives the rest (threads, backend, device,
        /// memory cap).</summary>
        public static Session Load(Model model, string path, SessionParams parameters = null)
        {
            if (model == null) throw new ArgumentNullException(nameof(model));
            byte[] pathBytes = Utf8.CString("snapshot path", path);
            var p = (parameters ?? new SessionParams()).Raw;
            H2o.Check.Status(Native.h2o_session_load(model.Handle, pathBytes, ref p, out IntPtr raw));
            return new Session(SessionHandle.From(raw, model.Handle));
        }

        /// <summary>Creates a session from a snapshot made by ToBytes, as Load does from a file.</summary>
        public static Session FromBytes(Model model, byte[] snapshot, SessionParams parameters = null)
        {
            if (model == null) throw new ArgumentNullException(nameof(model));
            if (snapshot == null) throw new ArgumentNullException(nameof(snapshot));
            var p = (parameters ?? new SessionParams()).Raw;
            H2o.Check.Status(Native.h2o_session_load_from_buffer(model.Handle, snapshot, (UIntPtr)snapshot.Length, ref p,
                                                                 out IntPtr raw));
            return new Session(SessionHandle.From(raw, model.Handle));
        }

        /// <summary>Writes a snapshot of the whole conversation to path (atomically: the file holds
        /// its old content or the whole snapshot). Load resumes it exactly.</summary>
        public void Save(string path) => Check(Native.h2o_session_save(handle, Utf8.CString("snapshot path", path)));

        /// <summary>A snapshot of the whole conversation in memory; FromBytes resumes it exactly.</summary>
        public byte[] ToBytes()
        {
            Check(Native.h2o_session_state_size(handle, out UIntPtr bound));
            var buffer = new byte[checked((int)bound)];
            Check(Native.h2o_session_save_to_buffer(handle, buffer, bound, out UIntPtr size));
            Array.Resize(ref buffer, checked((int)size));
            return buffer;
        }

        /// <summary>A new, independent session in this one's state and with its settings, without
        /// processing anything again (a pinned system prompt can start many conversations).</summary>
        public Session Fork()
        {
            Check(Native.h2o_session_fork(handle, out IntPtr raw));
            return new Session(SessionHandle.From(raw, handle.Model));
        }

        /// <summary>Throws for a failed status, with the session's own message.</summary>
        private void Check(int code)
        {
            // An exception of the event callback comes out here, once the call has returned.
            eventGuard.RethrowIfFailed();
            if (code != 0) throw new H2oException((Status)code, Utf8.FromNative(Native.h2o_session_last_error(handle)));
        }

        private CallbackGuard eventGuard = new CallbackGuard();
#pragma warning disable CS0414  // never read: the field keeps the delegate alive while the library may call it
        private EventCallback eventCallback;
#pragma warning restore CS0414

        /// <summary>Calls handler(event, usage) when the session reports an event: KvFull once per
        /// conversation, when its cache fills and starts to evict. It runs inside the call that
        /// caused it and must not use this session; an exception it throws is rethrown when that
        /// call returns. null removes it.</summary>
        public void SetEventHandler(Action<SessionEvent, KvUsage> handler)
        {
            eventGuard = new CallbackGuard();
            if (handler == null)
            {
                Check(Native.h2o_session_set_event_callback(handle, null, IntPtr.Zero));
                eventCallback = null;
                return;
            }
            CallbackGuard guard = eventGuard;
            EventCallback callback = (uint e, ref NativeKvUsage u, IntPtr _) =>
            {
                KvUsage usage = KvUsage.From(u);
                guard.Run(() => { handler((SessionEvent)e, usage); return 0; }, 0);
            };
            Check(Native.h2o_session_set_event_callback(handle, callback, IntPtr.Zero));
            eventCallback = callback;
        }

        /// <summary>How many tokens the stream has had, the cache holds and has evicted, and since when.</summary>
        public KvUsage KvUsage
        {
            get
            {
                var u = new NativeKvUsage { struct_size = (uint)Marshal.SizeOf<NativeKvUsage>() };
                Check(Native.h2o_session_get_kv_usage(handle, ref u));
                return KvUsage.From(u);
            }
        }

        /// <summary>Appends text without generating; pin: its tokens are never evicted.</summary>
        public void AddText(string text, bool pin = false)
        {
            byte[] bytes = Utf8.Bytes(text);
            Check(Native.h2o_session_add_text(handle, bytes, (UIntPtr)bytes.Length, pin ? Native.TextPin : 0));
        }

        /// <summary>Appends chat-formatted text (Model.FormatChatWithTools): the spellings of
        /// control tokens become those tokens; pin as in AddText.</summary>
        public void AddChatText(string text, bool pin = false)
        {
            byte[] bytes = Utf8.Bytes(text);
            Check(Native.h2o_session_add_text(handle, bytes, (UIntPtr)bytes.Length, Native.TextSpecial | (pin ? Native.TextPin : 0)));
        }

        /// <summary>Retention spans a session may hold (AddSpanText).</summary>
        public const uint MaxSpans = 32;

        /// <summary>Appends text to the retention span spanId (any nonzero id; the same id again
        /// appends to the span, up to MaxSpans spans). Every (layer, kv head) keeps at least
        /// floor(minShare * kv_budget) of the span's tokens, those its policy ranks highest; the rest
        /// compete like any text. Each call sets the span's share anew (0: the policy decides
        /// alone); pin as in AddText. Pinned tokens plus every span's minimum may not exceed
        /// kv_budget - 1: a call that would break this, a share outside [0, 1], id 0, one span too
        /// many, or a minimum under the 'full' policy throws Status.InvalidArgument and changes
        /// nothing. Spans travel with snapshots and forks; Reset ends them.</summary>
        public void AddSpanText(uint spanId, float minShare, string text, bool pin = false)
        {
            byte[] bytes = Utf8.Bytes(text);
            Check(Native.h2o_session_add_span_text(handle, spanId, minShare, bytes, (UIntPtr)bytes.Length,
                                                   pin ? Native.TextPin : 0));
        }

        /// <summary>The span spanId and what the cache holds of it; Status.InvalidArgument when the
        /// session has no such span. It reads the whole cache's bookkeeping (from the device on a
        /// GPU backend): a diagnostic, not a per-token call.</summary>
        public SpanInfo GetSpanInfo(uint spanId)
        {
            var s = new NativeSpanInfo { struct_size = (uint)Marshal.SizeOf<NativeSpanInfo>() };
            Check(Native.h2o_session_get_span_info(handle, spanId, ref s));
            return new SpanInfo
            {
                SpanId = s.span_id, MinShare = s.min_share, MinTokens = s.min_tokens, NTokens = s.n_tokens,
                KeptMin = s.kept_min, KeptMax = s.kept_max, KeptMean = s.kept_mean,
                // The header's "no statistics" value is -1; any negative share means none.
                AttentionShare = s.attention_share >= 0 ? s.attention_share : (double?)null,
            };
        }

        /// <summary>Forgets the conversation (nothing is allocated or freed).</summary>
        public void Reset() => Check(Native.h2o_session_reset(handle));

        /// <summary>Restarts the sampler's random generator from <paramref name="seed"/>, as a session
        /// created with that seed starts it, and keeps the conversation (a per-request seed).
        /// Reset() goes back to the session's own seed.</summary>
        public void SetSeed(ulong seed) => Check(Native.h2o_session_set_seed(handle, seed));

        /// <summary>Makes the running call throw an H2oException with Status.Cancelled at its next
        /// batch boundary. Callable from any thread; does nothing when no call runs.</summary>
        public void Cancel() => Check(Native.h2o_session_cancel(handle));

        /// <summary>Appends prompt and generates, passing each piece of text to onText, which
        /// returns false to stop (not an error). An exception from onText stops generation and is
        /// rethrown here.</summary>
        public StopReason Generate(string prompt, GenerateParams parameters, Func<string, bool> onText)
        {
            byte[] bytes = Utf8.Bytes(prompt);
            var guard = new CallbackGuard();
            TokenCallback callback = (text, length, _) =>
                guard.Run(() => onText(Utf8.FromNative(text, checked((int)length))) ? 0 : 1, 1);
            int status;
            using (var p = (parameters ?? new GenerateParams()).ToNative())
            {
                status = Native.h2o_generate(handle, bytes, (UIntPtr)bytes.Length, ref p.Raw, callback, IntPtr.Zero);
            }
            GC.KeepAlive(callback); // the delegate must outlive the native call that holds its pointer
            guard.RethrowIfFailed();
            Check(status);
            return Stats.StopReason;
        }

        /// <summary>Appends prompt now and returns the generated pieces of text, produced one at a
        /// time as the sequence is enumerated (once). StopReason tells why it ended.</summary>
        public IEnumerable<string> Stream(string prompt, GenerateParams parameters = null)
        {
            byte[] bytes = Utf8.Bytes(prompt);
            using (var p = (parameters ?? new GenerateParams()).ToNative())
            {
                Check(Native.h2o_generate_begin(handle, bytes, (UIntPtr)bytes.Length, ref p.Raw));
            }
            LastStopReason = StopReason.None;
            return Pieces();
        }

        /// <summary>Why the last Stream ended (None while it runs).</summary>
        public StopReason LastStopReason { get; private set; }

        private IEnumerable<string> Pieces()
        {
            while (LastStopReason == StopReason.None)
            {
                Check(Native.h2o_generate_next(handle, out IntPtr text, out UIntPtr length, out uint reason));
                LastStopReason = (StopReason)reason;
                if (length != UIntPtr.Zero) yield return Utf8.FromNative(text, checked((int)length));
            }
        }

        /// <summary>Of the last generation.</summary>
        public GenerateStats Stats
        {
            get
            {
                var s = new NativeGenerateStats { struct_size = (uint)Marshal.SizeOf<NativeGenerateStats>() };
                Check(Native.h2o_session_get_stats(handle, ref s));
                return new GenerateStats
                {
                    NPromptTokens = s.n_prompt_tokens, NGeneratedTokens = s.n_generated_tokens,
                    StopReason = (StopReason)s.stop_reason, NPast = s.n_past,
                    PromptSeconds = s.prompt_seconds, GenerateSeconds = s.generate_seconds,
                };
            }
        }

        /// <summary>The KV cache the session runs with.</summary>
        public KvLayout KvLayout
        {
            get
            {
                var l = new NativeKvLayout { struct_size = (uint)Marshal.SizeOf<NativeKvLayout>() };
                Check(Native.h2o_session_get_kv_layout(handle, ref l));
                return new KvLayout
                {
                    Budget = l.budget, Policy = (KvPolicy)l.policy, Recent = l.recent, Sinks = l.sinks,
                    Heavy = l.heavy, PositionRolling = l.position_rolling != 0, Type = (KvType)l.type, NCtx = l.n_ctx, Horizon = l.horizon,
                    MinLayerBudget = l.min_layer_budget, MaxLayerBudget = l.max_layer_budget, MinHeadBudget = l.min_head_budget,
                };
            }
        }

        /// <summary>The value of a research setting (h2o_experimental.h) the session runs with, after
        /// resolution (0 where the session ignores it).</summary>
        public double GetExperimental(string name)
        {
            uint key = Names.ParseExperimental(name);
            Check(Native.h2o_session_get_experimental(handle, key, out double value));
            return value;
        }

        /// <summary>The session's memory, by part.</summary>
        public MemoryReport Memory
        {
            get
            {
                var m = new NativeMemoryReport { struct_size = (uint)Marshal.SizeOf<NativeMemoryReport>() };
                Check(Native.h2o_session_memory(handle, ref m));
                return new MemoryReport { WeightBytes = m.weight_bytes, KvBytes = m.kv_bytes, ScratchBytes = m.scratch_bytes };
            }
        }

        /// <summary>The name of the device the session runs on, e.g. "cpu (avx2)".</summary>
        public unsafe string BackendName
        {
            get
            {
                var b = new NativeBackendInfo { struct_size = (uint)Marshal.SizeOf<NativeBackendInfo>() };
                Check(Native.h2o_session_get_backend(handle, ref b));
                return Utf8.FromNative((IntPtr)b.name);
            }
        }

        /// <summary>Frees the session.</summary>
        public void Dispose() => handle.Dispose();
    }
}

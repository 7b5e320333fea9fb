using System;
using System.Runtime.InteropServices;

namespace H2o
{
    /// <summary>How a model is loaded (h2o_model_params).</summary>
    public sealed class ModelParams
    {
        /// <summary>A sentencepiece .model file to use instead of the GGUF file's vocabulary.</summary>
        public string TokenizerPath { get; set; }
        /// <summary>Receives the fraction loaded; returns false to cancel.</summary>
        public Func<float, bool> Progress { get; set; }
        /// <summary>Bytes the model may keep of processed prompt prefixes, so that a fresh session
        /// whose first text begins like another's starts from that state (0: no cache; CPU only).</summary>
        public ulong PrefixCacheBytes { get; set; }
        /// <summary>Which prompts the prefix cache gives up first when it is full (CachePolicy.Reuse, the default).</summary>
        public CachePolicy PrefixCachePolicy { get; set; } = CachePolicy.Reuse;
    }

    /// <summary>How a session is created (h2o_session_params). Starts from the library's
    /// defaults; the library validates the values when the session is created.</summary>
    public sealed class SessionParams
    {
        internal NativeSessionParams Raw;

        /// <summary>The library's defaults (h2o_session_params_init).</summary>
        public SessionParams()
        {
            Raw.struct_size = (uint)Marshal.SizeOf<NativeSessionParams>();
            Check.Status(Native.h2o_session_params_init(ref Raw, (UIntPtr)Raw.struct_size));
        }

        /// <summary>The context: slots per (layer, kv head) unless KvBudget is smaller; 0: the model's (at most 4096).</summary>
        public uint NCtx { get => Raw.n_ctx; set => Raw.n_ctx = value; }
        /// <summary>Compute threads; 0: the cores (at most 8).</summary>
        public uint Threads { get => Raw.n_threads; set => Raw.n_threads = value; }
        /// <summary>Prompt tokens per batch; 0: 256.</summary>
        public uint Batch { get => Raw.n_batch; set => Raw.n_batch = value; }
        /// <summary>The sampler's (and the random policy's) seed.</summary>
        public ulong Seed { get => Raw.seed; set => Raw.seed = value; }
        /// <summary>KV slots per (layer, kv head), allocated once: the memory never grows.</summary>
        public uint KvBudget { get => Raw.kv_budget; set => Raw.kv_budget = value; }
        /// <summary>The eviction policy (default Scissorhands).</summary>
        public KvPolicy KvPolicy { get => (KvPolicy)Raw.kv_policy; set => Raw.kv_policy = (uint)value; }
        /// <summary>Protected recent window in tokens; 0: KvRecentRatio of the budget.</summary>
        public uint KvRecent { get => Raw.kv_recent; set => Raw.kv_recent = value; }
        /// <summary>The recent window's share of the budget; negative: the policy's default.</summary>
        public float KvRecentRatio { get => Raw.kv_recent_ratio; set => Raw.kv_recent_ratio = value; }
        /// <summary>First tokens of the stream never evicted, for the policies with sinks (default 4).</summary>
        public uint KvSinks { get => Raw.kv_sinks; set => Raw.kv_sinks = value; }
        /// <summary>What a full cache does (default Evict: the session evicts, rolls and never
        /// runs out; Error: a plain full cache's H2O_ERR_CONTEXT_FULL at the context's end).</summary>
        public KvOverflow KvOverflow { get => (KvOverflow)Raw.kv_overflow; set => Raw.kv_overflow = (uint)value; }
        /// <summary>Rotary positions from cache ranks: a conversation without end (implied by
        /// KvOverflow.Evict, the default).</summary>
        public bool PositionRolling { get => Raw.position_rolling != 0; set => Raw.position_rolling = value ? 1 : 0; }
        /// <summary>The compute backend (default Auto).</summary>
        public Backend Backend { get => (Backend)Raw.backend; set => Raw.backend = (uint)value; }
        /// <summary>The device of that backend; -1: the best one.</summary>
        public int DeviceIndex { get => Raw.device_index; set => Raw.device_index = value; }
        /// <summary>The KV cache's element format (default F16).</summary>
        public KvType KvType { get => (KvType)Raw.kv_type; set => Raw.kv_type = (uint)value; }
        /// <summary>Refuse a session that needs more bytes than this; 0: no cap.</summary>
        public ulong MaxMemoryBytes { get => Raw.max_memory_bytes; set => Raw.max_memory_bytes = value; }
        /// <summary>Heavy hitters this many tokens or more behind the newest are evicted first;
        /// 0: the policy's default, <see cref="KvHorizonNone"/>: none.</summary>
        public uint KvHorizon { get => Raw.kv_horizon; set => Raw.kv_horizon = value; }
        /// <summary>Sets a research setting of h2o_experimental.h by its name (see
        /// <see cref="Names.Experimental"/>, e.g. "kv_head_share"). These are outside the library's
        /// stable interface: a later version may change or remove one, which is then an error here.
        /// Throws H2oException for an unknown name or a value outside the setting's range.</summary>
        public SessionParams SetExperimental(string name, double value)
        {
            Check.Status(Native.h2o_session_params_set_experimental(ref Raw, Names.ParseExperimental(name), value));
            return this;
        }

        /// <summary>A research setting's value in these parameters (0: off).</summary>
        public double GetExperimental(string name)
        {
            Check.Status(Native.h2o_session_params_get_experimental(ref Raw, Names.ParseExperimental(name), out double value));
            return value;
        }

        /// <summary>H2O_KV_HORIZON_NONE: heavy hitters are kept however far back they lie.</summary>
        public const uint KvHorizonNone = 0xFFFFFFFFu;
    }

    /// <summary>How text is generated (h2o_generate_params), from the library's defaults.</summary>
    public sealed class GenerateParams
    {
        internal NativeGenerateParams Raw;

        /// <summary>The library's defaults (h2o_generate_params_init).</summary>
        public GenerateParams()
        {
            Raw.struct_size = (uint)Marshal.SizeOf<NativeGenerateParams>();
            Check.Status(Native.h2o_generate_params_init(ref Raw, (UIntPtr)Raw.struct_size));
        }

        /// <summary>Tokens to generate at most (default 256).</summary>
        public uint MaxTokens { get => Raw.max_tokens; set => Raw.max_tokens = value; }
        /// <summary>0: greedy, the same input always gives the same text.</summary>
        public float Temperature { get => Raw.temperature; set => Raw.temperature = value; }
        /// <summary>Sample among the k most likely tokens; 0: off (default 40).</summary>
        public uint TopK { get => Raw.top_k; set => Raw.top_k = value; }
        /// <summary>Nucleus sampling's probability mass; 1: off (default 0.95).</summary>
        public float TopP { get => Raw.top_p; set => Raw.top_p = value; }
        /// <summary>Drop tokens below this share of the top probability; 0: off (default 0.05).</summary>
        public float MinP { get => Raw.min_p; set => Raw.min_p = value; }
        /// <summary>Penalty of recently seen tokens; 1: off (the default).</summary>
        public float RepeatPenalty { get => Raw.repeat_penalty; set => Raw.repeat_penalty = value; }
        /// <summary>How many recent tokens the penalty looks at (default 64).</summary>
        public uint RepeatLastN { get => Raw.repeat_last_n; set => Raw.repeat_last_n = value; }
        /// <summary>Stop at an end-of-generation token (default true).</summary>
        public bool StopAtEos { get => Raw.stop_at_eos != 0; set => Raw.stop_at_eos = value ? 1 : 0; }
        /// <summary>Generation stops when the text contains one of these (not delivered).</summary>
        public string[] StopStrings { get; set; } = new string[0];
        /// <summary>A GBNF grammar the reply must follow (its rule root); null: none. Generation
        /// stops with StopReason.Grammar when nothing more may follow.</summary>
        public string Grammar { get; set; }
        /// <summary>A JSON schema the reply must satisfy (the subset h2o.h documents); null: none.
        /// At most one of Grammar and JsonSchema.</summary>
        public string JsonSchema { get; set; }
        /// <summary>Added to these tokens' logits (float.NegativeInfinity bans one).</summary>
        public System.Collections.Generic.IDictionary<int, float> LogitBias { get; set; }

        /// <summary>The native struct with its stop strings in unmanaged memory, valid until the
        /// returned object is disposed (the library copies them during the call).</summary>
        internal Pinned ToNative() => new Pinned(this);

        internal sealed class Pinned : IDisposable
        {
            internal NativeGenerateParams Raw;
            private readonly IntPtr[] strings;
            private IntPtr array, grammar, biasTokens, biasValues;

            internal Pinned(GenerateParams p)
            {
                Raw = p.Raw;
                var stops = p.StopStrings ?? new string[0];
                strings = new IntPtr[stops.Length];
                try
                {
                    for (int i = 0; i < stops.Length; i++)
                    {
                        byte[] bytes = Utf8.CString("stop string", stops[i]);
                        strings[i] = Marshal.AllocHGlobal(bytes.Length);
                        Marshal.Copy(bytes, 0, strings[i], bytes.Length);
                    }
                    if (stops.Length > 0)
                    {
                        array = Marshal.AllocHGlobal(IntPtr.Size * stops.Length);
                        Marshal.Copy(strings, 0, array, stops.Length);
                    }
                }
                catch
                {
                    Dispose();
                    throw;
                }
                Raw.stop_strings = array;
                Raw.n_stop_strings = (UIntPtr)stops.Length;
                try
                {
                    if (p.Grammar != null && p.JsonSchema != null) throw new ArgumentException("give Grammar or JsonSchema, not both");
                    string constraint = p.Grammar ?? p.JsonSchema;
                    if (constraint != null)
                    {
                        byte[] bytes = Utf8.Bytes(constraint);
                        grammar = Marshal.AllocHGlobal(Math.Max(1, bytes.Length));
                        Marshal.Copy(bytes, 0, grammar, bytes.Length);
                        if (p.Grammar != null) { Raw.grammar = grammar; Raw.grammar_len = (UIntPtr)bytes.Length; }
                        else { Raw.json_schema = grammar; Raw.json_schema_len = (UIntPtr)bytes.Length; }
                    }
                    if (p.LogitBias != null && p.LogitBias.Count > 0)
                    {
                        var tokens = new int[p.LogitBias.Count];
                        var values = new float[p.LogitBias.Count];
                        int i = 0;
                        foreach (var pair in p.LogitBias) { tokens[i] = pair.Key; values[i++] = pair.Value; }
                        biasTokens = Marshal.AllocHGlobal(sizeof(int) * tokens.Length);
                        biasValues = Marshal.AllocHGlobal(sizeof(float) * values.Length);
                        Marshal.Copy(tokens, 0, biasTokens, tokens.Length);
                        Marshal.Copy(values, 0, biasValues, values.Length);
                        Raw.logit_bias_tokens = biasTokens;
                        Raw.logit_bias_values = biasValues;
                        Raw.n_logit_bias = (UIntPtr)tokens.Length;
                    }
                }
                catch
                {
                    Dispose();
                    throw;
                }
            }

            public void Dispose()
            {
                foreach (IntPtr s in strings) if (s != IntPtr.Zero) Marshal.FreeHGlobal(s);
                foreach (IntPtr block in new[] { array, grammar, biasTokens, biasValues })
                    if (block != IntPtr.Zero) Marshal.FreeHGlobal(block);
                array = grammar = biasTokens = biasValues = IntPtr.Zero;
                Array.Clear(strings, 0, strings.Length);
            }
        }
    }
}

using System;
using System.Runtime.InteropServices;

namespace H2o
{
    /// <summary>Compute backends (h2o_backend_kind).</summary>
    public enum Backend : uint
    {
        /// <summary>A GPU when one runs the model, else the CPU.</summary>
        Auto = 0,
        /// <summary>The CPU (the reference backend).</summary>
        Cpu = 1,
        /// <summary>A GPU (or a software device) through Vulkan.</summary>
        Vulkan = 2,
        /// <summary>An NVIDIA GPU through CUDA.</summary>
        Cuda = 3,
    }

    /// <summary>What a session does when its cache is full (h2o_kv_overflow).</summary>
    public enum KvOverflow : uint
    {
        /// <summary>Evict by the policy and roll positions: the session never runs out (the default).</summary>
        Evict = 0,
        /// <summary>A plain full cache: the stream ends at the context (H2O_ERR_CONTEXT_FULL).</summary>
        Error = 1,
    }

    /// <summary>Which prompts a model's prefix cache gives up first when it is full (h2o_cache_policy).</summary>
    public enum CachePolicy : uint {
        /// <summary>The lowest expected saving first: reuse learned from the cache's own history (the default).</summary>
        Reuse = 0,
        /// <summary>The least recently used first.</summary>
        Lru = 1,
    }

    /// <summary>Events a session reports (h2o_session_event).</summary>
    public enum SessionEvent : uint
    {
        /// <summary>The cache is full and begins to evict (once per conversation).</summary>
        KvFull = 1,
    }

    /// <summary>KV eviction policies (h2o_kv_policy); the header documents each.</summary>
    public enum KvPolicy : uint
    {
        /// <summary>No eviction: a full cache refuses more tokens.</summary>
        Full = 0,
        /// <summary>Heavy-Hitter Oracle: a recent window and the most attended tokens.</summary>
        H2o = 1,
        /// <summary>The most recent tokens only.</summary>
        Window = 2,
        /// <summary>StreamingLLM: the first tokens (sinks) and the most recent.</summary>
        SinkWindow = 3,
        /// <summary>Scissorhands: a recent window and the most persistently important tokens (the default).</summary>
        Scissorhands = 4,
        /// <summary>TOVA: evicts the token with the least attention at the latest step.</summary>
        Tova = 5,
        /// <summary>RoCo: a recent window and the tokens of highest mean attention.</summary>
        Roco = 6,
        /// <summary>A random unprotected token: a baseline.</summary>
        Random = 7,
        /// <summary>Sinks, a recent window and heavy hitters by mean attention.</summary>
        MeanH2o = 8,
        /// <summary>A recent window and the keys of smallest norm (query-agnostic).</summary>
        KeyNorm = 9,
        /// <summary>KeyDiff: a recent window and the keys least like the others (query-agnostic).</summary>
        KeyDiff = 10,
        /// <summary>Expected Attention: a recent window and the tokens future queries are expected to attend to.</summary>
        ExpectedAttention = 11,
    }

    /// <summary>Element formats of the KV cache (h2o_kv_type).</summary>
    public enum KvType : uint
    {
        /// <summary>32-bit floats.</summary>
        F32 = 0,
        /// <summary>16-bit floats (the default).</summary>
        F16 = 1,
        /// <summary>8 bits with a scale per row.</summary>
        Q8 = 2,
        /// <summary>4 bits with a scale and minimum per row (lossy for keys).</summary>
        Q4 = 3,
        /// <summary>Keys in 8 bits, values in 4: the recommended small cache.</summary>
        K8V4 = 4,
    }

    /// <summary>Why a generation ended (h2o_stop_reason).</summary>
    public enum StopReason : uint
    {
        /// <summary>It has not stopped.</summary>
        None = 0,
        /// <summary>MaxTokens tokens were generated.</summary>
        MaxTokens = 1,
        /// <summary>An end-of-generation token.</summary>
        Eos = 2,
        /// <summary>A stop string was generated.</summary>
        StopString = 3,
        /// <summary>The callback asked to stop.</summary>
        Callback = 4,
        /// <summary>The grammar or schema is complete and nothing may follow.</summary>
        Grammar = 5,
    }

    /// <summary>What a policy keeps (h2o_kv_policy_info).</summary>
    public struct KvPolicyInfo
    {
        /// <summary>The policy's name, e.g. "scissorhands".</summary>
        public string Name;
        /// <summary>Ranks tokens by attention: the horizon and the research settings that move budgets apply.</summary>
        public bool GathersStatistics;
        /// <summary>Protects a recent window: KvRecent and KvRecentRatio apply.</summary>
        public bool HasRecentWindow;
        /// <summary>Always keeps the first KvSinks tokens of the stream.</summary>
        public bool KeepsSinks;
        /// <summary>The window's share of the budget when KvRecentRatio is negative.</summary>
        public float DefaultRecentRatio;
        /// <summary>The horizon's default, in budgets (0: none).</summary>
        public float DefaultHorizon;
    }

    /// <summary>The library's names of backends, policies and KV types ("sink_window", "k8v4",
    /// ...): null for a value the library does not know; parsing an unknown name throws.</summary>
    public static class Names
    {
        /// <summary>The GBNF grammar the library makes of a JSON schema (the subset h2o.h documents).
        /// Throws H2oException naming what it refuses.</summary>
        public static string JsonSchemaToGrammar(string schema)
        {
            byte[] bytes = Utf8.Bytes(schema);
            return Utf8.Out((byte[] text, UIntPtr capacity, out UIntPtr needed) =>
                                Native.h2o_json_schema_to_grammar(bytes, (UIntPtr)bytes.Length, text, capacity, out needed));
        }

        /// <summary>The library's name of a backend ("cpu", "vulkan", ...).</summary>
        public static string Of(Backend v) => Name(Native.h2o_backend_kind_name((uint)v));
        /// <summary>The library's name of a policy ("h2o", "sink_window", ...).</summary>
        public static string Of(KvPolicy v) => Name(Native.h2o_kv_policy_name((uint)v));
        /// <summary>The library's name of a KV type ("f16", "k8v4", ...).</summary>
        public static string Of(KvType v) => Name(Native.h2o_kv_type_name((uint)v));

        /// <summary>The backend of a name; throws H2oException for an unknown one.</summary>
        public static Backend ParseBackend(string name) => (Backend)Parse(name, Native.h2o_backend_kind_from_name);
        /// <summary>The policy of a name; throws H2oException for an unknown one.</summary>
        public static KvPolicy ParseKvPolicy(string name) => (KvPolicy)Parse(name, Native.h2o_kv_policy_from_name);
        /// <summary>The KV type of a name; throws H2oException for an unknown one.</summary>
        public static KvType ParseKvType(string name) => (KvType)Parse(name, Native.h2o_kv_type_from_name);

        /// <summary>The names of the research settings of h2o_experimental.h this library has.</summary>
        public static string[] Experimental
        {
            get
            {
                var names = new System.Collections.Generic.List<string>();
                for (uint key = 0; ; ++key)
                {
                    string name = Name(Native.h2o_experimental_name(key));
                    if (name == null) return names.ToArray();
                    names.Add(name);
                }
            }
        }

        internal static uint ParseExperimental(string name) => Parse(name, Native.h2o_experimental_from_name);

        /// <summary>The values a research setting accepts, [min, max], as SetExperimental checks them
        /// (h2o_experimental_bounds); throws H2oException for an unknown name.</summary>
        public static void ExperimentalBounds(string name, out double min, out double max)
        {
            Check.Status(Native.h2o_experimental_bounds(ParseExperimental(name), out min, out max));
        }

        /// <summary>What a policy keeps, and so which settings apply to it (h2o_kv_policy_get_info).</summary>
        public static KvPolicyInfo Info(KvPolicy policy)
        {
            var raw = new NativeKvPolicyInfo { struct_size = (uint)Marshal.SizeOf<NativeKvPolicyInfo>() };
            Check.Status(Native.h2o_kv_policy_get_info((uint)policy, ref raw));
            return new KvPolicyInfo
            {
                Name = Name(raw.name), GathersStatistics = raw.gathers_statistics != 0, HasRecentWindow = raw.has_recent_window != 0,
                KeepsSinks = raw.keeps_sinks != 0, DefaultRecentRatio = raw.default_recent_ratio, DefaultHorizon = raw.default_horizon,
            };
        }

        private delegate int FromName(byte[] name, out uint value);

        private static uint Parse(string name, FromName parse)
        {
            Check.Status(parse(Utf8.CString("name", name), out uint value));
            return value;
        }

        private static string Name(IntPtr p) => p == IntPtr.Zero ? null : Utf8.FromNative(p);
    }
}

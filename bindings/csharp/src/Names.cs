using System;
using System.Runtime.InteropServices;

namespace H2o
{
    /// <summary>Compute backends (h2o_backend_kind).</summary>
    public enum Backend : uint { Auto = 0, Cpu = 1, Vulkan = 2, Cuda = 3 }

    /// <summary>KV eviction policies (h2o_kv_policy); the header documents each.</summary>
    public enum KvPolicy : uint
    {
        Full = 0, H2o = 1, Window = 2, SinkWindow = 3, Scissorhands = 4, Tova = 5, Roco = 6, Random = 7, MeanH2o = 8,
    }

    /// <summary>Element formats of the KV cache (h2o_kv_type).</summary>
    public enum KvType : uint { F32 = 0, F16 = 1, Q8 = 2, Q4 = 3, K8V4 = 4 }

    /// <summary>Why a generation ended (h2o_stop_reason).</summary>
    public enum StopReason : uint { None = 0, MaxTokens = 1, Eos = 2, StopString = 3, Callback = 4 }

    /// <summary>What a policy keeps (h2o_kv_policy_info).</summary>
    public struct KvPolicyInfo
    {
        public string Name;
        /// <summary>Ranks tokens by attention: the horizon and the research settings that move budgets apply.</summary>
        public bool GathersStatistics;
        public bool HasRecentWindow, KeepsSinks;
        public float DefaultRecentRatio;
        /// <summary>The horizon's default, in budgets (0: none).</summary>
        public float DefaultHorizon;
    }

    /// <summary>The library's names of backends, policies and KV types ("sink_window", "k8v4",
    /// ...): null for a value the library does not know; parsing an unknown name throws.</summary>
    public static class Names
    {
        public static string Of(Backend v) => Name(Native.h2o_backend_kind_name((uint)v));
        public static string Of(KvPolicy v) => Name(Native.h2o_kv_policy_name((uint)v));
        public static string Of(KvType v) => Name(Native.h2o_kv_type_name((uint)v));

        public static Backend ParseBackend(string name) => (Backend)Parse(name, Native.h2o_backend_kind_from_name);
        public static KvPolicy ParseKvPolicy(string name) => (KvPolicy)Parse(name, Native.h2o_kv_policy_from_name);
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

// Declarations of the C API (include/h2o/h2o.h, ABI 0.5). Struct layouts follow the header field
// by field; the tests compare Marshal.SizeOf and field offsets with the values a C program
// compiled against the header prints.
using System;
using System.Runtime.InteropServices;

namespace H2o
{
    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate int TokenCallback(IntPtr text, UIntPtr length, IntPtr userData);

    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate int ProgressCallback(float fraction, IntPtr userData);

    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate void EventCallback(uint sessionEvent, ref NativeKvUsage usage, IntPtr userData);

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeModelParams
    {
        public uint struct_size;
        public IntPtr tokenizer_path;
        public IntPtr progress;
        public IntPtr progress_user_data;
        public ulong prefix_cache_bytes;
        public uint prefix_cache_policy;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeModelInfo
    {
        public uint struct_size, n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim;
        public int bos_token, eos_token;
        public ulong n_params, weight_bytes;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativePrefixCacheStats
    {
        public uint struct_size, entries;
        public ulong bytes, hits, misses;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeChatMessage
    {
        public IntPtr role;
        public UIntPtr role_len;
        public IntPtr content;
        public UIntPtr content_len;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeDeviceTraffic
    {
        public uint struct_size;
        public ulong bytes_to_device, bytes_to_host, submissions, device_memory_bytes;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal unsafe struct NativeBackendInfo
    {
        public uint struct_size, kind;
        public int device_index;
        public fixed byte name[128];
        public fixed byte device_type[16];
        public ulong memory_bytes;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal unsafe struct NativeSessionParams
    {
        public uint struct_size, n_ctx, n_threads, n_batch;
        public ulong seed;
        public uint kv_budget, kv_policy, kv_recent;
        public float kv_recent_ratio;
        public uint kv_sinks;
        public int position_rolling;
        public uint backend;
        public int device_index;
        public uint kv_type;
        public ulong max_memory_bytes;
        public uint kv_horizon;
        /// <summary>Research settings by key (h2o_experimental.h): set through h2o_session_params_set_experimental.</summary>
        public fixed double experimental[16];
        public uint kv_overflow;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeKvLayout
    {
        public uint struct_size, budget, policy, recent, sinks, heavy;
        public int position_rolling;
        public uint type, n_ctx, horizon;
        public uint min_layer_budget, max_layer_budget, min_head_budget;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeKvUsage
    {
        public uint struct_size, capacity;
        public ulong n_past, n_held, n_evicted, n_pinned, evicting_since;
        public int evicts;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeKvPolicyInfo
    {
        public uint struct_size, policy;
        public IntPtr name;
        public int gathers_statistics, has_recent_window, keeps_sinks;
        public float default_recent_ratio, default_horizon;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeMemoryReport
    {
        public uint struct_size;
        public ulong weight_bytes, kv_bytes, scratch_bytes;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeSpanInfo
    {
        public uint struct_size, span_id;
        public float min_share;
        public int min_tokens;
        public long n_tokens;
        public int kept_min, kept_max;
        public double kept_mean, attention_share;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeGenerateParams
    {
        public uint struct_size, max_tokens;
        public float temperature;
        public uint top_k;
        public float top_p, min_p, repeat_penalty;
        public uint repeat_last_n;
        public IntPtr stop_strings;
        public UIntPtr n_stop_strings;
        public int stop_at_eos;
        public IntPtr grammar;
        public UIntPtr grammar_len;
        public IntPtr json_schema;
        public UIntPtr json_schema_len;
        public IntPtr logit_bias_tokens, logit_bias_values;
        public UIntPtr n_logit_bias;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeGenerateStats
    {
        public uint struct_size, n_prompt_tokens, n_generated_tokens, stop_reason;
        public ulong n_past;
        public double prompt_seconds, generate_seconds;
    }

    internal static class Native
    {
        // Resolved as libh2o-llm.so: see Library.cs for where it is looked for.
        internal const string Lib = "h2o-llm";
        internal const uint TextPin = 1;
        internal const uint TextSpecial = 2;
        internal const int BufferTooSmall = 9;

        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_version();
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern uint h2o_version_number();
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_status_string(int status);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_last_error();

        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_model_params_init(ref NativeModelParams p, UIntPtr size);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_model_load(byte[] path, ref NativeModelParams p, out IntPtr model);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern void h2o_model_free(IntPtr model);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_model_get_info(ModelHandle model, ref NativeModelInfo info);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_model_get_prefix_cache_stats(ModelHandle model, ref NativePrefixCacheStats stats);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_tokenize(ModelHandle model, byte[] text, UIntPtr len, uint flags, int[] tokens,
                                                UIntPtr capacity, out UIntPtr needed);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_detokenize(ModelHandle model, int[] tokens, UIntPtr n, byte[] text,
                                                  UIntPtr capacity, out UIntPtr needed);

        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_backend_kind_name(uint kind);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_backend_kind_from_name(byte[] name, out uint kind);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_kv_policy_name(uint policy);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_kv_policy_from_name(byte[] name, out uint policy);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_kv_policy_get_info(uint policy, ref NativeKvPolicyInfo info);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_experimental_name(uint key);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_experimental_from_name(byte[] name, out uint key);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_experimental_bounds(uint key, out double min, out double max);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_params_set_experimental(ref NativeSessionParams p, uint key, double value);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_params_get_experimental(ref NativeSessionParams p, uint key, out double value);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_get_experimental(SessionHandle s, uint key, out double value);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_kv_type_name(uint type);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_kv_type_from_name(byte[] name, out uint type);

        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_params_init(ref NativeSessionParams p, UIntPtr size);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_create(ModelHandle model, ref NativeSessionParams p, out IntPtr session);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern void h2o_session_free(IntPtr session);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_get_backend(SessionHandle s, ref NativeBackendInfo info);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_get_kv_layout(SessionHandle s, ref NativeKvLayout layout);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_get_kv_usage(SessionHandle s, ref NativeKvUsage usage);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_json_schema_to_grammar(byte[] schema, UIntPtr len, byte[] text, UIntPtr capacity, out UIntPtr needed);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_chat_format_tools(ModelHandle model, byte[] format, byte[] messages, UIntPtr messagesLen, byte[] tools,
                                                         UIntPtr toolsLen, int addAssistantPrefix, byte[] text, UIntPtr capacity,
                                                         out UIntPtr needed);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_tool_call_grammar(ModelHandle model, byte[] format, byte[] tools, UIntPtr toolsLen, byte[] toolChoice,
                                                         int parallel, byte[] grammar, UIntPtr capacity, out UIntPtr needed);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_parse_tool_calls(ModelHandle model, byte[] format, byte[] reply, UIntPtr replyLen, ulong idSalt,
                                                        byte[] json, UIntPtr capacity, out UIntPtr needed);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_set_event_callback(SessionHandle s, EventCallback callback, IntPtr userData);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern int h2o_session_reset(SessionHandle s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern int h2o_session_set_seed(SessionHandle s, ulong seed);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern int h2o_session_cancel(SessionHandle s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)] internal static extern IntPtr h2o_session_last_error(SessionHandle s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_memory(SessionHandle s, ref NativeMemoryReport report);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_add_text(SessionHandle s, byte[] text, UIntPtr len, uint flags);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_add_span_text(SessionHandle s, uint spanId, float minShare, byte[] text,
                                                             UIntPtr len, uint flags);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_get_span_info(SessionHandle s, uint spanId, ref NativeSpanInfo info);

        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_save(SessionHandle s, byte[] path);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_load(ModelHandle model, byte[] path, ref NativeSessionParams p, out IntPtr session);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_state_size(SessionHandle s, out UIntPtr size);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_save_to_buffer(SessionHandle s, byte[] buffer, UIntPtr capacity, out UIntPtr size);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_load_from_buffer(ModelHandle model, byte[] buffer, UIntPtr size,
                                                                ref NativeSessionParams p, out IntPtr session);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_fork(SessionHandle source, out IntPtr session);

        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_generate_params_init(ref NativeGenerateParams p, UIntPtr size);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_generate(SessionHandle s, byte[] prompt, UIntPtr len, ref NativeGenerateParams p,
                                                TokenCallback callback, IntPtr userData);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_generate_begin(SessionHandle s, byte[] prompt, UIntPtr len, ref NativeGenerateParams p);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_generate_next(SessionHandle s, out IntPtr text, out UIntPtr len, out uint stopReason);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        internal static extern int h2o_session_get_stats(SessionHandle s, ref NativeGenerateStats stats);
    }
}

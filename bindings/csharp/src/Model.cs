using System;
using System.Runtime.InteropServices;

namespace H2o
{
    /// <summary>Hyperparameters of a model (h2o_model_info); -1 for a token the model lacks.</summary>
    public struct ModelInfo
    {
        /// <summary>Tokens in the vocabulary (the logits' count).</summary>
        public uint NVocab;
        /// <summary>The context length the model was trained with.</summary>
        public uint NCtxTrain;
        /// <summary>Width of the residual stream.</summary>
        public uint NEmbd;
        /// <summary>Transformer blocks.</summary>
        public uint NLayer;
        /// <summary>Query heads.</summary>
        public uint NHead;
        /// <summary>Key/value heads.</summary>
        public uint NHeadKv;
        /// <summary>Width of the feed-forward network.</summary>
        public uint NFf;
        /// <summary>Elements of one head.</summary>
        public uint HeadDim;
        /// <summary>The beginning-of-text token, or -1.</summary>
        public int BosToken;
        /// <summary>The end-of-text token, or -1.</summary>
        public int EosToken;
        /// <summary>Weight elements.</summary>
        public ulong NParams;
        /// <summary>Bytes of the weights as stored.</summary>
        public ulong WeightBytes;
    }

    /// <summary>The model's prefix cache (h2o_prefix_cache_stats): Hits counts fresh sessions that
    /// started from a cached prefix, Misses those that found none.</summary>
    public struct PrefixCacheStats
    {
        /// <summary>Processed prefixes held.</summary>
        public uint Entries;
        /// <summary>Bytes they take.</summary>
        public ulong Bytes;
        /// <summary>Fresh sessions that started from a cached prefix.</summary>
        public ulong Hits;
        /// <summary>Fresh sessions that found none.</summary>
        public ulong Misses;
    }

    /// <summary>A loaded model (read-only weights and tokenizer), safe to share between threads
    /// and sessions. Sessions keep it alive: it may be disposed before them.</summary>
    public sealed class Model : IDisposable
    {
        internal readonly ModelHandle Handle;

        private Model(ModelHandle handle) { Handle = handle; }

        /// <summary>Loads a GGUF model. progress (optional) receives the fraction loaded and returns
        /// false to cancel; an exception it throws cancels the load and is rethrown here.</summary>
        public static Model Load(string path, string tokenizerPath = null, Func<float, bool> progress = null) =>
            Load(path, new ModelParams { TokenizerPath = tokenizerPath, Progress = progress });

        /// <summary>Loads a GGUF model with the given options.</summary>
        public static Model Load(string path, ModelParams parameters)
        {
            if (parameters == null) throw new ArgumentNullException(nameof(parameters));
            var p = new NativeModelParams { struct_size = (uint)Marshal.SizeOf<NativeModelParams>() };
            Check.Status(Native.h2o_model_params_init(ref p, (UIntPtr)p.struct_size));
            p.prefix_cache_bytes = parameters.PrefixCacheBytes;
            p.prefix_cache_policy = (uint)parameters.PrefixCachePolicy;
            byte[] pathBytes = Utf8.CString("path", path);
            IntPtr tokenizer = IntPtr.Zero;
            var guard = new CallbackGuard();
            Func<float, bool> progress = parameters.Progress;
            // The delegate is referenced until the end of this method, so it outlives the call.
            ProgressCallback callback = (fraction, _) => guard.Run(() => progress(fraction) ? 0 : 1, 1);
            try
            {
                if (parameters.TokenizerPath != null)
                {
                    byte[] t = Utf8.CString("tokenizer path", parameters.TokenizerPath);
                    tokenizer = Marshal.AllocHGlobal(t.Length);
                    Marshal.Copy(t, 0, tokenizer, t.Length);
                    p.tokenizer_path = tokenizer;
                }
                if (progress != null) p.progress = Marshal.GetFunctionPointerForDelegate(callback);
                int status = Native.h2o_model_load(pathBytes, ref p, out IntPtr raw);
                GC.KeepAlive(callback);
                if (status == 0 && guard.Failed) Native.h2o_model_free(raw);
                guard.RethrowIfFailed();
                Check.Status(status);
                return new Model(ModelHandle.From(raw));
            }
            finally
            {
                if (tokenizer != IntPtr.Zero) Marshal.FreeHGlobal(tokenizer);
            }
        }

        /// <summary>What the prefix cache (ModelParams.PrefixCacheBytes) holds and has done.</summary>
        public PrefixCacheStats PrefixCacheStats
        {
            get
            {
                var s = new NativePrefixCacheStats { struct_size = (uint)Marshal.SizeOf<NativePrefixCacheStats>() };
                Check.Status(Native.h2o_model_get_prefix_cache_stats(Handle, ref s));
                return new PrefixCacheStats { Entries = s.entries, Bytes = s.bytes, Hits = s.hits, Misses = s.misses };
            }
        }

        /// <summary>The model's shape (h2o_model_get_info).</summary>
        public ModelInfo Info
        {
            get
            {
                var i = new NativeModelInfo { struct_size = (uint)Marshal.SizeOf<NativeModelInfo>() };
                Check.Status(Native.h2o_model_get_info(Handle, ref i));
                return new ModelInfo
                {
                    NVocab = i.n_vocab, NCtxTrain = i.n_ctx_train, NEmbd = i.n_embd, NLayer = i.n_layer,
                    NHead = i.n_head, NHeadKv = i.n_head_kv, NFf = i.n_ff, HeadDim = i.head_dim,
                    BosToken = i.bos_token, EosToken = i.eos_token, NParams = i.n_params, WeightBytes = i.weight_bytes,
                };
            }
        }

        /// <summary>The text's token ids, with the BOS token first when addBos.</summary>
        public int[] Tokenize(string text, bool addBos)
        {
            byte[] bytes = Utf8.Bytes(text);
            int status = Native.h2o_tokenize(Handle, bytes, (UIntPtr)bytes.Length, addBos ? 1u : 0u, null, UIntPtr.Zero,
                                             out UIntPtr needed);
            if (status != Native.BufferTooSmall) Check.Status(status);
            var tokens = new int[(int)needed];
            Check.Status(Native.h2o_tokenize(Handle, bytes, (UIntPtr)bytes.Length, addBos ? 1u : 0u, tokens,
                                             (UIntPtr)tokens.Length, out needed));
            return tokens;
        }

        /// <summary>The tokens' text.</summary>
        public string Detokenize(int[] tokens)
        {
            int status = Native.h2o_detokenize(Handle, tokens, (UIntPtr)tokens.Length, null, UIntPtr.Zero, out UIntPtr needed);
            if (status != Native.BufferTooSmall) Check.Status(status);
            var text = new byte[(int)needed + 1];
            Check.Status(Native.h2o_detokenize(Handle, tokens, (UIntPtr)tokens.Length, text, (UIntPtr)text.Length,
                                               out needed));
            return System.Text.Encoding.UTF8.GetString(text, 0, (int)needed);
        }

        /// <summary>A conversation with tools as the model's family writes it (h2o_chat_format_tools):
        /// messagesJson and toolsJson (null: none) in OpenAI's shapes; format null: the model's own
        /// template. Feed it with Session.AddChatText.</summary>
        public string FormatChatWithTools(string messagesJson, string toolsJson, string format = null, bool addAssistantPrefix = true)
        {
            byte[] messages = Utf8.Bytes(messagesJson), tools = toolsJson == null ? null : Utf8.Bytes(toolsJson);
            byte[] name = format == null ? null : Utf8.CString("format", format);
            return Utf8.Out((byte[] text, UIntPtr capacity, out UIntPtr needed) =>
                                Native.h2o_chat_format_tools(Handle, name, messages, (UIntPtr)messages.Length, tools,
                                                             (UIntPtr)(tools?.Length ?? 0), addAssistantPrefix ? 1 : 0, text, capacity,
                                                             out needed));
        }

        /// <summary>The grammar (GenerateParams.Grammar) of a reply under toolChoice: "auto",
        /// "required" or a function's name; parallel false: one call (h2o_tool_call_grammar).</summary>
        public string ToolCallGrammar(string toolsJson, string toolChoice = "auto", bool parallel = true, string format = null)
        {
            byte[] tools = Utf8.Bytes(toolsJson), choice = Utf8.CString("toolChoice", toolChoice);
            byte[] name = format == null ? null : Utf8.CString("format", format);
            return Utf8.Out((byte[] text, UIntPtr capacity, out UIntPtr needed) =>
                                Native.h2o_tool_call_grammar(Handle, name, tools, (UIntPtr)tools.Length, choice, parallel ? 1 : 0, text,
                                                             capacity, out needed));
        }

        /// <summary>A reply read back as JSON: {"content": text or null, "tool_calls": [{"id",
        /// "type", "function": {"name", "arguments"}}]} (h2o_parse_tool_calls).</summary>
        public string ParseToolCalls(string reply, ulong idSalt = 0, string format = null)
        {
            byte[] bytes = Utf8.Bytes(reply);
            byte[] name = format == null ? null : Utf8.CString("format", format);
            return Utf8.Out((byte[] text, UIntPtr capacity, out UIntPtr needed) =>
                                Native.h2o_parse_tool_calls(Handle, name, bytes, (UIntPtr)bytes.Length, idSalt, text, capacity, out needed));
        }

        /// <summary>Releases the model; sessions made from it keep working.</summary>
        public void Dispose() => Handle.Dispose();
    }
}

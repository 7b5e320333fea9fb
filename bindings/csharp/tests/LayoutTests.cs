using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.InteropServices;

namespace H2o.Tests
{
    /// <summary>The structs of Native.cs against the C header: a C program compiled here prints
    /// sizeof and offsetof of every field, so the declarations cannot drift unnoticed.</summary>
    public static class LayoutTests
    {
        private static readonly Dictionary<Type, string> CNames = new Dictionary<Type, string>
        {
            { typeof(NativeModelParams), "h2o_model_params" }, { typeof(NativeModelInfo), "h2o_model_info" },
            { typeof(NativePrefixCacheStats), "h2o_prefix_cache_stats" },
            { typeof(NativeBackendInfo), "h2o_backend_info" }, { typeof(NativeSessionParams), "h2o_session_params" },
            { typeof(NativeKvLayout), "h2o_kv_layout" }, { typeof(NativeMemoryReport), "h2o_memory_report" },
            { typeof(NativeSpanInfo), "h2o_span_info" }, { typeof(NativeKvPolicyInfo), "h2o_kv_policy_info" },
            { typeof(NativeGenerateParams), "h2o_generate_params" }, { typeof(NativeGenerateStats), "h2o_generate_stats" },
            { typeof(NativeKvUsage), "h2o_kv_usage" }, { typeof(NativeChatMessage), "h2o_chat_message" },
            { typeof(NativeDeviceTraffic), "h2o_device_traffic" },
        };

        [Test]
        public static void StructLayoutsMatchTheCHeader()
        {
            var expected = new List<string>();
            var c = "#include <stdio.h>\n#include <stddef.h>\n#include \"h2o/h2o.h\"\nint main(void) {\n";
            foreach (var pair in CNames)
            {
                expected.Add($"{pair.Value} sizeof {Marshal.SizeOf(pair.Key)}");
                c += $"printf(\"{pair.Value} sizeof %zu\\n\", sizeof({pair.Value}));\n";
                foreach (var f in pair.Key.GetFields(BindingFlags.Public | BindingFlags.Instance))
                {
                    expected.Add($"{pair.Value} {f.Name} {Marshal.OffsetOf(pair.Key, f.Name)}");
                    c += $"printf(\"{pair.Value} {f.Name} %zu\\n\", offsetof({pair.Value}, {f.Name}));\n";
                }
            }
            c += "return 0;\n}\n";
            string dir = Path.Combine(Path.GetTempPath(), "h2o-cs-layout-" + Process.GetCurrentProcess().Id);
            Directory.CreateDirectory(dir);
            File.WriteAllText(Path.Combine(dir, "layout.c"), c);
            Run(Environment.GetEnvironmentVariable("CC") ?? "cc",
                $"-I \"{Path.Combine(Runner.Root, "include")}\" \"{dir}/layout.c\" -o \"{dir}/layout\"");
            string[] actual = Run(Path.Combine(dir, "layout"), "").Split(new[] { '\n' }, StringSplitOptions.RemoveEmptyEntries);
            Directory.Delete(dir, true);
            Assert.Equal(string.Join("\n", actual), string.Join("\n", expected), "layouts (C, then C#)");
            Assert.True(expected.Count > 60, "every field was compared");
        }

        /// <summary>H2O_MAX_SPANS is a #define, which the layout program does not see: read from the
        /// header. The span info's size is the header comment's 48 bytes as well.</summary>
        [Test]
        public static void SpanDeclarationsMatchTheCHeader()
        {
            string line = File.ReadLines(Path.Combine(Runner.Root, "include/h2o/h2o.h"))
                .First(l => l.StartsWith("#define H2O_MAX_SPANS ", StringComparison.Ordinal));
            Assert.Equal(line.Split(new[] { ' ' }, StringSplitOptions.RemoveEmptyEntries)[2], Session.MaxSpans.ToString(), "H2O_MAX_SPANS");
            Assert.Equal(48, Marshal.SizeOf<NativeSpanInfo>(), "sizeof(h2o_span_info)");
        }

        private static string Run(string program, string arguments)
        {
            var start = new ProcessStartInfo(program, arguments) { RedirectStandardOutput = true, UseShellExecute = false };
            using (var p = Process.Start(start))
            {
                string output = p.StandardOutput.ReadToEnd();
                p.WaitForExit();
                Assert.Equal(0, p.ExitCode, program + " exit status");
                return output;
            }
        }
    }
}

namespace H2o
{
    /// <summary>The native library. P/Invoke loads libh2o-llm.so by its name "h2o-llm": both .NET
    /// and Mono look next to the assembly first, then on the system loader's path. So either copy
    /// libh2o-llm.so* beside H2o.dll, or put its folder on LD_LIBRARY_PATH, which is what
    /// scripts/test-bindings.sh does with $H2O_LIB_DIR (default: the build folder). netstandard2.0
    /// has no API to choose a library path at run time.</summary>
    public static class Library
    {
        /// <summary>The library's version, e.g. "0.7.0".</summary>
        public static string Version => Utf8.FromNative(Native.h2o_version());

        /// <summary>The version these bindings were written for: 0.7.0 (ABI 1).</summary>
        public const uint AbiVersionNumber = 700;

        /// <summary>True when the loaded library has that ABI: the same major and minor version (before
        /// 1.0 a minor version may change the ABI) and a patch at least theirs (a patch may lift a
        /// refusal callers rely on).</summary>
        public static bool VersionMatches
        {
            get
            {
                uint number = Native.h2o_version_number();
                return number / 100 == AbiVersionNumber / 100 && number >= AbiVersionNumber;
            }
        }
    }
}

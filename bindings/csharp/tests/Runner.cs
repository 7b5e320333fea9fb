using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;

namespace H2o.Tests
{
    /// <summary>Marks a test: a public static void method without parameters.</summary>
    [AttributeUsage(AttributeTargets.Method)]
    internal sealed class TestAttribute : Attribute { }

    /// <summary>Thrown by a test that cannot run here (the model file is missing).</summary>
    internal sealed class SkipException : Exception
    {
        public SkipException(string why) : base(why) { }
    }

    internal static class Assert
    {
        public static void True(bool condition, string what)
        {
            if (!condition) throw new Exception("assertion failed: " + what);
        }

        public static void Equal<T>(T expected, T actual, string what = "")
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
                throw new Exception($"{what}: expected <{expected}>, got <{actual}>");
        }

        public static TException Throws<TException>(Action action) where TException : Exception
        {
            try { action(); }
            catch (TException e) { return e; }
            catch (Exception e) { throw new Exception($"expected {typeof(TException).Name}, got {e.GetType().Name}: {e.Message}"); }
            throw new Exception($"expected {typeof(TException).Name}, nothing was thrown");
        }

        public static H2oException H2oError(Status status, Action action)
        {
            var e = Throws<H2oException>(action);
            Equal(status, e.Status, "status of \"" + e.Message + "\"");
            True(e.LibraryMessage.Length > 0, "the library's message is not empty");
            return e;
        }
    }

    /// <summary>Runs every [Test] method of this assembly and ends with "N passed, N failed".</summary>
    internal static class Runner
    {
        /// <summary>The checkout's root: the first folder above this program holding include/h2o/h2o.h.</summary>
        internal static readonly string Root = FindRoot();

        private static string FindRoot()
        {
            for (var d = new DirectoryInfo(AppDomain.CurrentDomain.BaseDirectory); d != null; d = d.Parent)
                if (File.Exists(Path.Combine(d.FullName, "include/h2o/h2o.h"))) return d.FullName;
            throw new Exception("the checkout (include/h2o/h2o.h) is not above " + AppDomain.CurrentDomain.BaseDirectory);
        }

        /// <summary>stories260K from $H2O_SHARED_DIR, else ../shared beside the checkout.</summary>
        internal static string ModelPath()
        {
            string shared = Environment.GetEnvironmentVariable("H2O_SHARED_DIR");
            if (string.IsNullOrEmpty(shared)) shared = Path.Combine(Root, "..", "shared");
            string path = Path.GetFullPath(Path.Combine(shared, "models", "stories260K.gguf"));
            if (!File.Exists(path)) throw new SkipException(path + " not found; put the shared data folder beside the checkout (../shared) or set H2O_SHARED_DIR");
            return path;
        }

        private static int Main(string[] args)
        {
            var tests = typeof(Runner).Assembly.GetTypes()
                .SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.Static))
                .Where(m => m.GetCustomAttribute<TestAttribute>() != null)
                .Where(m => args.Length == 0 || args.Any(a => (m.DeclaringType.Name + "." + m.Name).Contains(a)))
                .OrderBy(m => m.DeclaringType.Name + "." + m.Name).ToList();
            int passed = 0, failed = 0, skipped = 0;
            foreach (var test in tests)
            {
                string name = test.DeclaringType.Name + "." + test.Name;
                var clock = System.Diagnostics.Stopwatch.StartNew();
                try
                {
                    test.Invoke(null, null);
                    passed++;
                    Console.WriteLine($"ok      {name} ({clock.ElapsedMilliseconds} ms)");
                }
                catch (TargetInvocationException e) when (e.InnerException is SkipException)
                {
                    skipped++;
                    Console.WriteLine("H2O-SKIP " + name + ": " + e.InnerException.Message);
                }
                catch (TargetInvocationException e)
                {
                    failed++;
                    Console.WriteLine("FAILED  " + name + ": " + e.InnerException);
                }
            }
            Console.WriteLine($"{passed} passed, {failed} failed" + (skipped > 0 ? $", {skipped} skipped" : ""));
            return failed == 0 && tests.Count > 0 ? 0 : 1;
        }
    }
}

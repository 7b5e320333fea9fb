using System;
using System.IO;
using System.Text;

namespace H2o.Tests
{
    /// <summary>Session state against stories260K: snapshots to a file and to bytes resume
    /// exactly, a fork continues like its source, damaged snapshots are refused with the library's
    /// status and message, and the model's prefix cache serves a second session's pinned prompt.</summary>
    public static class StateTests
    {
        private const string Prompt = "Once upon a time";
        private const string System =
            "You are a storyteller. You tell short and happy stories about a little girl, her dog and the sun.";

        private static string Collect(Session session, string prompt, GenerateParams p)
        {
            var text = new StringBuilder();
            session.Generate(prompt, p, piece => { text.Append(piece); return true; });
            return text.ToString();
        }

        private static string TempPath(string name) =>
            Path.Combine(Path.GetTempPath(), $"h2o-cs-{global::System.Diagnostics.Process.GetCurrentProcess().Id}-{name}");

        /// <summary>Generates, snapshots the session three ways (file, bytes, fork), then checks
        /// that each copy continues exactly as the original does.</summary>
        private static void CheckResume(SessionParams sessionParams, GenerateParams p, string file)
        {
            string path = TempPath(file);
            try
            {
                using (var model = Model.Load(Runner.ModelPath()))
                using (var original = new Session(model, sessionParams))
                {
                    Assert.True(Collect(original, Prompt, p).Length > 0, "first text");
                    original.Save(path);
                    byte[] bytes = original.ToBytes();
                    using (var forked = original.Fork())
                    using (var fromFile = Session.Load(model, path))
                    using (var fromBytes = Session.FromBytes(model, bytes))
                    {
                        string expected = Collect(original, " Then", p);
                        Assert.True(expected.Length > 20, "enough text: " + expected);
                        Assert.Equal(expected, Collect(fromFile, " Then", p), "loaded from " + path);
                        Assert.Equal(expected, Collect(fromBytes, " Then", p), "loaded from bytes");
                        Assert.Equal(expected, Collect(forked, " Then", p), "forked");
                        Assert.Equal(original.Stats.NPast, fromFile.Stats.NPast, "tokens processed");
                    }
                }
            }
            finally
            {
                File.Delete(path);
            }
        }

        [Test]
        public static void ASavedSessionContinuesLikeTheOriginalGreedy() =>
            CheckResume(new SessionParams(), new GenerateParams { MaxTokens = 24, Temperature = 0 }, "greedy.state");

        [Test]
        public static void ASavedSessionContinuesLikeTheOriginalSeeded()
        {
            // Sampling draws from the saved generator: a copy with a fresh generator would differ.
            var p = new GenerateParams { MaxTokens = 24, Temperature = 1, TopK = 0, TopP = 1, MinP = 0 };
            CheckResume(new SessionParams { Seed = 1234, KvBudget = 48, PositionRolling = true }, p, "seeded.state");
        }

        [Test]
        public static void TheForkKeepsTheModelAlive()
        {
            var p = new GenerateParams { MaxTokens = 16, Temperature = 0 };
            var model = Model.Load(Runner.ModelPath());
            var source = new Session(model);
            source.AddText(System, pin: true);
            using (var fork = source.Fork())
            {
                string expected = Collect(source, Prompt, p);
                source.Dispose();
                model.Dispose();
                Assert.Equal(expected, Collect(fork, Prompt, p), "the fork's text");
            }
        }

        [Test]
        public static void ADamagedSnapshotIsAStateFormatErrorWithTheLibraryMessage()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                Collect(session, Prompt, new GenerateParams { MaxTokens = 8, Temperature = 0 });
                byte[] bytes = session.ToBytes();
                var flipped = (byte[])bytes.Clone();
                flipped[bytes.Length / 2] ^= 0x40;
                var truncated = new byte[bytes.Length - 7];
                Array.Copy(bytes, truncated, truncated.Length);
                var damages = new[] { "flipped", "truncated" };
                foreach (string what in damages)
                {
                    byte[] damaged = what == "flipped" ? flipped : truncated;
                    var e = Assert.H2oError(Status.StateFormat, () => Session.FromBytes(model, damaged));
                    Assert.Equal(13, e.Code, what);
                    Assert.True(e.LibraryMessage.Contains("snapshot"), what + ": " + e.LibraryMessage);

                    string path = TempPath(what + ".state");
                    try
                    {
                        File.WriteAllBytes(path, damaged);
                        e = Assert.H2oError(Status.StateFormat, () => Session.Load(model, path));
                        Assert.True(e.LibraryMessage.Contains(path), what + ": " + e.LibraryMessage);
                    }
                    finally
                    {
                        File.Delete(path);
                    }
                }
                // The original bytes still load: the damage, not the reading, was refused.
                Session.FromBytes(model, bytes).Dispose();
            }
        }

        [Test]
        public static void AMissingSnapshotFileIsAnIoErrorNamingThePath()
        {
            const string path = "/nonexistent/dir/session.state";
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                var e = Assert.H2oError(Status.Io, () => Session.Load(model, path));
                Assert.True(e.LibraryMessage.Contains(path), "load: " + e.LibraryMessage);
                e = Assert.H2oError(Status.Io, () => session.Save(path));
                Assert.True(e.LibraryMessage.Contains(path), "save: " + e.LibraryMessage);
            }
        }

        [Test]
        public static void ThePrefixCacheServesTheSecondSessionTheSameText()
        {
            const ulong cap = 16 << 20;
            var p = new GenerateParams { MaxTokens = 24, Temperature = 0 };
            var texts = new string[2];
            foreach (var policy in new[] { CachePolicy.Reuse, CachePolicy.Lru }) {
                using (var model = Model.Load(Runner.ModelPath(), new ModelParams { PrefixCacheBytes = cap, PrefixCachePolicy = policy })) {
                    Assert.True(model.Tokenize(System, true).Length >= 16, "the prompt is long enough to be cached");
                    for (int i = 0; i < 2; i++) {
                        using (var session = new Session(model)) {
                            session.AddText(System, pin: true);
                            texts[i] = Collect(session, Prompt, p);
                        }
                    }
                    var stats = model.PrefixCacheStats;
                    Assert.Equal(1ul, stats.Hits, "hits under " + policy);
                    Assert.Equal(1ul, stats.Misses, "misses");
                    Assert.Equal(1u, stats.Entries, "entries");
                    Assert.True(stats.Bytes > 0 && stats.Bytes <= cap, "bytes held: " + stats.Bytes);
                    Assert.Equal(texts[0], texts[1], "the second session's text");
                }
            }
            // The same text as a model without a cache, whose statistics stay empty.
            using (var plain = Model.Load(Runner.ModelPath()))
            using (var session = new Session(plain))
            {
                session.AddText(System, pin: true);
                Assert.Equal(texts[0], Collect(session, Prompt, p), "without a cache");
                Assert.Equal(new PrefixCacheStats(), plain.PrefixCacheStats, "statistics without a cache");
            }
        }
    }
}

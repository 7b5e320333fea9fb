using System;
using System.IO;
using System.Text;

namespace H2o.Tests
{
    /// <summary>Retention spans against stories260K: a span keeps its minimum in every (layer, kv
    /// head), refused calls are invalid arguments that change nothing, and spans travel with
    /// snapshots and forks and end with Reset. The eviction rule itself is the C suite's
    /// (tests/session/test_retention_spans.cpp); these check that the binding passes it through.</summary>
    public static class SpanTests
    {
        private const string Instruction = "Always rhyme. Pip is a blue bird.";
        private const string Pin = " One day they found a big red ball under a tree.";
        private const string Story =
            "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. One day " +
            "they found a big red ball under a tree. Lily threw the ball and the dog ran after it. They played all day " +
            "until the sun went down, and then they went home to eat soup.";

        /// <summary>A budget of 32 slots: a share of 0.25 is 8 tokens, and the story passes through
        /// it twice.</summary>
        private static SessionParams SpanParams(KvPolicy policy) => new SessionParams
        {
            Threads = 1, KvBudget = 32, NCtx = 512, Batch = 16, KvPolicy = policy, PositionRolling = true, Seed = 99,
        };

        private static string Greedy(Session session, string prompt, uint n)
        {
            var text = new StringBuilder();
            var p = new GenerateParams { MaxTokens = n, Temperature = 0, StopAtEos = false };
            session.Generate(prompt, p, piece => { text.Append(piece); return true; });
            return text.ToString();
        }

        [Test]
        public static void ASpanKeepsItsMinimumInEveryCellAfterSeveralBudgetsOfText()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            {
                foreach (var policy in new[] { KvPolicy.Scissorhands, KvPolicy.Window })
                {
                    foreach (float share in new[] { 0f, 0.25f })
                    {
                        string what = $"{policy}, share {share}";
                        using (var session = new Session(model, SpanParams(policy)))
                        {
                            session.AddSpanText(7, share, Instruction);
                            SpanInfo before = session.GetSpanInfo(7);
                            Assert.Equal(7u, before.SpanId, what);
                            Assert.Equal(share, before.MinShare, what);
                            Assert.Equal((int)(share * 32), before.MinTokens, what);
                            Assert.True(before.NTokens >= 10, what + ": BOS and the instruction, " + before.NTokens);
                            Assert.Equal(before.NTokens, (long)before.KeptMin, what + ": all held so far");
                            Assert.Equal(before.NTokens, (long)before.KeptMax, what + ": all held so far");

                            // Several budgets of other text, a prompt and a generation.
                            for (int i = 0; i < 3; i++) session.AddText(Story);
                            Greedy(session, " The end.", 40);
                            SpanInfo after = session.GetSpanInfo(7);
                            Assert.Equal(before.NTokens, after.NTokens, what);
                            Assert.True(after.KeptMax <= after.NTokens, what + ": kept_max " + after.KeptMax);
                            if (share > 0)
                                Assert.True(after.KeptMin >= 8, what + ": every (layer, kv head) keeps the minimum, " + after.KeptMin);
                            if (policy == KvPolicy.Window)
                            {
                                // The window evicts the oldest first: the span down to its minimum, or all of it.
                                Assert.Equal(share > 0 ? 8 : 0, after.KeptMax, what + ": kept_max");
                                Assert.Equal(null, after.AttentionShare, what + ": the window gathers no statistics");
                            }
                            else
                            {
                                Assert.True(after.AttentionShare.HasValue, what + ": scissorhands gathers statistics");
                                Assert.True(after.AttentionShare >= 0 && after.AttentionShare <= 1, what + ": " + after.AttentionShare);
                            }
                        }
                    }
                }
            }
        }

        [Test]
        public static void RefusedSpanCallsAreInvalidArgumentsAndChangeNothing()
        {
            var p = SpanParams(KvPolicy.Scissorhands);
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, p))
            using (var twin = new Session(model, p))
            {
                foreach (var s in new[] { session, twin }) s.AddSpanText(1, 0.5f, Instruction); // 16 of the 31 reservable slots
                SpanInfo held = session.GetSpanInfo(1);

                // Minimums and pins beyond kv_budget - 1.
                var e = Assert.H2oError(Status.InvalidArgument, () => session.AddSpanText(2, 0.5f, " More."));
                Assert.True(e.LibraryMessage.Contains("kv_budget - 1"), "message: " + e.LibraryMessage);
                Assert.H2oError(Status.InvalidArgument, () => session.AddSpanText(1, 1.0f, " More."));
                // A pin that would fit the budget alone, but not beside the span's 16 reserved slots.
                int n = model.Tokenize(Pin, false).Length;
                Assert.True(n >= 16 && n <= 28, n + " tokens");
                Assert.H2oError(Status.InvalidArgument, () => session.AddText(Pin, pin: true));
                // Bad arguments.
                Assert.H2oError(Status.InvalidArgument, () => session.AddSpanText(0, 0.1f, "x"));
                Assert.H2oError(Status.InvalidArgument, () => session.AddSpanText(3, 1.5f, "x"));
                Assert.H2oError(Status.InvalidArgument, () => session.AddSpanText(3, -0.1f, "x"));
                Assert.H2oError(Status.InvalidArgument, () => session.AddSpanText(3, float.NaN, "x"));
                Assert.Throws<ArgumentNullException>(() => session.AddSpanText(3, 0.1f, null));

                // No span was made or changed, and nothing reached the cache: the session continues
                // as its twin, which saw none of the refused calls.
                Assert.H2oError(Status.InvalidArgument, () => session.GetSpanInfo(2));
                Assert.H2oError(Status.InvalidArgument, () => session.GetSpanInfo(3));
                Assert.Equal(held, session.GetSpanInfo(1), "span 1");
                Assert.Equal(Greedy(twin, " Then", 30), Greedy(session, " Then", 30), "the continuation");
                Assert.Equal(twin.GetSpanInfo(1), session.GetSpanInfo(1), "span 1 after the continuation");
            }
        }

        [Test]
        public static void SpansSurviveASnapshotAndAForkAndEndWithReset()
        {
            string path = Path.Combine(Path.GetTempPath(),
                                       $"h2o-cs-{global::System.Diagnostics.Process.GetCurrentProcess().Id}-spans.state");
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, SpanParams(KvPolicy.Scissorhands)))
            {
                session.AddSpanText(11, 0.25f, Instruction);
                session.AddSpanText(12, 0.125f, " Pip is blue.", pin: true);
                session.AddText(Story);
                Session loaded;
                try
                {
                    session.Save(path);
                    loaded = Session.Load(model, path);
                }
                finally
                {
                    File.Delete(path);
                }
                var copies = new[] { loaded, Session.FromBytes(model, session.ToBytes()), session.Fork() };
                var names = new[] { "loaded", "from bytes", "forked" };
                try
                {
                    for (int i = 0; i < copies.Length; i++)
                        foreach (uint id in new[] { 11u, 12u })
                            Assert.Equal(session.GetSpanInfo(id), copies[i].GetSpanInfo(id), names[i] + ", span " + id);

                    // The minimums act after loading: the continuations (which evict) are the
                    // same, and so is what each span keeps.
                    string expected = Greedy(session, " Later", 60);
                    SpanInfo kept = session.GetSpanInfo(11);
                    Assert.True(kept.KeptMin >= 8, "kept_min " + kept.KeptMin);
                    for (int i = 0; i < copies.Length; i++)
                    {
                        Assert.Equal(expected, Greedy(copies[i], " Later", 60), names[i]);
                        Assert.Equal(kept, copies[i].GetSpanInfo(11), names[i] + ", span 11 after the continuation");
                    }
                }
                finally
                {
                    foreach (var copy in copies) copy.Dispose();
                }

                session.Reset();
                Assert.H2oError(Status.InvalidArgument, () => session.GetSpanInfo(11));
                session.AddText(Instruction, pin: true); // the minimums no longer reserve slots
            }
        }
    }
}

using System;
using System.Linq;
using System.Text;
using System.Threading;

namespace H2o.Tests
{
    /// <summary>Generation against stories260K: determinism, callback and iterator parity, stop
    /// reasons, exceptions in callbacks, cancellation and model lifetime.</summary>
    public static class GenerationTests
    {
        private const string Prompt = "Once upon a time";

        private static GenerateParams Greedy(uint n) => new GenerateParams { MaxTokens = n, Temperature = 0 };

        private static string Collect(Session session, string prompt, GenerateParams p)
        {
            var text = new StringBuilder();
            session.Generate(prompt, p, piece => { text.Append(piece); return true; });
            return text.ToString();
        }

        private static string Reference(Model model, uint n)
        {
            using (var session = new Session(model)) return Collect(session, Prompt, Greedy(n));
        }

        [Test]
        public static void GreedyTextIsDeterministicAndTheStreamGivesTheSameText()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                string first = Reference(model, 32);
                Assert.True(first.Length > 20, "enough text: " + first);
                Assert.Equal(first, Reference(model, 32), "second run");
                var pieces = session.Stream(Prompt, Greedy(32)).ToList();
                Assert.True(pieces.Count > 1, "several pieces");
                Assert.Equal(first, string.Concat(pieces), "streamed text");
                Assert.Equal(StopReason.MaxTokens, session.LastStopReason);
                Assert.Equal(32u, session.Stats.NGeneratedTokens, "generated tokens");
            }
        }

        [Test]
        public static void TheDefaultSessionNeverRunsOutAndSaysWhenItBeganToEvict()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, new SessionParams { NCtx = 128, Threads = 1, Backend = Backend.Cpu }))
            {
                int events = 0;
                KvUsage atEvent = new KvUsage();
                session.SetEventHandler((e, usage) => { if (e == SessionEvent.KvFull) { ++events; atEvent = usage; } });
                Collect(session, Prompt, new GenerateParams { MaxTokens = 400, Temperature = 0, StopAtEos = false });
                KvUsage u = session.KvUsage;
                Assert.Equal(128u, u.Capacity, "capacity");
                Assert.True(u.NPast > 400, "past the context: " + u.NPast);
                Assert.Equal(u.NPast - 128, u.NEvicted, "evicted");
                Assert.Equal(128ul, u.EvictingSince, "since");
                Assert.Equal(1, events, "one event");
                Assert.True(atEvent.NPast <= 128, "at the fill");
                // An exception in the handler comes out of the call that raised the event.
                session.Reset();
                session.SetEventHandler((e, usage) => throw new InvalidOperationException("from the handler"));
                Assert.Throws<InvalidOperationException>(() => Collect(session, Prompt, new GenerateParams { MaxTokens = 200, Temperature = 0, StopAtEos = false }));
                session.SetEventHandler(null);
            }
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, new SessionParams { NCtx = 64, Threads = 1, KvOverflow = KvOverflow.Error }))
            {
                var e = Assert.Throws<H2oException>(() => Collect(session, Prompt, new GenerateParams { MaxTokens = 100, Temperature = 0, StopAtEos = false }));
                Assert.Equal(Status.ContextFull, e.Status, "the old contract");
            }
        }

        [Test]
        public static void AGrammarAndASchemaShapeTheReplyAndLogitBiasForcesAToken()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                string reply = Collect(session, "Once", new GenerateParams { Temperature = 0, Grammar = "root ::= \" upon a \" [a-z]+ \".\"" });
                Assert.True(System.Text.RegularExpressions.Regex.IsMatch(reply, "^ upon a [a-z]+\\.$"), "the grammar's shape: " + reply);
                Assert.Equal(StopReason.Grammar, session.Stats.StopReason);
                string schema = "{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, \"required\": [\"ok\"]}";
                for (ulong seed = 1; seed <= 3; ++seed)
                {
                    session.Reset();
                    session.SetSeed(seed);
                    string json = Collect(session, "Lily", new GenerateParams { Temperature = 1, JsonSchema = schema });
                    string compact = json.Replace(" ", "").Replace("\n", "").Replace("\t", "");
                    Assert.True(compact == "{\"ok\":true}" || compact == "{\"ok\":false}", "the schema's shape: " + json);
                }
                Assert.True(Names.JsonSchemaToGrammar(schema).StartsWith("root ::= "), "the schema's grammar");
                Assert.Throws<H2oException>(() => Names.JsonSchemaToGrammar("{\"pattern\": \"x\"}"));
                session.Reset();
                var e = Assert.Throws<H2oException>(() => Collect(session, "x", new GenerateParams { Grammar = "root ::= [a-" }));
                Assert.Equal(Status.InvalidArgument, e.Status, "a malformed grammar");
                int token = model.Tokenize(" cat", false).Last();
                session.Reset();
                string forced = Collect(session, "Once", new GenerateParams { Temperature = 0, MaxTokens = 3,
                                                                               LogitBias = new System.Collections.Generic.Dictionary<int, float> { { token, 100f } } });
                string piece = model.Detokenize(new[] { token }).Trim();
                Assert.Equal(piece + piece + piece, forced.Replace(" ", ""), "a forced token");
            }
        }

        [Test]
        public static void ARequiredToolCallIsGeneratedReadBackAndWrittenAgain()
        {
            const string tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": " +
                                 "\"object\", \"properties\": {\"city\": {\"enum\": [\"Paris\", \"Rome\"]}}, \"required\": [\"city\"]}}}]";
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                string prompt = model.FormatChatWithTools("[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}]", tools, "chatml");
                Assert.True(prompt.Contains("<tools>\n{\"type\": \"function\""), "the tools in the prompt: " + prompt);
                session.AddChatText(prompt);
                string grammar = model.ToolCallGrammar(tools, "required", false, "chatml");
                string reply = Collect(session, "", new GenerateParams { Temperature = 0, MaxTokens = 300, Grammar = grammar });
                string parsed = model.ParseToolCalls(reply, 1, "chatml");
                Assert.True(parsed.StartsWith("{\"content\": null, \"tool_calls\": [{\"id\": \"call_") &&
                                parsed.Contains("\"name\": \"get_weather\""), "the call read back: " + parsed);
                Assert.Equal("{\"content\": \"Text.\", \"tool_calls\": []}", model.ParseToolCalls("Text.", 0, "chatml"), "text stays text");
                Assert.Throws<H2oException>(() => model.ToolCallGrammar(tools, "nope", true, "chatml"));
            }
        }

        [Test]
        public static void SetSeedSamplesAsASessionMadeWithThatSeed()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var seeded = new Session(model, new SessionParams { Seed = 99 }))
            using (var session = new Session(model, new SessionParams { Seed = 7 }))
            {
                var sampled = new GenerateParams { MaxTokens = 24, Temperature = 1.0f };
                string expected = Collect(seeded, Prompt, sampled);
                session.SetSeed(99);
                Assert.Equal(expected, Collect(session, Prompt, sampled), "the same text");
            }
        }

        [Test]
        public static void StopStringsAndTheCallbackStopGeneration()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            {
                string reference = Reference(model, 32);
                string word = reference.Split(' ')[2];
                using (var session = new Session(model))
                {
                    var p = Greedy(32);
                    p.StopStrings = new[] { word };
                    Assert.Equal(reference.Substring(0, reference.IndexOf(word)), Collect(session, Prompt, p), "text before the stop string");
                    Assert.Equal(StopReason.StopString, session.Stats.StopReason);
                }
                using (var session = new Session(model))
                {
                    int calls = 0;
                    Assert.Equal(StopReason.Callback, session.Generate(Prompt, Greedy(32), _ => ++calls < 3));
                    Assert.Equal(3, calls, "calls");
                }
            }
        }

        [Test]
        public static void AnExceptionInTheCallbackIsRethrownAndTheSessionStaysUsable()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                int calls = 0;
                var e = Assert.Throws<InvalidOperationException>(() =>
                    session.Generate(Prompt, Greedy(16), _ => { calls++; throw new InvalidOperationException("boom"); }));
                Assert.Equal("boom", e.Message);
                Assert.Equal(1, calls, "no call after the exception");
                Assert.True(Collect(session, " The end.", Greedy(4)).Length > 0, "generates afterwards");
            }
        }

        [Test]
        public static void CancelFromTheCallbackAndFromAnotherThread()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, new SessionParams { KvBudget = 64, PositionRolling = true }))
            {
                Assert.H2oError(Status.Cancelled, () => session.Generate(Prompt, Greedy(1000), _ => { session.Cancel(); return true; }));

                // Another thread cancels until the generation, which would run for a million tokens, ends.
                // One cancel is not enough: h2o_generate_next clears a cancel that arrived after the
                // previous call's last check.
                bool done = false;
                var canceller = new Thread(() => { while (!Volatile.Read(ref done)) { session.Cancel(); Thread.Sleep(1); } });
                canceller.Start();
                try
                {
                    // The cancel may land while the prompt is processed or during generation.
                    Assert.H2oError(Status.Cancelled, () => session.Stream(" Then", Greedy(1000000)).ToList());
                }
                finally
                {
                    Volatile.Write(ref done, true);
                    canceller.Join();
                }
            }
        }

        [Test]
        public static void SessionsKeepTheModelAliveAndShareItAcrossThreads()
        {
            var model = Model.Load(Runner.ModelPath());
            string expected = Reference(model, 16);
            var results = new string[2];
            var threads = Enumerable.Range(0, 2).Select(i => new Thread(() => results[i] = Reference(model, 16))).ToList();
            threads.ForEach(t => t.Start());
            threads.ForEach(t => t.Join());
            Assert.Equal(expected, results[0], "thread 0");
            Assert.Equal(expected, results[1], "thread 1");

            using (var session = new Session(model))
            {
                model.Dispose(); // the session keeps the library's model
                Assert.Equal(expected, Collect(session, Prompt, Greedy(16)), "after the model was disposed");
            }
        }

        [Test]
        public static void ConstantMemorySessionRunsPastItsBudget()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, new SessionParams { KvBudget = 32, KvPolicy = KvPolicy.H2o, PositionRolling = true, KvType = KvType.Q8, KvHorizon = 48 }.SetExperimental("kv_layer_slope", 0.5)))
            {
                var layout = session.KvLayout;
                Assert.Equal(32u, layout.Budget, "budget");
                Assert.Equal(KvPolicy.H2o, layout.Policy);
                Assert.Equal(KvType.Q8, layout.Type);
                Assert.True(layout.PositionRolling, "rolling");
                Assert.Equal(48u, layout.Horizon, "horizon");
                Assert.Equal(0.5, session.GetExperimental("kv_layer_slope"), "layer slope");
                Assert.Equal(16u, layout.MinLayerBudget, "smallest layer budget");  // 5 layers: 16, 24, 32, 40, 48
                Assert.Equal(48u, layout.MaxLayerBudget, "largest layer budget");
                var memory = session.Memory;
                Assert.True(memory.KvBytes > 0 && memory.WeightBytes > 0, "memory is reported");
                session.AddText("You are a storyteller.", pin: true);
                var p = Greedy(200);
                p.StopAtEos = false;
                Assert.True(Collect(session, Prompt, p).Length > 200, "long text");
                Assert.Equal(StopReason.MaxTokens, session.Stats.StopReason);
                Assert.Equal(memory.KvBytes + memory.ScratchBytes, session.Memory.KvBytes + session.Memory.ScratchBytes, "memory");
                Assert.True(session.BackendName.StartsWith("cpu"), "backend " + session.BackendName);
            }
        }

        [Test]
        public static void PromptProxyEvictionReadsAPromptLongerThanTheBudget()
        {
            // Batches of 8: each after the first ranks its victims by the previous batch's last queries.
            Func<SessionParams> proxy = () => new SessionParams { KvBudget = 32, KvPolicy = KvPolicy.H2o, Batch = 8, Seed = 7 }
                .SetExperimental("kv_prompt_proxy", 16).SetExperimental("kv_prompt_random_share", 0.25);
            const string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                + "with her friends. One day, she saw a big red ball under a tree and ran to get it.";
            using (var model = Model.Load(Runner.ModelPath()))
            {
                int nPrompt = model.Tokenize(prompt, true).Length;
                Assert.True(nPrompt > 32, "the prompt has " + nPrompt + " tokens");
                var texts = new string[2];
                for (int i = 0; i < 2; i++)
                {
                    using (var session = new Session(model, proxy()))
                    {
                        var p = Greedy(32);
                        p.StopAtEos = false;
                        texts[i] = Collect(session, prompt, p);
                        Assert.True(texts[i].Length > 0, "text");
                        Assert.Equal(16.0, session.GetExperimental("kv_prompt_proxy"), "resolved prompt proxy");
                        Assert.Equal(0.25, session.GetExperimental("kv_prompt_random_share"), "resolved random share");
                        Assert.Equal(StopReason.MaxTokens, session.Stats.StopReason);
                        Assert.True(session.Stats.NPromptTokens >= nPrompt - 1, "prompt tokens " + session.Stats.NPromptTokens);
                        Assert.Equal(32u, session.Stats.NGeneratedTokens, "generated tokens");
                    }
                }
                Assert.Equal(texts[0], texts[1], "the random factors come from the seed");

                // A policy that gathers no statistics has nothing to rank by proxy attention.
                var window = new SessionParams { KvBudget = 32, KvPolicy = KvPolicy.Window }.SetExperimental("kv_prompt_proxy", 16);
                var e = Assert.H2oError(Status.InvalidArgument, () => new Session(model, window));
                Assert.True(e.LibraryMessage.Contains("kv_prompt_proxy"), "message names the field: " + e.Message);
                Assert.True(!Names.Info(KvPolicy.Window).GathersStatistics, "window gathers no statistics");
                // Values outside a research setting's range, and unknown names, are refused when set.
                Assert.H2oError(Status.InvalidArgument, () => proxy().SetExperimental("kv_prompt_proxy", 4097));
                Assert.H2oError(Status.InvalidArgument, () => proxy().SetExperimental("kv_prompt_random_share", 1.5));
                Assert.H2oError(Status.InvalidArgument, () => proxy().SetExperimental("no_such_setting", 1));
                Assert.Equal(16.0, proxy().GetExperimental("kv_prompt_proxy"), "params hold the value");
                Assert.True(Array.IndexOf(Names.Experimental, "kv_sinks_every_policy") >= 0, "names are listed");
                // The bounds are the library's: their ends are accepted, just past them is not.
                foreach (string name in Names.Experimental)
                {
                    Names.ExperimentalBounds(name, out double min, out double max);
                    Assert.True(min <= max, name + " bounds");
                    proxy().SetExperimental(name, max);
                    Assert.H2oError(Status.InvalidArgument, () => proxy().SetExperimental(name, max + 1));
                }
                Names.ExperimentalBounds("kv_prompt_proxy", out double proxyMin, out double proxyMax);
                Assert.Equal(4096.0, proxyMax, "kv_prompt_proxy's maximum");
                Assert.H2oError(Status.InvalidArgument, () => Names.ExperimentalBounds("no_such_setting", out double a, out double b));
            }
        }

        [Test]
        public static void HeadBudgetsReadAPromptLongerThanTheBudget()
        {
            // 80% of each layer's 32 slots move between its kv heads by their attention.
            Func<SessionParams> heads = () => new SessionParams { KvBudget = 32, KvPolicy = KvPolicy.Scissorhands }.SetExperimental("kv_head_share", 0.8);
            const string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                + "with her friends. One day, she saw a big red ball under a tree and ran to get it.";
            using (var model = Model.Load(Runner.ModelPath()))
            {
                int nPrompt = model.Tokenize(prompt, true).Length;
                Assert.True(nPrompt >= 60, "the prompt has " + nPrompt + " tokens");
                // With stream positions and with rolling ones (each head's ranks among its own tokens),
                // within each layer and across layers.
                foreach (int run in new[] { 0, 1, 2, 3 })
                {
                    bool rolling = run % 2 == 1, acrossLayers = run >= 2;
                    var texts = new string[2];
                    for (int i = 0; i < 2; i++)
                    {
                        var sp = heads();
                        sp.PositionRolling = rolling;
                        sp.SetExperimental("kv_share_across_layers", acrossLayers ? 1 : 0);
                        using (var session = new Session(model, sp))
                        {
                            session.AddText(prompt);
                            var layout = session.KvLayout;
                            Assert.Equal(32u, layout.Budget, "layout's budget");
                            Assert.Equal((double)0.8f, session.GetExperimental("kv_head_share"), "resolved head share");
                            // Each kv head keeps at least 32 - floor(0.8 * 32) = 7 slots.
                            Assert.Equal(7u, layout.MinHeadBudget, "layout's smallest head budget");
                            Assert.Equal(acrossLayers ? 1.0 : 0.0, session.GetExperimental("kv_share_across_layers"), "resolved sharing across layers");
                            var p = Greedy(48);
                            p.StopAtEos = false;
                            texts[i] = Collect(session, " Then", p);
                            Assert.True(texts[i].Length > 20, "too little text: " + texts[i]);
                            Assert.Equal(StopReason.MaxTokens, session.Stats.StopReason);
                            Assert.True(session.Stats.NPast >= (ulong)(nPrompt + 47), "stream length " + session.Stats.NPast);
                            Assert.Equal(48u, session.Stats.NGeneratedTokens, "generated tokens");
                        }
                    }
                    Assert.Equal(texts[0], texts[1], "generation from the same state gives the same text, rolling " + rolling + ", across layers " + acrossLayers);
                }

                // Out of range and a policy that gathers no statistics are refused.
                var tooMuch = Assert.H2oError(Status.InvalidArgument, () => heads().SetExperimental("kv_head_share", 0.95));
                Assert.True(tooMuch.LibraryMessage.Contains("kv_head_share"), "message names the setting: " + tooMuch.Message);
                var window = new SessionParams { KvBudget = 32, KvPolicy = KvPolicy.Window }.SetExperimental("kv_head_share", 0.5);
                var e = Assert.H2oError(Status.InvalidArgument, () => new Session(model, window));
                Assert.True(e.LibraryMessage.Contains("kv_head_share"), "message names the setting: " + e.Message);
                // Across layers without a head share has no slots to move.
                var noShare = new SessionParams { KvBudget = 32 }.SetExperimental("kv_share_across_layers", 1);
                var err = Assert.H2oError(Status.InvalidArgument, () => new Session(model, noShare));
                Assert.True(err.LibraryMessage.Contains("kv_share_across_layers"), "message names the field: " + err.Message);
            }
        }

        [Test]
        public static void TokenizeAndDetokenizeRoundTrip()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            {
                int[] tokens = model.Tokenize(Prompt, true);
                Assert.Equal(model.Info.BosToken, tokens[0], "BOS");
                Assert.Equal(Prompt, model.Detokenize(tokens));
                Assert.Equal(0, model.Tokenize("", false).Length, "empty text");
                Assert.H2oError(Status.InvalidArgument, () => model.Detokenize(new[] { -1 }));
            }
        }
    }
}

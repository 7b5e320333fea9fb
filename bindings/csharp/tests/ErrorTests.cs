using System;
using System.IO;
using System.Linq;

namespace H2o.Tests
{
    /// <summary>Bad input gives an exception with h2o's status and message, never a crash.</summary>
    public static class ErrorTests
    {
        [Test]
        public static void MissingModelFileIsAnIoErrorNamingThePath()
        {
            var e = Assert.H2oError(Status.Io, () => Model.Load("/nonexistent/dir/model.gguf"));
            Assert.True(e.LibraryMessage.Contains("/nonexistent/dir/model.gguf"), "message names the path: " + e.Message);
            Assert.Equal("i/o error: " + e.LibraryMessage, e.Message, "message");
            Assert.H2oError(Status.Io, () => Model.Load(Path.GetTempPath()));
            Assert.H2oError(Status.InvalidArgument, () => Model.Load("bad\0path"));
            Assert.Throws<ArgumentNullException>(() => Model.Load(null));
        }

        [Test]
        public static void NamesRoundTripAndUnknownNamesAreInvalidArguments()
        {
            Assert.H2oError(Status.InvalidArgument, () => Names.ParseKvPolicy("no_such_policy"));
            foreach (KvPolicy p in Enum.GetValues(typeof(KvPolicy))) Assert.Equal(p, Names.ParseKvPolicy(Names.Of(p)), "policy");
            foreach (KvType t in Enum.GetValues(typeof(KvType))) Assert.Equal(t, Names.ParseKvType(Names.Of(t)), "kv type");
            foreach (Backend b in Enum.GetValues(typeof(Backend))) Assert.Equal(b, Names.ParseBackend(Names.Of(b)), "backend");
            Assert.Equal("sink_window", Names.Of(KvPolicy.SinkWindow));
            Assert.Equal(null, Names.Of((KvPolicy)1000), "unknown value");
            // The library knows no policy that this enum lacks.
            Assert.Equal(null, Names.Of((KvPolicy)Enum.GetValues(typeof(KvPolicy)).Length), "next policy");
            Assert.Equal("unknown status", H2oException.StatusName((Status)77));
            Assert.True(Library.VersionMatches, "library " + Library.Version + " has ABI 0.5");
        }

        [Test]
        public static void InvalidSessionParametersAreRefused()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            {
                var e = Assert.H2oError(Status.InvalidArgument, () => new Session(model, new SessionParams { NCtx = 1 }));
                Assert.True(e.LibraryMessage.Contains("n_ctx"), "message names the field: " + e.Message);
                Assert.H2oError(Status.InvalidArgument, () => new Session(model, new SessionParams { KvPolicy = (KvPolicy)99 }));
                Assert.H2oError(Status.OutOfMemory, () => new Session(model, new SessionParams { MaxMemoryBytes = 1 }));
            }
        }

        [Test]
        public static void InvalidGenerationParametersAreRefusedAndTheSessionStaysUsable()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model))
            {
                var e = Assert.H2oError(Status.InvalidArgument,
                    () => session.Generate("Hi", new GenerateParams { MaxTokens = 0 }, _ => true));
                Assert.True(e.LibraryMessage.Contains("max_tokens"), "message names the field: " + e.Message);
                Assert.H2oError(Status.InvalidArgument, () => session.Stream("Hi", new GenerateParams { StopStrings = new[] { "" } }));
                Assert.H2oError(Status.InvalidArgument, () => session.Stream("Hi", new GenerateParams { StopStrings = new[] { "a\0b" } }));
                string text = string.Concat(session.Stream("Once upon a time", new GenerateParams { MaxTokens = 8, Temperature = 0 }));
                Assert.True(text.Length > 0, "generates after the errors");
            }
        }

        [Test]
        public static void PinningMoreThanTheBudgetIsRefused()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, new SessionParams { KvBudget = 8, PositionRolling = true }))
            {
                string text = string.Concat(Enumerable.Repeat("Once upon a time there was a cat. ", 4));
                Assert.H2oError(Status.InvalidArgument, () => session.AddText(text, pin: true));
                session.AddText(text); // unpinned, the same text is evicted as needed
            }
        }

        [Test]
        public static void AFullCacheWithoutEvictionIsContextFull()
        {
            using (var model = Model.Load(Runner.ModelPath()))
            using (var session = new Session(model, new SessionParams { NCtx = 16, KvPolicy = KvPolicy.Full }))
            {
                Assert.H2oError(Status.ContextFull, () => session.Generate("Once upon a time",
                    new GenerateParams { MaxTokens = 64, Temperature = 0, StopAtEos = false }, _ => true));
            }
        }

        [Test]
        public static void UseAfterDisposeThrowsObjectDisposed()
        {
            var model = Model.Load(Runner.ModelPath());
            var session = new Session(model);
            session.Dispose();
            session.Dispose(); // twice is harmless
            Assert.Throws<ObjectDisposedException>(() => session.AddText("Hi"));
            Assert.Throws<ObjectDisposedException>(() => session.Cancel());
            Assert.Throws<ObjectDisposedException>(() => { var _ = session.Stats; });
            model.Dispose();
            Assert.Throws<ObjectDisposedException>(() => model.Tokenize("Hi", true));
            Assert.Throws<ObjectDisposedException>(() => new Session(model));
        }

        [Test]
        public static void ProgressCallbackCancelsTheLoadAndItsExceptionIsRethrown()
        {
            string path = Runner.ModelPath();
            int calls = 0;
            Assert.H2oError(Status.Cancelled, () => Model.Load(path, progress: f => { calls++; return false; }));
            Assert.Equal(1, calls, "calls after cancelling");
            var e = Assert.Throws<InvalidOperationException>(() => Model.Load(path, progress: f => { throw new InvalidOperationException("from progress"); }));
            Assert.Equal("from progress", e.Message);
        }
    }
}

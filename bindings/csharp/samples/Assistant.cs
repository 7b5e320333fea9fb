// A constant-memory assistant: mono Assistant.exe [MODEL.gguf], one user turn per line on stdin.
// The KV cache has a fixed budget, the instructions are pinned so eviction never drops them, and
// position rolling lets the conversation go on without end. Ctrl-C cancels the current reply.
using System;
using H2o;

static class AssistantSample
{
    const string System = "You are a friendly storyteller. You answer with short, happy stories.\n";

    static int Main(string[] args)
    {
        string path = args.Length > 0 ? args[0] : Environment.GetEnvironmentVariable("H2O_MODEL") ?? "../shared/models/stories260K.gguf";
        using (var model = Model.Load(path))
        using (var session = new Session(model, new SessionParams { KvBudget = 128, KvPolicy = KvPolicy.Scissorhands, PositionRolling = true }))
        {
            session.AddText(System, pin: true);
            var memory = session.Memory;
            Console.Error.WriteLine($"[session memory: {memory.KvBytes / 1024} KiB KV + {memory.ScratchBytes / 1024} KiB scratch, fixed]");
            Console.CancelKeyPress += (_, e) => { e.Cancel = true; session.Cancel(); };
            // The model must not write the user's next turn: stop where it would begin one.
            var reply = new GenerateParams { MaxTokens = 96, StopStrings = new[] { "\nUser:" } };
            for (string line; (line = Console.ReadLine()) != null;)
            {
                Console.Write("Assistant:");
                try
                {
                    foreach (string piece in session.Stream($"User: {line}\nAssistant:", reply)) Console.Write(piece);
                }
                catch (H2oException e) when (e.Status == Status.Cancelled)
                {
                    Console.Write(" [cancelled]");
                }
                Console.WriteLine();
                session.AddText("\n"); // the next turn starts on a line of its own
            }
        }
        return 0;
    }
}

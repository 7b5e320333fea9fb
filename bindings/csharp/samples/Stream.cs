// Streams a story piece by piece: mono Stream.exe [MODEL.gguf] [PROMPT]
using System;
using H2o;

static class StreamSample
{
    static int Main(string[] args)
    {
        string path = args.Length > 0 ? args[0] : Environment.GetEnvironmentVariable("H2O_MODEL") ?? "../shared/models/stories260K.gguf";
        string prompt = args.Length > 1 ? args[1] : "Once upon a time";
        try
        {
            using (var model = Model.Load(path))
            using (var session = new Session(model))
            {
                Console.Write(prompt);
                foreach (string piece in session.Stream(prompt, new GenerateParams { MaxTokens = 128 }))
                    Console.Write(piece);
                Console.Error.WriteLine($"\n[{session.Stats.NGeneratedTokens} tokens, {session.LastStopReason}]");
            }
            return 0;
        }
        catch (H2oException e)
        {
            Console.Error.WriteLine(e.Message);
            return 1;
        }
    }
}

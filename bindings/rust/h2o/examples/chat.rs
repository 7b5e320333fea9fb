//! A constant-memory assistant: cargo run --example chat -- [MODEL.gguf]
//! Reads one user turn per line from stdin. The KV cache has a fixed budget, the instructions are
//! pinned so eviction never drops them, and position rolling lets the conversation run forever.
use h2o::{GenerateParams, KvPolicy, Model, Session, SessionParams};
use std::io::{BufRead, Write};

const SYSTEM: &str = "You are a friendly storyteller. You answer with short, happy stories.\n";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::var("H2O_MODEL").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../../../shared/models/stories260K.gguf").into()
        })
    });
    let model = Model::load(path)?;
    let params = SessionParams::new().kv_budget(128).kv_policy(KvPolicy::Scissorhands).position_rolling(true);
    let mut session = Session::new(&model, &params)?;
    session.add_text(SYSTEM, true)?;
    let memory = session.memory()?;
    eprintln!(
        "[session memory: {} KiB KV + {} KiB scratch, fixed]",
        memory.kv_bytes / 1024,
        memory.scratch_bytes / 1024
    );

    // The model must not write the user's next turn: stop where it would begin one.
    let reply = GenerateParams::new().max_tokens(96).stop_strings(["\nUser:"]);
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        print!("Assistant:");
        for piece in session.stream(&format!("User: {line}\nAssistant:"), &reply)? {
            print!("{}", piece?);
            std::io::stdout().flush()?;
        }
        println!();
        // End the turn so that the next one starts on a line of its own.
        session.add_text("\n", false)?;
    }
    Ok(())
}

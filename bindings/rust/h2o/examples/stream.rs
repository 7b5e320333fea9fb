//! Streams a story: cargo run --example stream -- [MODEL.gguf] [PROMPT]
use h2o::{GenerateParams, Model, Session, SessionParams};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = Model::load(args.next().unwrap_or_else(default_model))?;
    let prompt = args.next().unwrap_or_else(|| "Once upon a time".into());
    let mut session = Session::new(&model, &SessionParams::new())?;
    print!("{prompt}");
    for piece in session.stream(&prompt, &GenerateParams::new().max_tokens(128))? {
        print!("{}", piece?);
        std::io::stdout().flush()?;
    }
    let stats = session.stats()?;
    eprintln!("\n[{} tokens, {:?}]", stats.n_generated_tokens, stats.stop_reason);
    Ok(())
}

/// $H2O_MODEL, else stories260K in the shared folder beside the checkout.
fn default_model() -> String {
    std::env::var("H2O_MODEL")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../../../shared/models/stories260K.gguf").into())
}

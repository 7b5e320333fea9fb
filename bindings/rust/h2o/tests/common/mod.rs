//! The test model: stories260K from $H2O_SHARED_DIR, else ../shared beside the checkout.
use std::path::PathBuf;

pub fn model_path() -> Option<PathBuf> {
    let shared = std::env::var_os("H2O_SHARED_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared"));
    let path = shared.join("models/stories260K.gguf");
    if path.exists() {
        Some(path)
    } else {
        println!(
            "H2O-SKIP: {} not found. Put the shared data folder beside the checkout (../shared) \
                  or set H2O_SHARED_DIR to it.",
            path.display()
        );
        None
    }
}

/// The model, or return from the test (after the skip notice) when it is absent.
#[macro_export]
macro_rules! model_or_skip {
    () => {
        match common::model_path() {
            Some(p) => h2o::Model::load(p).expect("loading stories260K"),
            None => return,
        }
    };
}

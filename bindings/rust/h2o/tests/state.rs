//! Session state against stories260K: snapshots to a file and to bytes resume exactly, a fork
//! continues like its source, damaged snapshots are refused with the library's status and
//! message, and the model's prefix cache serves a second session's pinned prompt.
mod common;

use h2o::{GenerateParams, Model, ModelLoader, Session, SessionParams, Status};
use std::path::PathBuf;

const PROMPT: &str = "Once upon a time";
const SYSTEM: &str =
    "You are a storyteller. You tell short and happy stories about a little girl, her dog and the sun.";

fn text_of(session: &mut Session, prompt: &str, params: &GenerateParams) -> String {
    let mut text = String::new();
    session
        .generate(prompt, params, |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    text
}

/// A file in the temporary folder, unique to this process and test, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("h2o-rust-{}-{name}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Generates, snapshots the session three ways (file, bytes, fork), then checks that each copy
/// continues exactly as the original does.
fn check_resume(model: &Model, session_params: &SessionParams, params: &GenerateParams, file: &str) {
    let mut original = Session::new(model, session_params).unwrap();
    let first = text_of(&mut original, PROMPT, params);
    assert!(!first.is_empty());

    let file = TempFile::new(file);
    original.save(&file.0).unwrap();
    let bytes = original.to_bytes().unwrap();
    let mut forked = original.fork().unwrap();
    let mut from_file = Session::load(model, &file.0, &SessionParams::new()).unwrap();
    let mut from_bytes = Session::from_bytes(model, &bytes, &SessionParams::new()).unwrap();

    let expected = text_of(&mut original, " Then", params);
    assert!(expected.len() > 20, "too little text: {expected:?}");
    assert_eq!(text_of(&mut from_file, " Then", params), expected, "loaded from {}", file.0.display());
    assert_eq!(text_of(&mut from_bytes, " Then", params), expected, "loaded from bytes");
    assert_eq!(text_of(&mut forked, " Then", params), expected, "forked");
    assert_eq!(from_file.stats().unwrap().n_past, original.stats().unwrap().n_past);
}

#[test]
fn a_saved_session_continues_like_the_original_greedy() {
    let model = model_or_skip!();
    check_resume(&model, &SessionParams::new(), &GenerateParams::new().greedy().max_tokens(24), "greedy.state");
}

#[test]
fn a_saved_session_continues_like_the_original_seeded() {
    let model = model_or_skip!();
    let params = GenerateParams::new().temperature(1.0).top_k(0).top_p(1.0).min_p(0.0).max_tokens(24);
    // Sampling draws from the saved generator: a copy with a fresh generator would differ.
    let session_params = SessionParams::new().seed(1234).kv_budget(48).position_rolling(true);
    check_resume(&model, &session_params, &params, "seeded.state");
}

#[test]
fn the_fork_keeps_the_model_alive() {
    let model = model_or_skip!();
    let params = GenerateParams::new().greedy().max_tokens(16);
    let mut source = Session::new(&model, &SessionParams::new()).unwrap();
    source.add_text(SYSTEM, true).unwrap();
    let mut fork = source.fork().unwrap();
    let expected = text_of(&mut source, PROMPT, &params);
    drop(source);
    drop(model);
    assert_eq!(text_of(&mut fork, PROMPT, &params), expected);
}

#[test]
fn a_damaged_snapshot_is_a_state_format_error_with_the_library_message() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    text_of(&mut session, PROMPT, &GenerateParams::new().greedy().max_tokens(8));
    let bytes = session.to_bytes().unwrap();

    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    let truncated = &bytes[..bytes.len() - 7];
    for (what, damaged) in [("flipped", &flipped[..]), ("truncated", truncated)] {
        let err = Session::from_bytes(&model, damaged, &SessionParams::new()).err().expect(what);
        assert_eq!(err.status(), Some(Status::StateFormat), "{what}: {err}");
        assert_eq!(err.status().unwrap().code(), 13);
        assert!(err.message().contains("snapshot"), "{what}: {}", err.message());

        let file = TempFile::new(&format!("{what}.state"));
        std::fs::write(&file.0, damaged).unwrap();
        let err = Session::load(&model, &file.0, &SessionParams::new()).err().expect(what);
        assert_eq!(err.status(), Some(Status::StateFormat), "{what}: {err}");
        assert!(err.message().contains(file.0.to_str().unwrap()), "{what}: {}", err.message());
    }
    // The original bytes still load: the damage, not the reading, was refused.
    Session::from_bytes(&model, &bytes, &SessionParams::new()).unwrap();
}

#[test]
fn a_missing_snapshot_file_is_an_io_error_naming_the_path() {
    let model = model_or_skip!();
    let err = Session::load(&model, "/nonexistent/dir/session.state", &SessionParams::new()).err().unwrap();
    assert_eq!(err.status(), Some(Status::Io));
    assert!(err.message().contains("/nonexistent/dir/session.state"), "message: {}", err.message());
    let session = Session::new(&model, &SessionParams::new()).unwrap();
    let err = session.save("/nonexistent/dir/session.state").unwrap_err();
    assert_eq!(err.status(), Some(Status::Io));
    assert!(err.message().contains("/nonexistent/dir/session.state"), "message: {}", err.message());
}

#[test]
fn the_prefix_cache_serves_the_second_session_the_same_text() {
    let path = match common::model_path() {
        Some(path) => path,
        None => return,
    };
    let cap = 16 << 20;
    let params = GenerateParams::new().greedy().max_tokens(24);
    let mut texts = Vec::new();
    for policy in [h2o::CachePolicy::Reuse, h2o::CachePolicy::Lru] {
        let model = ModelLoader::new(&path).prefix_cache_bytes(cap).prefix_cache_policy(policy).load().unwrap();
        assert!(model.tokenize(SYSTEM, true).unwrap().len() >= 16);
        for _ in 0..2 {
            let mut session = Session::new(&model, &SessionParams::new()).unwrap();
            session.add_text(SYSTEM, true).unwrap();
            texts.push(text_of(&mut session, PROMPT, &params));
        }
        let stats = model.prefix_cache_stats();
        assert_eq!((stats.hits, stats.misses, stats.entries), (1, 1, 1), "{policy:?} {stats:?}");
        assert!(stats.bytes > 0 && stats.bytes <= cap, "{stats:?}");
    }
    assert!(texts.iter().all(|t| *t == texts[0]), "{texts:?}");

    // The same text as a model without a cache, whose statistics stay empty.
    let plain = Model::load(&path).unwrap();
    let mut session = Session::new(&plain, &SessionParams::new()).unwrap();
    session.add_text(SYSTEM, true).unwrap();
    assert_eq!(text_of(&mut session, PROMPT, &params), texts[0]);
    assert_eq!(plain.prefix_cache_stats(), h2o::PrefixCacheStats { entries: 0, bytes: 0, hits: 0, misses: 0 });
}

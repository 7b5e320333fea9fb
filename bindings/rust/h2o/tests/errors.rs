//! Bad input gives an h2o::Error with the library's status and message, never a crash.
mod common;

use h2o::{GenerateParams, KvPolicy, Model, ModelLoader, Session, SessionParams, Status};

#[test]
fn missing_model_file_is_an_io_error_naming_the_path() {
    let err = Model::load("/nonexistent/dir/model.gguf").err().expect("loading a missing file must fail");
    assert_eq!(err.status(), Some(Status::Io));
    assert!(err.message().contains("/nonexistent/dir/model.gguf"), "message: {}", err.message());
    assert_eq!(err.to_string(), format!("h2o: i/o error: {}", err.message()));
}

#[test]
fn a_directory_or_a_nul_in_the_path_is_refused() {
    assert_eq!(Model::load("/tmp").err().unwrap().status(), Some(Status::Io));
    let err = Model::load("bad\0path").err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(err.message().contains("NUL"));
}

#[test]
fn unknown_names_are_invalid_arguments_and_names_round_trip() {
    let err = "no_such_policy".parse::<KvPolicy>().unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(!err.message().is_empty());
    for raw in 0.. {
        let policy = KvPolicy::from_raw(raw);
        let name = match policy.name() {
            Some(name) => name,
            None => break,
        };
        assert_eq!(name.parse::<KvPolicy>().unwrap(), policy);
        assert!(!matches!(policy, KvPolicy::Other(_)), "the library knows a policy ({name}) this crate does not");
    }
    assert_eq!("sink_window".parse::<KvPolicy>().unwrap(), KvPolicy::SinkWindow);
    assert_eq!("k8v4".parse::<h2o::KvType>().unwrap(), h2o::KvType::K8V4);
    assert_eq!(h2o::Backend::Cpu.to_string(), "cpu");
    assert_eq!(KvPolicy::Other(1000).name(), None);
}

#[test]
fn status_codes_map_both_ways_and_unknown_codes_are_kept() {
    for code in 1..=14 {
        let status = Status::from_code(code);
        assert!(!matches!(status, Status::Other(_)));
        assert_eq!(status.code(), code);
    }
    assert_eq!(Status::from_code(77), Status::Other(77));
    assert_eq!(Status::Other(77).code(), 77);
    assert_eq!(Status::Other(77).name(), "unknown status");
    assert_eq!(Status::InvalidArgument.name(), "invalid argument");
}

#[test]
fn invalid_session_parameters_are_refused_with_the_library_message() {
    let model = model_or_skip!();
    let err = Session::new(&model, &SessionParams::new().n_ctx(1)).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(err.message().contains("n_ctx"), "message: {}", err.message());

    let err = Session::new(&model, &SessionParams::new().kv_policy(KvPolicy::Other(99))).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument));

    let err = Session::new(&model, &SessionParams::new().max_memory_bytes(1)).err().unwrap();
    assert_eq!(err.status(), Some(Status::OutOfMemory));
    assert!(!err.message().is_empty());
}

#[test]
fn invalid_generation_parameters_are_refused_and_the_session_stays_usable() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    let err = session.generate("Hi", &GenerateParams::new().max_tokens(0), |_| true).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(err.message().contains("max_tokens"), "message: {}", err.message());
    let err = session.stream("Hi", &GenerateParams::new().stop_strings([""])).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    let err = session.stream("Hi", &GenerateParams::new().stop_strings(["a\0b"])).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument));

    let mut text = String::new();
    session
        .generate("Once upon a time", &GenerateParams::new().greedy().max_tokens(8), |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    assert!(!text.is_empty());
}

#[test]
fn pinning_more_than_the_budget_and_ids_outside_the_vocabulary_are_refused() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new().kv_budget(8).position_rolling(true)).unwrap();
    let err = session.add_text(&"Once upon a time there was a cat. ".repeat(4), true).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    let err = session.decode(&[model.info().n_vocab as i32]).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(model.detokenize(&[-1]).is_err());
}

#[test]
fn a_full_cache_without_eviction_is_context_full() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new().n_ctx(16).kv_policy(KvPolicy::Full)).unwrap();
    let params = GenerateParams::new().greedy().max_tokens(64).stop_at_eos(false);
    let err = session.generate("Once upon a time", &params, |_| true).unwrap_err();
    assert_eq!(err.status(), Some(Status::ContextFull));
}

#[test]
fn loading_cancelled_by_the_progress_callback() {
    let path = match common::model_path() {
        Some(path) => path,
        None => return,
    };
    let mut calls = 0;
    let err = ModelLoader::new(&path)
        .progress(|_| {
            calls += 1;
            false
        })
        .load()
        .err()
        .unwrap();
    assert_eq!(err.status(), Some(Status::Cancelled));
    assert_eq!(calls, 1);
}

#[test]
fn a_panic_in_the_progress_callback_cancels_the_load_and_is_returned() {
    let path = match common::model_path() {
        Some(path) => path,
        None => return,
    };
    let err = ModelLoader::new(&path).progress(|_| panic!("progress panic")).load().err().unwrap();
    assert_eq!(err, h2o::Error::CallbackPanicked { message: "progress panic".into() });
    assert_eq!(err.status(), None);
}

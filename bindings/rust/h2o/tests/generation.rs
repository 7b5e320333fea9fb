//! Generation through the safe API against stories260K: determinism, callback and iterator
//! parity, stop reasons, panics in callbacks, cancellation and model lifetime.
mod common;

use h2o::{Error, GenerateParams, Model, Session, SessionParams, Status, StopReason};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

const PROMPT: &str = "Once upon a time";

fn greedy(n: u32) -> GenerateParams {
    GenerateParams::new().greedy().max_tokens(n)
}

fn collect(session: &mut Session, prompt: &str, params: &GenerateParams) -> (String, StopReason) {
    let mut text = String::new();
    let reason = session
        .generate(prompt, params, |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    (text, reason)
}

#[allow(dead_code)]
fn assert_thread_traits() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send_sync::<h2o::CancelHandle>();
    send::<Session>();
}

#[test]
fn greedy_generation_is_deterministic_and_the_iterator_gives_the_same_text() {
    let model = model_or_skip!();
    let (first, reason) = collect(&mut Session::new(&model, &SessionParams::new()).unwrap(), PROMPT, &greedy(32));
    let (second, _) = collect(&mut Session::new(&model, &SessionParams::new()).unwrap(), PROMPT, &greedy(32));
    assert!(first.len() > 20, "too little text: {first:?}");
    assert_eq!(first, second);
    assert_eq!(reason, StopReason::MaxTokens);

    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    let pieces: Vec<String> = {
        let mut stream = session.stream(PROMPT, &greedy(32)).unwrap();
        let pieces = stream.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(stream.stop_reason(), StopReason::MaxTokens);
        assert!(stream.next().is_none(), "a finished stream stays finished");
        pieces
    };
    assert!(pieces.len() > 1);
    assert_eq!(pieces.concat(), first);
    let stats = session.stats().unwrap();
    assert_eq!(stats.n_generated_tokens, 32);
    // The last sampled token is not yet processed: it enters with the next call.
    assert!(stats.n_past >= 31 + stats.n_prompt_tokens as u64, "{stats:?}");
}

#[test]
fn set_seed_samples_as_a_session_made_with_that_seed() {
    let model = model_or_skip!();
    let sampled = GenerateParams::new().temperature(1.0).max_tokens(24);
    let (expected, _) = collect(&mut Session::new(&model, &SessionParams::new().seed(99)).unwrap(), PROMPT, &sampled);
    let mut session = Session::new(&model, &SessionParams::new().seed(7)).unwrap();
    session.set_seed(99).unwrap();
    assert_eq!(collect(&mut session, PROMPT, &sampled).0, expected);
}

#[test]
fn stop_strings_and_the_callback_stop_generation() {
    let model = model_or_skip!();
    let (reference, _) = collect(&mut Session::new(&model, &SessionParams::new()).unwrap(), PROMPT, &greedy(32));
    // The third word of the greedy text as a stop string: the text ends right before it.
    let word = reference.split_whitespace().nth(2).unwrap().to_owned();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    let (text, reason) = collect(&mut session, PROMPT, &greedy(32).stop_strings([word.clone()]));
    assert_eq!(reason, StopReason::StopString);
    assert_eq!(text, reference[..reference.find(&word).unwrap()]);

    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    let mut calls = 0;
    let reason = session
        .generate(PROMPT, &greedy(32), |_| {
            calls += 1;
            calls < 3
        })
        .unwrap();
    assert_eq!((reason, calls), (StopReason::Callback, 3));
}

#[test]
fn a_panic_in_the_callback_becomes_an_error_and_the_session_stays_usable() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    let mut calls = 0;
    let err = session
        .generate(PROMPT, &greedy(16), |_| {
            calls += 1;
            panic!("boom in callback")
        })
        .unwrap_err();
    assert_eq!(err, Error::CallbackPanicked { message: "boom in callback".into() });
    assert_eq!(calls, 1, "no call after the panic");
    assert_eq!(session.stats().unwrap().stop_reason, StopReason::Callback);
    let (more, _) = collect(&mut session, " The end.", &greedy(4));
    assert!(!more.is_empty());
}

#[test]
fn cancel_from_the_callback_and_from_another_thread() {
    let model = model_or_skip!();
    let params = SessionParams::new().kv_budget(64).position_rolling(true);
    let mut session = Session::new(&model, &params).unwrap();
    let handle = session.cancel_handle();
    let mut calls = 0;
    let err = session
        .generate(PROMPT, &greedy(1000), |_| {
            calls += 1;
            handle.cancel();
            true
        })
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::Cancelled));
    assert!(calls <= 2, "cancel takes effect at the next token, got {calls} pieces");

    // Another thread cancels until the generation (which would run for a million tokens) ends.
    // One cancel is not enough: h2o_generate_next clears a cancel that arrived after the previous
    // call's last check, so only a cancel landing inside a call's checked window takes effect.
    let handle = session.cancel_handle();
    let done = Arc::new(AtomicBool::new(false));
    let canceller = {
        let done = Arc::clone(&done);
        thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                handle.cancel();
                thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    // The cancel may land while the prompt is processed (in stream) or during generation.
    let result = session.stream(" Then", &greedy(1_000_000)).and_then(|s| s.collect::<Result<Vec<_>, _>>());
    done.store(true, Ordering::Relaxed);
    canceller.join().unwrap();
    assert_eq!(result.unwrap_err().status(), Some(Status::Cancelled));

    // A handle outliving its session cancels nothing and does not crash.
    let handle = session.cancel_handle();
    drop(session);
    handle.cancel();
}

#[test]
fn sessions_keep_the_model_alive_and_share_it_across_threads() {
    let model = Arc::new(model_or_skip!());
    let (expected, _) = collect(&mut Session::new(&model, &SessionParams::new()).unwrap(), PROMPT, &greedy(16));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let model = Arc::clone(&model);
            thread::spawn(move || {
                collect(&mut Session::new(&model, &SessionParams::new()).unwrap(), PROMPT, &greedy(16)).0
            })
        })
        .collect();
    for w in workers {
        assert_eq!(w.join().unwrap(), expected);
    }

    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    drop(model); // the last Rust reference: the session still holds the library's model
    assert_eq!(collect(&mut session, PROMPT, &greedy(16)).0, expected);
}

#[test]
fn constant_memory_session_reports_its_layout_and_memory() {
    let model = model_or_skip!();
    let params = SessionParams::new()
        .kv_budget(32)
        .kv_policy(h2o::KvPolicy::H2o)
        .position_rolling(true)
        .kv_type(h2o::KvType::Q8)
        .kv_horizon(48)
        .experimental("kv_layer_slope", 0.5)
        .unwrap();
    let mut session = Session::new(&model, &params).unwrap();
    let layout = session.kv_layout().unwrap();
    assert_eq!((layout.budget, layout.policy, layout.kv_type), (32, h2o::KvPolicy::H2o, h2o::KvType::Q8));
    assert!(layout.position_rolling);
    assert_eq!(layout.horizon, 48);
    // stories260K's 5 layers get 16, 24, 32, 40 and 48 slots.
    assert_eq!((layout.min_layer_budget, layout.max_layer_budget), (16, 48));
    assert_eq!(session.experimental("kv_layer_slope").unwrap(), 0.5);
    let memory = session.memory().unwrap();
    assert!(memory.kv_bytes > 0 && memory.weight_bytes > 0);
    session.add_text("You are a storyteller.", true).unwrap();
    // Far more tokens than the budget: eviction and rolling keep the session going.
    let (text, reason) = collect(&mut session, PROMPT, &greedy(200).stop_at_eos(false));
    assert_eq!(reason, StopReason::MaxTokens);
    assert!(text.len() > 200);
    assert_eq!(session.memory().unwrap(), memory);
    assert_eq!(session.backend().unwrap().kind, h2o::Backend::Cpu);
}

#[test]
fn prompt_proxy_eviction_reads_a_prompt_longer_than_the_budget() {
    let model = model_or_skip!();
    // Batches of 8: each after the first ranks its victims by the previous batch's last queries.
    let params = SessionParams::new()
        .kv_budget(32)
        .kv_policy(h2o::KvPolicy::H2o)
        .batch(8)
        .seed(7)
        .experimental("kv_prompt_proxy", 16.0)
        .and_then(|p| p.experimental("kv_prompt_random_share", 0.25))
        .unwrap();
    let prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park \
                  with her friends. One day, she saw a big red ball under a tree and ran to get it.";
    let n_prompt = model.tokenize(prompt, true).unwrap().len();
    assert!(n_prompt > 32, "the prompt has {n_prompt} tokens");
    let mut texts = Vec::new();
    for _ in 0..2 {
        let mut session = Session::new(&model, &params).unwrap();
        let (text, reason) = collect(&mut session, prompt, &greedy(32).stop_at_eos(false));
        assert_eq!(reason, StopReason::MaxTokens);
        assert!(!text.is_empty());
        let resolved = (session.experimental("kv_prompt_proxy").unwrap(), session.experimental("kv_prompt_random_share").unwrap());
        assert_eq!(resolved, (16.0, 0.25));
        let stats = session.stats().unwrap();
        assert!(stats.n_prompt_tokens as usize >= n_prompt - 1, "{stats:?}");
        assert_eq!(stats.n_generated_tokens, 32);
        texts.push(text);
    }
    // The random factors come from the seed.
    assert_eq!(texts[0], texts[1]);

    // A policy that gathers no statistics has nothing to rank by proxy attention.
    let window =
        SessionParams::new().kv_budget(32).kv_policy(h2o::KvPolicy::Window).experimental("kv_prompt_proxy", 16.0).unwrap();
    let err = Session::new(&model, &window).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(err.message().contains("kv_prompt_proxy"), "message: {}", err.message());
    // Values outside a research setting's range are refused when set; unknown names too.
    for (name, bad) in [("kv_prompt_proxy", 4097.0), ("kv_prompt_random_share", 1.5), ("kv_prompt_proxy", 2.5)] {
        let err = params.experimental(name, bad).err().unwrap();
        assert_eq!(err.status(), Some(Status::InvalidArgument), "{}", err.message());
        assert!(err.message().contains(name), "message: {}", err.message());
    }
    let err = params.experimental("no_such_setting", 1.0).err().unwrap();
    assert!(err.message().contains("kv_head_share"), "the known names are listed: {}", err.message());
    assert!(h2o::experimental_names().iter().any(|n| n == "kv_sinks_every_policy"));
    // The bounds are the library's: their ends are accepted, just past them is not.
    for name in h2o::experimental_names() {
        let (min, max) = h2o::experimental_bounds(&name).unwrap();
        assert!(min <= max, "{}", name);
        assert!(SessionParams::new().experimental(&name, max).is_ok(), "{} {}", name, max);
        assert!(SessionParams::new().experimental(&name, max + 1.0).is_err(), "{} {}", name, max + 1.0);
    }
    assert_eq!(h2o::experimental_bounds("kv_prompt_proxy").unwrap(), (0.0, 4096.0));
    assert!(h2o::experimental_bounds("no_such_setting").is_err());
    assert_eq!(params.get_experimental("kv_prompt_proxy").unwrap(), 16.0);
}

#[test]
fn head_budgets_read_a_prompt_longer_than_the_budget() {
    let model = model_or_skip!();
    // 80% of each layer's 32 slots move between its kv heads by their attention.
    let params = SessionParams::new()
        .kv_budget(32)
        .kv_policy(h2o::KvPolicy::Scissorhands)
        .experimental("kv_head_share", 0.8)
        .unwrap();
    let prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park \
                  with her friends. One day, she saw a big red ball under a tree and ran to get it.";
    let n_prompt = model.tokenize(prompt, true).unwrap().len();
    assert!(n_prompt >= 60, "the prompt has {n_prompt} tokens");
    // With stream positions and with rolling ones (each head's ranks among its own tokens), within
    // each layer and across layers.
    for (rolling, across_layers) in [(false, false), (true, false), (false, true), (true, true)] {
        let params = params.position_rolling(rolling).experimental("kv_share_across_layers", across_layers as u8 as f64).unwrap();
        let mut texts = Vec::new();
        for _ in 0..2 {
            let mut session = Session::new(&model, &params).unwrap();
            session.add_text(prompt, false).unwrap();
            let layout = session.kv_layout().unwrap();
            // Each kv head keeps at least 32 - floor(0.8 * 32) = 7 slots.
            assert_eq!((layout.budget, layout.min_head_budget), (32, 7));
            assert_eq!(session.experimental("kv_head_share").unwrap(), 0.8f32 as f64);
            assert_eq!(session.experimental("kv_share_across_layers").unwrap() != 0.0, across_layers);
            let (text, reason) = collect(&mut session, " Then", &greedy(48).stop_at_eos(false));
            assert_eq!(reason, StopReason::MaxTokens);
            assert!(text.len() > 20, "too little text: {text:?}");
            let stats = session.stats().unwrap();
            assert!(stats.n_past as usize >= n_prompt + 47, "{stats:?}");
            assert_eq!(stats.n_generated_tokens, 48);
            texts.push(text);
        }
        // Generation from the same state gives the same text.
        assert_eq!(texts[0], texts[1], "rolling: {rolling}, across layers: {across_layers}");
    }

    // Out of range and a policy that gathers no statistics are refused.
    let err = params.experimental("kv_head_share", 0.95).err().unwrap();
    assert!(err.message().contains("kv_head_share"), "message: {}", err.message());
    let window = SessionParams::new().kv_budget(32).kv_policy(h2o::KvPolicy::Window).experimental("kv_head_share", 0.5).unwrap();
    let err = Session::new(&model, &window).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument), "{}", err.message());
    assert!(err.message().contains("kv_head_share"), "message: {}", err.message());
    assert!(!h2o::KvPolicy::Window.info().unwrap().gathers_statistics);
    assert!(h2o::KvPolicy::Scissorhands.info().unwrap().gathers_statistics);
    // Across layers without a head share has no slots to move.
    let across = SessionParams::new().kv_budget(32).experimental("kv_share_across_layers", 1.0).unwrap();
    let err = Session::new(&model, &across).err().unwrap();
    assert_eq!(err.status(), Some(Status::InvalidArgument), "{}", err.message());
    assert!(err.message().contains("kv_share_across_layers"), "message: {}", err.message());
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let model = model_or_skip!();
    let info = model.info();
    let tokens = model.tokenize(PROMPT, true).unwrap();
    assert_eq!(Some(tokens[0]), info.bos_token);
    assert_eq!(model.detokenize(&tokens).unwrap(), PROMPT);
    assert!(model.tokenize("", false).unwrap().is_empty());
    assert!(h2o::version_matches(), "library {} is not ABI 0.5", h2o::version());
}

#[test]
fn decode_gives_logits_for_the_vocabulary() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    session.decode(&model.tokenize(PROMPT, true).unwrap()).unwrap();
    let logits = session.logits().unwrap();
    assert_eq!(logits.len(), model.info().n_vocab as usize);
    assert!(logits.iter().all(|l| l.is_finite()));
}

#[test]
fn the_default_session_never_runs_out_and_says_when_it_began_to_evict() {
    let model = model_or_skip!();
    let params = SessionParams::new().n_ctx(128).threads(1).backend(h2o::Backend::Cpu);
    let mut session = Session::new(&model, &params).unwrap();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    session.set_event_callback(Some(move |event, usage: h2o::KvUsage| seen.lock().unwrap().push((event, usage)))).unwrap();
    collect(&mut session, PROMPT, &greedy(400).stop_at_eos(false));
    let usage = session.kv_usage().unwrap();
    assert_eq!(usage.capacity, 128);
    assert!(usage.n_past > 400, "{usage:?}");
    assert_eq!(usage.n_evicted, usage.n_past - 128);
    assert_eq!(usage.evicting_since, 128);
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, h2o::SessionEvent::KvFull);
    assert!(events[0].1.n_past <= 128);
    // A panic in the handler comes out of the call that raised the event.
    session.reset().unwrap();
    session.set_event_callback(Some(|_: h2o::SessionEvent, _: h2o::KvUsage| panic!("from the handler"))).unwrap();
    let failed = session.generate(PROMPT, &greedy(200).stop_at_eos(false), |_| true);
    assert!(matches!(failed, Err(Error::CallbackPanicked { .. })), "{failed:?}");
    session.set_event_callback(None::<fn(h2o::SessionEvent, h2o::KvUsage)>).unwrap();

    // The old contract on request.
    let old = SessionParams::new().n_ctx(64).threads(1).kv_overflow(h2o::KvOverflow::Error);
    let mut session = Session::new(&model, &old).unwrap();
    let full = session.generate(PROMPT, &greedy(100).stop_at_eos(false), |_| true);
    assert_eq!(full.unwrap_err().status(), Some(Status::ContextFull));
}

#[test]
fn a_grammar_and_a_schema_shape_the_reply_and_logit_bias_forces_a_token() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    let (text, reason) = collect(&mut session, "Once", &greedy(60).grammar(r#"root ::= " upon a " [a-z]+ ".""#));
    assert!(text.starts_with(" upon a ") && text.ends_with('.'), "{text}");
    assert_eq!(reason, StopReason::Grammar);
    let schema = r#"{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}"#;
    for seed in 1..4 {
        session.reset().unwrap();
        session.set_seed(seed).unwrap();
        let (json, _) = collect(&mut session, "Lily", &GenerateParams::new().temperature(1.0).json_schema(schema));
        let compact: String = json.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(compact == r#"{"ok":true}"# || compact == r#"{"ok":false}"#, "{json}");
    }
    assert!(h2o::json_schema_to_grammar(schema).unwrap().starts_with("root ::= "));
    assert!(h2o::json_schema_to_grammar(r#"{"pattern": "x"}"#).is_err());
    session.reset().unwrap();
    let bad = session.generate("x", &GenerateParams::new().grammar("root ::= [a-"), |_| true);
    assert_eq!(bad.unwrap_err().status(), Some(Status::InvalidArgument));
    let token = *model.tokenize(" cat", false).unwrap().last().unwrap();
    let piece = model.detokenize(&[token]).unwrap();
    session.reset().unwrap();
    let (forced, _) = collect(&mut session, "Once", &greedy(3).logit_bias([(token, 100.0)]));
    assert_eq!(forced.replace(' ', ""), piece.trim().repeat(3));
}

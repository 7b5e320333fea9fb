//! Retention spans through the safe API against stories260K: a span keeps its minimum in every
//! (layer, kv head), refused calls are invalid arguments that change nothing, and spans travel
//! with snapshots and forks and end with reset. The eviction rule itself is the C suite's
//! (tests/session/test_retention_spans.cpp); these check that the binding passes it through.
mod common;

use h2o::{GenerateParams, KvPolicy, Session, SessionParams, Status};

const INSTRUCTION: &str = "Always rhyme. Pip is a blue bird.";
const STORY: &str = "Once upon a time there was a little girl named Lily. She liked to play in the park with \
                     her dog. One day they found a big red ball under a tree. Lily threw the ball and the dog \
                     ran after it. They played all day until the sun went down, and then they went home to eat \
                     soup.";

const PIN: &str = " One day they found a big red ball under a tree.";

/// A budget of 32 slots: a share of 0.25 is 8 tokens, and the story passes through it twice.
fn span_params(policy: KvPolicy) -> SessionParams {
    SessionParams::new().threads(1).kv_budget(32).n_ctx(512).batch(16).kv_policy(policy).position_rolling(true).seed(99)
}

fn greedy(session: &mut Session, prompt: &str, n: u32) -> String {
    let mut text = String::new();
    let params = GenerateParams::new().greedy().max_tokens(n).stop_at_eos(false);
    session
        .generate(prompt, &params, |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    text
}

#[test]
fn a_span_keeps_its_minimum_in_every_cell_after_several_budgets_of_text() {
    let model = model_or_skip!();
    for policy in [KvPolicy::Scissorhands, KvPolicy::Window] {
        for share in [0.0f32, 0.25] {
            let what = format!("{policy:?}, share {share}");
            let mut session = Session::new(&model, &span_params(policy)).unwrap();
            session.add_span_text(7, share, INSTRUCTION, false).unwrap();
            let before = session.span_info(7).unwrap();
            assert_eq!(
                (before.span_id, before.min_share, before.min_tokens),
                (7, share, (share * 32.0) as i32),
                "{what}"
            );
            assert!(before.n_tokens >= 10, "{what}: {before:?}"); // BOS and the instruction, all held so far
            assert_eq!((i64::from(before.kept_min), i64::from(before.kept_max)), (before.n_tokens, before.n_tokens));

            // Several budgets of other text, a prompt and a generation.
            for _ in 0..3 {
                session.add_text(STORY, false).unwrap();
            }
            greedy(&mut session, " The end.", 40);
            let after = session.span_info(7).unwrap();
            assert_eq!(after.n_tokens, before.n_tokens, "{what}");
            assert!(i64::from(after.kept_max) <= after.n_tokens, "{what}: {after:?}");
            if share > 0.0 {
                assert!(after.kept_min >= 8, "{what}: every (layer, kv head) keeps the minimum: {after:?}");
            }
            match policy {
                // The window evicts the oldest first: the span down to its minimum, or all of it.
                KvPolicy::Window => {
                    assert_eq!(after.kept_max, if share > 0.0 { 8 } else { 0 }, "{what}: {after:?}");
                    assert_eq!(after.attention_share, None, "{what}: the window gathers no statistics");
                }
                _ => {
                    let a = after.attention_share.expect("scissorhands gathers statistics");
                    assert!((0.0..=1.0).contains(&a), "{what}: {after:?}");
                }
            }
        }
    }
}

#[test]
fn refused_span_calls_are_invalid_arguments_and_change_nothing() {
    let model = model_or_skip!();
    let params = span_params(KvPolicy::Scissorhands);
    let mut session = Session::new(&model, &params).unwrap();
    let mut twin = Session::new(&model, &params).unwrap();
    for s in [&mut session, &mut twin] {
        s.add_span_text(1, 0.5, INSTRUCTION, false).unwrap(); // 16 of the 31 reservable slots
    }
    let held = session.span_info(1).unwrap();

    // Minimums and pins beyond kv_budget - 1.
    let err = session.add_span_text(2, 0.5, " More.", false).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument), "{err}");
    assert!(err.message().contains("kv_budget - 1"), "message: {}", err.message());
    let err = session.add_span_text(1, 1.0, " More.", false).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument), "raising the span's own minimum: {err}");
    // A pin that would fit the budget alone, but not beside the span's 16 reserved slots.
    let n = model.tokenize(PIN, false).unwrap().len();
    assert!((16..=28).contains(&n), "{n} tokens");
    let err = session.add_text(PIN, true).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument), "pinning past the minimums: {err}");
    // Bad arguments.
    for (id, share) in [(0, 0.1), (3, 1.5), (3, -0.1), (3, f32::NAN)] {
        let err = session.add_span_text(id, share, "x", false).unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument), "span {id}, share {share}: {err}");
        assert!(!err.message().is_empty());
    }

    // No span was made or changed, and nothing reached the cache: the session continues as its
    // twin, which saw none of the refused calls.
    for id in [2, 3] {
        assert_eq!(session.span_info(id).unwrap_err().status(), Some(Status::InvalidArgument), "span {id}");
    }
    assert_eq!(session.span_info(1).unwrap(), held);
    assert_eq!(greedy(&mut session, " Then", 30), greedy(&mut twin, " Then", 30));
    assert_eq!(session.span_info(1).unwrap(), twin.span_info(1).unwrap());
}

#[test]
fn spans_survive_a_snapshot_and_a_fork_and_end_with_reset() {
    let model = model_or_skip!();
    let mut session = Session::new(&model, &span_params(KvPolicy::Scissorhands)).unwrap();
    session.add_span_text(11, 0.25, INSTRUCTION, false).unwrap();
    session.add_span_text(12, 0.125, " Pip is blue.", true).unwrap();
    session.add_text(STORY, false).unwrap();

    let file = std::env::temp_dir().join(format!("h2o-rust-{}-spans.state", std::process::id()));
    session.save(&file).unwrap();
    let loaded = Session::load(&model, &file, &SessionParams::new());
    let _ = std::fs::remove_file(&file);
    let mut copies = [
        ("loaded", loaded.unwrap()),
        ("from bytes", Session::from_bytes(&model, &session.to_bytes().unwrap(), &SessionParams::new()).unwrap()),
        ("forked", session.fork().unwrap()),
    ];
    for (what, copy) in &copies {
        for id in [11, 12] {
            assert_eq!(copy.span_info(id).unwrap(), session.span_info(id).unwrap(), "{what}, span {id}");
        }
    }

    // The minimums act after loading: the continuations (which evict) are the same, and so is
    // what each span keeps.
    let expected = greedy(&mut session, " Later", 60);
    let kept = session.span_info(11).unwrap();
    assert!(kept.kept_min >= 8, "{kept:?}");
    for (what, copy) in &mut copies {
        assert_eq!(greedy(copy, " Later", 60), expected, "{what}");
        assert_eq!(copy.span_info(11).unwrap(), kept, "{what}");
    }

    session.reset().unwrap();
    assert_eq!(session.span_info(11).unwrap_err().status(), Some(Status::InvalidArgument), "after reset");
    session.add_text(INSTRUCTION, true).unwrap(); // the minimums no longer reserve slots
}

//! Tool calls through the safe API against stories260K: the prompt with tools, a required call
//! generated under its grammar, read back, and the history written again with the call.
mod common;

use h2o::{GenerateParams, Session, SessionParams};

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]"#;

#[test]
fn a_required_call_is_generated_read_back_and_written_again() {
    let model = model_or_skip!();
    let user = r#"[{"role": "user", "content": "Weather in Paris?"}]"#;
    let prompt = model.format_chat_with_tools(user, Some(TOOLS), Some("chatml"), true).unwrap();
    assert!(prompt.contains("<tools>\n{\"type\": \"function\""), "{prompt}");
    let grammar = model.tool_call_grammar(TOOLS, "required", false, Some("chatml")).unwrap();
    let mut session = Session::new(&model, &SessionParams::new()).unwrap();
    session.add_chat_text(&prompt, false).unwrap();
    let mut reply = String::new();
    session
        .generate("", &GenerateParams::new().greedy().max_tokens(300).grammar(grammar), |t| {
            reply.push_str(t);
            true
        })
        .unwrap();
    let parsed = model.parse_tool_calls(&reply, 1, Some("chatml")).unwrap();
    assert!(parsed.starts_with(r#"{"content": null, "tool_calls": [{"id": "call_"#), "{parsed}");
    assert!(parsed.contains(r#""name": "get_weather""#), "{parsed}");
    let id_at = parsed.find("call_").unwrap();
    let id = &parsed[id_at..id_at + 29];
    let arguments = &reply[reply.find("\"arguments\": ").unwrap() + 13..reply.rfind("}\n</tool_call>").unwrap()];
    let escaped = arguments.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    let history = format!(
        r#"[{{"role": "user", "content": "Weather in Paris?"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "{id}",
        "type": "function", "function": {{"name": "get_weather", "arguments": "{escaped}"}}}}]}}, {{"role": "tool", "tool_call_id": "{id}", "content": "sunny"}}]"#
    );
    let written = model.format_chat_with_tools(&history, Some(TOOLS), Some("chatml"), true).unwrap();
    assert!(written.contains(&format!("{reply}<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>")), "{written}");
    assert_eq!(model.parse_tool_calls("Text.", 0, Some("chatml")).unwrap(), r#"{"content": "Text.", "tool_calls": []}"#);
    assert!(model.tool_call_grammar(TOOLS, "nope", true, Some("chatml")).is_err());
}

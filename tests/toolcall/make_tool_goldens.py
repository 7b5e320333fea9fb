#!/usr/bin/env python3
"""Writes the prompts Qwen3's own chat template (../shared/vocab/qwen3/tokenizer_config.json)
makes of conversations with tools, rendered with Jinja2 as Hugging Face's apply_chat_template
does (trim_blocks, lstrip_blocks, its tojson), for test_tool_calls.cpp to compare with.

    python3 tests/toolcall/make_tool_goldens.py ../shared   # Jinja2 3.1
"""
import json
import os
import sys

import jinja2

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time, \"HH:MM\""}},
]
CONVERSATIONS = {
    "qwen3_tools_first_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ],
    "qwen3_tools_after_results": [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
    ],
}


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../shared")
    config = json.load(open(os.path.join(shared, "vocab/qwen3/tokenizer_config.json")))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    template = env.from_string(config["chat_template"])
    out_dir = os.path.join(os.path.dirname(__file__), "goldens")
    for name, messages in CONVERSATIONS.items():
        text = template.render(messages=messages, tools=TOOLS, add_generation_prompt=True)
        with open(os.path.join(out_dir, name + ".txt"), "w") as f:
            f.write(text)
    with open(os.path.join(out_dir, "tools.json"), "w") as f:
        json.dump(TOOLS, f)
    with open(os.path.join(out_dir, "conversations.json"), "w") as f:
        json.dump(CONVERSATIONS, f)


if __name__ == "__main__":
    main()

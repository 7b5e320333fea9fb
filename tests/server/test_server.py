"""End-to-end tests of h2o-server with stories260K, on loopback:

    python3 test_server.py H2O_SERVER MODEL [NODE_MODULES_DIR]

The protocol's shapes (plain and streamed), errors, conversations continued without processing
their history again, restarts (SIGTERM and kill -9), LRU eviction to disk and back, a client that
leaves mid-stream, memory over 1000 turns and 100 conversations, curl, and the official `openai`
npm package when NODE_MODULES_DIR has it (else that test says it is skipped)."""
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from server_harness import Server

SERVER, MODEL = sys.argv[1], sys.argv[2]
NODE_MODULES = sys.argv[3] if len(sys.argv) > 3 else ""
HERE = os.path.dirname(os.path.abspath(__file__))
WORK = tempfile.mkdtemp(prefix="h2o-server-test-")
# The model has no chat template; zephyr's markers are plain text to its vocabulary.
COMMON = ["--chat-format", "zephyr", "--kv-budget", "64"]
SYSTEM = {"role": "system", "content": "You tell short stories."}
TESTS = []


def test(function):
    TESTS.append(function)
    return function


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def server(*args):
    return Server(SERVER, MODEL, *COMMON, *args)


def talk(srv, turns, **fields):
    """Runs a conversation turn by turn as a client does (the whole history each time); returns
    the replies and the last response."""
    messages, replies, response = [SYSTEM], [], None
    for user in turns:
        messages.append({"role": "user", "content": user})
        status, response = srv.chat(messages, **fields)
        check(status == 200, "turn %r: %s %s" % (user, status, response))
        reply = response["choices"][0]["message"]["content"]
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
    return replies, response


TURNS = ["Once upon a time there was a cat.", "What did the cat do?", "And then?", "Tell me the end."]


@test
def protocol_shapes():
    srv = server()
    try:
        status, models = srv.request("GET", "/v1/models")
        check(status == 200 and models["object"] == "list" and models["data"][0]["id"] == "stories260K", models)
        status, body = srv.chat([SYSTEM, {"role": "user", "content": "Hello"}], max_tokens=8)
        check(status == 200, body)
        check(body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-"), body)
        choice = body["choices"][0]
        check(choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str), choice)
        check(choice["finish_reason"] in ("stop", "length"), choice)
        usage = body["usage"]
        check(usage["completion_tokens"] <= 8 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage)
        check(body["conversation_id"].startswith("c-"), body)
        health = srv.health()
        check(health["status"] == "ok" and health["memory"]["bound_bytes"] > 0 and health["sessions"]["max"] == 4, health)
    finally:
        srv.stop()


@test
def streaming_order_and_text():
    srv = server()
    try:
        messages = [SYSTEM, {"role": "user", "content": "Tell me a story."}]
        events = srv.stream(messages, max_tokens=12, stream_options={"include_usage": True})
        check(events[-1] == "[DONE]", events[-1])
        chunks = events[:-1]
        check(all(c["object"] == "chat.completion.chunk" for c in chunks), chunks)
        check(len({c["id"] for c in chunks}) == 1, "one id for the whole stream")
        check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", chunks[0])
        finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        check(len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "length", finish)
        check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12, chunks[-1])
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        # The same request on a fresh server, not streamed, gives the same text (greedy).
        other = server()
        try:
            status, body = other.chat(messages, max_tokens=12)
            check(status == 200 and body["choices"][0]["message"]["content"] == text, (text, body))
        finally:
            other.stop()
    finally:
        srv.stop()


@test
def errors_have_the_openai_shape():
    srv = server("--max-body", "65536")
    try:
        def expect(status, body, code_status, fragment):
            check(status == code_status, "%s, not %s: %s" % (status, code_status, body))
            error = body["error"]
            check(set(error) == {"message", "type", "param", "code"}, error)
            check(fragment in error["message"], "%r not in %r" % (fragment, error["message"]))

        post = lambda raw: srv.request("POST", "/v1/chat/completions", raw=raw)
        expect(*post(b"{not json"), 400, "not valid JSON")
        expect(*post(b'{"model":"stories260K","messages":[{"role":"user","content":"\xff\xfe"}]}'), 400, "not valid JSON")
        expect(*post(b"[" * 100000 + b"]" * 100000), 413, "larger than --max-body")
        expect(*post(b'{"a":' * 40 + b"1" + b"}" * 40), 400, "nests")
        expect(*post(b'{"model":"stories260K","messages":' + b"[" * 50 + b"]" * 50 + b"}"), 400, "nests")
        expect(*post(b"x" * 70000), 413, "larger than --max-body")
        user = {"role": "user", "content": "hi"}
        # One model: a client configured with another name gets it, under its own id.
        status, body = srv.chat([user], model="gpt-4", max_tokens=2)
        check(status == 200 and body["model"] == "stories260K", (status, body))
        check(srv.request("GET", "/v1/models/gpt-4")[1]["id"] == "stories260K", "a model asked by another name")
        expect(*srv.chat([]), 400, "non-empty")
        expect(*srv.chat([{"role": "robot", "content": "x"}]), 400, "role 'robot'")
        expect(*srv.chat([user, {"role": "assistant", "content": "x"}]), 400, "last message")
        expect(*srv.chat([user], temperature=3), 400, "temperature")
        expect(*srv.chat([user], max_tokens=0), 400, "max_tokens")
        expect(*srv.chat([user], stop=["a", "b", "c", "d", "e"]), 400, "stop")
        expect(*srv.chat([user], n=2), 400, "n = 1")
        expect(*srv.chat([user], conversation_id="../etc"), 400, "conversation_id")
        expect(*srv.chat([user], top_p=0), 400, "top_p")
        expect(*srv.request("GET", "/v1/nothing"), 404, "no such endpoint")
        # A system message longer than the budget cannot be pinned.
        expect(*srv.chat([{"role": "system", "content": "word " * 200}, user]), 400, "cannot be pinned")
        # None of that changed anything: the server answers as before.
        check(srv.chat([user])[0] == 200, "the server still answers")
    finally:
        srv.stop()


@test
def model_names_and_aliases():
    """One name (or none given): any model asked for is this one. Two or more --alias names: only
    those, the first being the id."""
    srv = server("--alias", "tiny-stories", "--alias", "stories")
    try:
        user = {"role": "user", "content": "hi"}
        status, body = srv.chat([user], model="stories", max_tokens=2)
        check(status == 200 and body["model"] == "tiny-stories", (status, body))
        status, body = srv.chat([user], model="gpt-4")
        check(status == 404 and "no model 'gpt-4'" in body["error"]["message"] and "'tiny-stories', 'stories'" in body["error"]["message"],
              (status, body))
        check(srv.request("GET", "/v1/models/gpt-4")[0] == 404, "an unknown name with aliases")
        check(srv.request("GET", "/v1/models/stories")[1]["id"] == "tiny-stories", "an alias")
    finally:
        srv.stop()


PET = {"type": "object", "additionalProperties": False, "required": ["age", "happy", "pet"],
       "properties": {"age": {"type": "integer"}, "happy": {"type": "boolean"}, "pet": {"enum": ["cat", "dog"]}}}


@test
def structured_output_and_logit_bias():
    """response_format json_schema: the reply is JSON that satisfies the schema and ends the turn
    (plain and streamed alike); json_object: a JSON object; a schema the library cannot enforce, a
    bad logit_bias: 400 naming the field. logit_bias +100 on one token: only that token."""
    srv = server()
    try:
        user = [SYSTEM, {"role": "user", "content": "Tell me about your pet."}]
        schema_format = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": PET}}
        status, body = srv.chat(user, max_tokens=200, response_format=schema_format)
        check(status == 200 and body["choices"][0]["finish_reason"] == "stop", body)
        reply = json.loads(body["choices"][0]["message"]["content"])
        check(set(reply) == {"age", "happy", "pet"} and isinstance(reply["age"], int) and isinstance(reply["happy"], bool) and
              reply["pet"] in ("cat", "dog"), reply)
        events = srv.stream(user, max_tokens=200, response_format=schema_format)
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1] if c["choices"])
        check(streamed == body["choices"][0]["message"]["content"], (streamed, body))
        status, body = srv.chat(user, max_tokens=200, response_format={"type": "json_object"})
        check(status == 200, body)
        if body["choices"][0]["finish_reason"] == "stop":
            check(isinstance(json.loads(body["choices"][0]["message"]["content"]), dict), body)
        else:  # the reply ran out of tokens inside the object: it is at least one's beginning
            check(body["choices"][0]["message"]["content"].lstrip().startswith("{"), body)

        def refused(status, body, param, fragment):
            check(status == 400 and body["error"]["param"] == param and fragment in body["error"]["message"], (status, body))

        pattern = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "^a+$"}}}
        refused(*srv.chat(user, response_format=pattern), "response_format", "pattern")
        refused(*srv.chat(user, response_format={"type": "xml"}), "response_format.type", "json_schema")
        refused(*srv.chat(user, response_format={"type": "json_schema"}), "response_format.json_schema", "schema")
        refused(*srv.chat(user, logit_bias={"x": 1}), "logit_bias", "token ids")
        refused(*srv.chat(user, logit_bias={"5": 101}), "logit_bias", "-100 to 100")
        refused(*srv.chat(user, logit_bias={"100000": 5}), "logit_bias", "logit_bias")
        # +100 on one ordinary token (of the 512): the reply is that token's text, again and again.
        status, body = srv.chat(user, max_tokens=6, logit_bias={"300": 100})
        text = body["choices"][0]["message"]["content"]
        check(status == 200 and body["usage"]["completion_tokens"] == 6, body)
        piece = next(text[:n] for n in range(1, len(text) + 1) if text[:n] * (len(text) // n) == text)
        check(len(piece) * 6 >= len(text) - 1 and len(piece) < len(text), (piece, text))
        # Banned (-100) with the same +100 elsewhere: the banned token never comes.
        status, body = srv.chat(user, max_tokens=6, logit_bias={"300": -100, "301": 100})
        check(status == 200 and piece not in body["choices"][0]["message"]["content"], (piece, body))
    finally:
        srv.stop()


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


@test
def tool_calls_round_trip():
    """tools with tool_choice required: the reply is a call (finish_reason tool_calls, content
    null, an id, JSON arguments of the schema), plain and streamed alike; sent back with the
    tool's result, the conversation continues from the session (cached tokens), across a restart
    too; tool_choice none answers in text; malformed tools, choices and tool messages are 400s."""
    for chat_format in ("zephyr", "chatml", "llama3"):
        state = os.path.join(WORK, "tools-" + chat_format)
        srv = server("--chat-format", chat_format, "--kv-budget", "1024", "--state-dir", state)
        messages = [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}]
        try:
            status, body = srv.chat(messages, max_tokens=400, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False)
            check(status == 200 and body["choices"][0]["finish_reason"] == "tool_calls", (chat_format, body))
            message = body["choices"][0]["message"]
            check(message["content"] is None and len(message["tool_calls"]) >= 1, message)
            call = message["tool_calls"][0]
            check(call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "get_weather", call)
            arguments = json.loads(call["function"]["arguments"])
            check(arguments["city"] in ("Paris", "Rome") and set(arguments) <= {"city", "unit"}, arguments)
            events = srv.stream(messages, max_tokens=400, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False)
            deltas = [c["choices"][0]["delta"] for c in events[:-1] if c["choices"]]
            streamed = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
            check(not any(d.get("content") for d in deltas), deltas)
            check([(c["index"], c["function"]) for c in streamed] ==
                  [(i, c["function"]) for i, c in enumerate(message["tool_calls"])], (streamed, message))
            check([c for c in events[:-1] if c["choices"]][-1]["choices"][0]["finish_reason"] == "tool_calls", events)
            messages.append({"role": "assistant", "content": None, "tool_calls": message["tool_calls"]})
            for c in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"sky": "clear", "celsius": 21})})
            status, body = srv.chat(messages, max_tokens=12, tools=[WEATHER_TOOL], tool_choice="none")
            check(status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"), body)
            check(isinstance(body["choices"][0]["message"]["content"], str) and "tool_calls" not in body["choices"][0]["message"], body)
            check(body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "continued, not processed again: %s" % body["usage"])
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        finally:
            check(srv.stop() == 0, "exit status after SIGTERM")
        srv = server("--chat-format", chat_format, "--kv-budget", "1024", "--state-dir", state)
        try:
            messages.append({"role": "user", "content": "And in Rome?"})
            status, body = srv.chat(messages, max_tokens=400, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
            check(status == 200 and body["choices"][0]["finish_reason"] == "tool_calls", body)
            check(body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "restored, not processed again: %s" % body["usage"])
        finally:
            srv.stop()

    srv = server("--kv-budget", "1024")  # the tools' description is pinned with the system message
    try:
        user = [SYSTEM, {"role": "user", "content": "Weather?"}]

        def refused(status, body, param, fragment):
            check(status == 400 and body["error"]["param"] == param and fragment in body["error"]["message"], (status, body))

        refused(*srv.chat(user, tool_choice="required"), "tool_choice", "needs tools")
        refused(*srv.chat(user, tools=[WEATHER_TOOL], tool_choice="sometimes"), "tool_choice", "none, auto, required")
        refused(*srv.chat(user, tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools", "name")
        refused(*srv.chat(user, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
                "tool_choice", "nope")
        refused(*srv.chat(user, tools=[WEATHER_TOOL], response_format={"type": "json_object"}), "response_format", "tools")
        refused(*srv.chat(user + [{"role": "tool", "content": "21"}]), "messages[2].tool_call_id", "tool_call_id")
        refused(*srv.chat(user, tools=[WEATHER_TOOL], parallel_tool_calls="yes"), "parallel_tool_calls", "true or false")
        # auto: a call or text, and either way a whole reply.
        status, body = srv.chat(user, max_tokens=60, tools=[WEATHER_TOOL], temperature=1, seed=3)
        check(status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls"), body)
    finally:
        srv.stop()


@test
def help_says_what_the_server_does():
    """The server's own defaults: a 512-slot cache that rolls."""
    out = subprocess.run([SERVER, "--help"], capture_output=True, text=True, check=True).stdout
    check("--kv-budget N          KV slots per layer and kv head (default 512: a fixed cache that evicts" in out, out)
    check("default 0: a full cache" not in out and "run past the model's context length (on by default)" in out, out)


@test
def evictions_are_reported_in_usage_and_health():
    """A conversation longer than its 64 slots goes on; usage says how many of its tokens are
    evicted (an extension field) and /health counts them."""
    srv = server()
    try:
        replies, last = talk(srv, TURNS, max_tokens=48)
        check(last["usage"]["evicted_tokens"] > 0 and last["usage"]["prompt_tokens"] > 64, last["usage"])
        kv = srv.health()["kv_evictions"]
        check(kv["conversations_filled"] == 1 and kv["tokens"] == last["usage"]["evicted_tokens"], (kv, last["usage"]))
        # A fresh conversation has evicted nothing.
        status, body = srv.chat([{"role": "user", "content": "hi"}], max_tokens=2)
        check(status == 200 and body["usage"]["evicted_tokens"] == 0, body)
    finally:
        srv.stop()


@test
def a_million_messages_get_413():
    srv = server()  # the default --max-body, 8 MiB
    try:
        body = b'{"model":"stories260K","messages":[' + b",".join([b'{"role":"user","content":"hi"}'] * 1000000) + b"]}"
        status, response = srv.request("POST", "/v1/chat/completions", raw=body)
        check(status == 413, (status, response))
        check(srv.chat([{"role": "user", "content": "hi"}])[0] == 200, "the server still answers")
    finally:
        srv.stop()


@test
def continued_conversations_process_only_new_messages():
    srv = server()
    try:
        replies, last = talk(srv, TURNS)
        usage = last["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        check(cached > usage["prompt_tokens"] / 2, usage)
        check(srv.health()["sessions"]["conversations"] == 1, srv.health())
        # A fresh server processing the same history at once gives the same last reply (greedy).
        other = server()
        try:
            messages = [SYSTEM]
            for user, reply in zip(TURNS[:-1], replies[:-1]):
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
            messages.append({"role": "user", "content": TURNS[-1]})
            status, body = other.chat(messages)
            check(status == 200 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, body)
            # Each turn's text is tokenized on its own: at a turn's edges the tokens may differ
            # from those of the whole history tokenized at once, by a token or so per turn.
            check(abs(body["usage"]["prompt_tokens"] - usage["prompt_tokens"]) <= len(TURNS), (body["usage"], usage))
        finally:
            other.stop()
    finally:
        srv.stop()


def reference_replies(turns, **fields):
    srv = server("--sessions", "8")
    try:
        return talk(srv, turns, **fields)[0]
    finally:
        srv.stop()


@test
def restart_continues_exactly():
    expected = reference_replies(TURNS)
    for how in (signal.SIGTERM, signal.SIGKILL):
        state = os.path.join(WORK, "restart-%d" % how)
        srv = server("--state-dir", state)
        messages, replies = [SYSTEM], []
        try:
            for user in TURNS[:2]:
                messages.append({"role": "user", "content": user})
                status, body = srv.chat(messages)
                check(status == 200, body)
                replies.append(body["choices"][0]["message"]["content"])
                messages.append({"role": "assistant", "content": replies[-1]})
        finally:
            code = srv.stop(how)
        check(how == signal.SIGKILL or code == 0, "exit status %s after SIGTERM" % code)
        srv = server("--state-dir", state)
        try:
            for user in TURNS[2:]:
                messages.append({"role": "user", "content": user})
                status, body = srv.chat(messages)
                check(status == 200, body)
                check(body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "restored, not processed again: %s" % body["usage"])
                replies.append(body["choices"][0]["message"]["content"])
                messages.append({"role": "assistant", "content": replies[-1]})
            check(srv.health()["sessions"]["restores"] >= 1, srv.health())
        finally:
            srv.stop()
        check(replies == expected, "after %s: %r != %r" % (how, replies, expected))


@test
def conversation_id_extension():
    srv = server("--state-dir", os.path.join(WORK, "ids"))
    try:
        _, first = talk(srv, TURNS[:1], conversation_id="my-chat_1")
        check(first["conversation_id"] == "my-chat_1", first)
        check(os.path.exists(os.path.join(WORK, "ids", "my-chat_1.conv")), "saved under its id")
        replies, last = talk(srv, TURNS[:2], conversation_id="my-chat_1")
        check(last["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, last["usage"])
        # Edited history under the same id: the session starts again, and the answer is right.
        status, body = srv.chat([SYSTEM, {"role": "user", "content": TURNS[3]}], conversation_id="my-chat_1")
        check(status == 200 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, body)
    finally:
        srv.stop()


@test
def lru_eviction_to_disk_and_back():
    conversations = [["Tom had a dog.", "Where did it go?"], ["Sue saw a bird.", "What colour was it?"], ["A boy ran.", "Why?"]]
    expected = [reference_replies(turns) for turns in conversations]
    srv = server("--sessions", "2", "--state-dir", os.path.join(WORK, "lru"))
    try:
        histories = [[SYSTEM] for _ in conversations]
        got = [[] for _ in conversations]
        for turn in range(2):
            for i, turns in enumerate(conversations):
                histories[i].append({"role": "user", "content": turns[turn]})
                status, body = srv.chat(histories[i])
                check(status == 200, body)
                got[i].append(body["choices"][0]["message"]["content"])
                histories[i].append({"role": "assistant", "content": got[i][-1]})
                if turn == 1:
                    check(body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "continued from its snapshot")
        health = srv.health()
        check(health["sessions"]["live"] <= 2 and health["sessions"]["evictions"] >= 3 and health["sessions"]["restores"] >= 2, health)
        check(got == expected, "%r != %r" % (got, expected))
    finally:
        srv.stop()


@test
def a_recorded_trace_replays():
    """--record-trace: a line per request, no text of the conversation in it, and h2o-cache-replay reads it."""
    path = os.path.join(WORK, "trace.jsonl")
    srv = server("--record-trace", path)
    try:
        _, named = talk(srv, TURNS[:2], conversation_id="story-1")
        status, one_shot = srv.chat([SYSTEM, {"role": "user", "content": "Hello there."}])
        check(status == 200, one_shot)
    finally:
        srv.stop()
    with open(path) as f:
        text = f.read()
    lines = [json.loads(line) for line in text.splitlines()]
    check(len(lines) == 3, lines)
    check("cat" not in text and "short stories" not in text and "story-1" not in text, text)
    check(lines[0]["conversation"] == lines[1]["conversation"] != lines[2]["conversation"], lines)
    check(lines[0]["named"] and lines[1]["named"] and not lines[2]["named"], lines)
    check(lines[0]["system"] == lines[2]["system"] and lines[0]["system_tokens"] > 0, lines)
    check(lines[0]["history_tokens"] == 0 < lines[1]["history_tokens"], lines)
    check(lines[1]["reply_tokens"] == named["usage"]["completion_tokens"], (lines, named["usage"]))
    check(lines[0]["t"] <= lines[1]["t"] <= lines[2]["t"], lines)
    replay = os.path.join(os.path.dirname(SERVER), "h2o-cache-replay")
    if os.path.exists(replay):
        result = subprocess.run([replay, path, "--sessions", "2"], capture_output=True, text=True)
        check(result.returncode == 0 and "| trace.jsonl | 2 |" in result.stdout, result.stdout + result.stderr)


@test
def conversations_are_listed_shown_and_deleted():
    state = os.path.join(WORK, "manage")
    srv = server("--state-dir", state)
    thread = None
    try:
        status, empty = srv.request("GET", "/v1/conversations")
        check(status == 200 and empty == {"object": "list", "data": []}, empty)
        talk(srv, ["Once upon a time\nthere was a very long first line about a cat named Tom who lived in a house by the sea."],
             conversation_id="first")
        talk(srv, TURNS[:2], conversation_id="second")
        status, listing = srv.request("GET", "/v1/conversations")
        check(status == 200 and sorted(c["id"] for c in listing["data"]) == ["first", "second"], listing)
        check([c["last_used"] for c in listing["data"]] == sorted((c["last_used"] for c in listing["data"]), reverse=True),
              "the most recently used first: %s" % listing)
        by_id = {c["id"]: c for c in listing["data"]}
        first, second = by_id["first"], by_id["second"]
        # The title: the first user message's beginning, on one line, at most 64 bytes.
        check(first["title"].startswith("Once upon a time there was") and len(first["title"].encode()) <= 64, first)
        check(first["turns"] == 1 and second["turns"] == 2 and second["messages"] == 5, listing)
        check(second["tokens_held"] > 0 and second["bytes_on_disk"] == os.path.getsize(os.path.join(state, "second.conv")), second)
        check(second["last_used"] >= first["last_used"] > 0 and not second["in_use"], listing)
        status, one = srv.request("GET", "/v1/conversations/second")
        check(status == 200 and one["id"] == "second" and one["object"] == "conversation", one)
        for method, path, code in (("GET", "/v1/conversations/nobody", 404), ("DELETE", "/v1/conversations/nobody", 404),
                                   ("GET", "/v1/conversations/bad%21id", 404)):
            status, body = srv.request(method, path)
            check(status == code and body["error"]["code"] == "conversation_not_found", (method, path, status, body))
        status, gone = srv.request("DELETE", "/v1/conversations/first")
        check(status == 200 and gone == {"id": "first", "object": "conversation.deleted", "deleted": True}, gone)
        check(not os.path.exists(os.path.join(state, "first.conv")), "the file is removed")
        status, listing = srv.request("GET", "/v1/conversations")
        check([c["id"] for c in listing["data"]] == ["second"], listing)
        # A conversation that a request is using is not deleted under it.
        thread = start_long_reply(srv, "busy")
        status, body = srv.request("DELETE", "/v1/conversations/busy")
        check(status == 409 and body["error"]["code"] == "conversation_in_use", body)
    finally:
        srv.stop()
        if thread:
            thread.join()
    # After a restart the saved ones are listed again, with their titles; the deleted one is not.
    srv = server("--state-dir", state)
    try:
        status, listing = srv.request("GET", "/v1/conversations")
        ids = {c["id"]: c for c in listing["data"]}
        check(status == 200 and "first" not in ids and ids["second"]["title"] == TURNS[0] and not ids["second"]["live"], listing)
        status, gone = srv.request("DELETE", "/v1/conversations/second")
        check(status == 200 and not os.path.exists(os.path.join(state, "second.conv")), gone)
        # Deleted, a conversation named again starts afresh.
        _, again = talk(srv, TURNS[:1], conversation_id="second")
        check(again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, again["usage"])
    finally:
        srv.stop()


@test
def messages_are_kept_with_the_conversation():
    """GET /v1/conversations/{id}/messages: what a chat page shows again after a reload or a restart."""
    state = os.path.join(WORK, "transcripts")
    srv = server("--state-dir", state)
    try:
        replies, _ = talk(srv, TURNS[:2], conversation_id="kept")
        expected = [SYSTEM, {"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": replies[0]},
                    {"role": "user", "content": TURNS[1]}, {"role": "assistant", "content": replies[1]}]
        status, body = srv.request("GET", "/v1/conversations/kept/messages")
        check(status == 200 and body == {"object": "list", "conversation_id": "kept", "data": expected}, body)
        status, body = srv.request("GET", "/v1/conversations/nobody/messages")
        check(status == 404 and body["error"]["code"] == "conversation_not_found", body)
    finally:
        srv.stop()
    srv = server("--state-dir", state)
    try:
        status, body = srv.request("GET", "/v1/conversations/kept/messages")
        check(status == 200 and body["data"] == expected, "after a restart: %s" % body)
        # The conversation goes on from its snapshot, and its messages with it.
        messages = expected + [{"role": "user", "content": TURNS[2]}]
        status, reply = srv.chat(messages, conversation_id="kept")
        check(status == 200 and reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, reply)
        status, body = srv.request("GET", "/v1/conversations/kept/messages")
        check(body["data"] == messages + [reply["choices"][0]["message"]], body)
    finally:
        srv.stop()
    # Without a state directory the server keeps no messages (its memory would grow with them).
    srv = server()
    try:
        talk(srv, TURNS[:1], conversation_id="unkept")
        status, body = srv.request("GET", "/v1/conversations/unkept/messages")
        check(status == 404 and "--state-dir" in body["error"]["message"], body)
    finally:
        srv.stop()


@test
def state_bounds_remove_the_least_recently_used():
    state = os.path.join(WORK, "bounded")
    names = ["oldest", "older", "newer", "newest"]
    # One conversation's file, to size the bound: two and a half of them.
    srv = server("--state-dir", state)
    try:
        talk(srv, TURNS[:1], conversation_id="probe")
        size = srv.request("GET", "/v1/conversations/probe")[1]["bytes_on_disk"]
    finally:
        srv.stop()
    shutil.rmtree(state)
    srv = server("--state-dir", state, "--sessions", "1", "--state-max-bytes", str(size * 5 // 2))
    try:
        for name in names:
            talk(srv, TURNS[:1], conversation_id=name)
            time.sleep(1.1)  # last_used is in seconds
        listing = srv.request("GET", "/v1/conversations")[1]["data"]
        # The two oldest went; the newest holds the one session, and a file, like the one before it.
        check([c["id"] for c in listing] == ["newest", "newer"], listing)
        check(sorted(os.listdir(state)) == ["newer.conv", "newest.conv"], os.listdir(state))
        sessions = srv.health()["sessions"]
        check(sessions["state_removed"] == 2 and sessions["state_bytes"] == sum(c["bytes_on_disk"] for c in listing), sessions)
        check(any("conversation oldest removed from the state directory (--state-max-bytes)" in line for line in srv.log), srv.log)
    finally:
        srv.stop()
    # The age bound, at startup: a conversation last used a day ago goes, a recent one stays.
    path = os.path.join(state, "newer.conv")
    with open(path, "rb") as f:
        data = f.read()
    data = re.sub(rb'"last_used":\d+', b'"last_used":%d' % (int(time.time()) - 86400), data, count=1)
    with open(path, "wb") as f:
        f.write(data)
    srv = server("--state-dir", state, "--state-max-age", "3600")
    try:
        listing = srv.request("GET", "/v1/conversations")[1]["data"]
        check([c["id"] for c in listing] == ["newest"] and os.listdir(state) == ["newest.conv"], listing)
    finally:
        srv.stop()
    status = subprocess.run([SERVER, "-m", MODEL, "--state-max-bytes", "100"], capture_output=True, text=True)
    check(status.returncode != 0 and "give --state-dir too" in status.stderr, status.stderr)


@test
def a_kill_during_a_delete_leaves_the_conversation_whole_or_gone():
    state = os.path.join(WORK, "kill-delete")
    outcomes = set()
    for attempt in range(6):
        srv = server("--state-dir", state)
        try:
            replies, _ = talk(srv, TURNS[:1], conversation_id="doomed")
            # The DELETE and a SIGKILL at once: the kill lands before, during or after the unlink.
            def delete(srv=srv):
                try:
                    srv.request("DELETE", "/v1/conversations/doomed", timeout=5)
                except OSError:
                    pass  # killed before it answered
            threading.Thread(target=delete, daemon=True).start()
            time.sleep(0.0005 * attempt)
        finally:
            srv.stop(signal.SIGKILL)
        files = sorted(os.listdir(state))
        check(files in ([], ["doomed.conv"]), files)
        srv = server("--state-dir", state)
        try:
            listing = srv.request("GET", "/v1/conversations")[1]["data"]
            if files:
                # Whole: it continues from its snapshot, its messages intact.
                outcomes.add("whole")
                check([c["id"] for c in listing] == ["doomed"], listing)
                messages = srv.request("GET", "/v1/conversations/doomed/messages")[1]["data"]
                check(messages == [SYSTEM, {"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": replies[0]}], messages)
                status, reply = srv.chat(messages + [{"role": "user", "content": TURNS[1]}], conversation_id="doomed")
                check(status == 200 and reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, reply)
                srv.request("DELETE", "/v1/conversations/doomed")
            else:
                outcomes.add("gone")
                check(listing == [], listing)
        finally:
            srv.stop()
    print("  after a kill during a delete: %s" % ", ".join(sorted(outcomes)))


@test
def the_chat_page_is_served_with_a_strict_policy():
    srv = server()
    try:
        for path, kind in (("/", "text/html"), ("/index.html", "text/html"), ("/chat.js", "text/javascript")):
            with urllib.request.urlopen(srv.base + path, timeout=10) as response:
                body = response.read().decode()
                check(response.headers["Content-Type"] == kind + "; charset=utf-8", (path, response.headers["Content-Type"]))
                policy = response.headers["Content-Security-Policy"]
                check("default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy, policy)
                check(response.headers["X-Content-Type-Options"] == "nosniff", response.headers)
                check(("<script src=\"/chat.js\">" in body) if kind == "text/html" else "textContent" in body, body[:200])
        # Nothing on the page loads from elsewhere.
        with urllib.request.urlopen(srv.base + "/", timeout=10) as response:
            page = response.read().decode()
        check(not re.search(r"(src|href)=\"(https?:)?//", page), "the page refers to another host")
    finally:
        srv.stop()


def start_long_reply(srv, conversation_id):
    """Starts a long streamed reply on another thread; returns the thread once the reply has begun
    (so the conversation holds its session and its request is admitted). The stream may end with
    the server (SIGTERM): that is not an error here."""
    began = threading.Event()

    def run():
        body = {"model": "stories260K", "messages": [{"role": "user", "content": "Go"}], "max_tokens": 4096, "stream": True,
                "conversation_id": conversation_id}
        req = urllib.request.Request(srv.base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                for line in response:
                    if b'"content"' in line:
                        began.set()
        except Exception:
            pass
        began.set()

    thread = threading.Thread(target=run)
    thread.start()
    check(began.wait(30), "the long reply never began")
    return thread


@test
def busy_sessions_get_503_and_too_many_requests_429():
    srv = server("--sessions", "1", "--session-wait", "0")
    try:
        holder = start_long_reply(srv, "long")  # holds the only session while it streams
        status, body = srv.chat([{"role": "user", "content": "Another conversation"}], conversation_id="other")
        holder.join()
        check(status == 503 and body["error"]["code"] == "server_busy", (status, body))
        check(srv.chat([{"role": "user", "content": "Now"}], conversation_id="other")[0] == 200, "free again")
    finally:
        srv.stop()
    # Past --queue requests at once: 429.
    srv = server("--queue", "1")
    try:
        holder = start_long_reply(srv, "long")
        status, body = srv.chat([{"role": "user", "content": "Me too"}], conversation_id="second")
        holder.join()
        check(status == 429 and body["error"]["code"] == "too_many_requests", (status, body))
    finally:
        srv.stop()


@test
def client_leaving_cancels_the_stream():
    srv = server()
    try:
        srv.open_stream_and_leave([{"role": "user", "content": "Go on and on"}], 3, max_tokens=4096, conversation_id="left")
        deadline = time.time() + 10
        while time.time() < deadline and srv.health()["requests"]["client_gone"] == 0:
            time.sleep(0.05)
        health = srv.health()
        check(health["requests"]["client_gone"] == 1 and health["requests"]["in_flight"] == 0, health)
        # The conversation is consistent: it continues with what the client saw, or starts again.
        status, body = srv.chat([{"role": "user", "content": "Hello"}], conversation_id="left")
        check(status == 200, body)
    finally:
        srv.stop()


@test
def sigterm_mid_stream_saves_and_exits():
    state = os.path.join(WORK, "term")
    srv = server("--state-dir", state)
    holder = start_long_reply(srv, "long")
    start = time.time()
    code = srv.stop(signal.SIGTERM)
    holder.join()
    check(code == 0 and time.time() - start < 10, "exit %s after %.1f s" % (code, time.time() - start))
    check(os.path.exists(os.path.join(state, "long.conv")), "the interrupted conversation is saved")


@test
def memory_is_flat_over_1000_turns_and_100_conversations():
    if os.environ.get("H2O_SERVER_SANITIZED"):
        print("  built with AddressSanitizer, whose quarantine holds freed memory: skipped")
        return "skipped"
    srv = server("--kv-budget", "32")
    try:
        messages, rss, body_bytes = [SYSTEM], {}, {}
        for turn in range(1, 1001):
            messages.append({"role": "user", "content": "Turn %d." % turn})
            status, body = srv.chat(messages, max_tokens=3)
            check(status == 200, body)
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            if turn in (100, 1000):
                rss[turn], body_bytes[turn] = srv.rss(), len(json.dumps(messages))
        growth = rss[1000] / rss[100] - 1
        # The request grows with the history the client sends; what the server keeps does not.
        print("  RSS after turn 100: %.2f MiB, after turn 1000: %.2f MiB (%+.2f%%); the request grew from %d to %d bytes"
              % (rss[100] / 2**20, rss[1000] / 2**20, 100 * growth, body_bytes[100], body_bytes[1000]))
        check(abs(growth) <= 0.02, "RSS grew %.2f%% over 900 turns" % (100 * growth))
    finally:
        srv.stop()
    srv = server("--kv-budget", "32", "--sessions", "4")
    try:
        samples = {}
        # 50 conversations to warm up (sessions made, the allocator settled), then 100 more.
        for i in range(1, 151):
            status, body = srv.chat([SYSTEM, {"role": "user", "content": "Story %d." % i}], max_tokens=3, conversation_id="n%d" % i)
            check(status == 200, body)
            if i in (50, 150):
                samples[i] = srv.rss()
        growth = samples[150] / samples[50] - 1
        print("  RSS after 50 conversations: %.2f MiB, after 150: %.2f MiB (%+.2f%%)" % (samples[50] / 2**20, samples[150] / 2**20, 100 * growth))
        check(abs(growth) <= 0.02, "RSS grew %.2f%% over 100 conversations" % (100 * growth))
        check(srv.health()["sessions"]["live"] == 4, srv.health())
    finally:
        srv.stop()


@test
def cors_only_when_asked():
    srv = server()
    try:
        with urllib.request.urlopen(srv.base + "/v1/models") as response:
            check(response.headers["Access-Control-Allow-Origin"] is None, "no CORS header without --cors")
    finally:
        srv.stop()
    srv = server("--cors", "http://localhost:3000")
    try:
        # A browser's preflight, then the request itself.
        req = urllib.request.Request(srv.base + "/v1/chat/completions", method="OPTIONS",
                                     headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
        with urllib.request.urlopen(req) as response:
            check(response.status == 204 and response.headers["Access-Control-Allow-Origin"] == "http://localhost:3000", response.headers)
            check("POST" in response.headers["Access-Control-Allow-Methods"], response.headers)
        with urllib.request.urlopen(srv.base + "/v1/models") as response:
            check(response.headers["Access-Control-Allow-Origin"] == "http://localhost:3000", response.headers)
    finally:
        srv.stop()


@test
def curl_client():
    if not shutil.which("curl"):
        print("  curl is not installed: skipped")
        return
    srv = server()
    try:
        body = json.dumps({"model": "stories260K", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
        out = subprocess.run(["curl", "-sSN", srv.base + "/v1/chat/completions", "-H", "Content-Type: application/json", "-d", body],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        check(out.rstrip().endswith("data: [DONE]") and out.count("chat.completion.chunk") >= 2, out)
    finally:
        srv.stop()


@test
def openai_npm_client():
    package = os.path.join(NODE_MODULES, "openai") if NODE_MODULES else ""
    if not package or not os.path.isdir(package) or not shutil.which("node"):
        print("  the openai npm package is not installed (scripts/test.sh installs it): skipped")
        return "skipped"
    srv = server("--alias", "stories260K", "--alias", "stories")
    try:
        env = dict(os.environ, NODE_PATH=NODE_MODULES, H2O_SERVER_URL=srv.base + "/v1")
        result = subprocess.run(["node", os.path.join(HERE, "openai_client.cjs")], env=env, capture_output=True, text=True, timeout=120)
        print("  " + result.stdout.strip().replace("\n", "\n  "))
        check(result.returncode == 0, result.stderr)
    finally:
        srv.stop()


def main():
    if not os.path.exists(MODEL):
        print("H2O-SKIP: %s is not there (the shared data folder)" % MODEL)
        return 0
    only = os.environ.get("H2O_SERVER_TESTS", "")
    failures, skipped = 0, 0
    for function in TESTS:
        if only and function.__name__ not in only.split(","):
            continue
        start = time.time()
        try:
            outcome = function()
            skipped += outcome == "skipped"
            print("ok   %s (%.1f s)" % (function.__name__, time.time() - start), flush=True)
        except Exception as error:
            failures += 1
            print("FAIL %s: %s" % (function.__name__, error), flush=True)
    shutil.rmtree(WORK, ignore_errors=True)
    print("%d failed, %d skipped" % (failures, skipped))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

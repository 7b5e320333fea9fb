"""The binding on stories260K (../shared/models, or $H2O_SHARED_DIR/models): generation,
streaming, cancelling from another thread, snapshots, forks, pinning and bad input."""

import json
import os
import tempfile
import threading
import unittest
from typing import Any, Dict, List
from pathlib import Path

import h2o_llm as h2o

SHARED = Path(os.environ.get("H2O_SHARED_DIR", Path(__file__).resolve().parents[4] / "shared"))
MODEL = SHARED / "models" / "stories260K.gguf"

if not MODEL.is_file():
    print(f"H2O-SKIP: no model at {MODEL}: the Python tests that need it were not run")


def session(model: h2o.Model, **params: object) -> h2o.Session:
    settings = dict(n_threads=1, backend="cpu", kv_budget=48, kv_policy="scissorhands", position_rolling=True, seed=7)
    settings.update(params)
    return model.session(**settings)


@unittest.skipUnless(MODEL.is_file(), "needs stories260K")
class ModelTest(unittest.TestCase):
    model: h2o.Model

    @classmethod
    def setUpClass(cls) -> None:
        cls.model = h2o.Model(MODEL)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.model.close()

    def test_info_and_tokens(self) -> None:
        info = self.model.info
        self.assertEqual(info.n_vocab, 512)
        self.assertEqual(info.bos_token, 1)
        self.assertEqual(self.model.architecture, "llama")
        self.assertIsNone(self.model.chat_format)  # stories260K has no template
        ids = self.model.tokenize("Once upon a time", add_bos=True)
        self.assertEqual(ids[0], 1)
        self.assertEqual(self.model.detokenize(ids[1:]), "Once upon a time")
        self.assertEqual(self.model.tokenize(b"Once upon a time"), ids[1:])
        self.assertTrue(self.model.is_end_of_generation(info.eos_token))
        self.assertEqual(self.model.tokenize("a</s>", special=True)[-1], info.eos_token)

    def test_chat_format(self) -> None:
        text = self.model.format_chat([("system", "Be kind."), {"role": "user", "content": "Hi"}], format="zephyr")
        self.assertEqual(text, "<|system|>\nBe kind.</s>\n<|user|>\nHi</s>\n<|assistant|>\n")
        with self.assertRaises(h2o.H2oError) as e:
            self.model.format_chat([("user", "Hi")])  # no template: a format must be named
        self.assertEqual(e.exception.status, h2o.Status.UNSUPPORTED)

    def test_generation_is_deterministic_and_streams_whole_pieces(self) -> None:
        with session(self.model) as a, session(self.model) as b:
            text = a.generate(" Once upon a time", max_tokens=40, temperature=0)
            pieces = list(b.stream(" Once upon a time", max_tokens=40, temperature=0))
            self.assertGreater(len(pieces), 10)
            self.assertEqual("".join(pieces), text)
            self.assertEqual(a.stats.n_generated_tokens, 40)
            self.assertEqual(a.stats.stop_reason, "max_tokens")
            # A stop string ends the reply before it.
            with session(self.model) as c:
                cut = c.generate(" Once upon a time", max_tokens=40, temperature=0, stop=["Lily"])
            self.assertIn("Lily", text)
            self.assertTrue(text.startswith(cut))
            self.assertNotIn("Lily", cut)

    def test_set_seed_samples_as_a_session_made_with_that_seed(self) -> None:
        with session(self.model, seed=99) as a, session(self.model, seed=7) as b:
            expected = a.generate(" Once upon a time", max_tokens=24, temperature=1.0)
            b.set_seed(99)
            self.assertEqual(b.generate(" Once upon a time", max_tokens=24, temperature=1.0), expected)

    def test_decode_and_logits(self) -> None:
        with session(self.model) as s:
            s.decode(self.model.tokenize("Once upon a time", add_bos=True))
            logits = s.logits()
            self.assertEqual(len(logits), 512)
            self.assertEqual(max(range(512), key=logits.__getitem__), self.model.tokenize(",")[-1])

    def test_cancel_from_another_thread(self) -> None:
        with session(self.model) as s:
            first_piece = threading.Event()
            pieces = []

            def cancel_after_first_piece() -> None:
                first_piece.wait(30)
                s.cancel()

            canceller = threading.Thread(target=cancel_after_first_piece)
            canceller.start()
            with self.assertRaises(h2o.Cancelled) as e:
                for piece in s.stream(" Once upon a time", max_tokens=100000, temperature=0.8):
                    pieces.append(piece)
                    first_piece.set()
            canceller.join()
            self.assertEqual(e.exception.status, h2o.Status.CANCELLED)
            self.assertGreater(len(pieces), 0)
            self.assertLess(len(pieces), 100000)
            # The session stays usable, the conversation going on from where it stopped.
            self.assertTrue(s.generate(" The end.", max_tokens=5, temperature=0))

    def test_snapshots_and_forks_continue_exactly(self) -> None:
        with session(self.model) as s:
            s.add_text("Lily had a red ball.", pin=True)
            s.generate(" Once upon a time", max_tokens=60, temperature=0.8)  # past the budget: evicting
            state = s.save_state()
            self.assertIsInstance(state, bytes)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "chat.h2o"
                s.save(path)
                with self.model.load_session(state) as loaded, self.model.load_session_file(path) as from_file, s.fork() as forked:
                    expected = s.generate("", max_tokens=30, temperature=0.8)
                    for copy in (loaded, from_file, forked):
                        self.assertEqual(copy.generate("", max_tokens=30, temperature=0.8), expected)
                    self.assertEqual(loaded.kv_layout, s.kv_layout)

    def test_pinning_and_spans(self) -> None:
        with session(self.model, kv_budget=32) as s:
            s.add_span_text(3, "Pip is a blue bird.", min_share=0.25)
            self.assertEqual(s.span_info(3).min_tokens, 8)
            with self.assertRaises(h2o.H2oError) as e:
                s.add_text("word " * 40, pin=True)  # more than kv_budget - 1 pinned tokens
            self.assertEqual(e.exception.status, h2o.Status.INVALID_ARGUMENT)
            s.generate(" Once upon a time", max_tokens=60, temperature=0)
            self.assertGreaterEqual(s.span_info(3).kept_min, 8)

    def test_settings_by_name_and_research_settings(self) -> None:
        with session(self.model, kv_type="k8v4", kv_policy=h2o.kv_policies().index("h2o"), experimental={"kv_sinks_every_policy": 1}) as s:
            layout = s.kv_layout
            self.assertEqual((layout.type, layout.policy, layout.budget), ("k8v4", "h2o", 48))
            self.assertEqual(s.experimental("kv_sinks_every_policy"), 1.0)
            self.assertEqual(s.memory.weight_bytes, self.model.info.weight_bytes)
            self.assertEqual(s.backend.kind, "cpu")

    def test_the_prefix_cache_serves_a_second_session_under_either_policy(self) -> None:
        system = "Once upon a time, there was a little girl named Lily. She loved to play outside with her dog."
        texts = []
        for policy in ("reuse", "lru"):
            with h2o.Model(MODEL, prefix_cache_bytes=16 << 20, prefix_cache_policy=policy) as model:
                for _ in range(2):
                    with session(model) as s:
                        s.add_text(system, pin=True)
                        texts.append(s.generate(" One day", max_tokens=24, temperature=0))
                stats = model.prefix_cache_stats
                self.assertEqual((stats["hits"], stats["misses"], stats["entries"]), (1, 1, 1), (policy, stats))
        self.assertEqual(set(texts), {texts[0]})
        with self.assertRaises(ValueError):
            h2o.Model(MODEL, prefix_cache_policy="fifo")

    def test_bad_input_raises_and_changes_nothing(self) -> None:
        with self.assertRaises(h2o.H2oError) as e:
            h2o.Model(SHARED / "no-such-model.gguf")
        self.assertEqual(e.exception.status, h2o.Status.IO)
        self.assertIn("no-such-model.gguf", str(e.exception))
        with self.assertRaises(h2o.H2oError) as e:
            session(self.model, kv_policy="lru")
        self.assertEqual(e.exception.status, h2o.Status.INVALID_ARGUMENT)
        with self.assertRaises(h2o.H2oError) as e:
            session(self.model, experimental={"kv_head_share": 2.0})  # beyond its range
        self.assertEqual(e.exception.status, h2o.Status.INVALID_ARGUMENT)
        with self.assertRaises(TypeError):
            session(self.model, kv_budgett=64)
        with self.assertRaises(TypeError):
            self.model.tokenize(42)  # type: ignore[arg-type]
        with session(self.model) as s:
            s.add_text("Once")
            before = s.save_state()
            with self.assertRaises(h2o.H2oError) as e:
                s.add_text(b"\xff\xfe not UTF-8")
            self.assertEqual(e.exception.status, h2o.Status.INVALID_TEXT)
            self.assertEqual(s.save_state(), before)
            with self.assertRaises(h2o.H2oError) as e:
                self.model.load_session(before[: len(before) // 2])
            self.assertEqual(e.exception.status, h2o.Status.STATE_FORMAT)
            with self.assertRaises(h2o.H2oError) as e:
                s.decode([100000])
            self.assertEqual(e.exception.status, h2o.Status.INVALID_ARGUMENT)
        closed = session(self.model)
        closed.close()
        closed.close()
        with self.assertRaises(ValueError):
            closed.generate("x")

    def test_the_default_session_never_runs_out_and_says_when_it_began_to_evict(self) -> None:
        # The library's defaults (no settings of this file's helper): 128 slots, then eviction.
        with self.model.session(n_ctx=128, n_threads=1, backend="cpu") as s:
            events = []
            s.on_event(lambda event, usage: events.append((event, usage)))
            self.assertEqual(s.kv_usage.capacity, 128)
            self.assertEqual(s.kv_usage.evicting_since, 0)
            s.generate("Once upon a time", max_tokens=400, temperature=0, stop_at_eos=False)
            usage = s.kv_usage
            self.assertGreater(usage.n_past, 400)
            self.assertEqual(usage.n_held, 128)
            self.assertEqual(usage.n_evicted, usage.n_past - 128)
            self.assertEqual(usage.evicting_since, 128)
            self.assertTrue(usage.evicts)
            self.assertEqual(len(events), 1)
            self.assertEqual(events[0][0], "kv_full")
            self.assertLessEqual(events[0][1].n_past, 128)
            s.on_event(None)
        # The old contract on request.
        with self.model.session(n_ctx=64, n_threads=1, backend="cpu", kv_overflow="error") as s:
            with self.assertRaises(h2o.H2oError) as e:
                s.generate("Once upon a time", max_tokens=100, temperature=0, stop_at_eos=False)
            self.assertEqual(e.exception.status, h2o.Status.CONTEXT_FULL)
            self.assertEqual(s.kv_usage.n_evicted, 0)
        with self.assertRaises(ValueError):
            self.model.session(kv_overflow="wrap")

    def test_grammar_schema_and_logit_bias_constrain_the_reply(self) -> None:
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
                  "required": ["name", "ok"]}
        with session(self.model) as s:
            for seed in range(5):
                s.reset()
                s.set_seed(seed)
                reply = json.loads(s.generate("Lily", json_schema=schema, max_tokens=200, temperature=1.0))
                self.assertEqual(set(reply), {"name", "ok"})
                self.assertIsInstance(reply["ok"], bool)
            s.reset()
            self.assertRegex(s.generate("Once", grammar='root ::= " upon a " [a-z]+ "."', temperature=0), r"^ upon a [a-z]+\.$")
            self.assertEqual(s.stats.stop_reason, "grammar")
            with self.assertRaises(h2o.H2oError) as e:
                s.generate("x", grammar="root ::= [a-")
            self.assertEqual(e.exception.status, h2o.Status.INVALID_ARGUMENT)
            s.reset()
            forced = self.model.tokenize(" cat")[-1]
            piece = self.model.token_to_piece(forced).decode().strip()
            again = s.generate("Once upon a time", max_tokens=3, temperature=0, logit_bias={forced: 100.0})
            self.assertEqual(again.replace(" ", ""), piece * 3)
        self.assertTrue(h2o.json_schema_to_grammar(schema).startswith("root ::= "))
        with self.assertRaises(h2o.H2oError):
            h2o.json_schema_to_grammar({"type": "string", "pattern": "x"})

    def test_tool_calls_round_trip(self) -> None:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]
        messages: List[Dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
        prompt = self.model.format_chat_with_tools(messages, tools, format="chatml")
        self.assertIn("<tools>\n" + json.dumps(tools[0]) + "\n</tools>", prompt)
        grammar = self.model.tool_call_grammar(tools, "required", parallel=False, format="chatml")
        with session(self.model) as s:
            s.add_text(prompt, special=True)
            reply = s.generate("", grammar=grammar, max_tokens=300, temperature=0)
        parsed = self.model.parse_tool_calls(reply, id_salt=1, format="chatml")
        self.assertIsNone(parsed["content"])
        call = parsed["tool_calls"][0]
        self.assertEqual(call["function"]["name"], "get_weather")
        self.assertIn(json.loads(call["function"]["arguments"])["city"], ("Paris", "Rome"))
        messages += [{"role": "assistant", "content": None, "tool_calls": parsed["tool_calls"]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
        history = self.model.format_chat_with_tools(messages, tools, format="chatml")
        self.assertIn(reply + "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>", history)
        self.assertEqual(self.model.parse_tool_calls("Just text.", format="chatml"), {"content": "Just text.", "tool_calls": []})
        with self.assertRaises(h2o.H2oError):
            self.model.tool_call_grammar(tools, "nope", format="chatml")

    def test_progress_can_cancel_a_load(self) -> None:
        seen = []
        with h2o.Model(MODEL, progress=seen.append) as m:
            self.assertEqual(m.info.n_vocab, 512)
        self.assertEqual(seen[-1], 1.0)
        with self.assertRaises(h2o.Cancelled):
            h2o.Model(MODEL, progress=lambda fraction: False)

        def broken(fraction: float) -> bool:
            raise RuntimeError("the caller's own error")

        with self.assertRaises(RuntimeError):
            h2o.Model(MODEL, progress=broken)


class LibraryTest(unittest.TestCase):
    def test_names_and_devices(self) -> None:
        self.assertEqual(h2o.version(), h2o.__version__)
        self.assertIn("scissorhands", h2o.kv_policies())
        self.assertEqual(h2o.kv_types(), ["f32", "f16", "q8", "q4", "k8v4"])
        self.assertIn("kv_head_share", h2o.experimental_names())
        self.assertEqual(h2o.experimental_bounds("kv_prompt_proxy"), (0.0, 4096.0))
        for name in h2o.experimental_names():
            low, high = h2o.experimental_bounds(name)
            self.assertLessEqual(low, high, name)
        with self.assertRaises(h2o.H2oError):
            h2o.experimental_bounds("no_such_setting")
        self.assertEqual(h2o.backends()[0].kind, "cpu")


if __name__ == "__main__":
    unittest.main()

"""Constrained generations validated by a JSON-schema validator that is not h2o's: Ajv, the npm
package (installed by scripts/test.sh into BUILD/npm).

    python3 validate_schema_replies.py H2O_SYNTH LIB_DIR SHARED_DIR NODE_MODULES WORK_DIR [VOCAB]

For each real vocabulary (Llama 3, Qwen3, GPT-4o; or VOCAB alone, so that a test runner may run
them side by side) a small random-weight model is written with
h2o-synth; for each schema of schemas/, 100 replies are generated through the Python binding
(seed 0 greedy, the others sampled at temperature 1), each must parse as JSON, and Ajv (strict
mode off for the $comment keyword, formats checked by ajv-formats) must find every one valid."""
import json
import os
import subprocess
import sys

SYNTH, LIB_DIR, SHARED, NODE_MODULES, WORK = sys.argv[1:6]
VOCABS = tuple(sys.argv[6:]) or ("llama3", "qwen3", "gpt4o")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
os.environ["H2O_LIB_DIR"] = LIB_DIR
import h2o_llm as h2o  # noqa: E402

REPLIES = 100

VALIDATE = r"""
const Ajv = require("ajv"), addFormats = require("ajv-formats"), fs = require("fs");
const [schemaPath, repliesPath] = process.argv.slice(2);
const ajv = new Ajv({strict: false, allErrors: true});
addFormats(ajv);
const validate = ajv.compile(JSON.parse(fs.readFileSync(schemaPath, "utf8")));
let bad = 0;
JSON.parse(fs.readFileSync(repliesPath, "utf8")).forEach((text, i) => {
  const reply = JSON.parse(text);  // the reply's own text, parsed by Node's reader
  if (!validate(reply)) { bad++; console.log("reply " + i + " is invalid: " + JSON.stringify(validate.errors) + "\n" + JSON.stringify(reply)); }
});
console.log(bad + " invalid");
process.exit(bad ? 1 : 0);
"""


def main():
    if not os.path.isdir(os.path.join(NODE_MODULES, "ajv")) or not os.path.isdir(os.path.join(NODE_MODULES, "ajv-formats")):
        print("H2O-SKIP: the npm packages ajv and ajv-formats are not in %s (scripts/test.sh installs them)" % NODE_MODULES)
        return 0
    os.makedirs(WORK, exist_ok=True)
    validator = os.path.join(WORK, "validate-%d.cjs" % os.getpid())
    with open(validator, "w") as f:
        f.write(VALIDATE)
    schemas = sorted(os.path.join(HERE, "schemas", n) for n in os.listdir(os.path.join(HERE, "schemas")) if n.endswith(".json"))
    failures = 0
    for vocab in VOCABS:
        folder = os.path.join(SHARED, "vocab", vocab)
        if not os.path.isdir(folder):
            print("H2O-SKIP: no vocabulary at %s" % folder)
            continue
        model_path = os.path.join(WORK, vocab + ".gguf")
        subprocess.run([SYNTH, "-o", model_path, "--type", "F16", "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                        "--ff", "128", "--vocab", folder, "--tied", "--embd-scale", "0.1"], check=True, capture_output=True)
        with h2o.Model(model_path) as model, model.session(n_threads=1, backend="cpu") as session:
            for schema_path in schemas:
                schema = open(schema_path).read()
                replies = []
                for seed in range(REPLIES):
                    session.reset()
                    session.set_seed(seed)
                    text = session.generate("Reply in JSON:", json_schema=schema, max_tokens=1024, temperature=0.0 if seed == 0 else 1.0)
                    if session.stats.stop_reason not in ("grammar", "eos"):
                        print("%s %s seed %d: the reply did not end (%s): %r" % (vocab, schema_path, seed, session.stats.stop_reason, text))
                        failures += 1
                        continue
                    try:
                        json.loads(text)
                        replies.append(text)
                    except ValueError as error:
                        print("%s %s seed %d: not JSON (%s): %r" % (vocab, schema_path, seed, error, text))
                        failures += 1
                out = os.path.join(WORK, "%s-%s" % (vocab, os.path.basename(schema_path)))
                with open(out, "w") as f:
                    json.dump(replies, f)
                run = subprocess.run(["node", validator, schema_path, out], capture_output=True, text=True,
                                     env=dict(os.environ, NODE_PATH=NODE_MODULES))
                print("%s %s: %d replies, Ajv: %s" % (vocab, os.path.basename(schema_path), len(replies), run.stdout.strip().splitlines()[-1]
                                                      if run.stdout.strip() else run.stderr.strip()))
                if run.returncode != 0:
                    print(run.stdout + run.stderr)
                    failures += 1
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

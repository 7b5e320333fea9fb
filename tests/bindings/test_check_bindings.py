"""scripts/check-bindings.py passes on the checkout and catches each kind of drift: a copy of
the header and the mirrors, edited one way at a time, must be refused with the difference named.

    python3 test_check_bindings.py CHECKOUT"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1])
SCRIPT = os.path.join(ROOT, "scripts", "check-bindings.py")
FILES = ["include/h2o/h2o.h", "include/h2o/h2o_experimental.h", "bindings/rust/h2o-sys/src/lib.rs",
         "bindings/python/h2o_llm/_native.py", "bindings/python/h2o_llm/_api.py"]
FOLDERS = ["bindings/rust/h2o/src", "bindings/csharp/src"]

# (file, text, replacement, what the report must say)
EDITS = [
    ("include/h2o/h2o.h", "    uint64_t evicting_since;", "    uint64_t evicting_since;\n    uint32_t added;", "h2o_kv_usage has fields"),
    ("include/h2o/h2o.h", "H2O_KV_TYPE_K8V4 = 4", "H2O_KV_TYPE_K8V4 = 4,\n    H2O_KV_TYPE_Q2 = 5", "h2o_kv_type lacks H2O_KV_TYPE_Q2"),
    ("bindings/rust/h2o-sys/src/lib.rs", "pub const H2O_KV_TOVA: u32 = 5;", "pub const H2O_KV_TOVA: u32 = 6;", "H2O_KV_TOVA = 6"),
    ("bindings/rust/h2o-sys/src/lib.rs", "    pub n_held: u64,\n    pub n_evicted: u64,", "    pub n_evicted: u64,\n    pub n_held: u64,",
     "struct h2o_kv_usage has fields"),
    ("bindings/rust/h2o/src/names.rs", "Roco = 6,", "Roco = 7,", "h2o_kv_policy.Roco is 7"),
    ("bindings/csharp/src/Names.cs", "Q4 = 3,", "Q4 = 3,\n        Q3 = 9,", "h2o_kv_type has Q3"),
    ("bindings/csharp/src/Native.cs", "public uint struct_size, entries;", "public uint struct_size;\n        public ulong entries;",
     "h2o_prefix_cache_stats.entries is u64"),
    ("bindings/python/h2o_llm/_native.py", '_declare("h2o_kv_type_name", c_char_p, c_uint32)', '_declare("h2o_kv_type_name", c_char_p, c_uint64)',
     "h2o_kv_type_name takes (u64)"),
    ("bindings/python/h2o_llm/_native.py", "TEXT_SPECIAL = 2", "TEXT_SPECIAL = 4", "TEXT_SPECIAL = 4"),
    ("bindings/python/h2o_llm/_api.py", '"callback", "grammar")', '"callback")', "_STOP_REASONS is"),
]


def copy_tree(dest):
    for f in FILES:
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, f), os.path.join(dest, f))
    for d in FOLDERS:
        shutil.copytree(os.path.join(ROOT, d), os.path.join(dest, d))


def run(root):
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)


def main():
    failures = 0
    clean = run(ROOT)
    print(clean.stdout.strip().splitlines()[-1])
    if clean.returncode != 0:
        print("the checkout's bindings differ from the header:\n" + clean.stdout)
        failures += 1
    for path, old, new, expected in EDITS:
        with tempfile.TemporaryDirectory() as tmp:
            copy_tree(tmp)
            full = os.path.join(tmp, path)
            text = open(full).read()
            if old not in text:
                print("edit of %s: %r is not in the file (update this test)" % (path, old))
                failures += 1
                continue
            open(full, "w").write(text.replace(old, new, 1))
            result = run(tmp)
            if result.returncode == 0 or expected not in result.stdout:
                print("edit of %s (%r -> %r) was not reported as %r:\n%s" % (path, old, new, expected, result.stdout))
                failures += 1
            else:
                print("caught: " + next(line for line in result.stdout.splitlines() if expected in line))
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

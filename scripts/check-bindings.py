#!/usr/bin/env python3
"""Checks the bindings' hand-written mirrors of the C API against include/h2o/*.h.

    scripts/check-bindings.py [CHECKOUT]

The header is the one source: its structs (field names, order, widths), enums and constants
(names and values) and functions (parameter and return widths). Each binding must mirror every
struct and enum of the header, and whatever constants and functions it declares must match:
  - Rust: bindings/rust/h2o-sys/src/lib.rs (structs under their C names, every constant as
    H2O_..., the extern functions), and the enums of bindings/rust/h2o/src/*.rs written as
    `Variant = value` under a doc comment naming the C enum;
  - C#: bindings/csharp/src/*.cs (structs Native<CamelCase>, enums under a summary naming the C
    enum, constants, [DllImport] functions);
  - Python: bindings/python/h2o_llm/_native.py (the STRUCTS table, constants without H2O_, the
    _declare'd functions) and the name tuples of _api.py that list an enum in value order.
The layout tests still compare sizes and offsets with a C compiler's; this catches the names,
values and signatures those tests cannot see. Exits 1 listing every difference, 0 when none."""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
problems = []


def problem(where, text):
    problems.append("%s: %s" % (where, text))


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def norm(name):
    """A name compared across languages: letters and digits, lower case."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def camel(c_name):
    """h2o_kv_usage -> KvUsage."""
    return "".join(w.capitalize() for w in c_name.split("_")[1:])


def split_top(text):
    """Splits a parameter list at the commas outside (), <> and []."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def evaluate(expr, known):
    expr = re.sub(r"\b(H2O_[A-Z0-9_]+)\b", lambda m: str(known[m.group(1)]) if m.group(1) in known else m.group(0), expr)
    expr = re.sub(r"\b(0[xX][0-9a-fA-F_]+|[0-9][0-9_]*)[uUlL]*\b", lambda m: m.group(1).replace("_", ""), expr)
    if not re.fullmatch(r"[0-9a-fA-Fx+\-*/() \t]+", expr):
        return None
    return int(eval(expr, {"__builtins__": {}}))  # digits and operators only, checked above


# ---- the header -----------------------------------------------------------------------------
class Header:
    C_TYPES = {"uint32_t": "u32", "int32_t": "i32", "uint64_t": "u64", "int64_t": "i64", "float": "f32",
               "double": "f64", "size_t": "usize", "int": "i32", "char": "u8", "uint8_t": "u8", "void": "void"}

    def __init__(self, paths):
        text = "\n".join(read(p) for p in paths)
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        self.fn_pointers = set(re.findall(r"typedef [^;(]*\(\s*\*\s*(\w+)\s*\)", text))
        self.constants, self.enums, self.structs, self.functions = {}, {}, {}, {}
        for name, value in re.findall(r"#define (H2O_[A-Z0-9_]+)[ \t]+([^\n]+)", text):
            v = evaluate(value.strip(), self.constants)
            if v is not None:
                self.constants[name] = v
        for body, name in re.findall(r"typedef enum \w+ \{(.*?)\} (\w+);", text, flags=re.S):
            members, nxt = [], 0
            for item in split_top(body):
                m = re.fullmatch(r"(H2O_\w+)(?:\s*=\s*(.+))?", item.strip(), flags=re.S)
                if not m:
                    problem("header", "enum %s: cannot read %r" % (name, item))
                    continue
                nxt = evaluate(m.group(2), self.constants) if m.group(2) else nxt
                members.append((m.group(1), nxt))
                self.constants[m.group(1)] = nxt
                nxt += 1
            self.enums[name] = members
        for body, name in re.findall(r"typedef struct \w+ \{(.*?)\} (\w+);", text, flags=re.S):
            fields = []
            for decl in body.split(";"):
                decl = " ".join(decl.split())
                if not decl:
                    continue
                m = re.fullmatch(r"(.+?)\s*\b(\w+)(?:\[(\w+)\])?", decl)
                kind = self.kind(m.group(1))
                if m.group(3):
                    kind += "[%d]" % evaluate(m.group(3), self.constants)
                fields.append((m.group(2), kind))
            self.structs[name] = fields
        for ret, name, params in re.findall(r"H2O_API\s+([^;{}()]*?)\b(h2o_\w+)\s*\(([^;]*?)\)\s*;", text, flags=re.S):
            params = " ".join(params.split())
            args = [] if params in ("", "void") else [self.kind(re.sub(r"\s*\b\w+$", "", p)) for p in split_top(params)]
            self.functions[name] = (self.kind(ret), args)

    def kind(self, c_type):
        t = " ".join(c_type.replace("const", " ").split())
        if "*" in t or t in self.fn_pointers:
            return "ptr"
        if t in self.C_TYPES:
            return self.C_TYPES[t]
        if t.startswith("h2o_") and t in getattr(self, "enums", {}):
            return "i32"
        if t == "h2o_status":
            return "i32"
        problem("header", "unknown C type %r" % c_type)
        return t


def compare_struct(where, c_name, header_fields, fields):
    names = [n for n, _ in fields]
    want = [n for n, _ in header_fields]
    if names != want:
        problem(where, "struct %s has fields %s, the header %s" % (c_name, names, want))
        return
    for (n, kind), (_, want_kind) in zip(fields, header_fields):
        if kind != want_kind:
            problem(where, "%s.%s is %s, the header's is %s" % (c_name, n, kind, want_kind))


def compare_function(where, name, header, ret, args):
    if name not in header.functions:
        problem(where, "declares %s, which the header does not have" % name)
        return
    want_ret, want_args = header.functions[name]
    if ret != want_ret:
        problem(where, "%s returns %s, the header's %s" % (name, ret, want_ret))
    if args != want_args:
        problem(where, "%s takes (%s), the header's (%s)" % (name, ", ".join(args), ", ".join(want_args)))


def member_names(c_member):
    """H2O_STOP_STRING -> the names a binding may give it: String, StopString, H2oStopString."""
    words = c_member.split("_")
    return {norm("".join(words[i:])) for i in range(len(words))}


def compare_enum(where, header, c_enum, variants):
    """variants: (name, value) pairs a binding gives the C enum c_enum."""
    members = header.enums[c_enum]
    seen = set()
    for name, value in variants:
        match = [m for m, _ in members if norm(name) in member_names(m)]
        if not match:
            problem(where, "%s has %s, which no member of the header's names" % (c_enum, name))
            continue
        if header.constants[match[0]] != value:
            problem(where, "%s.%s is %d, the header's %s is %d" % (c_enum, name, value, match[0], header.constants[match[0]]))
        seen.add(match[0])
    for m, _ in members:
        if m not in seen:
            problem(where, "%s lacks %s" % (c_enum, m))


def doc_enums(text, pattern):
    """Enums whose doc comment names their C enum: {c_enum: [(variant, value)]}. pattern finds
    (doc, body) pairs."""
    out = {}
    for doc, body in re.findall(pattern, text, flags=re.S):
        c_names = re.findall(r"\((h2o_\w+)\)", doc)
        if c_names:
            out[c_names[-1]] = [(n, evaluate(v, {})) for n, v in re.findall(r"\b([A-Z]\w*)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)", body)]
    return out


# ---- Rust -----------------------------------------------------------------------------------
RUST_TYPES = {"u32": "u32", "i32": "i32", "u64": "u64", "i64": "i64", "f32": "f32", "f64": "f64", "usize": "usize",
              "c_int": "i32", "c_uint": "u32", "c_char": "u8", "u8": "u8", "c_double": "f64", "c_float": "f32",
              "h2o_status": "i32"}


def rust_kind(t, consts):
    t = t.strip()
    m = re.fullmatch(r"\[(.+);\s*(\w+)\]", t)
    if m:
        n = consts.get(m.group(2)) if not m.group(2).isdigit() else int(m.group(2))
        return "%s[%s]" % (rust_kind(m.group(1), consts), n)
    if t.startswith("*") or t.startswith("Option<") or re.fullmatch(r"h2o_\w+_callback", t):
        return "ptr"
    return RUST_TYPES.get(t, "?" + t)


def check_rust(header):
    where = "rust h2o-sys"
    text = read("bindings/rust/h2o-sys/src/lib.rs")
    code = re.sub(r"//[^\n]*", "", text)
    consts = {}
    for name, value in re.findall(r"pub const (H2O_\w+):\s*[\w:]+\s*=\s*([^;]+);", code):
        consts[name] = evaluate(value, consts)
        if name not in header.constants:
            problem(where, "%s is not a constant of the header" % name)
        elif consts[name] != header.constants[name]:
            problem(where, "%s = %s, the header's is %d" % (name, consts[name], header.constants[name]))
    for name in header.constants:
        if name not in consts and name not in ("H2O_VERSION_MAJOR", "H2O_VERSION_MINOR", "H2O_VERSION_PATCH"):
            problem(where, "lacks the constant %s" % name)
    structs = {}
    for name, body in re.findall(r"pub struct (h2o_\w+)\s*\{(.*?)\n\}", code, flags=re.S):
        fields = [(n.rstrip("_"), rust_kind(t, consts)) for n, t in re.findall(r"pub (\w+):\s*([^,\n]+),", body)]
        if fields:
            structs[name] = fields
    for name, fields in header.structs.items():
        if name not in structs:
            problem(where, "lacks the struct %s" % name)
        else:
            compare_struct(where, name, fields, structs[name])
    for block in re.findall(r'extern "C" \{(.*?)\n\}', code, flags=re.S):
        for name, params, ret in re.findall(r"pub fn (h2o_\w+)\s*\((.*?)\)\s*(?:->\s*([^;]+))?;", block, flags=re.S):
            args = [rust_kind(p.split(":", 1)[1], consts) for p in split_top(params)]
            compare_function(where, name, header, rust_kind(ret, consts) if ret else "void", args)
    safe = "\n".join(read(os.path.join("bindings/rust/h2o/src", f)) for f in sorted(os.listdir(os.path.join(ROOT, "bindings/rust/h2o/src"))))
    for c_enum, variants in doc_enums(safe, r"((?:///[^\n]*\n\s*)+)[^{}]*?\{([^{}]*)\}").items():
        if c_enum in header.enums and variants:
            compare_enum("rust h2o", header, c_enum, variants)


# ---- C# -------------------------------------------------------------------------------------
CS_TYPES = {"uint": "u32", "int": "i32", "ulong": "u64", "long": "i64", "float": "f32", "double": "f64",
            "UIntPtr": "usize", "IntPtr": "ptr", "byte": "u8", "void": "void"}
# C# constants named otherwise than their header constant.
CS_CONSTANT_NAMES = {"AbiVersionNumber": "H2O_VERSION_NUMBER"}


def cs_kind(t):
    t = re.sub(r"\[[^\]]*\]\s*", "", t).strip() if not t.endswith("[]") else "IntPtr"
    if t.startswith(("ref ", "out ", "in ")) or t.endswith("[]") or t.endswith("*"):
        return "ptr"
    if t in CS_TYPES:
        return CS_TYPES[t]
    if t.endswith("Handle") or t.endswith("Callback"):
        return "ptr"
    return "?" + t


def check_cs(header):
    where = "c#"
    folder = os.path.join(ROOT, "bindings/csharp/src")
    text = "\n".join(read(os.path.join("bindings/csharp/src", f)) for f in sorted(os.listdir(folder)) if f.endswith(".cs"))
    structs = {}
    for name, body in re.findall(r"struct Native(\w+)\s*\{(.*?)\n    \}", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(re.sub(r"//[^\n]*", "", decl).split())
            m = re.fullmatch(r"public (fixed )?(\w+) (.+)", decl)
            if not m:
                continue
            for field in m.group(3).split(","):
                fm = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", field.strip())
                kind = cs_kind(m.group(2)) + ("[%s]" % fm.group(2) if fm.group(2) else "")
                fields.append((fm.group(1), kind))
        structs[name] = fields
    for name, fields in header.structs.items():
        if camel(name) not in structs:
            problem(where, "lacks the struct Native%s (%s)" % (camel(name), name))
        else:
            compare_struct(where, name, fields, structs[camel(name)])
    for ret, name, params in re.findall(r"\[DllImport[^\]]*\]\s*(?:internal|public) static extern (\S+) (h2o_\w+)\((.*?)\);", text, flags=re.S):
        args = [cs_kind(re.sub(r"\s*\b\w+$", "", p)) for p in split_top(params)]
        compare_function(where, name, header, cs_kind(ret), args)
    enums = doc_enums(text, r"<summary>([^<]*)</summary>\s*public enum \w+(?:\s*:\s*\w+)?\s*\{(.*?)\}")
    for c_enum in header.enums:
        if c_enum in enums:
            compare_enum(where, header, c_enum, enums[c_enum])
        elif c_enum not in CS_ENUMS_AS_CONSTANTS:
            problem(where, "lacks an enum for %s (a summary naming it)" % c_enum)
    for name, value in re.findall(r"const (?:uint|int|ulong) (\w+) = (0[xX][0-9a-fA-F]+|\d+)u?;", text):
        target = CS_CONSTANT_NAMES.get(name) or next(
            (c for c in header.constants if norm(name) in member_names(c) and not c.endswith(("_MAJOR", "_MINOR", "_PATCH"))), None)
        if target is None:
            problem(where, "the constant %s names no constant of the header" % name)
        elif header.constants[target] != evaluate(value, {}):
            problem(where, "%s = %s, the header's %s is %d" % (name, value, target, header.constants[target]))


# Enums the C# binding gives as strings or constants rather than an enum of its own (their
# values are then checked as constants, where it has them).
CS_ENUMS_AS_CONSTANTS = {"h2o_log_level", "h2o_model_text", "h2o_experimental_key"}


# ---- Python ---------------------------------------------------------------------------------
PY_TYPES = {"c_uint32": "u32", "c_int32": "i32", "c_int": "i32", "c_uint64": "u64", "c_int64": "i64", "c_float": "f32",
            "c_double": "f64", "c_size_t": "usize", "c_char": "u8", "None": "void", "status": "i32"}


def py_kind(t, consts):
    t = t.strip().replace("ctypes.", "")
    m = re.fullmatch(r"(\w+)\s*\*\s*(\w+)", t)
    if m:
        return "%s[%s]" % (py_kind(m.group(1), consts), consts.get(m.group(2), m.group(2)))
    if t in PY_TYPES:
        return PY_TYPES[t]
    if t in ("c_void_p", "c_char_p", "model_p", "session_p", "sizep", "u32p") or t.startswith("POINTER(") or t.endswith("Callback"):
        return "ptr"
    return "?" + t


def check_python(header):
    where = "python"
    text = read("bindings/python/h2o_llm/_native.py")
    consts = {}
    for name, value in re.findall(r"^([A-Z][A-Z0-9_]*) = (0[xX][0-9a-fA-F]+|\d+)$", text, flags=re.M):
        consts[name] = int(value, 0)
        target = "H2O_" + name
        if target not in header.constants:
            problem(where, "the constant %s is not a constant of the header (as %s)" % (name, target))
        elif header.constants[target] != consts[name]:
            problem(where, "%s = %d, the header's %s is %d" % (name, consts[name], target, header.constants[target]))
    classes = {}
    for name, body in re.findall(r"^class (\w+)\(Structure\):\n    _fields_ = \[(.*?)\n    \]", text, flags=re.S | re.M):
        classes[name] = [(n, py_kind(t, consts)) for n, t in re.findall(r'\("(\w+)",\s*([^)]+(?:\))?)\)', body)]
    table = dict(re.findall(r'"(h2o_\w+)": (\w+),', text.split("STRUCTS = {", 1)[1].split("}", 1)[0]))
    for name, fields in header.structs.items():
        if name not in table or table[name] not in classes:
            problem(where, "STRUCTS lacks %s" % name)
        else:
            compare_struct(where, name, fields, classes[table[name]])
    for name, types in re.findall(r'_declare\("(h2o_\w+)",\s*(.*?)\)\n', text):
        kinds = [py_kind(t, consts) for t in split_top(types)]
        compare_function(where, name, header, kinds[0], kinds[1:])
    # Name tuples in value order, e.g. _STOP_REASONS for h2o_stop_reason.
    api = read("bindings/python/h2o_llm/_api.py")
    for tuple_name, c_enum in (("_STOP_REASONS", "h2o_stop_reason"),):
        m = re.search(r"^%s = \((.*?)\)" % tuple_name, api, flags=re.M | re.S)
        names = re.findall(r'"(\w+)"', m.group(1)) if m else []
        want = [c.split("_", 2)[2].lower() for c, _ in sorted(header.enums[c_enum], key=lambda mv: mv[1])]
        if names != want:
            problem(where, "%s is %s, the header's %s in value order %s" % (tuple_name, names, c_enum, want))


def main():
    header = Header(["include/h2o/h2o.h", "include/h2o/h2o_experimental.h"])
    if not header.structs or not header.enums or not header.functions:
        problem("header", "read no structs, enums or functions: has its layout changed?")
    check_rust(header)
    check_cs(header)
    check_python(header)
    for p in problems:
        print(p)
    print("%d structs, %d enums, %d constants, %d functions in the header; %d differences in the bindings"
          % (len(header.structs), len(header.enums), len(header.constants), len(header.functions), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Plain English text from Python's documentation (Debian's python3-doc ships its
reStructuredText sources), for training and evaluating the second model.

Keeps the prose: section titles and paragraphs, the descriptions under function and class
entries, notes and list items. Drops what is not English prose: code examples (literal
blocks after '::', doctest lines), indexes, tables of contents, comments and labels. Inline
markup keeps its text (':func:`~os.path.join`' becomes 'join', '``x``' becomes 'x').

The split is by file, so no document is in both: every 10th file in path order is held out.

    prepare_text.py [--sources DIR] OUT_DIR     ->  OUT_DIR/train.txt, OUT_DIR/val.txt
"""
import argparse
import os
import re
import sys

DEFAULT_SOURCES = "/usr/share/doc/python3.11/html/_sources"
HELD_OUT_EVERY = 10

# Directives whose indented body is prose worth keeping (the directive line itself goes,
# except for object descriptions, whose signature becomes a line).
PROSE_DIRECTIVES = {
    "note", "warning", "important", "tip", "caution", "attention", "hint", "seealso",
    "versionadded", "versionchanged", "deprecated", "deprecated-removed", "impl-detail",
    "topic", "sidebar", "admonition", "rubric",
}
DESCRIPTION_DIRECTIVES = {
    "function", "method", "class", "attribute", "data", "exception", "decorator",
    "classmethod", "staticmethod", "describe", "module", "opcode", "cmdoption", "option",
    "envvar", "pdbcommand", "coroutinefunction", "coroutinemethod", "abstractmethod",
    "decoratormethod", "property", "c:function", "c:type", "c:macro", "c:member", "c:var",
}

ROLE = re.compile(r":[\w:+-]+:`([^`]*)`")
LITERAL = re.compile(r"``([^`]*)``")
LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_*")
INTERPRETED = re.compile(r"`([^`]*)`_*")
UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")
DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")


def role_text(match):
    text = match.group(1).lstrip("!~")
    explicit = re.match(r"(.*?)\s*<[^>]*>$", text)
    if explicit:
        return explicit.group(1)
    if match.group(0).startswith(":") and "." in text and not text.endswith("."):
        # ':func:`~os.path.join`' shows 'join' in the rendered page; ':mod:`os.path`' keeps it.
        if match.group(1).startswith("~"):
            text = text.rsplit(".", 1)[1]
    return text


def inline(line):
    line = ROLE.sub(role_text, line)
    line = LITERAL.sub(r"\1", line)
    line = LINK.sub(r"\1", line)
    line = INTERPRETED.sub(r"\1", line)
    line = line.replace("\\", "")
    return line


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def prose(text):
    out = []
    lines = text.splitlines()
    skip_deeper_than = None  # drop lines indented deeper than this (a dropped block's body)
    for i, raw in enumerate(lines):
        line = raw.expandtabs(4).rstrip()
        if skip_deeper_than is not None:
            if not line or indent_of(line) > skip_deeper_than:
                continue
            skip_deeper_than = None
        if not line:
            out.append("")
            continue
        stripped = line.strip()
        if UNDERLINE.match(stripped):
            continue
        if stripped.startswith(">>>") or stripped.startswith("... "):
            continue
        directive = DIRECTIVE.match(line)
        if directive:
            name, argument = directive.group(2), directive.group(3)
            if name in PROSE_DIRECTIVES:
                if name == "rubric" and argument:
                    out.append(inline(argument))
                continue
            if name in DESCRIPTION_DIRECTIVES:
                if argument:
                    out.append(inline(argument))
                continue
            skip_deeper_than = indent_of(line)
            continue
        if stripped.startswith(".."):  # comments, labels, substitutions, footnote targets
            skip_deeper_than = indent_of(line)
            continue
        if stripped.startswith("|") or stripped.startswith("+-") or stripped.startswith("+="):
            continue  # tables
        if stripped.endswith("::"):
            # A literal block follows: keep the sentence ('Example::' reads 'Example:').
            body = stripped[:-2].rstrip()
            if body:
                out.append(inline(body) + ":")
            skip_deeper_than = indent_of(line)
            continue
        out.append(inline(stripped))
    # Paragraphs on one line each, blank lines between them.
    paragraphs, current = [], []
    for line in out:
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(p for p in paragraphs if len(p.split()) >= 3)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", default=DEFAULT_SOURCES)
    parser.add_argument("out_dir")
    args = parser.parse_args()
    files = []
    for root, _, names in os.walk(args.sources):
        files += [os.path.join(root, n) for n in names if n.endswith(".rst.txt")]
    files.sort()
    if not files:
        sys.exit(f"no .rst.txt files under {args.sources} (install python3-doc)")
    os.makedirs(args.out_dir, exist_ok=True)
    sizes = {}
    with open(os.path.join(args.out_dir, "train.txt"), "w") as train, \
            open(os.path.join(args.out_dir, "val.txt"), "w") as val:
        for index, path in enumerate(files):
            with open(path, encoding="utf-8") as f:
                text = prose(f.read())
            if not text:
                continue
            out = val if index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train
            out.write(text + "\n\n")
            sizes[out.name] = sizes.get(out.name, 0) + len(text) + 2
    for name, size in sizes.items():
        print(f"{name}: {size} characters")


if __name__ == "__main__":
    main()

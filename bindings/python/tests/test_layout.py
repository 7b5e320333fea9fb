"""The ctypes structs of h2o_llm/_native.py against the C header: a C program compiled here prints
sizeof and offsetof of every field, so the declarations cannot drift unnoticed."""

import ctypes
import os
import re
import subprocess
import tempfile
import unittest
from pathlib import Path

from h2o_llm import _native

CHECKOUT = Path(__file__).resolve().parents[3]
HEADER = CHECKOUT / "include" / "h2o" / "h2o.h"


class LayoutTest(unittest.TestCase):
    def test_struct_layouts_match_the_c_header(self) -> None:
        lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "h2o/h2o.h"', "int main(void) {"]
        expected = []
        for c_name, struct in _native.STRUCTS.items():
            lines.append(f'printf("{c_name} sizeof %zu\\n", sizeof({c_name}));')
            expected.append(f"{c_name} sizeof {ctypes.sizeof(struct)}")
            for field, _ in struct._fields_:
                lines.append(f'printf("{c_name} {field} %zu\\n", offsetof({c_name}, {field}));')
                expected.append(f"{c_name} {field} {getattr(struct, field).offset}")
        lines += ["return 0;", "}"]
        with tempfile.TemporaryDirectory() as tmp:
            source, program = Path(tmp) / "layout.c", Path(tmp) / "layout"
            source.write_text("\n".join(lines) + "\n")
            subprocess.run([os.environ.get("CC", "cc"), "-I", str(CHECKOUT / "include"), str(source), "-o", str(program)], check=True)
            actual = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout.split("\n")
        self.assertEqual([line for line in actual if line], expected)
        self.assertGreater(len(expected), 100)  # every field of every struct was compared

    def test_every_struct_of_the_header_is_declared(self) -> None:
        declared = set(re.findall(r"^} (h2o_\w+);", HEADER.read_text(), re.MULTILINE))
        enums = set(re.findall(r"^typedef enum (h2o_\w+)", HEADER.read_text(), re.MULTILINE))
        self.assertEqual(declared - enums, set(_native.STRUCTS))

    def test_constants_match_the_header(self) -> None:
        text = HEADER.read_text()

        def define(name: str) -> int:
            match = re.search(rf"^#define {name} (\w+)", text, re.MULTILINE)
            assert match, name
            return int(match.group(1).rstrip("u"), 0)

        self.assertEqual(define("H2O_ABI_VERSION"), _native.ABI_VERSION)
        self.assertEqual(define("H2O_MAX_SPANS"), _native.MAX_SPANS)
        self.assertEqual(define("H2O_EXPERIMENTAL_CAPACITY"), _native.EXPERIMENTAL_CAPACITY)
        self.assertEqual(define("H2O_TOKENIZE_ADD_BOS"), _native.TOKENIZE_ADD_BOS)
        self.assertEqual(define("H2O_TOKENIZE_SPECIAL"), _native.TOKENIZE_SPECIAL)
        self.assertEqual(define("H2O_TOKENIZE_VOCAB_BOS"), _native.TOKENIZE_VOCAB_BOS)
        self.assertEqual(define("H2O_TEXT_PIN"), _native.TEXT_PIN)
        self.assertEqual(define("H2O_TEXT_SPECIAL"), _native.TEXT_SPECIAL)
        self.assertEqual(define("H2O_KV_HORIZON_NONE"), _native.KV_HORIZON_NONE)


if __name__ == "__main__":
    unittest.main()

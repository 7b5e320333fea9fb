#!/usr/bin/env bash
# The API reference of include/h2o/*.h: doxygen (docs/Doxyfile) writes HTML to DIR/html, and fails
# on any undocumented public function, type, field or macro; doxygen does not warn about
# enumeration values, so its XML is then read to require a description for every one of them.
# Usage: scripts/build-docs.sh [DIR]   (default: build/docs; open DIR/html/index.html)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/build/docs}"
"$root/scripts/install-deps.sh" doxygen
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -rf "$out/html" "$out/xml"
(cd "$root" && H2O_DOCS_DIR="$out" doxygen docs/Doxyfile)
python3 - "$out/xml" <<'PY'
import glob, sys
import xml.etree.ElementTree as ET

def text(node):
    return "".join(node.itertext()).strip() if node is not None else ""

missing = []
for path in glob.glob(sys.argv[1] + "/*.xml"):
    for value in ET.parse(path).iter("enumvalue"):
        if not text(value.find("briefdescription")) and not text(value.find("detaileddescription")):
            missing.append(value.findtext("name"))
if missing:
    sys.exit("h2o: enumeration values without a description: " + ", ".join(sorted(set(missing))))
PY
echo "h2o: the API reference is in $out/html/index.html"

#!/usr/bin/env bash
# Makes the C# binding's NuGet package (bindings/csharp/H2o.nuspec) with Debian's nuget (Mono):
# lib/netstandard2.0/ holds H2o.dll, its XML documentation and H2o.dll.config (Mono's map to the
# native library), runtimes/linux-x64/native/ the libh2o-llm.so of BUILD_DIR, and
# runtimes/linux-arm64/native/ that of ARM64_BUILD_DIR when one is given. Then it checks the
# package: its files, and its id, version, authors and description against H2o.csproj's; and it
# lays the package out as a .NET build's output folder (the assemblies beside the program, the
# native library under runtimes/RID/native) and runs a Mono program there, started from another
# folder with no LD_LIBRARY_PATH: it must find the native library through the package's layout.
# Usage: scripts/pack-nuget.sh BUILD_DIR [ARM64_BUILD_DIR]   -> BUILD_DIR/nuget/H2o.VERSION.nupkg
# The model is $H2O_MODEL, or ../shared/models/stories260K.gguf beside the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 1 ] || [ $# -gt 2 ]; then echo "usage: $0 BUILD_DIR [ARM64_BUILD_DIR]" >&2; exit 2; fi
build="$(cd "$1" && pwd)"
arm64="${2:+$(cd "$2" && pwd)}"
model="${H2O_MODEL:-$root/../shared/models/stories260K.gguf}"
[ -f "$model" ] || { echo "h2o: no model at $model (set H2O_MODEL)" >&2; exit 1; }
fail() { echo "h2o: $*" >&2; exit 1; }
"$root/scripts/install-deps.sh" mono-mcs mono-runtime nuget unzip
cs="$root/bindings/csharp"
start=$SECONDS

# The metadata the package and the project must share.
field() { sed -n "s|.*<$1>\(.*\)</$1>.*|\1|p" "$2" | head -n 1; }
for f in version authors description; do
  csproj_name="${f^}"
  [ "$f" != version ] || csproj_name=Version
  [ "$(field "$f" "$cs/H2o.nuspec")" = "$(field "$csproj_name" "$cs/H2o.csproj")" ] \
    || fail "H2o.nuspec's $f differs from H2o.csproj's $csproj_name"
done
[ "$(field id "$cs/H2o.nuspec")" = "$(field PackageId "$cs/H2o.csproj")" ] || fail "H2o.nuspec's id differs from H2o.csproj's PackageId"
version="$(field version "$cs/H2o.nuspec")"

echo "== NuGet package of the C# binding ($build${arm64:+, $arm64})"
stage="$build/nuget/stage"
rm -rf "$build/nuget"
mkdir -p "$stage/lib/netstandard2.0" "$stage/runtimes/linux-x64/native"
mcs -warnaserror -unsafe -target:library -doc:"$stage/lib/netstandard2.0/H2o.xml" -out:"$stage/lib/netstandard2.0/H2o.dll" "$cs"/src/*.cs
cp "$cs/H2o.dll.config" "$stage/lib/netstandard2.0/"
cp -L "$build/libh2o-llm.so" "$stage/runtimes/linux-x64/native/libh2o-llm.so"
if [ -n "$arm64" ]; then
  mkdir -p "$stage/runtimes/linux-arm64/native"
  cp -L "$arm64/libh2o-llm.so" "$stage/runtimes/linux-arm64/native/libh2o-llm.so"
  file -L "$stage/runtimes/linux-arm64/native/libh2o-llm.so" | grep -q "ARM aarch64" || fail "$arm64/libh2o-llm.so is not an ARM64 library"
fi
cp "$root/LICENSE" "$stage/LICENSE.txt"
nuget pack "$cs/H2o.nuspec" -BasePath "$stage" -OutputDirectory "$build/nuget" -NoPackageAnalysis >"$build/nuget/pack.log" 2>&1 \
  || { cat "$build/nuget/pack.log" >&2; fail "nuget pack failed"; }
package="$build/nuget/H2o.$version.nupkg"
[ -f "$package" ] || fail "nuget pack made no $package"

# The package's files.
listing="$(unzip -Z1 "$package")"
expected=(lib/netstandard2.0/H2o.dll lib/netstandard2.0/H2o.xml lib/netstandard2.0/H2o.dll.config
          runtimes/linux-x64/native/libh2o-llm.so LICENSE.txt H2o.nuspec)
[ -z "$arm64" ] || expected+=(runtimes/linux-arm64/native/libh2o-llm.so)
for f in "${expected[@]}"; do grep -qx "$f" <<<"$listing" || fail "the package lacks $f"; done
echo "  ok  layout: ${expected[*]}"

# A program's output folder as a .NET build makes it from the package, used from elsewhere. The
# library must not be found through the loader instead (an install in /usr/local, a package).
! ldconfig -p | grep -q 'libh2o-llm\.so ' || fail "libh2o-llm.so is installed on this machine: the test could not tell where Mono found it"
app="$build/nuget/app"
mkdir -p "$app/unpacked"
unzip -q "$package" -d "$app/unpacked"
cp "$app/unpacked/lib/netstandard2.0/"* "$app/"
cp -r "$app/unpacked/runtimes" "$app/"
mcs -warnaserror -r:"$app/H2o.dll" -out:"$app/Stream.exe" "$cs/samples/Stream.cs"
text="$(cd / && env -u LD_LIBRARY_PATH mono "$app/Stream.exe" "$model" "Once upon a time" 2>"$build/nuget/run.log")" \
  || { cat "$build/nuget/run.log" >&2; fail "the program using the packed H2o.dll failed"; }
[ ${#text} -gt 40 ] || fail "the program using the packed H2o.dll printed too little: $text"
echo "  ok  a Mono program finds the native library in the package's layout"
echo "== NuGet package $package passed in $((SECONDS - start)) s"

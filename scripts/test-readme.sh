#!/usr/bin/env bash
# Runs README.md's shell command blocks (```sh) as a new user would: in order, each from the
# checkout's root, in a fresh copy of the checkout (its tracked and unignored files: no build
# folders) with the shared data folder beside it. Each block runs in its own `bash -e -o pipefail`,
# so every command must succeed; the first block that fails ends the test, with its README line
# and the end of its output. The blocks in `not_run` below are only checked for syntax, each for
# the reason given there; an entry that does not match exactly one block fails the test, so the
# list cannot go stale. A shell block tagged otherwise than `sh` fails it too.
# The blocks of docs/*.md reproduce measurements (minutes to hours each): they are checked for
# syntax, and every option they give a program of build/tools must be one its --help lists.
# The README's Installing section installs h2o into /usr/local: run this as root on a machine
# without h2o there (CI does). What that section installed is removed at the end.
# Usage: scripts/test-readme.sh   (the shared data folder: $H2O_SHARED_DIR, else ../shared;
# H2O_README_KEEP_BUILD=DIR: after passing, the quick start's build folder is moved to DIR)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
shared="${H2O_SHARED_DIR:-$root/../shared}"
[ -f "$shared/models/stories260K.gguf" ] || { echo "h2o: no shared data folder at $shared (set H2O_SHARED_DIR)" >&2; exit 1; }
shared="$(cd "$shared" && pwd)"
[ "$(id -u)" -eq 0 ] || { echo "h2o: run as root: the README installs packages, and h2o into /usr/local" >&2; exit 1; }
[ ! -e /usr/local/include/h2o/h2o.h ] \
  || { echo "h2o: /usr/local already holds an h2o install, which the README's would replace and this test remove" >&2; exit 1; }

# Blocks checked for syntax only, each found by a part of its text, and why.
declare -A not_run=(
  ["-max_total_time=14400"]="fuzzes for 4 hours; scripts/ci-matrix.sh builds, replays and fuzzes the same targets"
  ["ctest --test-dir build --output-on-failure"]="the quick start's scripts/test.sh ran these same steps (install-deps --test, configure, build, ctest) in the same folder"
  ["scripts/ci-arm64.sh"]="CI runs scripts/ci-arm64.sh itself (the cross build and the tests under qemu)"
  ["H2O_CPU_KERNELS=\$k"]="runs on an ARM64 device, h2o-bench and the library copied there"
)

# The ```sh blocks of a Markdown file: their text into `texts`, the line where each starts into
# `lines`.
read_blocks() {
  local file="$1" n=0 fence="" text="" start=0 line
  texts=()
  lines=()
  while IFS= read -r line; do
    n=$((n + 1))
    if [ -z "$fence" ]; then
      [[ "$line" == '```'* ]] || continue
      fence="${line#'```'}"
      fence="${fence:--}"
      case "$fence" in
        sh) text="" start=$((n + 1)) ;;
        bash | shell | console | -) echo "h2o: ${file#"$root"/}:$n: tag shell command blocks \`\`\`sh (so that this test reads them)" >&2; exit 1 ;;
      esac
    elif [ "$line" = '```' ]; then
      if [ "$fence" = sh ]; then
        texts+=("$text")
        lines+=("$start")
      fi
      fence=""
    elif [ "$fence" = sh ]; then
      text+="$line"$'\n'
    fi
  done <"$file"
  [ -z "$fence" ] || { echo "h2o: ${file#"$root"/}: a code block is not closed" >&2; exit 1; }
}
read_blocks "$root/README.md"

# The reason a block is not run, or nothing.
reason_not_run() {
  local part
  for part in "${!not_run[@]}"; do
    if [[ "$1" == *"$part"* ]]; then echo "${not_run[$part]}"; fi
  done
}
for part in "${!not_run[@]}"; do
  found=0
  for text in "${texts[@]}"; do [[ "$text" != *"$part"* ]] || found=$((found + 1)); done
  [ $found -eq 1 ] || { echo "h2o: scripts/test-readme.sh: $found README blocks hold '$part' (one should)" >&2; exit 1; }
done

work="$(mktemp -d)"
copy="$work/h2o"
mkdir -p "$copy" "$work/logs"
ln -s "$shared" "$work/shared"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) \
  | tar -C "$copy" -xf -
passed=0
cleanup() {
  # The README's install into /usr/local, when its own last block did not remove it (tests
  # that install into temporary folders write the manifest too).
  if grep -qs '^/usr/local/' "$copy/build/install_manifest.txt"; then "$root/scripts/uninstall.sh" "$copy/build" || true; fi
  if [ $passed -eq 1 ]; then
    if [ -n "${H2O_README_KEEP_BUILD:-}" ]; then rm -rf "$H2O_README_KEEP_BUILD" && mv "$copy/build" "$H2O_README_KEEP_BUILD"; fi
    rm -rf "$work"
  else
    echo "h2o: the copy and each block's output stay in $work" >&2
  fi
}
trap cleanup EXIT

start=$SECONDS
echo "== README.md's command blocks, in a fresh copy of the checkout ($copy)"
for i in "${!texts[@]}"; do
  text="${texts[$i]}"
  where="README.md:${lines[$i]}"
  first="$(printf '%s\n' "$text" | head -n 1)"
  reason="$(reason_not_run "$text")"
  if [ -n "$reason" ]; then
    bash -n -c "$text" || { echo "h2o: $where: not valid shell" >&2; exit 1; }
    echo "  syntax only  $where: $reason"
    continue
  fi
  log="$work/logs/README-${lines[$i]}.log"
  block_start=$SECONDS
  if ! (cd "$copy" && env -u H2O_MODEL -u H2O_SHARED_DIR -u LD_LIBRARY_PATH bash -e -o pipefail -c "$text") >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    printf 'h2o: %s failed after %s s:\n%s' "$where" $((SECONDS - block_start)) "$text" >&2
    exit 1
  fi
  echo "  ok  $where ($((SECONDS - block_start)) s): $first"
done
echo "== README.md's command blocks passed in $((SECONDS - start)) s"

# The documents' blocks: syntax, and the options of the programs they run (built above) and of
# the Python scripts of scripts/ they run.
for doc in "$root"/docs/*.md; do
  read_blocks "$doc"
  for i in "${!texts[@]}"; do
    text="${texts[$i]}"
    where="${doc#"$root"/}:${lines[$i]}"
    bash -n -c "$text" || { echo "h2o: $where: not valid shell" >&2; exit 1; }
    help=""
    for tool in $(printf '%s' "$text" | grep -o 'build/tools/h2o-[a-z-]*' | sort -u); do
      [ -x "$copy/$tool" ] || { echo "h2o: $where: $tool is not a program the build makes" >&2; exit 1; }
      help+="$("$copy/$tool" --help 2>&1 || true)"$'\n'
    done
    for script in $(printf '%s' "$text" | grep -o 'scripts/[a-z-]*\.py' | sort -u); do
      [ -f "$copy/$script" ] || { echo "h2o: $where: $script is not in the checkout" >&2; exit 1; }
      help+="$(python3 "$copy/$script" --help 2>&1 || true)"$'\n'
    done
    for option in $(printf '%s' "$text" | grep -o -- ' --[a-z][a-z0-9-]*' | sort -u); do
      grep -q -- "$option\b" <<<"$help" || { echo "h2o: $where: no program of the block takes $option" >&2; exit 1; }
    done
    echo "  syntax and options  $where"
  done
done
passed=1

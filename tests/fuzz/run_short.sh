#!/usr/bin/env bash
# One short fuzz run for CTest (docs/fuzzing.md):
#   run_short.sh FUZZ_BUILD_DIR TARGET SECONDS
# Runs FUZZ_BUILD_DIR/bin/fuzz_TARGET for SECONDS over the seeds and the
# regression inputs of this directory (tests/fuzz/corpus/TARGET,
# tests/fuzz/regressions/TARGET), with its dictionary. New inputs go to a
# scratch directory, never into the tree; a crash is saved under
# FUZZ_BUILD_DIR/artifacts/TARGET/ and printed in base64. Exit 0: no crash;
# 77: skipped (ST_FUZZ_SKIP says why, or the binary is not built).
set -u
build=$1 target=$2 seconds=$3
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/bin/fuzz_$target
if [ -n "${ST_FUZZ_SKIP:-}" ]; then
  echo "skipped: $ST_FUZZ_SKIP"
  exit 77
fi
if [ ! -x "$bin" ]; then
  echo "skipped: $bin is not built"
  exit 77
fi
scratch=$(mktemp -d "${TMPDIR:-/tmp}/st-fuzz-$target.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
artifacts=$build/artifacts/$target
mkdir -p "$artifacts"
dirs=("$scratch")
for d in "$here/corpus/$target" "$here/regressions/$target"; do
  [ -d "$d" ] && dirs+=("$d")
done
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# -timeout: one input may take the load limit of config.lua (10 s) and
# more on a loaded machine; beyond that it hangs. -rss_limit_mb: far
# above what any input needs. libFuzzer's own exit code for a crash is 77,
# which CTest reads as "skipped": a failure must exit 1.
"$bin" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 -max_len=65536 \
  -error_exitcode=1 -timeout_exitcode=1 \
  -dict="$here/dict/$target.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 \
  "${dirs[@]}" 2>&1 | grep -v -e '^#[0-9]*[[:space:]]*\(NEW\|REDUCE\|pulse\)' -e ' # Uses: '
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    echo "--- $f (base64):"
    base64 "$f" | head -c 20000
    echo
  done
  echo "fuzz_$target failed (exit $rc); reproduce: $bin $artifacts/<file>"
  exit 1
fi
exit 0

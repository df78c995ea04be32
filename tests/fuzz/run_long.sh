#!/usr/bin/env bash
# The long fuzz run (docs/fuzzing.md): every target (or those named) for N
# executions in all, spread over J parallel jobs, then one line per target:
# executions, exec/s (all jobs together, and per job), coverage (edges and
# features), corpus size, and the crashes found (crash-, leak-, timeout-
# and oom- files; 0 is the pass).
#
#   run_long.sh [-n EXECUTIONS] [-t SECONDS] [-j JOBS] [-o OUTDIR] [-b BINDIR] [TARGET ...]
#
# -t stops each job of a target after SECONDS even when its share of the
# executions is not done (for the slow targets: result, config).
# Defaults: 10,000,000 executions per target, no time limit, one job per CPU, output in
# ./fuzz-long-<date>, binaries in bin/ beside this script. Seeds,
# dictionaries and regression inputs are read beside it (corpus/, dict/,
# regressions/): the fuzz build directory (build/tests/fuzz) holds copies
# of them with the script, so it runs there with bash alone, on any host
# that has the binaries' shared libraries (libluajit-5.1, libmsgpackc).
# Each target's new inputs, logs and crashes stay in OUTDIR/<target>/.
set -u
here=$(cd "$(dirname "$0")" && pwd)
runs=10000000
jobs=$(nproc 2>/dev/null || echo 2)
out=./fuzz-long-$(date +%Y%m%d-%H%M%S)
bindir=$here/bin
seconds=0
while getopts "n:t:j:o:b:h" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    t) seconds=$OPTARG ;;
    j) jobs=$OPTARG ;;
    o) out=$OPTARG ;;
    b) bindir=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for b in "$bindir"/fuzz_*; do
    [ -x "$b" ] && targets+=("${b##*/fuzz_}")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz_* binaries in $bindir" >&2
  exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
bindir=$(cd "$bindir" 2>/dev/null && pwd) || { echo "no directory $bindir" >&2; exit 2; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
per_job=$(( (runs + jobs - 1) / jobs ))

# Sums the per-job final stats of one target's logs: executions, the sum
# of the jobs' exec/s, the highest cov: and ft: figures, and the corpus.
summarize() {
  local dir=$1 t=$2 secs=$3
  local execs rate cov ft crashes corp
  execs=$(cat "$dir"/fuzz-*.log 2>/dev/null | awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}')
  rate=$(cat "$dir"/fuzz-*.log 2>/dev/null | awk '/stat::average_exec_per_sec/ {s += $2; n++} END {printf "%d", n ? s / n : 0}')
  cov=$(cat "$dir"/fuzz-*.log 2>/dev/null | grep -o 'cov: [0-9]*' | awk '{if ($2 > m) m = $2} END {print m + 0}')
  ft=$(cat "$dir"/fuzz-*.log 2>/dev/null | grep -o 'ft: [0-9]*' | awk '{if ($2 > m) m = $2} END {print m + 0}')
  crashes=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  corp=$(find "$dir/corpus" -type f | wc -l)
  printf "%-12s %12s %10s %10s %8s %8s %8s %8s\n" "$t" "$execs" \
    "$(( secs > 0 ? execs / secs : execs ))" "$rate" "$cov" "$ft" "$corp" "$crashes"
}

header=$(printf "%-12s %12s %10s %10s %8s %8s %8s %8s" target executions "exec/s" "exec/s/job" cov ft corpus crashes)
results=()
failed=0
for t in "${targets[@]}"; do
  bin=$bindir/fuzz_$t
  if [ ! -x "$bin" ]; then
    echo "skipping $t: no $bin" >&2
    continue
  fi
  dir=$out/$t
  mkdir -p "$dir/corpus"
  seeds=()
  for d in "$here/corpus/$t" "$here/regressions/$t"; do
    [ -d "$d" ] && seeds+=("$d")
  done
  dict=()
  [ -f "$here/dict/$t.dict" ] && dict=(-dict="$here/dict/$t.dict")
  echo "== $t: $runs executions, $jobs jobs of $per_job (logs in $dir)"
  start=$(date +%s)
  (cd "$dir" && "$bin" -jobs="$jobs" -workers="$jobs" -runs="$per_job" -timeout=60 \
     -max_total_time="$seconds" \
     -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$dir/" \
     "${dict[@]}" "$dir/corpus" "${seeds[@]}" > "$dir/driver.log" 2>&1)
  secs=$(( $(date +%s) - start ))
  if ! ls "$dir"/fuzz-*.log > /dev/null 2>&1; then
    echo "$t did not run:" >&2
    tail -5 "$dir/driver.log" >&2
    failed=$((failed + 1))
  fi
  line=$(summarize "$dir" "$t" "$secs")
  echo "$header"
  echo "$line   (${secs} s)"
  results+=("$line   (${secs} s)")
done
echo
echo "== all targets ($jobs jobs, $(uname -n), $(date -u +%Y-%m-%dT%H:%MZ))"
echo "$header"
printf "%s\n" "${results[@]}"
total=0
for t in "${targets[@]}"; do
  n=$(find "$out/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) 2>/dev/null | wc -l)
  total=$((total + n))
done
echo "crashes in all: $total"
[ "$failed" -eq 0 ] || echo "targets that did not run: $failed"
[ "$total" -eq 0 ] && [ "$failed" -eq 0 ]

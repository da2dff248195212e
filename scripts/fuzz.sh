#!/usr/bin/env bash
# Builds the fuzz targets of test/fuzz with clang (libFuzzer, AddressSanitizer,
# UndefinedBehaviorSanitizer) and runs each. They are built in the asan
# preset's tree, build/asan (EFA_FUZZ), beside the suite that
# `scripts/sanitizers.sh asan` runs: after that stage only the fuzz targets'
# own files compile.
#   scripts/fuzz.sh                  10 seconds per target (the CI run)
#   scripts/fuzz.sh 300              300 seconds per target
#   scripts/fuzz.sh --runs 1000000   1,000,000 executions per target (the long run)
#   scripts/fuzz.sh 60 kubelet_checkpoint config_yaml    only these targets
# Targets run one per core at a time. Each starts from its seed corpus,
# test/fuzz/corpus/<name> (never written), plus what earlier runs kept in
# build/asan/fuzz/corpus/<name>, where new inputs go; a crashing input is
# saved in build/asan/fuzz/artifacts/<name>/.
# Prints one line per target (executions, executions per second, corpus
# inputs/bytes, crashes) and exits 1 when any target crashed, leaked, timed
# out or ran out of memory. EFA_FUZZ_JOBS: build jobs (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

limit=(-max_total_time=10)
if [ $# -gt 0 ]; then
  case "$1" in
    --runs)
      [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS|--runs N] [TARGET...]" >&2; exit 2; }
      limit=(-runs="$2")
      shift 2
      ;;
    *[!0-9]*|"") ;;  # a target name: keep the default time
    *)
      limit=(-max_total_time="$1")
      shift
      ;;
  esac
fi

scripts/install-deps.sh
cmake --preset asan >/dev/null
build=build/asan
work=$build/fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in test/fuzz/*_fuzz.cc; do
    name=$(basename "$f" _fuzz.cc)
    targets+=("$name")
  done
fi
cmake --build "$build" -j"${EFA_FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/%/_fuzz}"

# fuzz_one NAME: runs one target; its line goes to $work/logs/NAME.result,
# ending in FAILED when it failed.
fuzz_one() {
  local name=$1 corpus artifacts log before status runs speed size crashes line
  corpus="$work/corpus/$name"
  artifacts="$work/artifacts/$name"
  log="$work/logs/$name.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  rm -f "$work/logs/$name.result"
  before=$(find "$artifacts" -type f | wc -l)
  echo "fuzz: running $name (${limit[*]})" >&2
  status=0
  "$build/test/fuzz/${name}_fuzz" "${limit[@]}" -print_final_stats=1 -timeout=25 \
    -rss_limit_mb=2048 -artifact_prefix="$artifacts/" "$corpus" "test/fuzz/corpus/$name" \
    >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # libFuzzer's corpus at the end: "corp: 457/72Kb" (inputs/bytes).
  size=$(grep -ao 'corp: [0-9]*/[0-9a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
  crashes=$(($(find "$artifacts" -type f | wc -l) - before))
  line="fuzz: $name: ${runs:-?} executions, ${speed:-?} exec/s, corpus ${size:-?}, $crashes new crash(es)"
  if [ "$status" -ne 0 ]; then
    line="$line, FAILED (exit $status; see $log)"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*fuzz check failed|.*runtime error)' "$log" | head -5 >&2 || true
  fi
  echo "$line" >"$work/logs/$name.result"
}

# One target per core at a time (each is one process, one thread): the
# same time and a core each, in fewer rounds.
parallel=$(nproc)
running=0
for name in "${targets[@]}"; do
  fuzz_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
failed=0
for name in "${targets[@]}"; do
  line=$(cat "$work/logs/$name.result" 2>/dev/null || echo "fuzz: $name: no result, FAILED")
  echo "$line"
  case "$line" in *FAILED*) failed=1 ;; esac
done
exit "$failed"

#!/usr/bin/env bash
# The sanitizer stages of the test suite (`scripts/test.sh --all` runs them
# after the ci preset):
#   asan  the whole suite but e2e, packaging and bench, built with clang's
#         AddressSanitizer + UndefinedBehaviorSanitizer (preset asan, -O1),
#         two tests at a time
#   tsan  the concurrency tests (Catch2 tag [concurrency]: every test with
#         threads or a daemon process; only the test files that have one are
#         compiled) under clang's ThreadSanitizer (preset tsan), with
#         abseil rebuilt with TSan (scripts/tsan-abseil.sh) so absl::Mutex
#         is seen in our code and in gRPC
#   fuzz  every libFuzzer target for EFA_FUZZ_SECONDS (default 10) seconds
#         (scripts/fuzz.sh), built in the asan stage's tree: after it, only
#         the fuzz targets' own files compile
#   scripts/sanitizers.sh [asan|tsan|fuzz]...   (default: all three)
# Every process the tests start (the daemon binary too) writes its reports
# to build/<preset>/sanitizer-reports/; a report fails the stage even when
# the process that wrote it was not watched. EFA_FAULT_CALLS (default 1000)
# lowers the calls per client of the 16-client fault test, which the ci
# preset runs at 10,000.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan fuzz)
export EFA_FAULT_CALLS="${EFA_FAULT_CALLS:-1000}"
say() { echo "sanitizers: $*" >&2; }

# run_preset PRESET "TARGET..." VAR=VALUE...: builds the targets (all when
# empty), runs the preset's CTest with the variables set and the reports
# going to a fresh directory, then fails if any process wrote one.
run_preset() {
  local preset=$1 targets=$2
  shift 2
  local reports="$PWD/build/$preset/sanitizer-reports"
  # A tree configured by an older preset (the asan preset was GCC's) cannot
  # change compiler in place: configured afresh.
  cmake --preset "$preset" >/dev/null 2>&1 || { rm -rf "build/$preset"; cmake --preset "$preset" >/dev/null; }
  # shellcheck disable=SC2086 # the target list is split on purpose
  cmake --build --preset "$preset" -j2 ${targets:+--target $targets}
  rm -rf "$reports" && mkdir -p "$reports"
  local status=0
  env "$@" ctest --preset "$preset" || status=$?
  if compgen -G "$reports/*" >/dev/null; then
    say "$preset: sanitizer reports in $reports:"
    for f in "$reports"/*; do
      echo "---- $f"
      cat "$f"
    done
    # Again the start of each (the kind of report and the racing stacks), so
    # the end of the log, which is what a CI summary shows, names them.
    for f in "$reports"/*; do
      say "$preset: start of $f:"
      head -40 "$f"
    done
    return 1
  fi
  [ "$status" -eq 0 ] || { say "$preset: tests failed"; return "$status"; }
  say "$preset: passed, no sanitizer report"
}

for stage in "${stages[@]}"; do
  started=$SECONDS
  case "$stage" in
    asan)
      # What the suite runs without e2e, packaging, bench and the lifecycle
      # test (its full descriptor table starves the sanitizer's runtime).
      run_preset asan "efa_tests efa-simnode efa-k8s-device-plugin efa_fuzz_corpora" \
        ASAN_OPTIONS="log_path=$PWD/build/asan/sanitizer-reports/asan:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1" \
        UBSAN_OPTIONS="log_path=$PWD/build/asan/sanitizer-reports/ubsan:print_stacktrace=1:halt_on_error=1"
      ;;
    tsan)
      # The instrumented abseil: the tsan test preset puts its directory
      # (build/tsan-absl/lib) first in LD_LIBRARY_PATH.
      scripts/tsan-abseil.sh >/dev/null
      # Only what the [concurrency] tests and verbs_crosscheck run.
      run_preset tsan "efa_tests efa-simnode efa-k8s-device-plugin" \
        TSAN_OPTIONS="log_path=$PWD/build/tsan/sanitizer-reports/tsan:halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/test/tsan.supp"
      ;;
    fuzz)
      scripts/fuzz.sh "${EFA_FUZZ_SECONDS:-10}"
      ;;
    *)
      say "unknown stage '$stage' (asan, tsan or fuzz)"
      exit 2
      ;;
  esac
  say "$stage: $((SECONDS - started)) s"
done

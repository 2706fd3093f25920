#!/usr/bin/env bash
# test.sh: builds pprun twice (release, and ASan+UBSan) and runs every test
# in both, then builds the libFuzzer targets (tests/fuzz/, with clang) and
# runs each for a bounded time. Prints each Criterion executable's synthesis
# line and each fuzzer's runs, and ends with one total line "N passed, N
# failed, N skipped" (skips are not passes: GPU tests skip, saying why, where
# there is no GPU; a fuzzer that ran its time clean is one pass). Exit
# status non-zero on any failure.
#
#   scripts/test.sh            all three
#   scripts/test.sh release    one build (release | sanitize | fuzz)
#   PPRUN_FUZZ_SECONDS=600 scripts/test.sh fuzz   each fuzzer longer (default 60)
set -uo pipefail
cd "$(dirname "$0")/.."

builds=("${@:-release sanitize fuzz}")
read -r -a builds <<<"${builds[*]}"
jobs=$(nproc)
total_pass=0
total_fail=0
total_skip=0
status=0

run_build() {
  local kind=$1 dir=build-test-$1 flags=()
  # The sanitizers at -O1 (with asserts), as AddressSanitizer's own
  # documentation advises: half the time of -O0 for the same checks.
  [ "$kind" = sanitize ] && flags=(-DPPRUN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
    "-DCMAKE_C_FLAGS_DEBUG=-g -O1" "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1")
  echo "== $kind build"
  if ! cmake -S . -B "$dir" "${flags[@]}" >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; return 1
  fi
  if ! cmake --build "$dir" -j"$jobs" >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; return 1
  fi
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    local name log
    name=$(basename "$t")
    log="$dir/$name.log"
    echo "-- $kind/$name"
    # One test at a time per executable: integration tests start many
    # processes and the CI machine has 2 cores.
    # --verbose so that skipped tests and their reasons reach the log.
    "$t" --jobs 1 --timeout 300 --verbose >"$log" 2>&1
    local rc=$?
    local line
    line=$(grep -a 'Synthesis:' "$log" | tail -1)
    if [ -z "$line" ]; then
      tail -40 "$log"; echo "$name: no Criterion synthesis line (exit $rc)"
      total_fail=$((total_fail + 1)); status=1; continue
    fi
    echo "$line"
    # A skip is not a pass: say how many and why (e.g. no CUDA device).
    local skips
    skips=$(grep -a -c '^\[SKIP\]' "$log")
    total_skip=$((total_skip + skips))
    if [ "$skips" -gt 0 ]; then
      echo "   $skips skipped: $(grep -a '^\[SKIP\]' "$log" | sed 's/^\[SKIP\] [^ ]*: //' | sort | uniq -c | head -3 | tr -s ' ' | paste -sd';')"
    fi
    local tested failing crashing
    tested=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$line")
    failing=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$line")
    crashing=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$line")
    total_pass=$((total_pass + tested - failing - crashing))
    total_fail=$((total_fail + failing + crashing))
    if [ "$rc" -ne 0 ] || [ "$failing" -ne 0 ] || [ "$crashing" -ne 0 ]; then
      grep -a -E '\[----\]|\[FAIL\]|CRASH|ERROR|Sanitizer' "$log" | head -40
      status=1
    fi
  done
}

# Each fuzzer over a copy of its seed corpus (tests/fuzz/corpus/NAME/), for
# PPRUN_FUZZ_SECONDS; a crash, leak, timeout or abort fails it, and its
# reproducer is left in build-test-fuzz/ (crash-*, leak-*, timeout-*).
run_fuzz() {
  local dir=build-test-fuzz seconds=${PPRUN_FUZZ_SECONDS:-60}
  echo "== fuzz build"
  if ! CC=clang cmake -S . -B "$dir" -DPPRUN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; return 1
  fi
  if ! cmake --build "$dir" -j"$jobs" --target fuzzers >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; return 1
  fi
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  for t in "$dir"/fuzz_*; do
    [ -x "$t" ] || continue
    local name corpus log
    name=$(basename "$t")
    corpus=$(mktemp -d)
    cp -r "tests/fuzz/corpus/$name/." "$corpus/" 2>/dev/null || true
    log="$dir/$name.log"
    echo "-- fuzz/$name"
    (cd "$dir" && "./$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "$corpus") >"$log" 2>&1
    local rc=$?
    rm -rf "$corpus"
    local runs
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ "$rc" -eq 0 ] && [ -n "$runs" ]; then
      echo "   $runs runs in ${seconds}s, no finding"
      total_pass=$((total_pass + 1))
    else
      grep -a -E 'ERROR|SUMMARY|Test unit written|fuzz_' "$log" | head -20
      echo "   $name: a finding (exit $rc); see $log"
      total_fail=$((total_fail + 1)); status=1
    fi
  done
}

for b in "${builds[@]}"; do
  if [ "$b" = fuzz ]; then
    run_fuzz || { echo "fuzz build failed"; status=1; total_fail=$((total_fail + 1)); }
    continue
  fi
  run_build "$b" || { echo "$b build failed"; status=1; total_fail=$((total_fail + 1)); }
done
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status

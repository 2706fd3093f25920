#!/usr/bin/env bash
# test.sh: builds pprun twice (release, and ASan+UBSan) and runs every test
# in both, then builds the libFuzzer targets (tests/fuzz/, with clang) and
# runs each for a bounded time. Prints each Criterion executable's synthesis
# line and each fuzzer's runs, and ends with one total line "N passed, N
# failed, N skipped" (skips are not passes: GPU tests skip, saying why, where
# there is no GPU; a fuzzer that ran its time clean is one pass). Exit
# status non-zero on any failure.
#
# Time (CI's limit is 40 minutes on 2 cores): most integration tests wait
# more than they compute (timeouts, restarts, daemons), so a build's test
# executables run PPRUN_TEST_PARALLEL at a time (default: the cores, at
# most 4), the longest first, each running its own tests one at a time;
# the tests in `alone` below run first with nothing beside them, and one of those in
# `waiting` at a time runs beside the others in a slot of its own (they
# wait on daemons, restarts and timeouts: 14-26% of a core). Meanwhile the next
# build compiles at the lowest priority. The fuzzers run a core each.
#
#   scripts/test.sh            all three
#   scripts/test.sh release    one build (release | sanitize | fuzz)
#   PPRUN_FUZZ_SECONDS=600 scripts/test.sh fuzz   each fuzzer longer (default 60)
#   PPRUN_TEST_PARALLEL=1 scripts/test.sh         one executable at a time
set -uo pipefail
cd "$(dirname "$0")/.."

builds=("${@:-release sanitize fuzz}")
read -r -a builds <<<"${builds[*]}"
jobs=$(nproc)
parallel=${PPRUN_TEST_PARALLEL:-$((jobs < 4 ? jobs : 4))}
total_pass=0
total_fail=0
total_skip=0
status=0
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

# Beside each other, the longest first (CI's order of wall time), so that
# short ones fill the end; the others follow in name order.
longest=(test_torch test_gpu_run_emu test_browser test_launch_multinode test_web test_attack_launch test_run
  test_slurm test_attack_files test_gpu_stage_emu test_gpu_mps_emu test_devcomm)
# The tests of an executable run first with nothing beside them (not even
# the next build), as EXECUTABLE:FILTER (a Criterion pattern); the rest of
# it runs in the pool. test_torch's what-if compares PyTorch's measured
# steps with the simulator's, which any other load skews (0.85-1.07
# measured alone, 0.75-1.25 allowed; 0.75 once in three beside a build at
# nice 19); its other tests, 240 s of CI's release run, leave a quarter of
# the cores idle (150% CPU).
alone=("test_torch:*what_if*")
# Not in the sanitize build: their time goes to Python with PyTorch and to
# Chromium, which no sanitizer instruments (libpprun_trace, which Python
# loads, is never sanitized: CMakeLists.txt), while the pprun code they
# drive (the launcher, the collector, the web server) runs sanitized in
# the other executables. The release build runs them.
release_only=" test_torch test_browser "
# Mostly waiting (their CPU over their wall time, alone: test_launch_multinode
# 14%, test_slurm 18%, test_attack_launch 21%, test_gpu_mps_emu 26%; most
# others 40-60%): one at a time takes no pool slot, so the CPU they leave
# idle goes to the others (about 4 minutes of CI's run).
waiting=" test_launch_multinode test_slurm test_attack_launch test_gpu_mps_emu "

# One executable (KIND PATH [NAME FILTER]: only the tests FILTER matches,
# reported as NAME), its tests one at a time (integration tests start many
# processes), --verbose so that skipped tests and their reasons reach the
# log. Writes what it reports to $results/NAME.report and its counts
# "passed failed skipped" to $results/NAME.counts.
run_exe() {
  local kind=$1 t=$2 name=${3:-$(basename "$2")} filter=${4:-} log rc line skipped skips tested failing crashing began=$SECONDS
  log=$(dirname "$t")/$name.log
  "$t" --jobs 1 --timeout 300 --verbose ${filter:+--filter "$filter"} >"$log" 2>&1
  rc=$?
  exec >"$results/$name.report"
  # its wall time, so that a run that nears CI's limit shows what to look at
  echo "-- $kind/$name ($((SECONDS - began)) s)"
  line=$(grep -a 'Synthesis:' "$log" | tail -1)
  if [ -z "$line" ]; then
    tail -40 "$log"; echo "$name: no Criterion synthesis line (exit $rc)"
    echo "0 1 0" >"$results/$name.counts"; return
  fi
  echo "$line"
  # A skip is not a pass: say how many and why (e.g. no CUDA device).
  # (a test its filter leaves out is listed as "Test is disabled": not run, not a skip)
  skipped=$(grep -a '^\[SKIP\]' "$log" | grep -a -v ': Test is disabled$')
  skips=$(grep -c . <<<"$skipped")
  if [ "$skips" -gt 0 ]; then
    echo "   $skips skipped: $(sed 's/^\[SKIP\] [^ ]*: //' <<<"$skipped" | sort | uniq -c | head -3 | tr -s ' ' | paste -sd';')"
  fi
  tested=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$line")
  failing=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$line")
  crashing=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$line")
  local failed=$((failing + crashing))
  # a filter that matches nothing (a test renamed) runs nothing: no pass
  if [ -n "$filter" ] && [ "$tested" -eq 0 ]; then echo "$name: no test matches $filter"; failed=1; fi
  # The runner's own failure (a sanitizer's report at its exit) is one more.
  [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
  if [ "$failed" -ne 0 ]; then
    grep -a -E '\[----\]|\[FAIL\]|CRASH|ERROR|Sanitizer' "$log" | head -40
  fi
  echo "$((tested - failing - crashing)) $failed $skips" >"$results/$name.counts"
}

# Adds an executable's counts to the totals and prints its report.
collect() {
  local name=$1 p f s
  collected=$((collected + 1))
  cat "$results/$name.report" 2>/dev/null
  if ! read -r p f s 2>/dev/null <"$results/$name.counts"; then
    echo "-- $name: its run ended without a report (killed?)"
    p=0 f=1 s=0
  fi
  rm -f "$results/$name.report" "$results/$name.counts"
  total_pass=$((total_pass + p)) total_fail=$((total_fail + f)) total_skip=$((total_skip + s))
  [ "$f" -eq 0 ] || status=1
}

# The pool: the background runs by pid, and the name each reports under.
# pool_wait_one collects the next to end; pool_taken counts the slots taken
# (every run, less one of those in `waiting`: theirs is a slot of its own).
declare -A running_name=()
pool_taken() {
  local pid w=0
  for pid in "${!running_name[@]}"; do [[ $waiting == *" ${running_name[$pid]} "* ]] && w=1; done
  echo $((${#running_name[@]} - w))
}
pool_wait_one() {
  local pid
  wait -n -p pid "${!running_name[@]}"
  collect "${running_name[$pid]}"
  unset "running_name[$pid]"
}

# Configures and builds build-test-KIND, its output in build-test-KIND.*.log;
# status 0 when built.
build() {
  local kind=$1 dir=build-test-$1 flags=() target=() cc=
  # The sanitizers at -O1 (with asserts), as AddressSanitizer's own
  # documentation advises: half the time of -O0 for the same checks.
  [ "$kind" = sanitize ] && flags=(-DPPRUN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
    "-DCMAKE_C_FLAGS_DEBUG=-g -O1" "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1")
  [ "$kind" = fuzz ] && flags=(-DPPRUN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug) target=(--target fuzzers) cc=clang
  rm -f "$dir.build.log"
  env ${cc:+CC=$cc} cmake -S . -B "$dir" "${flags[@]}" >"$dir.configure.log" 2>&1 || return 1
  cmake --build "$dir" -j"$jobs" "${target[@]}" >"$dir.build.log" 2>&1
}

# The next build compiles while this one's tests run, at the lowest
# priority (nice 19): it takes the cores those tests leave idle, not
# theirs. start_build KIND starts it; finish_build KIND waits for it (or
# builds it now, when nothing started it) and prints why it failed.
declare -A build_pid=()
start_build() {
  (renice -n 19 "$BASHPID" >/dev/null; build "$1"; echo $? >"$results/build-$1.rc") &
  build_pid[$1]=$!
}
finish_build() {
  local kind=$1 dir=build-test-$1
  echo "== $kind build ($SECONDS s into the run)"
  if [ -n "${build_pid[$kind]:-}" ]; then
    wait "${build_pid[$kind]}"
  else
    build "$kind"; echo $? >"$results/build-$kind.rc"
  fi
  [ "$(cat "$results/build-$kind.rc")" = 0 ] && return 0
  if [ -s "$dir.build.log" ]; then tail -50 "$dir.build.log"; else cat "$dir.configure.log"; fi
  return 1
}

# Runs build-test-KIND's tests: the ones run alone first, then NEXT (a
# build to come, or nothing) starts compiling, then the others beside each
# other.
run_tests() {
  local kind=$1 next=$2 dir=build-test-$1 order=() t name expected=0 entry filter
  collected=0
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  for name in "${longest[@]}"; do [ -x "$dir/$name" ] && order+=("$dir/$name"); done
  for t in "$dir"/test_*; do
    [ -x "$t" ] && [[ " ${longest[*]} " != *" $(basename "$t") "* ]] && order+=("$t")
  done
  for entry in "${alone[@]}"; do
    name=${entry%%:*} filter=${entry#*:}
    [[ $entry == *:?* ]] || { echo "scripts/test.sh: alone entry '$entry' is not EXECUTABLE:FILTER"; return 1; }
    [ -x "$dir/$name" ] && ! { [ "$kind" = sanitize ] && [[ $release_only == *" $name "* ]]; } || continue
    (run_exe "$kind" "$dir/$name" "$name.alone" "$filter")
    collect "$name.alone"
    expected=$((expected + 1))
  done
  for t in "${order[@]}"; do
    name=$(basename "$t") filter=
    if [ "$kind" = sanitize ] && [[ $release_only == *" $name "* ]]; then
      echo "-- $kind/$name: run by the release build only (its time is in Python or Chromium)"
      continue
    fi
    # (one entry an executable: a second's tests would run twice)
    for entry in "${alone[@]}"; do [ "${entry%%:*}" = "$name" ] && filter="!(${entry#*:})"; done
    [ -n "$next" ] && [ -z "${build_pid[$next]:-}" ] && start_build "$next"
    # a waiting one beside no other takes no slot: started at once
    if [[ $waiting != *" $name "* ]] || [ "$(pool_taken)" -lt "${#running_name[@]}" ]; then
      while [ "$(pool_taken)" -ge "$parallel" ]; do pool_wait_one; done
    fi
    run_exe "$kind" "$t" "$name" "$filter" &
    running_name[$!]=$name
    expected=$((expected + 1))
  done
  while [ ${#running_name[@]} -gt 0 ]; do pool_wait_one; done
  [ "$collected" -eq "$expected" ] || { echo "$kind: $collected of $expected test executables reported"; return 1; }
  finished=$kind
}

# Each fuzzer over a copy of its seed corpus (tests/fuzz/corpus/NAME/), for
# PPRUN_FUZZ_SECONDS, a core each; a crash, leak, timeout or abort fails
# it, and its reproducer is left in build-test-fuzz/ (crash-*, leak-*,
# timeout-*).
fuzz_one() {
  local dir=$1 seconds=$2 name=$3 corpus log rc runs
  corpus=$(mktemp -d)
  cp -r "tests/fuzz/corpus/$name/." "$corpus/" 2>/dev/null || true
  log="$dir/$name.log"
  (cd "$dir" && "./$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "$corpus") >"$log" 2>&1
  rc=$?
  rm -rf "$corpus"
  exec >"$results/$name.report"
  echo "-- fuzz/$name"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  if [ "$rc" -eq 0 ] && [ -n "$runs" ]; then
    echo "   $runs runs in ${seconds}s, no finding"
    echo "1 0 0" >"$results/$name.counts"
  else
    grep -a -E 'ERROR|SUMMARY|Test unit written|fuzz_' "$log" | head -20
    echo "   $name: a finding (exit $rc); see $log"
    echo "0 1 0" >"$results/$name.counts"
  fi
}

run_fuzz() {
  local dir=build-test-fuzz seconds=${PPRUN_FUZZ_SECONDS:-60} t
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  for t in "$dir"/fuzz_*; do
    [ -x "$t" ] || continue
    while [ ${#running_name[@]} -ge "$jobs" ]; do pool_wait_one; done
    fuzz_one "$dir" "$seconds" "$(basename "$t")" &
    running_name[$!]=$(basename "$t")
  done
  while [ ${#running_name[@]} -gt 0 ]; do pool_wait_one; done
  finished=fuzz
}

# A build counts as run only when its function got to its end (`finished`):
# a script error that cuts one short fails the run, never shortens it.
for i in "${!builds[@]}"; do
  b=${builds[$i]} next=${builds[$((i + 1))]:-}
  finished=
  if finish_build "$b"; then
    if [ "$b" = fuzz ]; then run_fuzz; else run_tests "$b" "$next"; fi
  fi
  [ "$finished" = "$b" ] || { echo "$b: the build or its tests did not run to their end"; status=1; total_fail=$((total_fail + 1)); }
done
# A next build started but not reached (this one's tests cut short) ends here.
wait
echo "== done ($SECONDS s)"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status

#!/usr/bin/env bash
# bench/gpu.sh: the GPU check, for a machine with a CUDA GPU. Builds pprun
# with the GPU backend, runs the GPU tests (kernels vs CPU, the GPU stage,
# 4 ranks per schedule on one GPU with bitwise loss parity), then the
# per-op timings and GEMM TFLOP/s of bench_gpu, and prints a summary table.
# Exits 1 at once, saying so, when there is no GPU. Written without a GPU at
# hand: see docs/gpu.md.
#
#   bench/gpu.sh [BUILD_DIR]        (default build-gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench/gpu.sh: no CUDA GPU on this machine (nvidia-smi -L fails): nothing checked" >&2
  exit 1
fi
nvidia-smi -L

echo "== build ($dir, PPRUN_CUDA=ON)"
if ! cmake -S . -B "$dir" -DPPRUN_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$dir.configure.log" 2>&1 ||
   ! cmake --build "$dir" -j"$(nproc)" >"$dir.build.log" 2>&1; then
  tail -40 "$dir.configure.log" "$dir.build.log"
  echo "bench/gpu.sh: build failed" >&2
  exit 1
fi

declare -A result
status=0
# A GPU test passes only if it ran: any skip on a GPU machine is a failure.
for t in test_gpu_kernels test_gpu_stage test_gpu_cli; do
  log="$dir/$t.log"
  "$dir/$t" --jobs 1 --verbose --timeout 600 >"$log" 2>&1
  rc=$?
  skips=$(grep -a -c '^\[SKIP\]' "$log")
  line=$(grep -a 'Synthesis:' "$log" | tail -1)
  if [ "$rc" -ne 0 ] || [ "$skips" -gt 0 ] || [ -z "$line" ]; then
    result[$t]="FAIL (exit $rc, $skips skipped; see $log)"
    status=1
    grep -a -E '^\[(FAIL|SKIP)\]|Assertion|rel err' "$log" | head -30
  else
    result[$t]="PASS: ${line#*Synthesis: }"
  fi
  # the measured relative errors, for docs/gpu.md
  grep -a 'rel err\|vs CPU' "$log" | sed 's/^\[----\] *//' | head -40
done

# 4 ranks sharing the GPU, traced (host spans), per schedule: per-op mean
# times and the measured vs simulated bubble ratio (the simulator uses the
# job's measured F/B/W medians). The 4 processes share the GPU by
# time-slicing, so their ops also wait for each other. --transport auto keeps
# boundary tensors in GPU memory (CUDA IPC between ranks of one GPU); the
# last row runs 1F1B with them staged through the host (shm) to compare. The
# transport column is what the workers said they used (their first line).
echo "== 4 ranks on one GPU, per schedule"
sql="SELECT (SELECT round(avg(CASE WHEN phase='F' THEN end_ns-start_ns END)/1e3,1) FROM events) AS f_us,
  (SELECT round(avg(CASE WHEN phase='B' THEN end_ns-start_ns END)/1e3,1) FROM events) AS b_us,
  (SELECT round(avg(CASE WHEN phase='W' THEN end_ns-start_ns END)/1e3,1) FROM events) AS w_us,
  (SELECT round(avg(end_ns-start_ns)/1e6,2) FROM step_stats WHERE step>0) AS step_ms,
  (SELECT round(sum(bubble_ns)*1.0/sum(end_ns-start_ns),3) FROM step_stats WHERE step>0) AS bubble_measured,
  (SELECT round(1 - sum(sim_end_ns-sim_start_ns)*1.0/(count(DISTINCT rank)*(max(sim_end_ns)-min(sim_start_ns))),3) FROM plan) AS bubble_simulated"
printf '%-18s %-10s %s\n' schedule transport "f_us,b_us,w_us,step_ms,bubble_measured,bubble_simulated"
for svt in gpipe::auto 1f1b::auto interleaved-1f1b:2:auto zb-h1::auto zb-v:2:auto 1f1b::shm; do
  sched=${svt%%:*} rest=${svt#*:}
  v=${rest%%:*} transport=${rest#*:}
  name="sched-$sched-$transport"
  db="$dir/$name.db"
  rm -f "$db" "$db-wal" "$db-shm"
  if ! "$dir/pprun" run --device cuda --nproc-per-node 4 --schedule "$sched" ${v:+--virtual-stages $v} \
      --transport "$transport" --microbatches 8 --steps 6 --model gpt:layers=8,dim=256,heads=8,seq=256,batch=4 \
      --progress off --db "$db" >"$dir/$name.log" 2>&1; then
    result[schedules]="FAIL: $sched over $transport (see $dir/$name.log)"; status=1; continue
  fi
  # "... rank 0: cuda-ipc; rank 2: cuda-ipc" from every worker -> cuda-ipc
  used=$(grep -a -o 'rank [0-9]*: [a-z-]*' "$dir/$name.log" | awk '{print $3}' | sort -u | paste -sd+ -)
  printf '%-18s %-10s %s\n' "$sched" "${used:-?}" "$("$dir/pprun" query --db "$db" --format csv "$sql" | tail -1)"
done
[ -z "${result[schedules]:-}" ] && result[schedules]="ran (table above)"

echo "== bench_gpu"
"$dir/bench_gpu" | tee "$dir/bench_gpu.log"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then result[bench_gpu]="FAIL"; status=1; else result[bench_gpu]="ran"; fi

echo
printf '%-20s %s\n' check result
for k in test_gpu_kernels test_gpu_stage test_gpu_cli schedules bench_gpu; do printf '%-20s %s\n' "$k" "${result[$k]}"; done
printf '%-20s %s\n' "schedules parity" "in test_gpu_cli (4 ranks on one GPU, every schedule vs one rank, bitwise)"
printf '%-20s %s\n' "CUDA IPC" "4 ranks on one GPU above (transport column); parity in test_gpu_cli (cuda-ipc and shm vs one rank)"
printf '%-20s %s\n' "NCCL" "needs one GPU per rank: not exercised by this script on a 1-GPU machine"
printf '%-20s %s\n' "CUPTI spans" "NOT BUILT (docs/gpu.md): no GPU-vs-host span comparison, no tracing overhead"
exit $status

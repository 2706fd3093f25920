#!/usr/bin/env bash
# bench/gpu.sh: the GPU check, for a machine with a CUDA GPU (docs/gpu.md).
#
#   bench/gpu.sh [--debs DIR] [BUILD_DIR]      (default build-gpu)
#   bench/gpu.sh --emu BUILD_DIR                a rehearsal on the CPU
#
# 1. builds pprun with the GPU backend (--debs: the build's Debian packages
#    carried as .deb files, unpacked by scripts/gpu-debs.sh, for a machine
#    without a package registry);
# 2. runs the GPU tests: kernels vs their CPU references, the GPU stage,
#    devcomm, CUPTI, the CLI (a skip fails, except the two reasons a one-GPU
#    machine has: the no-device checks, and tests that need two GPUs);
# 3. runs a 4-rank job on one GPU (boundary tensors over CUDA IPC) with each
#    schedule, and 1F1B with them staged through the host (shm);
# 4. checks that every job's per-microbatch losses are the same bits;
# 5. compares CUPTI's gpu spans with the host spans of the same ops;
# 6. kills one worker of a running job (kill -9): the job must end within
#    10 s naming that rank, leaving no process; and a clean job must leave
#    nothing in /dev/shm (the CUDA driver's cuda.shm.* files included);
# 7. measures the tracing overhead: step time with tracing + CUPTI, with
#    tracing only, and without tracing, alternating, and CUPTI's step end
#    (its GPU_TRACE spans, between steps) as a share of a step;
# 8. runs the 4-rank 1F1B job with --mps on and --mps off, alternating:
#    step time and measured bubble beside the planned one, the same losses
#    as the other jobs, and no MPS process or folder left after each job
#    (the other jobs run with --mps off, as they were measured before MPS);
# 9. runs examples/torch_pipeline.py --device cuda under pprun (1 rank, 2
#    stages, Interleaved1F1B and InterleavedZeroBubble) with the machine's
#    python3 and its CUDA torch: every F/B/W/BW/OPT of pprun.torch has a
#    gpu span from its CUDA events, each starting no earlier than its host
#    span (50 us slack);
# 10. runs bench_gpu (per-kernel times, GEMM TFLOP/s vs a bare cuBLAS GEMM
#    of the same shape in the same run);
# and prints a table. Exits 1 at once, saying so, without a GPU; exits 1
# when a check failed.
#
# --emu runs steps 3 to 8 on the CUDA emulator of BUILD_DIR (its pprun_emu,
# one stand-in GPU with launches that run late, the stand-in MPS daemon of
# tests/gpu_emu, a model small enough for it), and neither builds nor runs
# the tests (CI runs their _emu twins) nor bench_gpu: it checks the script
# itself, its parsing and its checks, before the GPU time is spent; its
# figures mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
debs="" emu=""
if [ "${1:-}" = --debs ]; then
  debs=${2:?--debs needs a folder}
  shift 2
elif [ "${1:-}" = --emu ]; then
  emu=1
  shift
fi
dir=${1:-build-gpu}

if [ -n "$emu" ]; then
  [ -x "$dir/pprun_emu" ] || { echo "bench/gpu.sh --emu: no $dir/pprun_emu (a build with the CUDA toolkit makes it)" >&2; exit 1; }
  export PPRUN_STUB_DEVICES=1
  export PPRUN_STUB_ASYNC_US=50 # launches run late, the host ahead of them, as on a GPU (cuda_emu.h)
  mkdir -p "$dir/mps-standin"
  ln -sf "$PWD/tests/gpu_emu/mps_control_standin.sh" "$dir/mps-standin/nvidia-cuda-mps-control"
  PATH="$(cd "$dir/mps-standin" && pwd):$PATH"
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench/gpu.sh: no CUDA GPU on this machine (nvidia-smi -L fails): nothing checked" >&2
  exit 1
fi
[ -n "$emu" ] || nvidia-smi -L
# Several ranks share one GPU over cuda-ipc: that needs compute mode Default
# (Exclusive_Process admits one context) and CUDA IPC (refused under some
# sandboxes). Both show here before anything fails on them.
[ -n "$emu" ] || nvidia-smi --query-gpu=index,name,compute_mode,driver_version,memory.total --format=csv
if [ -n "$debs" ]; then
  env_file=$(mktemp)
  scripts/gpu-debs.sh unpack "$debs" /tmp/pprun-deps >"$env_file" || exit 1
  # shellcheck source=/dev/null
  . "$env_file"
fi

echo "== build ($dir, PPRUN_CUDA=ON)"
mkdir -p "$dir"
if [ -n "$emu" ]; then
  pprun="$(cd "$dir" && pwd)/pprun_emu"
elif ! cmake -S . -B "$dir" -DPPRUN_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$dir/configure.log" 2>&1 ||
   ! cmake --build "$dir" -j"$(nproc)" >"$dir/build.log" 2>&1; then
  tail -40 "$dir/configure.log" "$dir/build.log"
  echo "bench/gpu.sh: build failed" >&2
  exit 1
else
  pprun="$(cd "$dir" && pwd)/pprun" # absolute: the kill check counts its processes by path
fi

declare -A result
status=0
fail() { result[$1]="FAIL: $2"; status=1; }

echo "== GPU tests"
allowed_skip='a CUDA device is present|needs two GPUs'
tests=(test_gpu_kernels test_gpu_stage test_gpu_run test_devcomm test_gputrace test_gpu_cli test_gpu_mps)
[ -z "$emu" ] || tests=()
for t in "${tests[@]}"; do
  log="$dir/$t.log"
  "$dir/$t" --jobs 1 --verbose --timeout 600 >"$log" 2>&1
  rc=$?
  bad_skips=$(grep -a '^\[SKIP\]' "$log" | grep -a -v -E -c "$allowed_skip")
  line=$(grep -a 'Synthesis:' "$log" | tail -1)
  if [ "$rc" -ne 0 ] || [ "$bad_skips" -gt 0 ] || [ -z "$line" ]; then
    fail "$t" "exit $rc, $bad_skips skipped for another reason; see $log"
    grep -a -E '^\[(FAIL|SKIP)\]|Assertion' "$log" | grep -a -v -E "$allowed_skip" | head -30
  else
    result[$t]="PASS: ${line#*Synthesis: }"
  fi
  # the measured relative errors, for docs/gpu.md's bounds
  grep -a 'rel err\|vs CPU' "$log" | sed 's/^\[----\] *//' | head -40
done

# One job: 4 ranks on the one GPU, 8 microbatches, 6 steps, no MPS unless
# the options say --mps on; $1 name, then pprun run options. Leaves
# $dir/$1.{db,log,jsonl}.
model=gpt:layers=8,dim=256,heads=8,seq=256,batch=4
[ -z "$emu" ] || model=gpt:layers=8,dim=32,heads=2,seq=16,batch=2
job() {
  local name=$1
  shift
  rm -f "$dir/$name".db* "$dir/$name.jsonl"
  "$pprun" run --device cuda --nproc-per-node 4 --microbatches 8 --steps 6 --model "$model" --progress off \
    --db "$dir/$name.db" --metrics "$dir/$name.jsonl" --mps off "$@" >"$dir/$name.log" 2>&1
}
# CSV rows end in CRLF; the header is one line when every column has a
# one-line name (an AS for each expression that spans lines).
q() { "$pprun" query --db "$1" --format csv "$2" | tail -n +2 | tr -d '\r'; }
# Median step time (ms) of steps 1.. from a --metrics file (step 0 warms up).
step_ms() { grep -a -o '"step_ms":[0-9.]*' "$1" | tail -n +2 | cut -d: -f2 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# "measured,planned": the bubble as `pprun stats` reports it, from step 1
# (planned: the plan simulated at the job's medians, an overlapped pair's
# two halves counted once), 3 decimals.
bubbles() {
  "$pprun" stats --db "$1" --format json | grep -a -o '"\(sim_\)\?bubble_ratio":[^,}]*' | head -2 | cut -d: -f2 |
    awk '{v[NR] = $1 == "null" ? "-" : sprintf("%.3f", $1)} END {print v[1] "," v[2]}'
}
# Per-microbatch losses of every step, as printed (9 significant digits: a float32 exactly).
losses() { grep -a -o '"step":[0-9]*,"loss":[^,]*,"losses":\[[^]]*\]' "$1" | sed 's/"loss":[^,]*,//'; }

echo "== 4 ranks on one GPU, per schedule"
# Host spans (source cpu) and CUPTI's gpu spans of the same ops: mean
# durations, the share of gpu spans that lie inside their host op (within
# 50 us: CUPTI maps GPU time onto the host clock by interpolation), and
# the measured vs simulated bubble (simulated from the job's F/B/W medians),
# and f_ovl: the share of F time (steps 1..) that ran while a B or BW of the
# same rank ran (DualPipeV's overlapped pairs, two streams; 0 elsewhere).
sql="WITH h AS (SELECT * FROM events WHERE source='cpu' AND phase IN ('F','B','W','BW')),
  g AS (SELECT * FROM events WHERE source='gpu' AND phase IN ('F','B','W','BW')),
  pair AS (SELECT h.start_ns hs, h.end_ns he, g.start_ns gs, g.end_ns ge FROM h JOIN g USING
    (job_id, attempt, rank, step, microbatch, stage, phase))
SELECT (SELECT round(avg(end_ns-start_ns)/1e3,1) FROM h WHERE phase='F') AS f_us,
  (SELECT round(avg(end_ns-start_ns)/1e3,1) FROM h WHERE phase='B') AS b_us,
  (SELECT round(avg(end_ns-start_ns)/1e3,1) FROM h WHERE phase='W') AS w_us,
  (SELECT round(avg(ge-gs)*1.0/avg(he-hs),3) FROM pair) AS ratio,
  (SELECT count(*) FROM pair) || '/' || (SELECT count(*) FROM h) AS spans,
  (SELECT round(avg(gs >= hs - 50000 AND ge <= he + 50000),3) FROM pair) AS inside,
  (SELECT sum(cupti_dropped) FROM ranks) AS dropped,
  (SELECT round(coalesce(sum(min(f.end_ns, b.end_ns) - max(f.start_ns, b.start_ns)), 0) * 1.0 /
     (SELECT sum(end_ns-start_ns) FROM h WHERE phase='F' AND step>0), 3)
   FROM h f JOIN h b USING (job_id, attempt, rank, step)
   WHERE f.phase='F' AND b.phase IN ('B','BW') AND f.step>0 AND f.start_ns < b.end_ns AND b.start_ns < f.end_ns) AS f_ovl"
printf '%-18s %-9s %8s %8s %8s %8s %8s %9s %8s %8s %8s %7s %6s\n' schedule transport step_ms f_us b_us w_us gpu/host \
  gpu_spans inside bub_meas bub_sim dropped f_ovl
ref_losses=""
for svt in gpipe::auto 1f1b::auto interleaved-1f1b:2:auto zb-h1::auto zb-v:2:auto dualpipev:2:auto 1f1b::shm; do
  sched=${svt%%:*} rest=${svt#*:}
  v=${rest%%:*} transport=${rest#*:}
  name="sched-$sched-$transport"
  if ! job "$name" --schedule "$sched" ${v:+--virtual-stages $v} --transport "$transport"; then
    fail schedules "$sched over $transport (see $dir/$name.log)"
    continue
  fi
  # "... rank 0: cuda-ipc; rank 2: cuda-ipc" from every worker -> cuda-ipc
  used=$(grep -a -o 'rank [0-9]*: [a-z-]*' "$dir/$name.log" | awk '{print $3}' | sort -u | paste -sd+ -)
  IFS=, read -r f b w ratio spans inside dropped ovl <<<"$(q "$dir/$name.db" "$sql")"
  IFS=, read -r bm bs <<<"$(bubbles "$dir/$name.db")"
  printf '%-18s %-9s %8s %8s %8s %8s %8s %9s %8s %8s %8s %7s %6s\n' "$sched" "${used:-?}" "$(step_ms "$dir/$name.jsonl")" \
    "$f" "$b" "$w" "$ratio" "$spans" "$inside" "$bm" "$bs" "$dropped" "$ovl"
  [ "$inside" = 1.0 ] || [ "$inside" = 1 ] || fail cupti "$sched: not every gpu span lies inside its host op ($inside)"
  [ "${spans%%/*}" -gt 0 ] 2>/dev/null || fail cupti "$sched: no gpu spans (see $dir/$name.log)"
  l=$(losses "$dir/$name.jsonl")
  if [ -z "$ref_losses" ]; then ref_losses=$l
  elif [ "$l" != "$ref_losses" ]; then fail parity "$sched over $transport: losses differ from gpipe's"
  fi
done
[ -n "${result[schedules]:-}" ] || result[schedules]="ran (table above)"
[ -n "${result[parity]:-}" ] || result[parity]="PASS: every job's per-microbatch losses are gpipe's, bit for bit"
[ -n "${result[cupti]:-}" ] || result[cupti]="PASS: every F/B/W has a gpu span inside its host op (table above)"

echo "== a clean job leaves nothing in /dev/shm; kill -9 of one worker ends the job"
before=$(ls /dev/shm | wc -l)
if job shm-clean --schedule 1f1b; then
  after=$(ls /dev/shm | wc -l)
  if [ "$after" -ne "$before" ]; then fail shm "$before entries in /dev/shm before a cuda-ipc job, $after after: $(ls /dev/shm | head -5 | tr '\n' ' ')"
  else result[shm]="PASS: /dev/shm has $after entries before and after a cuda-ipc job"; fi
else fail shm "the job failed (see $dir/shm-clean.log)"; fi
rm -f "$dir"/kill.db*
"$pprun" run --device cuda --nproc-per-node 4 --microbatches 8 --steps 100000 --model "$model" --progress off \
  --mps off --db "$dir/kill.db" >"$dir/kill.log" 2>&1 &
kjob=$!
victim=""
for _ in $(seq 1 300); do # until rank 1 has finished a step (30 s at most)
  sleep 0.1
  [ "$(q "$dir/kill.db" "SELECT count(*) FROM events WHERE rank=1 AND phase='OPT'" 2>/dev/null)" -ge 1 ] 2>/dev/null || continue
  victim=$(q "$dir/kill.db" "SELECT pid FROM ranks WHERE rank=1")
  break
done
if [ -z "$victim" ]; then
  kill -INT $kjob; wait $kjob
  fail kill "rank 1 never finished a step (see $dir/kill.log)"
else
  t0=$(date +%s%N)
  kill -9 "$victim"
  timeout 30 tail --pid=$kjob -f /dev/null
  ms=$((($(date +%s%N) - t0) / 1000000))
  if kill -0 $kjob 2>/dev/null; then # hung: stop it as Ctrl-C would, then for good
    kill -INT $kjob
    timeout 10 tail --pid=$kjob -f /dev/null
    kill -KILL $kjob 2>/dev/null
  fi
  wait $kjob
  krc=$?
  sleep 1 # the launcher's guard process leaves just after it
  left=$(pgrep -f "$pprun" | wc -l)
  named=$(q "$dir/kill.db" "SELECT status || ' ' || failed_rank FROM jobs")
  if [ "$krc" -ne 1 ] || [ "$ms" -gt 10000 ] || [ "$named" != "failed 1" ] || [ "$left" -ne 0 ]; then
    fail kill "exit $krc after $ms ms, job '$named', $left pprun processes left (see $dir/kill.log)"
  else result[kill]="PASS: the job ended $ms ms after kill -9 of rank 1 (exit 1, failed_rank 1), no process left"; fi
fi

echo "== tracing overhead (1f1b, cuda-ipc; median step ms of steps 1-5; 3 alternating rounds)"
# gpu_trace: CUPTI's step end (synchronise, flush, records into the ring),
# the GPU_TRACE spans, median ms: on the training thread between steps, so
# outside the step times beside it; the ratios are the ops' own cost.
gpu_trace_sql="SELECT printf('%.3f', (end_ns - start_ns) / 1e6) FROM events WHERE name = 'GPU_TRACE' AND step >= 1
  ORDER BY end_ns - start_ns LIMIT 1 OFFSET (SELECT count(*) / 2 FROM events WHERE name = 'GPU_TRACE' AND step >= 1)"
printf '%-6s %10s %10s %10s %10s\n' round cupti trace off gpu_trace
declare -a r_cupti r_trace r_gt
for round in 1 2 3; do
  job ovh-cupti --schedule 1f1b && job ovh-trace --schedule 1f1b --cupti off && job ovh-off --schedule 1f1b --trace off ||
    { fail overhead "a job failed (see $dir/ovh-*.log)"; break; }
  a=$(step_ms "$dir/ovh-cupti.jsonl") b=$(step_ms "$dir/ovh-trace.jsonl") c=$(step_ms "$dir/ovh-off.jsonl")
  gt=$(q "$dir/ovh-cupti.db" "$gpu_trace_sql")
  printf '%-6s %10s %10s %10s %10s\n' "$round" "$a" "$b" "$c" "$gt"
  r_cupti+=("$(awk -v x="$a" -v y="$c" 'BEGIN {printf "%.3f", x / y}')")
  r_trace+=("$(awk -v x="$b" -v y="$c" 'BEGIN {printf "%.3f", x / y}')")
  r_gt+=("$(awk -v x="$gt" -v y="$c" 'BEGIN {printf "%.3f", x / y}')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
[ -n "${result[overhead]:-}" ] ||
  result[overhead]="step time vs tracing off: tracing+CUPTI $(median "${r_cupti[@]}"), tracing only $(median "${r_trace[@]}"); CUPTI's step end $(median "${r_gt[@]}") of a step more, between steps (median of 3 rounds)"

echo "== MPS: 1f1b, 4 ranks on one GPU, --mps on vs off (median step ms of steps 1-5; 3 alternating rounds)"
# MPS processes and private folders: none may be left by a job (a daemon
# the machine ran before is counted in the baseline).
mps_procs() { pgrep -f 'nvidia-cuda-mps-(control|server)' | wc -l; }
mps_dirs() { find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'pprun-mps-*' | wc -l; }
mps_sql="SELECT json_extract(config_json, '\$.mps') FROM jobs"
procs0=$(mps_procs) dirs0=$(mps_dirs)
declare -a on_ms off_ms on_bm off_bm on_bs off_bs
if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  result[mps]="not run: nvidia-cuda-mps-control is not on PATH"
else
  printf '%-6s %-5s %10s %9s %9s %10s\n' round mps step_ms bub_meas bub_sim left
  for round in 1 2 3; do
    for mode in on off; do
      name="mps-$mode"
      job "$name" --schedule 1f1b --mps "$mode" || { fail mps "--mps $mode: the job failed (see $dir/$name.log)"; break 2; }
      state=$(q "$dir/$name.db" "$mps_sql")
      IFS=, read -r bm bs <<<"$(bubbles "$dir/$name.db")"
      ms=$(step_ms "$dir/$name.jsonl") procs=$(mps_procs) dirs=$(mps_dirs)
      printf '%-6s %-5s %10s %9s %9s %10s\n' "$round" "$state" "$ms" "$bm" "$bs" "$((procs - procs0))p,$((dirs - dirs0))d"
      [ "$state" = "$mode" ] || fail mps "--mps $mode: config_json says mps '$state' (see $dir/$name.log)"
      [ "$procs" -le "$procs0" ] && [ "$dirs" -le "$dirs0" ] ||
        fail mps "--mps $mode: $((procs - procs0)) MPS processes, $((dirs - dirs0)) pprun-mps-* folders left"
      [ "$(losses "$dir/$name.jsonl")" = "$ref_losses" ] || fail parity "--mps $mode: losses differ from gpipe's"
      if [ "$mode" = on ]; then on_ms+=("$ms") on_bm+=("$bm") on_bs+=("$bs")
      else off_ms+=("$ms") off_bm+=("$bm") off_bs+=("$bs"); fi
    done
  done
  [ -n "${result[mps]:-}" ] || result[mps]="on: step $(median "${on_ms[@]}") ms, bubble $(median "${on_bm[@]}") measured ($(median "${on_bs[@]}") simulated); off: step $(median "${off_ms[@]}") ms, bubble $(median "${off_bm[@]}") ($(median "${off_bs[@]}")); nothing left (median of 3 rounds)"
fi

echo "== PyTorch on the GPU: pprun.torch's CUDA-event spans (1 rank, 2 stages)"
torch_sql="WITH h AS (SELECT * FROM events WHERE source='cpu' AND phase IN ('F','B','W','BW','OPT')),
  g AS (SELECT * FROM events WHERE source='gpu' AND phase IN ('F','B','W','BW','OPT'))
SELECT (SELECT count(*) FROM h) AS host, (SELECT count(*) FROM g) AS gpu,
  (SELECT count(*) FROM h JOIN g USING (job_id, attempt, rank, step, microbatch, stage, phase)
   WHERE g.start_ns >= h.start_ns - 50000) AS placed,
  (SELECT round(avg(end_ns-start_ns)/1e3,1) FROM h WHERE phase <> 'OPT') AS host_us,
  (SELECT round(avg(end_ns-start_ns)/1e3,1) FROM g WHERE phase <> 'OPT') AS gpu_us,
  (SELECT count(*) FROM losses) AS losses"
if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  result[torch]="not run: python3 has no torch that sees a GPU"
else
  # which of the forms pprun.torch takes this torch has (docs/torch.md): for the note
  python3 -c 'import torch, inspect, importlib.util as u, torch.distributed.pipelining.schedules as s
print("torch", torch.__version__, "| runtime.py:", u.find_spec("torch.distributed.pipelining.runtime") is not None,
      "| _prepare_schedule_with_comms:", hasattr(s._PipelineScheduleRuntime, "_prepare_schedule_with_comms"),
      "| stage_index_to_group_rank:", "stage_index_to_group_rank" in inspect.signature(s.PipelineScheduleMulti.__init__).parameters,
      "| str(FULL_BACKWARD):", str(s._ComputationType.FULL_BACKWARD))'
  printf '%-22s %6s %6s %7s %8s %8s %7s\n' schedule host gpu placed host_us gpu_us losses
  for sched in Interleaved1F1B InterleavedZeroBubble; do
    name="torch-$sched"
    rm -f "$dir/$name".db*
    if ! "$pprun" run --nproc-per-node 1 --db "$dir/$name.db" -- python3 examples/torch_pipeline.py \
      --device cuda --schedule "$sched" --steps 4 --microbatches 4 --layers 8 --dim 256 --seq 128 >"$dir/$name.log" 2>&1; then
      fail torch "$sched: the job failed (see $dir/$name.log)"
      continue
    fi
    IFS=, read -r host gpu placed hus gus nloss <<<"$(q "$dir/$name.db" "$torch_sql")"
    printf '%-22s %6s %6s %7s %8s %8s %7s\n' "$sched" "$host" "$gpu" "$placed" "$hus" "$gus" "$nloss"
    [ "${host:-0}" -gt 0 ] && [ "$gpu" = "$host" ] && [ "$placed" = "$host" ] && [ "${nloss:-0}" -gt 0 ] ||
      fail torch "$sched: $host host spans, $gpu gpu spans, $placed placed after their host span, $nloss losses (see $dir/$name.log)"
  done
  [ -n "${result[torch]:-}" ] || result[torch]="PASS: every traced op has its gpu span, after its host span's start (table above)"
fi

echo "== bench_gpu"
if [ -n "$emu" ]; then
  result[bench_gpu]="not run (--emu)"
else
  "$dir/bench_gpu" | tee "$dir/bench_gpu.log"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then fail bench_gpu "exit status (see $dir/bench_gpu.log)"; else result[bench_gpu]="ran (tables above)"; fi
fi

echo
printf '%-18s %s\n' check result
for k in "${tests[@]}" schedules parity cupti shm kill overhead mps torch bench_gpu; do printf '%-18s %s\n' "$k" "${result[$k]}"; done
printf '%-18s %s\n' NCCL "needs one GPU per rank: test_devcomm and test_gpu_run run it where there are two GPUs"
exit $status

// whatif.js: the panel under the charts: every built-in schedule simulated
// at the job's measured op costs (GET /whatif; docs/schedules.md, "What
// if") and, from the same answer, the stage balance, as `pprun stats`
// prints it. The critical path's totals under them are read at the same
// cadence (critpath.js).
import { S } from './state.js';
import { api } from './api.js';
import { $, fmtMs, fmtBytes, fmtPct, headerRow } from './util.js';
import { probe } from './probe.js';
import { loadCritTotals } from './critpath.js';

// Every schedule at the job's measured costs (GET /whatif): read when a job
// opens, then again as its steps come in, WHATIF_EVERY_MS after the last
// answer came (every second until there is something measured), never
// two at once: a 1,024-rank job's answers take seconds each.
const WHATIF_EVERY_MS = 10000;
let whatif = null, whatifAt = 0, asking = false; // the latest answer; when it came; one being asked for
let opened = 0; // which job's asks these are: an answer for a job left behind changes neither

// A job opens: nothing asked yet.
export function resetWhatif() { whatif = null; whatifAt = 0; asking = false; opened++; }

// Whether a step that completed is to ask again.
export function whatifDue() {
  return !asking && Date.now() - whatifAt >= (whatif && whatif.measured ? WHATIF_EVERY_MS : 1000);
}

// The what-if and the critical path's totals, which come at the same cadence.
export async function loadWhatif(id) {
  const mine = opened;
  asking = true;
  try { await Promise.all([loadCritTotals(id), showWhatif(id)]); } finally {
    if (mine === opened) { asking = false; whatifAt = Date.now(); }
  }
}

async function showWhatif(id) {
  let r;
  try { r = await api(`/api/jobs/${id}/whatif`); } catch (e) { $('whatif-info').textContent = 'error: ' + e.message; return; }
  if (S.job !== id) return; // another job opened meanwhile
  const tbl = $('whatif-table');
  tbl.innerHTML = '';
  $('whatif-tuned').textContent = '';
  showBalance(r);
  showDataParallel(r);
  if (!r.measured) {
    $('whatif-info').textContent = '— nothing yet: no complete step with F, B and W';
    whatif = probe.whatif = r;
    return;
  }
  const c = r.costs_ns;
  $('whatif-info').textContent = `— F ${fmtMs(c.f)} · B ${fmtMs(c.b)} · W ${fmtMs(c.w)} · hand-off ${fmtMs(c.send)} · ` +
    (c.bw != null ? `BW ${fmtMs(c.bw)} · ` : '') + `between ops ${fmtMs(c.between)}, ` +
    `medians of ${r.source === 'gpu' ? 'GPU' : 'host'} spans (hand-off and between ops: means) over steps ` +
    `${r.first_step}–${r.last_step}` +
    (r.fixed_op_costs ? ' (timed model: an op costs the same in any chunk)' : '') +
    (r.shared_cores ? ` · ${r.shared_cores.ranks} ranks shared ${r.shared_cores.cores} core${r.shared_cores.cores === 1 ? '' : 's'}: these op times are less ` +
      'their waits for a core, and each schedule is simulated with a core per rank' : '') +
    (r.shared_gpu ? ` · ${r.shared_gpu.ranks} ranks shared one GPU (${r.shared_gpu.device})` +
      (r.shared_gpu.mps ? ' through MPS: these op times include running beside the others\' ops on it'
        : ': these op times include waiting for the GPU') + ', and each schedule is simulated with a GPU per rank' : '') +
    (r.bw_split_ns != null ? ` · this job's backward is one op, BW, of ${fmtMs(r.bw_split_ns)}: B and W are halves of it ` +
      '(never timed apart); its own schedule plays each BW whole' : '');
  const own = r.schedules.find((s) => s.this_job && !s.error);
  headerRow(tbl, ['schedule', 'chunks per rank', 'step time', 'bubble', 'vs this job', 'activations (est.)', 'in flight']);
  const body = tbl.createTBody();
  for (const s of r.schedules) {
    const tr = body.insertRow();
    tr.dataset.schedule = s.schedule;
    if (s.this_job) tr.className = 'own';
    const cells = [s.schedule + (s.this_job ? ' (this job)' : s.tuned ? ' (ordered for these costs)' : ''), s.virtual_stages];
    if (s.error) cells.push(s.error);
    else cells.push(fmtMs(s.step_time_ns), fmtPct(s.bubble_ratio), own ? (s.step_time_ns / own.step_time_ns).toFixed(2) + '×' : '–',
      s.act_peak_bytes == null ? '–' : fmtBytes(s.act_peak_bytes), s.peak_inflight);
    cells.forEach((v, k) => {
      const td = tr.insertCell();
      td.textContent = String(v);
      if (k > 0 && !s.error) td.className = 'num';
      if (s.error && k === 2) td.colSpan = 5;
    });
  }
  // the flag only where the tuned order was built and is faster than zb-v's (as `pprun stats` says)
  const tuned = r.schedules.find((s) => s.tuned);
  const plain = r.schedules.find((s) => s.schedule === 'zb-v' && !s.tuned && !s.this_job);
  if (r.tuned_recommended)
    $('whatif-tuned').textContent = 'zb-v ordered for these costs: pprun run --schedule zb-v --schedule-costs ' +
      r.tuned_schedule_costs;
  else if (tuned && !tuned.error && plain && !plain.error)
    $('whatif-tuned').textContent = 'zb-v ordered for these costs: no faster than zb-v\'s own order, nothing to gain ' +
      'from --schedule-costs';
  whatif = probe.whatif = r;
}

// A job of several pipelines (the /whatif answer's `data_parallel`, as
// `pprun stats` prints it): the job's step with 2D, 4D pipelines or 2m
// microbatches, each stage's all-reduce a costed op in the simulator
// (docs/schedules.md, "Data parallelism in the simulator").
function showDataParallel(r) {
  const d = r.data_parallel, tbl = $('dp-table');
  tbl.innerHTML = '';
  $('dp-info').textContent = '';
  $('dp').hidden = !d;
  if (!d) return;
  $('dp-info').textContent = `— this job's median step plus the simulated change, each stage's all-reduce after its ` +
    `last W (${d.allreduce_ns_by_stage.map((ns) => ns == null ? '–' : fmtMs(ns)).join(', ')} a stage, measured) scaled ` +
    `as a ring's 2(D−1)/D; the ranks waited ${fmtMs(d.exposed_allreduce_ns)} a step for it`;
  headerRow(tbl, ['D', 'm', 'step time', 'throughput']);
  const body = tbl.createTBody();
  d.rows.forEach((row, k) => {
    const tr = body.insertRow();
    if (k === 0) tr.className = 'own';
    [row.dp, row.microbatches, row.step_time_ns == null ? '–' : fmtMs(row.step_time_ns),
      row.throughput == null ? '–' : row.throughput.toFixed(2) + '×' + (k === 0 ? ' (this job)' : '')].forEach((v) => {
      const td = tr.insertCell();
      td.textContent = String(v);
      td.className = 'num';
    });
  });
}

// Stage balance (the /whatif answer's `balance`, as `pprun stats` prints it):
// each stage's F, B, W against the mean of the stages, the job's schedule
// simulated at these costs and with every stage at the mean, and the
// --pipeline-cuts that would even them out (or why there are none).
function showBalance(r) {
  const b = r.balance, tbl = $('balance-table');
  tbl.innerHTML = '';
  for (const id of ['balance-info', 'balance-sim', 'balance-layer', 'balance-cuts']) $(id).textContent = '';
  $('balance').hidden = !b;
  if (!b) return;
  const total = (c) => c.f + c.b + c.w, n = b.stages.length, mean = b.mean_stage_ns;
  const shown = b.stages.filter((s) => s.listed); // all, or the slowest of many (the server's choice, as the terminal's)
  $('balance-info').textContent = `— medians of ${r.source === 'gpu' ? 'GPU' : 'host'} spans over steps ${r.first_step}–${r.last_step}` +
    (shown.length < n ? `; the ${shown.length} slowest of ${n} stages` : '');
  // a --dp job runs each stage on a rank of every pipeline: its medians are over all of them
  const many = shown.some((s) => s.ranks && s.ranks.length > 1);
  const ranksOf = (s) => {
    const r = s.ranks || [s.rank];
    return r.length > 3 ? `${r[0]},${r[1]},..,${r[r.length - 1]}` : r.join(',');
  };
  headerRow(tbl, ['stage', many ? 'ranks' : 'rank', 'layers', 'F', 'B', 'W', 'F+B+W', 'vs mean', '']);
  const body = tbl.createTBody();
  for (const s of shown) {
    const c = s.costs_ns, t = total(c), slowest = t >= b.slowest_stage_ns;
    const tr = body.insertRow();
    tr.dataset.stage = s.stage;
    if (slowest) tr.className = 'slowest';
    const layers = b.layers_known ? `${s.first_layer}–${s.first_layer + s.layers - 1}` : '–';
    [s.stage, ranksOf(s), layers, fmtMs(c.f), fmtMs(c.b), fmtMs(c.w), fmtMs(t), mean > 0 ? (t / mean).toFixed(2) + '×' : '–',
      slowest ? 'slowest' : ''].forEach((v, k) => {
      const td = tr.insertCell();
      td.textContent = String(v);
      if (k !== 2 && k < 8) td.className = 'num';
    });
  }
  const sched = (S.info && S.info.job.schedule) || ((r.schedules.find((s) => s.this_job) || {}).schedule) || 'this job';
  if (b.step_time_ns != null && b.even_step_time_ns != null)
    $('balance-sim').textContent = `${sched} simulated: ${fmtMs(b.step_time_ns)} a step at these stage costs, ` +
      `${fmtMs(b.even_step_time_ns)} with every stage at their mean (` +
      (b.step_time_ns > b.even_step_time_ns
        ? `the unevenness costs ${(100 * (b.step_time_ns - b.even_step_time_ns) / b.step_time_ns).toFixed(1)}%)` : 'even)');
  const fbw = (c) => `F ${fmtMs(c.f)}, B ${fmtMs(c.b)}, W ${fmtMs(c.w)}`;
  if (b.layers_known)
    $('balance-layer').textContent = `one layer: ${fbw(b.per_layer_ns)}; the first stage adds ${fbw(b.first_stage_adds_ns)}; ` +
      `the last adds ${fbw(b.last_stage_adds_ns)}`;
  $('balance-cuts').textContent = b.suggested_cuts != null
    ? `suggested --pipeline-cuts ${b.suggested_cuts}: slowest stage ${fmtMs(b.suggested_slowest_stage_ns)} instead of ` +
      `${fmtMs(b.slowest_stage_ns)}; ${sched} simulated ${fmtMs(b.suggested_step_time_ns)} a step ` +
      `(${b.step_time_ns > 0 ? (b.suggested_step_time_ns / b.step_time_ns).toFixed(2) + '×' : '–'})`
    : `no cuts suggested: ${b.no_cuts}`;
}

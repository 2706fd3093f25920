// jobs-tab.js: the Jobs tab: the newest jobs side by side, one
// /api/jobs/{id}/summary each (click one to open its timeline), and two of
// them ticked compared, as `pprun stats --job NEWER --vs OLDER` does in a
// terminal (/api/jobs/{id}/compare?vs=M).
import { S } from './state.js';
import { api } from './api.js';
import { $, fmtMs, fmtBytes, fmtPct, headerRow } from './util.js';
import { probe } from './probe.js';
import { openJob } from './job.js';

const JOBS_COMPARED = 50; // the newest; each costs a /summary request
let picked = []; // the jobs ticked to compare, at most two, in the order ticked

export async function showJobs() {
  const info = $('jobs-info'), tbl = $('jobs-table');
  const jobs = S.jobs.slice(0, JOBS_COMPARED);
  info.textContent = 'loading…';
  const sums = await Promise.all(jobs.map((j) => api(`/api/jobs/${j.id}/summary`).catch((e) => ({ error: e.message }))));
  const cols = ['compare', 'job', 'name', 'status', 'schedule', 'ranks', 'microbatches', 'device', 'steps', 'step time',
    'bubble', 'planned', 'bubble vs plan', 'idle mostly', 'activations', 'with weights', 'in flight', 'loss'];
  tbl.innerHTML = '';
  headerRow(tbl, cols);
  const body = tbl.createTBody();
  jobs.forEach((j, i) => {
    const s = sums[i], tr = body.insertRow();
    tr.dataset.job = j.id;
    tr.onclick = () => { document.querySelector('.tab[data-tab=timeline]').click(); openJob(j.id); };
    const idle = s.idle_ns_by_cause || {}, total = Object.values(idle).reduce((a, b) => a + b, 0);
    const top = Object.keys(idle).reduce((a, k) => (a == null || idle[k] > idle[a] ? k : a), null);
    const cells = [null, j.id, j.name, j.status, j.schedule + (j.virtual_stages > 1 ? ` (v=${j.virtual_stages})` : ''), j.world_size,
      j.microbatches, j.device, s.error ? s.error : s.steps, s.step_time_ns == null ? '–' : fmtMs(s.step_time_ns),
      fmtPct(s.bubble_ratio), fmtPct(s.sim_bubble_ratio), null,
      total > 0 ? `${top} ${(100 * idle[top] / total).toFixed(0)}%` : '–',
      s.act_peak_bytes ? fmtBytes(s.act_peak_bytes) : '–',
      s.mem_peak_bytes == null ? '–' : `${fmtBytes(s.mem_peak_bytes)} (rank ${s.mem_peak_rank})`,
      s.plan_peak_inflight && s.plan_peak_inflight.length ? Math.max(...s.plan_peak_inflight) : '–',
      s.loss == null ? '–' : s.loss.toFixed(4)];
    cells.forEach((v, k) => {
      const td = tr.insertCell();
      if (k === 0) {
        td.className = 'pick';
        td.onclick = (e) => e.stopPropagation(); // ticking is not opening
        const box = document.createElement('input');
        box.type = 'checkbox'; box.title = 'compare'; box.checked = picked.includes(j.id);
        box.onchange = () => pickJob(j.id, box.checked);
        td.appendChild(box);
      } else if (k === 12) {
        td.className = 'bars';
        for (const [x, cls] of [[s.bubble_ratio, ''], [s.sim_bubble_ratio, 'plan']]) {
          const bar = document.createElement('i');
          bar.className = cls; bar.style.width = (100 * Math.min(1, x || 0)).toFixed(1) + '%';
          td.appendChild(bar);
        }
      } else {
        td.textContent = String(v);
        if (typeof v === 'number') td.className = 'num';
      }
    });
  });
  info.textContent = `${jobs.length} job${jobs.length === 1 ? '' : 's'}` + (S.jobs.length > jobs.length ? ` (the newest ${jobs.length})` : '');
  probe.jobsShown = jobs.length;
}

// ---- two jobs compared (GET /compare: `pprun stats --vs` in the page) --------------

// Ticks a job in the Jobs table; with two ticked, the newer is compared
// with the older (as `pprun stats --vs OLDER` does with the newest job).
function pickJob(id, on) {
  picked = picked.filter((x) => x !== id);
  if (on) picked.push(id);
  if (picked.length > 2) picked.shift(); // the earliest tick gives way
  document.querySelectorAll('#jobs-table td.pick input').forEach((b) => { b.checked = picked.includes(Number(b.closest('tr').dataset.job)); });
  showCompare().catch((e) => { $('compare-error').textContent = e.message; $('compare-error').hidden = false; });
}

async function showCompare() {
  const panel = $('compare'), err = $('compare-error');
  probe.compare = null;
  if (picked.length < 2) { panel.hidden = true; return; }
  const job = Math.max(...picked), other = Math.min(...picked);
  const r = await api(`/api/jobs/${job}/compare?vs=${other}`);
  if (Math.max(...picked) !== job || Math.min(...picked) !== other) return; // ticks changed meanwhile
  err.hidden = true; panel.hidden = false;
  const o = r.numbers.other, n = r.numbers.job, ch = r.numbers.change;
  const ms = (x) => (x == null ? '–' : fmtMs(x));
  const times = (x) => (x == null ? '–' : x.toFixed(2) + '×');
  const pp = (x) => (x == null ? '–' : (x >= 0 ? '+' : '') + x.toFixed(1) + ' pp');
  const bytes = (x) => (x ? fmtBytes(x) : '–');
  const lossOf = (s) => (s.loss == null ? '–' : `${s.loss.toFixed(4)} @${s.loss_step}`);
  // Each stored value in a <bdi> of its own: a right-to-left override in it
  // (a program's argument, a forged name) reorders that value alone, not the
  // rest of the line.
  const bdi = (text) => { const b = document.createElement('bdi'); b.textContent = text; return b; };
  $('compare-title').replaceChildren(`job ${other} (`, bdi(o.schedule), `) → job ${job} (`, bdi(n.schedule),
    `): the change from job ${other} to job ${job}`);
  const lines = r.differs.map((d) => [`${d.what}: `, bdi(d.other), ` in job ${other}, `, bdi(d.job), ` in job ${job}`]);
  if (r.op_sizes_differ) lines.push(['an op is one chunk\'s: more chunks per rank, shorter ops; compare step times']);
  if (!r.differs.length) lines.push(['nothing else differs in their configurations']);
  const ul = $('compare-differs');
  ul.innerHTML = '';
  for (const parts of lines) { const li = document.createElement('li'); li.append(...parts); ul.appendChild(li); }
  const differs = [...ul.children].map((li) => li.textContent);

  const rows = [['steps compared', o.steps, n.steps, ''],
    ['step time (median)', ms(o.step_time_ns), ms(n.step_time_ns), times(ch.step_time)],
    ['bubble measured', fmtPct(o.bubble_ratio), fmtPct(n.bubble_ratio), pp(ch.bubble_ratio_pp)],
    ['bubble planned', fmtPct(o.sim_bubble_ratio), fmtPct(n.sim_bubble_ratio), pp(ch.sim_bubble_ratio_pp)],
    ['activations at peak (rank)', bytes(o.act_peak_bytes), bytes(n.act_peak_bytes), times(ch.act_peak_bytes)],
    ['  with weights and optimizer', bytes(o.mem_peak_bytes), bytes(n.mem_peak_bytes), times(ch.mem_peak_bytes), 'sub'],
    ['idle per step, all ranks', ms(o.idle_ns_per_step), ms(n.idle_ns_per_step), times(ch.idle_ns_per_step)]];
  for (const [cause, x] of Object.entries(ch.idle_ns_per_step_by_cause))
    rows.push(['  ' + cause, ms(o.idle_ns_per_step_by_cause[cause]), ms(n.idle_ns_per_step_by_cause[cause]), times(x), 'sub']);
  // each job's critical path per step, the rows `pprun stats --vs` prints
  const pathO = o.critical_path_per_step, pathN = n.critical_path_per_step, pathC = ch.critical_path_per_step;
  if (pathO || pathN) {
    const of = (path, key) => (path ? path[key] : null), rankOf = (path, k) => (path ? path.rank_ops_ns[k] : null);
    rows.push(['critical path per step', ms(of(pathO, 'span_ns')), ms(of(pathN, 'span_ns')), times(pathC.span_ns)]);
    for (const k of pathC.listed_ranks)
      rows.push([`  rank ${k}'s ops`, ms(rankOf(pathO, k)), ms(rankOf(pathN, k)), times(pathC.rank_ops_ns[k]), 'sub']);
    const on = pathC.ranks_on_path;
    if (on.length > pathC.listed_ranks.length) { // too many for a row each: their sum
      const sum = (path) => (path ? on.reduce((a, k) => a + (path.rank_ops_ns[k] || 0), 0) : null);
      rows.push([`  ops of ${on.length} ranks`, ms(sum(pathO)), ms(sum(pathN)),
        pathO && pathN ? times(sum(pathN) / sum(pathO)) : '–', 'sub']);
    }
    for (const [label, key] of [['  hand-offs', 'handoff_ns'], ['  sends and receives', 'comm_ns'], ['  the rest', 'other_ns']])
      rows.push([label, ms(of(pathO, key)), ms(of(pathN, key)), times(pathC[key]), 'sub']);
  }
  for (const src of ['host', 'gpu']) {
    if (!ch.op_median_ns[src]) continue;
    rows.push([`op medians (${src === 'gpu' ? 'GPU' : 'host'} spans)`, '', '', '']);
    for (const [ph, x] of Object.entries(ch.op_median_ns[src]))
      rows.push(['  ' + ph, ms(o.op_median_ns[src][ph]), ms(n.op_median_ns[src][ph]), times(x), 'sub']);
  }
  rows.push(["loss (latest step's mean)", lossOf(o), lossOf(n), ch.loss == null ? '–' : (ch.loss >= 0 ? '+' : '') + ch.loss.toFixed(4)]);
  const tbl = $('compare-table');
  tbl.innerHTML = '';
  headerRow(tbl, ['', `job ${other}`, `job ${job}`, `${other}→${job}`]);
  const body = tbl.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    if (row[4]) tr.className = row[4];
    for (let k = 0; k < 4; k++) { const td = tr.insertCell(); td.textContent = String(row[k]); if (k) td.className = 'num'; }
  }

  const p = r.prediction;
  const prediction = p.why_not ? `what if: no prediction: ${p.why_not}`
    : `what if: job ${other} predicted ${p.schedule}${p.tuned ? ' (ordered for its costs)' : ''}` +
      (p.max_mem ? ` --max-mem ${p.max_mem} (the order job ${job} ran)` : '') + ` at ${ms(p.predicted_step_time_ns)}` +
      (p.own_schedule ? `, ${times(p.predicted_over_own)} of its own ${p.own_schedule}` : '') + ' (simulated); ' +
      (p.measured_step_time_ns == null ? `job ${job} has no complete step to hold it against yet`
        : `job ${job} measured ${ms(p.measured_step_time_ns)}: ${times(p.measured_over_predicted)} of the prediction, ` +
          `${times(p.measured_over_other)} of job ${other}'s ${ms(o.step_time_ns)}`);
  $('compare-prediction').textContent = prediction;
  const l = r.loss_check, lossEl = $('compare-loss');
  const mean = (x) => (x == null ? 'not finite' : x.toFixed(6));
  let loss;
  if (!l) loss = "loss: no step has every microbatch's loss in both jobs";
  else if (l.bitwise) loss = `loss at step ${l.step}: ${mean(l.job)} in both: bitwise equal`;
  else loss = `loss at step ${l.step}: ${mean(l.other)} (job ${other}), ${mean(l.job)} (job ${job}): not bitwise equal: ` +
    (l.microbatches_job !== l.microbatches_other ? `${l.microbatches_other} microbatches in job ${other}, ${l.microbatches_job} in job ${job}`
      : `${l.differing} microbatch${l.differing === 1 ? '' : 'es'} differ`);
  lossEl.textContent = loss;
  lossEl.className = !l ? '' : l.bitwise ? 'equal' : 'differ';
  probe.compare = { job, other, differs, rows: rows.map((x) => x.slice(0, 4).map(String)), prediction, loss, reply: r };
}

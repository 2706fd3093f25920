// app.js: the pprun dashboard. Plain JavaScript, no build step.
//
// Data comes from the JSON API (docs/api.md); times are ns since the job's
// start. The timeline keeps the fetched window in typed arrays and draws it
// on a canvas: one pass per colour, blocks narrower than a pixel merged per
// pixel column, everything off-screen skipped, so 100,000 visible events stay
// interactive. Live updates come from /api/jobs/{id}/live (Server-Sent
// Events read through fetch, so the bearer token can be sent as a header).
// For a job with CUPTI gpu spans (/api/jobs/{id} says gpu_spans), each
// rank's row gets a thin GPU lane under it: the gpu spans of the window
// (events?gpu=1) in lighter F/B/W colours and, zoomed in to a few hundred
// spans, the kernels themselves (/kernels) along its lower half.
// The Jobs tab compares two ticked jobs (/api/jobs/{id}/compare?vs=M).
// The critical path (/api/jobs/{id}/critpath) is outlined over the step the
// timeline shows, and its totals over the latest steps sit under the what-if.
// The step charts keep each series appended as steps arrive (Series), so a
// redraw while following a job costs about the same at any length.
// window.__pprun exposes what was fetched and drawn, for tests.
'use strict';

const PHASES = ['F', 'B', 'W', 'SEND_F', 'RECV_F', 'SEND_B', 'RECV_B', 'OPT'];
const PHASE_COLOR = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#b07aa1', '#76b7b2', '#9c755f'];
const CAUSES = ['warmup', 'cooldown', 'wait_activation', 'wait_gradient', 'comm', 'other'];
const CAUSE_COLOR = ['rgba(150,150,150,0.22)', 'rgba(150,150,150,0.22)', 'rgba(225,87,89,0.22)',
  'rgba(237,201,72,0.32)', 'rgba(176,122,161,0.4)', 'rgba(64,160,200,0.2)'];
// The legend's entries for the causes: [label, index into CAUSES] (warm-up and cool-down share a colour).
const CAUSE_LEGEND = [['warm-up/cool-down', 0], ['wait activation', 2], ['wait gradient', 3], ['comm (sending/receiving)', 4],
  ['other idle', 5]];
const ROW_H = 34, ROW_GAP = 6, AXIS_H = 22, LABEL_W = 64;
const GPU_H = 12;           // the GPU lane under a rank's row: spans on it, kernels on its lower half
const KERNEL_SPANS = 400;   // kernels are fetched when at most this many gpu spans are in the window
const KERNEL_LIMIT = 20000; // at most this many kernels per window (the server allows 25000)

const token = (() => {
  const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (m) { sessionStorage.setItem('pprun-token', decodeURIComponent(m[1])); history.replaceState(null, '', location.pathname); }
  return sessionStorage.getItem('pprun-token');
})();

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h['Authorization'] = 'Bearer ' + token;
  return h;
}

async function api(path, opts) {
  const o = Object.assign({}, opts || {});
  o.headers = headers(o.headers);
  const r = await fetch(path, o);
  let body = null;
  try { body = await r.json(); } catch (e) { body = { error: 'not JSON (' + r.status + ')' }; }
  if (!r.ok) { const err = new Error(body && body.error || ('HTTP ' + r.status)); err.status = r.status; throw err; }
  return body;
}

const $ = (id) => document.getElementById(id);
const fmtMs = (ns) => (ns / 1e6).toFixed(ns < 1e7 ? 3 : ns < 1e9 ? 2 : 0) + ' ms';
// As `pprun stats` writes them: "768 KiB", "1.5 MiB".
const fmtBytes = (b) => {
  let k = 0;
  for (; b >= 1024 && k < 4; k++) b /= 1024;
  return (k === 0 || b >= 100 || Math.round(b * 10) % 10 === 0 ? b.toFixed(0) : b.toFixed(1)) + ' ' + ['B', 'KiB', 'MiB', 'GiB', 'TiB'][k];
};

// ---- state -----------------------------------------------------------------

const S = {
  jobs: [], job: null, info: null, plan: null,
  steps: [], stepAt: new Map(), // steps sorted by number, and by number
  view: { from: 0, to: 1 }, follow: false, step: null,
  ev: null, gaps: null, bins: null, mode: 'events', binStep: false,
  gpuLane: false, gpu: [], kernels: null, actRecorded: false, // gpu: rows [id,rank,step,mb,stage,phase,start,end]; kernels: [rank,start,end,stream,event_id,name]
  stream: null, fetchSeq: 0,
  whatif: null, whatifAt: 0, // the latest /whatif answer, and when it was asked for
  crit: null, // the critical path overlay: newCrit()
  picked: [], // the jobs ticked in the Jobs table to compare, at most two
  charts: null, stepsDirty: 0, // the step charts' series (newCharts), and the first step they lack
  lossOutliers: true, lossLog: false, // the loss chart's options, kept while the page is open
};

// A growable column store for events: parallel typed arrays.
function EventStore(cap) {
  this.n = 0; this.cap = 0; this.grow(cap || 1024); this.ids = new Set();
}
EventStore.prototype.grow = function (cap) {
  const old = this;
  const make = (T, a) => { const x = new T(cap); if (a) x.set(a.subarray(0, old.n)); return x; };
  this.id = make(Float64Array, this.id); this.start = make(Float64Array, this.start); this.end = make(Float64Array, this.end);
  this.rank = make(Int32Array, this.rank); this.phase = make(Int8Array, this.phase);
  this.mb = make(Int32Array, this.mb); this.stage = make(Int32Array, this.stage);
  this.step = make(Int32Array, this.step); this.peer = make(Int32Array, this.peer);
  this.bytes = make(Float64Array, this.bytes); // F/B/W: activations the rank held after the op
  this.cap = cap;
};
EventStore.prototype.push = function (row) { // [id,rank,step,mb,stage,phase,start,end,peer,bytes]
  if (this.ids.has(row[0])) return;
  this.ids.add(row[0]);
  if (this.n === this.cap) this.grow(this.cap * 2);
  const i = this.n++;
  this.id[i] = row[0]; this.rank[i] = row[1]; this.step[i] = row[2]; this.mb[i] = row[3]; this.stage[i] = row[4];
  this.phase[i] = row[5]; this.start[i] = row[6]; this.end[i] = row[7]; this.peer[i] = row[8]; this.bytes[i] = row[9];
};
EventStore.prototype.row = function (i) {
  return [this.id[i], this.rank[i], this.step[i], this.mb[i], this.stage[i], this.phase[i], this.start[i], this.end[i], this.peer[i], this.bytes[i]];
};

// ---- jobs ------------------------------------------------------------------

async function loadJobs() {
  const r = await api('/api/jobs');
  S.jobs = r.jobs;
  const sel = $('job-select');
  const cur = sel.value;
  sel.innerHTML = '';
  for (const j of r.jobs) {
    const o = document.createElement('option');
    o.value = j.id;
    o.textContent = `#${j.id} ${j.name} · ${j.schedule} · ${j.world_size} ranks · ${j.status}`;
    sel.appendChild(o);
  }
  if (cur) sel.value = cur;
  return r.jobs;
}

let sqlExample = null; // the SQL tab's example query as last written, for the job open

// A job that ended before its last step: its last steps were cut short
// (events, no statistics: docs/schema.md, "When the analyses run").
function cutShort(job) { return ['failed', 'stopped', 'lost'].includes(job.status); }

async function openJob(id) {
  if (S.stream) S.stream.abort();
  Object.assign(S, { job: id, info: null, steps: [], stepAt: new Map(), plan: null, planAt: 0, ev: new EventStore(), gaps: [], bins: null, step: null, gpuLane: false, gpu: [], kernels: null, actRecorded: false, whatif: null, whatifAt: 0, crit: newCrit(), charts: null, stepsDirty: 0 });
  $('job-select').value = String(id);
  // The SQL tab's example query, about this job (unless it was edited).
  const sql = $('sql-text');
  if (sql.value === sqlExample) sqlExample = sql.value = sql.defaultValue.replace(/job_id = \d+/, `job_id = ${Number(id)}`);
  // The stream first: its hello fixes the cursor, then the history is read;
  // whatever arrives twice is merged by id / step.
  await new Promise((resolve) => { S.stream = openStream(id, resolve); });
  const [info, , plan] = await Promise.all([api(`/api/jobs/${id}`), loadSteps(id), api(`/api/jobs/${id}/plan`)]);
  S.info = info; S.plan = plan;
  window.__pprun.planLoads = [plan.simulated];
  S.gpuLane = !!info.gpu_spans;
  $('legend-gpu').hidden = !S.gpuLane;
  updateHeader();
  const running = info.job.status === 'running';
  $('follow').checked = S.follow = running;
  // A finished job opens at its last step with events: step 0 carries the
  // warm-up (first allocations, cold caches) and is the least typical. A job
  // cut short (failed, stopped) opens at its last whole step and what ran
  // after it until the end: the step it was cut in has events but no
  // statistics (docs/schema.md), so it is no step to show on its own.
  if (running) followLatest();
  else if (S.steps.length) {
    const traced = lastStep((s) => s.start != null && s.start <= info.timeline_end);
    const cut = traced && traced.end != null && cutShort(info.job) && info.timeline_end > traced.end;
    if (cut) await showWindow(traced.start, info.timeline_end + (info.timeline_end - traced.start) * 0.02);
    else await showStep((traced || S.steps[S.steps.length - 1]).step);
  }
  else await showWindow(0, Math.max(info.timeline_end, 1));
  drawCharts();
  checkTraceLink(id);
  loadWhatif(id);
  window.__pprun.ready = true;
}

// Every schedule at the job's measured costs (GET /whatif): read when a job
// opens, then again as its steps come in, at most every WHATIF_EVERY_MS
// (every second until there is something measured).
const WHATIF_EVERY_MS = 10000;
async function loadWhatif(id) {
  S.whatifAt = Date.now();
  loadCritTotals(id); // the critical path's totals come at the same cadence
  let r;
  try { r = await api(`/api/jobs/${id}/whatif`); } catch (e) { $('whatif-info').textContent = 'error: ' + e.message; return; }
  if (S.job !== id) return; // another job opened meanwhile
  const tbl = $('whatif-table'), pct = (x) => (x == null ? '–' : (100 * x).toFixed(1) + '%');
  tbl.innerHTML = '';
  $('whatif-tuned').textContent = '';
  showBalance(r);
  if (!r.measured) {
    $('whatif-info').textContent = '— nothing yet: no complete step with F, B and W';
    S.whatif = window.__pprun.whatif = r;
    return;
  }
  const c = r.costs_ns;
  $('whatif-info').textContent = `— F ${fmtMs(c.f)} · B ${fmtMs(c.b)} · W ${fmtMs(c.w)} · send ${fmtMs(c.send)} per op, ` +
    `medians of ${r.source === 'gpu' ? 'GPU' : 'host'} spans over steps ${r.first_step}–${r.last_step}` +
    (r.fixed_op_costs ? ' (timed model: an op costs the same in any chunk)' : '') +
    (r.shared_cores ? ` · ${r.shared_cores.ranks} ranks shared ${r.shared_cores.cores} core${r.shared_cores.cores === 1 ? '' : 's'}: these op times include ` +
      'waiting for a core, and each schedule is simulated with a core per rank' : '') +
    (r.shared_gpu ? ` · ${r.shared_gpu.ranks} ranks shared one GPU (${r.shared_gpu.device}): these op times include ` +
      'waiting for the GPU, and each schedule is simulated with a GPU per rank' : '');
  const own = r.schedules.find((s) => s.this_job && !s.error);
  const head = tbl.createTHead().insertRow();
  for (const h of ['schedule', 'chunks per rank', 'step time', 'bubble', 'vs this job', 'activations (est.)', 'in flight']) {
    const th = document.createElement('th'); th.textContent = h; head.appendChild(th);
  }
  const body = tbl.createTBody();
  for (const s of r.schedules) {
    const tr = body.insertRow();
    tr.dataset.schedule = s.schedule;
    if (s.this_job) tr.className = 'own';
    const cells = [s.schedule + (s.this_job ? ' (this job)' : s.tuned ? ' (ordered for these costs)' : ''), s.virtual_stages];
    if (s.error) cells.push(s.error);
    else cells.push(fmtMs(s.step_time_ns), pct(s.bubble_ratio), own ? (s.step_time_ns / own.step_time_ns).toFixed(2) + '×' : '–',
      s.act_peak_bytes == null ? '–' : fmtBytes(s.act_peak_bytes), s.peak_inflight);
    cells.forEach((v, k) => {
      const td = tr.insertCell();
      td.textContent = String(v);
      if (k > 0 && !s.error) td.className = 'num';
      if (s.error && k === 2) td.colSpan = 5;
    });
  }
  $('whatif-tuned').textContent = 'zb-v ordered for these costs: pprun run --schedule zb-v --schedule-costs ' +
    r.tuned_schedule_costs;
  S.whatif = window.__pprun.whatif = r;
}

// A gpt job's plan gets simulated times once its first steps are measured
// (runner/job/run_progress.c): a page opened before that asks again as steps
// complete, at most every second (a program's plan never gets them).
async function reloadPlan(id) {
  S.planAt = Date.now();
  let plan;
  try { plan = await api(`/api/jobs/${id}/plan`); } catch (e) { return; } // the next step asks again
  if (S.job !== id) return;
  S.plan = plan;
  window.__pprun.planLoads.push(plan.simulated);
  scheduleDraw();
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
  const head = tbl.createTHead().insertRow();
  for (const h of ['stage', 'rank', 'layers', 'F', 'B', 'W', 'F+B+W', 'vs mean', '']) {
    const th = document.createElement('th'); th.textContent = h; head.appendChild(th);
  }
  const body = tbl.createTBody();
  for (const s of shown) {
    const c = s.costs_ns, t = total(c), slowest = t >= b.slowest_stage_ns;
    const tr = body.insertRow();
    tr.dataset.stage = s.stage;
    if (slowest) tr.className = 'slowest';
    const layers = b.layers_known ? `${s.first_layer}–${s.first_layer + s.layers - 1}` : '–';
    [s.stage, s.rank, layers, fmtMs(c.f), fmtMs(c.b), fmtMs(c.w), fmtMs(t), mean > 0 ? (t / mean).toFixed(2) + '×' : '–',
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

function updateHeader() {
  if (!S.info) return;
  const j = S.info.job;
  const b = $('job-status');
  b.textContent = j.status; b.className = 'badge ' + j.status;
  const done = S.steps.filter((s) => s.complete !== false).length;
  $('job-meta').textContent = `${j.schedule}, ${j.world_size} ranks, ${j.microbatches} microbatches, ` +
    `${done}/${j.steps} steps, ${j.device}` + (j.events_dropped ? `, ${j.events_dropped} events dropped` : '') + (j.cupti_dropped ? `, ${j.cupti_dropped} CUPTI records dropped` : '') +
    (j.failure ? ` — ${j.failure}` : '');
}

// The steps the timeline shows, [first, last], or null when it shows them
// all: a long job's whole trace is more than Perfetto can open. A step
// counts when its middle is in view (the margin around a step shown shows
// bits of its neighbours), or, zoomed in between two, when any of it is.
function stepsInView() {
  const { from, to } = S.view;
  const seen = S.steps.filter((s) => s.start != null && s.end != null && s.end >= from && s.start <= to);
  const mostly = seen.filter((s) => (s.start + s.end) / 2 >= from && (s.start + s.end) / 2 <= to);
  const shown = mostly.length ? mostly : seen;
  if (!shown.length || shown.length === S.steps.length) return null;
  return [shown[0].step, shown[shown.length - 1].step];
}

function checkTraceLink(id) {
  // A plain link would be fetched without the Authorization header (a 401
  // with a token): fetch with it, hand the browser the bytes as a blob.
  const a = $('trace-link');
  a.hidden = false;
  a.href = '#';
  a.removeAttribute('download');
  a.textContent = 'Chrome trace';
  a.title = 'Chrome trace JSON (Perfetto) of the steps in the timeline';
  a.onclick = async (ev) => {
    ev.preventDefault();
    if (a.dataset.busy) return;
    a.dataset.busy = '1';
    a.textContent = 'Chrome trace…';
    const steps = stepsInView(), range = steps ? `${steps[0]}-${steps[1]}` : '';
    try {
      const r = await fetch(`/api/jobs/${id}/trace.json` + (steps ? `?steps=${range}` : ''), { headers: headers() });
      if (!r.ok) {
        let msg = 'HTTP ' + r.status;
        try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
        throw new Error(msg);
      }
      const url = URL.createObjectURL(await r.blob());
      const d = document.createElement('a');
      d.href = url;
      d.download = `pprun-job-${id}` + (steps ? `-steps-${range}` : '') + '.trace.json';
      document.body.appendChild(d);
      d.click();
      d.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      a.textContent = 'Chrome trace';
    } catch (e) {
      a.textContent = 'Chrome trace (failed: ' + e.message + ')';
    } finally {
      delete a.dataset.busy;
    }
  };
}

// Every step, a page at a time (the server sends at most STEPS_PAGE a call).
const STEPS_PAGE = 100000;
async function loadSteps(id) {
  for (let since = 0; ;) {
    const r = await api(`/api/jobs/${id}/steps?since=${since}&limit=${STEPS_PAGE}`);
    if (S.job !== id) return;
    for (const s of r.steps) mergeStep(s);
    if (r.steps.length < STEPS_PAGE) return;
    since = r.steps[r.steps.length - 1].step + 1;
  }
}

// Steps arrive in order, some twice (history and live): an index by number
// and an append make each new step's merge O(1), so a job of 100,000 steps
// opens in a moment (one out of order is inserted where it belongs, one
// seen again is found by bisection).
function mergeStep(s) {
  const a = S.steps, old = S.stepAt.get(s.step);
  let lo = a.length;
  if (lo && a[lo - 1].step >= s.step) {
    lo = 0;
    for (let hi = a.length; lo < hi;) { const m = (lo + hi) >> 1; if (a[m].step < s.step) lo = m + 1; else hi = m; }
  }
  S.stepsDirty = Math.min(S.stepsDirty, lo); // the charts take their points again from here (syncCharts)
  if (old) { Object.assign(old, s); return; }
  S.stepAt.set(s.step, s);
  a.splice(lo, 0, s);
}

// The newest step for which pred holds.
function lastStep(pred) {
  for (let i = S.steps.length - 1; i >= 0; i--) if (pred(S.steps[i])) return S.steps[i];
  return null;
}

// ---- live stream (SSE over fetch) -------------------------------------------

function openStream(id, onHello) {
  const ctl = new AbortController();
  let lastId = null, helloSeen = false;
  const handle = (ev, data, mid) => {
    if (mid) lastId = mid;
    const d = JSON.parse(data);
    if (ev === 'hello') { if (!helloSeen) { helloSeen = true; onHello(); } }
    else if (ev === 'status') onStatus(d);
    else if (ev === 'events') onEvents(d.events);
    else if (ev === 'step') onStepDone(d);
    else if (ev === 'losses') onLosses(d.losses);
  };
  (async () => {
    while (!ctl.signal.aborted) {
      try {
        const h = headers({ Accept: 'text/event-stream' });
        if (lastId) h['Last-Event-ID'] = lastId;
        const r = await fetch(`/api/jobs/${id}/live`, { headers: h, signal: ctl.signal });
        if (!r.ok) throw new Error('live ' + r.status);
        if (lastId && !helloSeen) { helloSeen = true; onHello(); }
        const rd = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await rd.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let k;
          while ((k = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, k); buf = buf.slice(k + 2);
            let ev = 'message', data = '', mid = null;
            for (const line of frame.split('\n')) {
              if (line.startsWith('event: ')) ev = line.slice(7);
              else if (line.startsWith('data: ')) data += line.slice(6);
              else if (line.startsWith('id: ')) mid = line.slice(4);
            }
            if (data) handle(ev, data, mid);
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        if (!helloSeen) { helloSeen = true; onHello(); }
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  return ctl;
}

function onStatus(d) {
  if (!S.info) return;
  const was = S.info.job.status;
  Object.assign(S.info.job, d);
  updateHeader();
  loadJobs();
  if (was === 'running' && d.status !== 'running') onJobEnded(S.job);
}

// The job has ended: the what-if, the stage balance and the critical path
// totals are read once more (their throttle would leave them at whatever
// steps they last read, "steps 1-9" of 60), and a page that followed it
// stops following and shows its last step, as a finished job opens. The
// status frame comes before the last steps' frames: those are read here.
async function onJobEnded(id) {
  loadWhatif(id);
  S.stepsDirty = 0; // the charts read every step again: a cut job's last loss goes (syncCharts)
  const follow = S.follow, done = lastStep((s) => s.complete);
  S.follow = $('follow').checked = false;
  updateStepLabel();
  try {
    const r = await api(`/api/jobs/${id}/steps?since=${done ? done.step + 1 : 0}&limit=${STEPS_PAGE}`);
    if (S.job !== id) return;
    for (const s of r.steps) mergeStep(s);
  } catch (e) { /* the stream brings them */ }
  updateHeader();
  drawCharts();
  const traced = lastStep((s) => s.start != null);
  if (follow && traced && S.step == null) await showStep(traced.step);
}

function onEvents(rows) {
  let maxEnd = 0;
  for (const r of rows) { S.ev.push(r); if (r[7] > maxEnd) maxEnd = r[7]; }
  window.__pprun.liveEvents += rows.length;
  if (S.follow && S.mode === 'events') followLatest(maxEnd);
  else scheduleDraw();
}

// Runs fn at most once every ms, and always after the last call: a fast job
// completes steps far more often than a page should redraw its charts or
// ask the server for its window (at 3 ms a step, one request per step was
// 75 a second).
function throttled(fn, ms) {
  let last = 0, timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, Math.max(0, last + ms - Date.now()));
  };
}
const LIVE_REDRAW_MS = 250;
const followWindowSoon = throttled(() => { if (S.follow) fetchWindow(); }, LIVE_REDRAW_MS);
const drawChartsSoon = throttled(() => drawCharts(), LIVE_REDRAW_MS);

function onStepDone(d) {
  d.complete = true;
  mergeStep(d);
  if (Date.now() - S.whatifAt >= (S.whatif && S.whatif.measured ? WHATIF_EVERY_MS : 1000)) loadWhatif(S.job);
  if (S.plan && !S.plan.simulated && Date.now() - S.planAt >= 1000) reloadPlan(S.job);
  if (S.follow) { followLatest(); followWindowSoon(); } // the window brings the step's gaps
  updateHeader();
  drawChartsSoon();
}

function onLosses(rows) {
  // Per-step mean of what has arrived, for steps without stats yet.
  const by = new Map();
  for (const [step, , loss] of rows) { const a = by.get(step) || []; a.push(loss); by.set(step, a); }
  for (const [step, a] of by) {
    const s = S.stepAt.get(step);
    if (s && s.complete) continue;
    const prev = s && s._losses ? s._losses : [];
    const all = prev.concat(a);
    // A loss that was not finite arrives as null: the step's mean is null too.
    const mean = all.some((x) => x == null) ? null : all.reduce((x, y) => x + y, 0) / all.length;
    mergeStep({ step, loss: mean, _losses: all, complete: false });
  }
  drawChartsSoon();
}

// Follow mode: the view ends at the newest event and is the last step's
// length and a bit; a step that runs longer than the last one widens it to
// keep its start (and the plan aligned to it) in view.
function followLatest(end) {
  let e = end || 0, newest = -1;
  for (let i = 0; i < S.ev.n; i++) if (S.ev.end[i] >= e) { e = S.ev.end[i]; newest = S.ev.step[i]; }
  let newestStart = e;
  for (let i = 0; i < S.ev.n; i++) if (S.ev.step[i] === newest && S.ev.start[i] < newestStart) newestStart = S.ev.start[i];
  const known = S.stepAt.get(newest);
  if (known && known.start != null) newestStart = Math.min(newestStart, known.start);
  const last = lastStep((s) => s.time_ns);
  const span = last ? last.time_ns * 1.15 : 50e6;
  if (!e && S.info) e = S.info.timeline_end;
  S.view = { from: Math.max(0, Math.min(e - span, newestStart - span * 0.02)), to: Math.max(e, span) + span * 0.02 };
  // A long follow would grow the store without bound: keep what is near.
  if (S.ev.n > 200000) {
    const st = new EventStore(65536);
    for (let i = 0; i < S.ev.n; i++) if (S.ev.end[i] >= S.view.from - span) st.push(S.ev.row(i));
    S.ev = st;
  }
  setStep(null);
  if (!S.ev.n && S.job) fetchWindow();
  scheduleDraw();
}

// ---- windows ---------------------------------------------------------------

async function showStep(step) {
  const s = S.stepAt.get(step);
  setStep(step);
  S.follow = $('follow').checked = false;
  if (s && s.start != null) {
    const pad = (s.end - s.start) * 0.02;
    S.view = { from: Math.max(0, s.start - pad), to: s.end + pad };
  }
  await fetchWindow();
}

async function showWindow(from, to) {
  S.view = { from, to };
  await fetchWindow();
}

let fetchTimer = null;
function scheduleFetch() {
  clearTimeout(fetchTimer);
  fetchTimer = setTimeout(fetchWindow, 120);
}

async function fetchWindow() {
  if (!S.job) return;
  const seq = ++S.fetchSeq;
  window.__pprun.windowFetches++;
  const w = $('timeline').clientWidth || 1000;
  // Whole ns in the range the server takes, whatever the view holds.
  const ns = (x) => Math.min(Number.MAX_SAFE_INTEGER, Math.max(0, Number.isFinite(x) ? x : 0));
  const from = Math.floor(ns(S.view.from)), to = Math.ceil(ns(S.view.to));
  const gpu = S.gpuLane;
  const r = await api(`/api/jobs/${S.job}/events?from=${from}&to=${Math.max(to, from + 1)}&buckets=${Math.min(4000, Math.max(10, Math.floor(w)))}` + (gpu ? '&gpu=1' : ''));
  if (seq !== S.fetchSeq) return; // a newer view was asked for
  // Kernels only when zoomed in: a few hundred ops' worth.
  let kr = null;
  if (gpu && r.mode === 'events' && r.gpu && r.gpu.length <= KERNEL_SPANS) {
    kr = await api(`/api/jobs/${S.job}/kernels?from=${from}&to=${Math.max(to, from + 1)}&limit=${KERNEL_LIMIT}`);
    if (seq !== S.fetchSeq) return;
  }
  S.gpu = r.mode === 'events' && r.gpu ? r.gpu : [];
  S.kernels = kr ? kr.kernels : null;
  window.__pprun.lastKernels = kr ? { count: kr.count, truncated: kr.truncated } : null;
  window.__pprun.lastWindow = { mode: r.mode, count: r.count, from: r.from, to: r.to };
  S.mode = r.mode;
  if (r.mode === 'events') {
    const st = new EventStore(Math.max(1024, r.events.length));
    for (const row of r.events) st.push(row);
    // Keep live rows the window does not have: those that reached the page
    // while it was asked for (the store skips ids it holds).
    for (let i = 0; S.ev && i < S.ev.n; i++) {
      if (S.ev.end[i] >= from) st.push(S.ev.row(i));
    }
    S.ev = st; S.bins = null;
    // Following, the view has moved on since this window was asked for: the
    // gaps the page held that are still in view stay (else the newest
    // steps' shading blinks out until the next answer).
    const seen = new Set(r.gaps.map((x) => x[0] + ':' + x[2]));
    S.gaps = S.follow ? r.gaps.concat((S.gaps || []).filter((x) => x[3] >= S.view.from && !seen.has(x[0] + ':' + x[2]))) : r.gaps;
  } else {
    S.bins = r.bins; S.binStep = r.mode === 'steps'; S.gaps = [];
    S.ev = new EventStore();
  }
  scheduleDraw();
}

function updateStepLabel() {
  const last = S.steps.length ? S.steps[S.steps.length - 1].step : null;
  $('step-label').textContent = S.step != null ? `step ${S.step}${last != null ? ' / ' + last : ''}` : (S.follow ? 'following live' : 'custom window');
}

// ---- drawing -----------------------------------------------------------------

let drawPending = false;
function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; draw(); });
}

function sizeCanvas(c, cssH) {
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth;
  c.style.height = cssH + 'px';
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(cssH * dpr)) {
    c.width = Math.round(w * dpr); c.height = Math.round(cssH * dpr);
  }
  const g = c.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { g, w, h: cssH };
}

function world() { return S.info ? S.info.job.world_size : 1; }
function rowPitch() { return ROW_H + ROW_GAP + (S.gpuLane ? GPU_H + 2 : 0); }
function rowY(rank) { return AXIS_H + rank * rowPitch(); }
function gpuY(rank) { return rowY(rank) + ROW_H + 1; } // top of the rank's GPU lane
function xOf(t, w) { return LABEL_W + (t - S.view.from) / (S.view.to - S.view.from) * (w - LABEL_W); }
function tOf(x, w) { return S.view.from + (x - LABEL_W) / (w - LABEL_W) * (S.view.to - S.view.from); }

function drawAxis(g, w, h) {
  const span = S.view.to - S.view.from;
  const raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const stepNs = [1, 2, 5, 10].map((k) => k * p).find((v) => v >= raw) || raw;
  g.fillStyle = '#888'; g.strokeStyle = '#eee'; g.font = '11px system-ui, sans-serif'; g.textBaseline = 'top';
  let prevEnd = -Infinity;
  for (let t = Math.ceil(S.view.from / stepNs) * stepNs; t <= S.view.to; t += stepNs) {
    const x = xOf(t, w);
    g.beginPath(); g.moveTo(x, AXIS_H - 4); g.lineTo(x, h); g.stroke();
    // The last label moves left to stay inside the canvas; where it would then
    // run into the one before, it is left out.
    const label = fmtMs(t), lw = g.measureText(label).width, lx = Math.min(x + 2, w - 2 - lw);
    if (lx < prevEnd + 4) continue;
    g.fillText(label, lx, 4);
    prevEnd = lx + lw;
  }
}

function drawRowLabels(g, n, prefix, ry = rowY, lanes = S.gpuLane) {
  g.fillStyle = '#444'; g.font = '12px system-ui, sans-serif'; g.textBaseline = 'middle';
  for (let r = 0; r < n; r++) {
    g.fillStyle = '#fff'; g.fillRect(0, ry(r) - 2, LABEL_W - 2, ROW_H + 4);
    g.fillStyle = '#444'; g.fillText(prefix + r, 6, ry(r) + ROW_H / 2);
    if (lanes) {
      g.fillStyle = '#fff'; g.fillRect(0, gpuY(r), LABEL_W - 2, GPU_H);
      g.fillStyle = '#888'; g.font = '10px system-ui, sans-serif'; g.fillText('gpu', 22, gpuY(r) + GPU_H / 2);
      g.font = '12px system-ui, sans-serif';
    }
  }
}

function draw() {
  if (!S.info) return;
  const n = world();
  const c = $('timeline');
  const { g, w, h } = sizeCanvas(c, AXIS_H + n * rowPitch() + 4);
  g.clearRect(0, 0, w, h);
  drawAxis(g, w, h);
  const drawn = { F: new Array(n).fill(0), B: new Array(n).fill(0), W: new Array(n).fill(0), comm: 0, opt: 0, gaps: 0, bins: 0, steps: new Set(),
    gpu: new Array(n).fill(0), kernels: 0 };
  const left = LABEL_W, right = w;
  // Idle gaps, shaded by cause.
  for (const gp of S.gaps || []) {
    const x0 = Math.max(left, xOf(gp[2], w)), x1 = Math.min(right, xOf(gp[3], w));
    if (x1 <= x0) continue;
    g.fillStyle = CAUSE_COLOR[gp[4]] || CAUSE_COLOR[5];
    g.fillRect(x0, rowY(gp[0]), x1 - x0, ROW_H);
    drawn.gaps++;
  }
  if (S.bins) drawBins(g, w, drawn);
  const ev = S.ev;
  // One pass per phase: no fillStyle churn; sub-pixel blocks merged.
  const lastPx = new Float64Array(n * 8).fill(-1);
  let inView = 0; // events in the view (the store keeps some from earlier windows)
  for (let ph = 0; ph < 8; ph++) {
    g.fillStyle = PHASE_COLOR[ph];
    const comm = ph >= 3 && ph <= 6;
    for (let i = 0; i < ev.n; i++) {
      if (ev.phase[i] !== ph) continue;
      if (ev.end[i] < S.view.from || ev.start[i] > S.view.to) continue;
      inView++;
      const r = ev.rank[i];
      if (r < 0 || r >= n) continue;
      let x0 = xOf(ev.start[i], w), x1 = xOf(ev.end[i], w);
      if (x0 < left) x0 = left;
      if (x1 > right) x1 = right;
      if (x1 - x0 < 1) {
        const px = Math.floor(x0);
        if (lastPx[r * 8 + ph] === px) continue;
        lastPx[r * 8 + ph] = px; x1 = x0 + 1;
      }
      const y = rowY(r);
      if (comm) { g.fillRect(x0, y + ROW_H - (ph === 3 || ph === 5 ? 3 : 6), x1 - x0, 3); drawn.comm++; }
      else if (ph === 7) { g.fillRect(x0, y + 4, x1 - x0, ROW_H - 12); drawn.opt++; }
      else { g.fillRect(x0, y, x1 - x0 - (x1 - x0 > 3 ? 0.5 : 0), ROW_H - 8); drawn[PHASES[ph]][r]++; drawn.steps.add(ev.step[i]); }
    }
  }
  if (S.gpuLane) drawGpu(g, w, n, drawn);
  // Microbatch labels where they fit.
  g.fillStyle = '#fff'; g.font = '11px system-ui, sans-serif'; g.textBaseline = 'middle'; g.textAlign = 'center';
  for (let i = 0; i < ev.n; i++) {
    const ph = ev.phase[i];
    if (ph > 2 || ev.end[i] < S.view.from || ev.start[i] > S.view.to) continue;
    const x0 = Math.max(left, xOf(ev.start[i], w)), x1 = Math.min(right, xOf(ev.end[i], w));
    if (x1 - x0 < 14) continue;
    g.fillText(String(ev.mb[i]), (x0 + x1) / 2, rowY(ev.rank[i]) + (ROW_H - 8) / 2);
  }
  g.textAlign = 'left';
  const anchor = viewAnchor();
  drawCritpath(g, w, h, n, anchor);
  drawRowLabels(g, n, 'rank ');
  window.__pprun.drawn = { F: drawn.F, B: drawn.B, W: drawn.W, comm: drawn.comm, opt: drawn.opt, gaps: drawn.gaps, bins: drawn.bins, steps: [...drawn.steps].sort((a, b) => a - b), inView,
    gpuLane: S.gpuLane, gpu: drawn.gpu, kernels: drawn.kernels };
  $('window-label').textContent = `${fmtMs(S.view.from)} – ${fmtMs(S.view.to)} · ${S.mode === 'events' ? inView + ' events' : 'aggregated (' + S.mode + ')'}` +
    (S.gpuLane ? (S.mode === 'events' ? ` · ${S.gpu.length} gpu spans` + (S.kernels ? `, ${S.kernels.length} kernels` + (window.__pprun.lastKernels && window.__pprun.lastKernels.truncated ? ` (cut at ${KERNEL_LIMIT.toLocaleString('en-US')}: zoom in)` : '') : '') : ' · gpu lane: zoom in') : '');
  drawPlan(anchor);
}

// The GPU lanes: a light track, the gpu spans in lighter phase colours over
// its full height, the kernels (when fetched) darker on its lower half.
function drawGpu(g, w, n, drawn) {
  const left = LABEL_W, right = w;
  g.fillStyle = '#f3f3f3';
  for (let r = 0; r < n; r++) g.fillRect(left, gpuY(r), right - left, GPU_H);
  const phaseOf = new Map();
  g.globalAlpha = 0.45;
  for (const x of S.gpu) {
    phaseOf.set(x[0], x[5]);
    const r = x[1];
    if (r < 0 || r >= n || x[7] < S.view.from || x[6] > S.view.to) continue;
    const x0 = Math.max(left, xOf(x[6], w)), x1 = Math.min(right, xOf(x[7], w));
    g.fillStyle = PHASE_COLOR[x[5]] || '#999';
    g.fillRect(x0, gpuY(r), Math.max(1, x1 - x0), GPU_H);
    drawn.gpu[r]++;
  }
  g.globalAlpha = 1;
  if (!S.kernels) return;
  for (const k of S.kernels) {
    const r = k[0];
    if (r < 0 || r >= n || k[2] < S.view.from || k[1] > S.view.to) continue;
    const x0 = Math.max(left, xOf(k[1], w)), x1 = Math.min(right, xOf(k[2], w));
    const ph = k[4] != null ? phaseOf.get(k[4]) : undefined;
    g.fillStyle = ph != null ? PHASE_COLOR[ph] : '#777';
    g.fillRect(x0, gpuY(r) + GPU_H / 2, Math.max(1, x1 - x0 - (x1 - x0 > 3 ? 0.5 : 0)), GPU_H / 2);
    drawn.kernels++;
  }
}

// Hover on a GPU lane: a kernel on the lower half (when fetched), else the
// gpu span, with its host op's time beside it.
function gpuHit(r, t, yin, tol) {
  const lower = yin >= GPU_H / 2;
  if (lower && S.kernels) {
    for (const k of S.kernels) {
      if (k[0] !== r || t < k[1] - tol || t > k[2] + tol) continue;
      const span = k[4] != null ? S.gpu.find((x) => x[0] === k[4]) : null;
      return { text: `rank ${r} · kernel ${k[5]}\nduration ${fmtMs(k[2] - k[1])} · stream ${k[3]}` +
        (span ? `\nin ${opLabel(span)}` : '\noutside any op (optimizer or set-up)') };
    }
  }
  for (const x of S.gpu) {
    if (x[1] !== r || t < x[6] - tol || t > x[7] + tol) continue;
    const ev = S.ev;
    let host = -1;
    for (let i = 0; i < ev.n; i++) {
      if (ev.rank[i] === r && ev.step[i] === x[2] && ev.mb[i] === x[3] && ev.stage[i] === x[4] && ev.phase[i] === x[5] &&
          ev.start[i] <= x[7] && ev.end[i] >= x[6]) { host = i; break; }
    }
    let text = `rank ${r} · GPU · ${opLabel(x)}\nGPU ${fmtMs(x[7] - x[6])} (first kernel start to last end)`;
    if (host >= 0) text += ` · host ${fmtMs(ev.end[host] - ev.start[host])}\nGPU starts ${fmtMs(x[6] - ev.start[host])} after the host op`;
    return { text };
  }
  return null;
}

function opLabel(x) { // a gpu span row: phase, microbatch, stage, step
  return PHASES[x[5]] + (x[3] >= 0 ? ` · microbatch ${x[3]}` : '') + (x[4] >= 0 ? ` · stage ${x[4]}` : '') + ` · step ${x[2]}`;
}

function drawBins(g, w, drawn) {
  // Aggregated: a bar per bin, its height the busy share, coloured by the
  // dominant phase (grey when the split is unknown: per-step bins).
  for (const b of S.bins) {
    const x0 = Math.max(LABEL_W, xOf(b[1], w)), x1 = Math.min(w, xOf(b[2], w));
    if (x1 <= x0) continue;
    const frac = Math.min(1, b[3] / Math.max(1, b[2] - b[1]));
    let ph = -1, best = -1;
    for (let k = 0; k < 3; k++) if (b[4 + k] != null && b[4 + k] > best) { best = b[4 + k]; ph = k; }
    g.fillStyle = ph >= 0 ? PHASE_COLOR[ph] : '#6b8bb0';
    const hh = (ROW_H - 8) * frac;
    g.fillRect(x0, rowY(b[0]) + (ROW_H - 8) - hh, Math.max(1, x1 - x0 - 0.3), hh);
    drawn.bins++;
  }
}

// The step the plan is aligned to: the one shown; else, of the steps with
// events in the window, the one whose planned span covers most of the view
// (the newest on a tie). A running step has no stats yet: it starts at its
// first event. Zoomed out (no events), the step that started last before
// the middle of the view.
function planAnchor(makespan) {
  const shown = S.step != null && S.stepAt.get(S.step);
  if (shown && shown.start != null) return { step: shown.step, start: shown.start };
  const first = new Map();
  for (let i = 0; i < S.ev.n; i++) {
    const st = S.ev.step[i], t = S.ev.start[i];
    if (!(first.get(st) <= t)) first.set(st, t);
  }
  let best = null, bestCover = 0;
  for (const [step, t] of first) {
    const known = S.stepAt.get(step), start = known && known.start != null ? known.start : t;
    const cover = Math.min(S.view.to, start + makespan) - Math.max(S.view.from, start);
    if (cover > bestCover || (cover === bestCover && best && step > best.step)) { best = { step, start }; bestCover = cover; }
  }
  if (best) return best;
  const mid = (S.view.from + S.view.to) / 2;
  const s = lastStep((x) => x.start != null && x.start <= mid);
  return s ? { step: s.step, start: s.start } : null;
}

// The step the timeline shows, for the plan and the critical path: the
// plan's anchor, with the last step's time standing in for the makespan of
// a plan without simulated times.
function viewAnchor() {
  const last = S.plan && S.plan.simulated ? null : lastStep((s) => s.time_ns);
  return planAnchor(S.plan && S.plan.simulated ? S.plan.sim_makespan_ns : last ? last.time_ns : 0);
}

// The plan's simulated timeline, aligned to the start of the step in view
// (anchor: viewAnchor()).
function drawPlan(anchor) {
  const c = $('plan');
  const n = world();
  const { g, w, h } = sizeCanvas(c, AXIS_H + n * (ROW_H + ROW_GAP) + 4);
  g.clearRect(0, 0, w, h);
  window.__pprun.planDrawn = 0;
  const planY = (rank) => AXIS_H + rank * (ROW_H + ROW_GAP); // the plan has no GPU lanes
  if (!S.plan || !S.plan.simulated) {
    g.fillStyle = '#888'; g.font = '12px system-ui, sans-serif';
    g.fillText(S.plan && S.plan.actions.length ? 'the plan has no simulated times' : 'no plan stored for this job', LABEL_W, 20);
    return;
  }
  window.__pprun.planAnchor = anchor ? anchor.step : null;
  const t0 = anchor ? anchor.start : 0;
  g.fillStyle = '#888'; g.font = '11px system-ui, sans-serif'; g.textBaseline = 'top';
  g.fillText(`makespan ${fmtMs(S.plan.sim_makespan_ns)} · bubble ${S.plan.sim_bubble_ratio.map((x) => (100 * x).toFixed(1) + '%').join(' ')}` +
    (S.plan.peak_inflight && S.plan.peak_inflight.length ? ` · in flight at most ${S.plan.peak_inflight.join(' ')} microbatch-stages` : '') +
    (anchor ? ` · aligned to step ${anchor.step}` : ''), LABEL_W + 4, 4);
  g.textBaseline = 'middle'; g.textAlign = 'center';
  for (const a of S.plan.actions) {
    const ph = PHASES.indexOf(a.phase);
    const x0 = Math.max(LABEL_W, xOf(t0 + a.sim_start, w)), x1 = Math.min(w, xOf(t0 + a.sim_end, w));
    if (x1 <= x0) continue;
    g.fillStyle = PHASE_COLOR[ph] || '#999';
    g.globalAlpha = 0.75;
    g.fillRect(x0, planY(a.rank), x1 - x0 - 0.5, ROW_H - 8);
    g.globalAlpha = 1;
    if (x1 - x0 >= 14) { g.fillStyle = '#fff'; g.fillText(String(a.microbatch), (x0 + x1) / 2, planY(a.rank) + (ROW_H - 8) / 2); }
    window.__pprun.planDrawn++;
  }
  g.textAlign = 'left';
  drawRowLabels(g, n, 'rank ', planY, false);
}

// ---- critical path -------------------------------------------------------------

// The path of the step the timeline shows (GET /critpath?step=N), drawn
// over the measured rows: each op on it outlined, each hand-off from another
// rank (via "data") a line from the producer's end to the consumer's start.
// One answer per step is kept, so stepping back and forth asks nothing
// again. A step is asked for only once it is complete (a running step's
// path changes with each op), and through a throttle: following a fast
// job, the step in view changes faster than the page should send requests.
const CRIT_KEEP = 64;          // answers kept per job; a long follow drops the oldest
const CRIT_COLOR = '#111';     // the outline: dark on every phase colour
const CRIT_EDGE = '#d62728';   // the hand-offs: apart from the outlines and the row colours

function newCrit() {
  return { on: $('critpath-on').checked, byStep: new Map(), want: null, shown: null };
}

const critFetchSoon = throttled(() => fetchCritpath(), LIVE_REDRAW_MS);

async function fetchCritpath() {
  const crit = S.crit, job = S.job, step = crit && crit.want;
  if (step == null || crit.byStep.has(step)) return;
  crit.byStep.set(step, { pending: true }); // asked once, whatever comes back
  window.__pprun.critFetches++;
  let r;
  try { r = await api(`/api/jobs/${job}/critpath?step=${step}`); } catch (e) { r = { error: e.message }; }
  if (S.crit !== crit) return; // another job opened meanwhile
  if (r.ops) r.byId = new Map(r.ops.map((o, i) => [o.id, i]));
  crit.byStep.delete(step); // re-inserted last: the Map's order is the age to drop by
  crit.byStep.set(step, r);
  for (const k of crit.byStep.keys()) { if (crit.byStep.size <= CRIT_KEEP) break; crit.byStep.delete(k); }
  scheduleDraw();
}

// The answer for the step in view: undefined while there is none to draw
// (asking for it when it can be asked for).
function critFor(anchor) {
  const crit = S.crit;
  if (!crit || !crit.on || S.mode !== 'events' || !anchor) return undefined;
  const s = S.stepAt.get(anchor.step);
  if (!s || s.complete === false || s.start == null) return undefined; // running: no path yet
  const got = crit.byStep.get(anchor.step);
  if (!got) { crit.want = anchor.step; critFetchSoon(); return undefined; }
  return got.ops ? got : undefined; // pending, no compute op (404) or an error
}

function blockY(rank, phase) { // top and height of a compute block, as draw() fills it
  return phase === 'OPT' ? [rowY(rank) + 4, ROW_H - 12] : [rowY(rank), ROW_H - 8];
}
function critMidY(rank) { return rowY(rank) + (ROW_H - 8) / 2; }

// The data hand-offs of a path: [producer, consumer] pairs of its ops.
function critEdges(path) {
  const out = [];
  for (let i = 1; i < path.ops.length; i++) if (path.ops[i].via === 'data') out.push([path.ops[i - 1], path.ops[i]]);
  return out;
}

function drawCritpath(g, w, h, n, anchor) {
  const path = critFor(anchor);
  const out = { on: !!(S.crit && S.crit.on), step: path ? path.step : null, ops: 0, outlined: 0, edges: 0, dataEdges: 0 };
  if (S.crit) S.crit.shown = path || null; // what the tooltips describe
  window.__pprun.critpath = out;
  if (!path) return;
  out.ops = path.ops.length;
  g.save();
  g.beginPath(); g.rect(LABEL_W, 0, w - LABEL_W, h); g.clip(); // the row labels stay clear
  g.strokeStyle = CRIT_COLOR; g.lineWidth = 2;
  for (const o of path.ops) {
    if (o.rank < 0 || o.rank >= n || o.end < S.view.from || o.start > S.view.to) continue;
    const x0 = xOf(o.start, w), x1 = xOf(o.end, w), [y, bh] = blockY(o.rank, o.phase);
    g.strokeRect(x0 + 1, y + 1, Math.max(0, x1 - x0 - 2), bh - 2); // inside the block: neighbours keep their edges
    out.outlined++;
  }
  g.strokeStyle = g.fillStyle = CRIT_EDGE; g.lineWidth = 1.5;
  for (const [p, o] of critEdges(path)) {
    out.dataEdges++;
    if (p.rank < 0 || p.rank >= n || o.rank < 0 || o.rank >= n) continue;
    const xa = xOf(p.end, w), xb = xOf(o.start, w), ya = critMidY(p.rank), yb = critMidY(o.rank);
    if (Math.max(xa, xb) < LABEL_W || Math.min(xa, xb) > w) continue;
    g.beginPath(); g.moveTo(xa, ya); g.lineTo(xb, yb); g.stroke();
    g.beginPath(); g.arc(xa, ya, 2.5, 0, 7); g.fill(); // where it left
    const a = Math.atan2(yb - ya, xb - xa); // the arrowhead: where it arrived
    g.beginPath(); g.moveTo(xb, yb);
    g.lineTo(xb - 7 * Math.cos(a - 0.4), yb - 7 * Math.sin(a - 0.4));
    g.lineTo(xb - 7 * Math.cos(a + 0.4), yb - 7 * Math.sin(a + 0.4));
    g.closePath(); g.fill();
    out.edges++;
  }
  g.restore();
}

// The tooltip's line for a block on the drawn path ('' off it).
function critNote(id) {
  const path = S.crit && S.crit.shown, i = path ? path.byId.get(id) : undefined;
  if (i === undefined) return '';
  const o = path.ops[i], p = path.ops[i - 1];
  if (o.via === 'data') return `\non the critical path: waited ${fmtMs(o.lead_ns)} for rank ${p.rank}'s ${p.phase}`;
  if (o.via === 'first') return "\non the critical path: the step's first op";
  return "\non the critical path: after the rank's previous op" + (o.lead_ns > 0 ? `, ${fmtMs(o.lead_ns)} later` +
    (o.lead_comm_ns > 0 ? ` (${fmtMs(o.lead_comm_ns)} of it sending or receiving)` : '') : '');
}

// Hover on a hand-off line (within 4 px of it).
function critEdgeHit(x, y, w) {
  const path = S.crit && S.crit.shown;
  if (!path) return null;
  for (const [p, o] of critEdges(path)) {
    const xa = xOf(p.end, w), xb = xOf(o.start, w), ya = critMidY(p.rank), yb = critMidY(o.rank);
    const dx = xb - xa, dy = yb - ya, len2 = dx * dx + dy * dy;
    const k = len2 ? Math.max(0, Math.min(1, ((x - xa) * dx + (y - ya) * dy) / len2)) : 0;
    if (Math.hypot(x - xa - k * dx, y - ya - k * dy) > 4) continue;
    return { text: `critical path · step ${path.step}: rank ${o.rank}'s ${o.phase} of microbatch ${o.microbatch}\n` +
      `waited ${fmtMs(o.lead_ns)} for rank ${p.rank}'s ${p.phase}` };
  }
  return null;
}

// The critical path over the latest complete steps (GET /critpath), as
// `pprun stats` prints it: per rank its F, B, W and OPT on the path, the
// mean per step, and its share of the step; then where the rest of the
// step went; hidden until a step is complete.
async function loadCritTotals(id) {
  let r;
  try { r = await api(`/api/jobs/${id}/critpath`); } catch (e) {
    $('critpath').hidden = false; $('critpath-table').innerHTML = ''; $('critpath-info').textContent = '— error: ' + e.message;
    return;
  }
  if (S.job !== id) return;
  showCritTotals(r);
}

function critRankNs(x) { return x.F + x.B + x.W + x.OPT; }


function showCritTotals(r) {
  const box = $('critpath'), tbl = $('critpath-table');
  tbl.innerHTML = '';
  $('critpath-info').textContent = '';
  box.hidden = !r.steps;
  window.__pprun.critTable = null;
  if (!r.steps) return;
  const per = (ns) => fmtMs(ns / r.steps), share = (ns) => (r.span_ns > 0 ? (100 * ns / r.span_ns).toFixed(1) + '%' : '–');
  $('critpath-info').textContent = `— steps ${r.first_step}–${r.last_step}, ${fmtMs(r.span_ns / r.steps)} a step (mean)`;
  const head = tbl.createTHead().insertRow();
  for (const h of ['rank', 'F', 'B', 'W', 'OPT', 'all', 'share']) { const th = document.createElement('th'); th.textContent = h; head.appendChild(th); }
  const body = tbl.createTBody(), rows = [];
  const add = (cls, cells, span) => { // span: the first cell runs over the op columns
    const tr = body.insertRow();
    if (cls) tr.className = cls;
    cells.forEach((v, k) => {
      const td = tr.insertCell();
      td.textContent = String(v);
      if (span && k === 0) td.colSpan = 5;
      else if (k > 0 || !span) td.className = 'num';
    });
    rows.push([cls, ...cells.map(String)]);
  };
  const shown = r.ranks.filter((x) => x.listed), most = Math.max(0, ...r.ranks.map(critRankNs));
  let listed = 0;
  for (const x of shown) {
    const all = critRankNs(x);
    listed += all;
    add(all === most ? 'most' : '', [x.rank, per(x.F), per(x.B), per(x.W), per(x.OPT), per(all), share(all)]);
  }
  const ops = r.ranks.reduce((a, x) => a + critRankNs(x), 0);
  if (ops > listed) add('', ['the other ranks', per(ops - listed), share(ops - listed)], true);
  for (const [what, ns] of [['hand-offs: an output crossing to another rank', r.handoff_ns],
    ['on a rank between its ops, sending or receiving', r.comm_ns], ['on a rank between its ops, the rest', r.other_ns]])
    add('wait', [what, per(ns), share(ns)], true);
  window.__pprun.critTable = { steps: r.steps, first_step: r.first_step, last_step: r.last_step,
    info: $('critpath-info').textContent, rows };
}

// ---- charts ------------------------------------------------------------------

// The pixel column (0 .. columns-1) that x falls in.
function columnOf(x, x0, x1, columns) {
  return Math.min(columns - 1, Math.floor((x - x0) / (x1 - x0) * columns));
}

// A chart series: [x, y] points in x order, appended as steps arrive, with a
// segment tree over them that gives the lowest and the highest point (the
// first of equals) and the sums of any run of points in O(log n). Thinning a
// job to its pixel columns then costs about the same at 100,000 steps as at
// 1,000; it was a pass over every step at every redraw, four times a second
// while following a job (125 ms at 100,000 steps).
function Series() { this.n = 0; this.grow(1024); }
Series.prototype.grow = function (cap) {
  const n = this.n, x = this.x, y = this.y;
  this.cap = cap; this.x = new Float64Array(cap); this.y = new Float64Array(cap);
  this.lo = new Int32Array(2 * cap).fill(-1); this.hi = new Int32Array(2 * cap).fill(-1);
  this.sx = new Float64Array(2 * cap); this.sy = new Float64Array(2 * cap);
  this.n = 0;
  for (let i = 0; i < n; i++) this.push(x[i], y[i]);
};
// Of two point indices (-1: none), the one with the lower (higher) y; the first of equals.
Series.prototype.lower = function (a, b) {
  return a < 0 ? b : b < 0 ? a : this.y[b] < this.y[a] || (this.y[b] === this.y[a] && b < a) ? b : a;
};
Series.prototype.higher = function (a, b) {
  return a < 0 ? b : b < 0 ? a : this.y[b] > this.y[a] || (this.y[b] === this.y[a] && b < a) ? b : a;
};
Series.prototype.push = function (x, y) {
  if (this.n === this.cap) this.grow(2 * this.cap);
  const i = this.n++;
  this.x[i] = x; this.y[i] = y;
  let k = this.cap + i;
  this.lo[k] = this.hi[k] = i; this.sx[k] = x; this.sy[k] = y;
  // Nodes over points past n (dropped by cut, not yet pushed again) are never
  // read whole: range() asks only for runs below n.
  for (k >>= 1; k >= 1; k >>= 1) {
    const a = 2 * k, b = a + 1;
    this.lo[k] = this.lower(this.lo[a], this.lo[b]); this.hi[k] = this.higher(this.hi[a], this.hi[b]);
    this.sx[k] = this.sx[a] + this.sx[b]; this.sy[k] = this.sy[a] + this.sy[b];
  }
};
// Drops the points from x = at on (a step that changed, and those after it).
Series.prototype.cut = function (at) {
  let lo = 0, hi = this.n;
  while (lo < hi) { const m = (lo + hi) >> 1; if (this.x[m] < at) lo = m + 1; else hi = m; }
  this.n = lo;
};
// Points i .. j-1: this.qlo and this.qhi, the indices of the lowest and the
// highest, and this.qsx, this.qsy, the sums of their x and y.
Series.prototype.range = function (i, j) {
  let lo = -1, hi = -1, sx = 0, sy = 0;
  for (let l = i + this.cap, r = j + this.cap; l < r; l >>= 1, r >>= 1) {
    if (l & 1) { lo = this.lower(lo, this.lo[l]); hi = this.higher(hi, this.hi[l]); sx += this.sx[l]; sy += this.sy[l]; l++; }
    if (r & 1) { r--; lo = this.lower(lo, this.lo[r]); hi = this.higher(hi, this.hi[r]); sx += this.sx[r]; sy += this.sy[r]; }
  }
  this.qlo = lo; this.qhi = hi; this.qsx = sx; this.qsy = sy;
};

// What a series draws: each point while there are at most two per pixel
// column, else the lowest and the highest point of each column in x order
// (a long job draws in bounded time and its spikes stay visible) and, with
// trend, the mean of each column, which step-to-step noise would bury.
function thinSeries(s, x0, x1, columns, trend) {
  const pts = [], means = [];
  if (s.n <= 2 * columns) {
    for (let i = 0; i < s.n; i++) pts.push([s.x[i], s.y[i]]);
    return { pts, means, thinned: false };
  }
  // x are steps, whole and distinct: a column holds at most this many.
  const most = Math.ceil((x1 - x0) / columns) + 1;
  for (let i = 0; i < s.n;) {
    const c = columnOf(s.x[i], x0, x1, columns);
    let j = i + 1, k = Math.min(s.n, i + most + 1); // j: the first point past column c
    while (j < k) { const m = (j + k) >> 1; if (columnOf(s.x[m], x0, x1, columns) > c) k = m; else j = m + 1; }
    s.range(i, j);
    const a = Math.min(s.qlo, s.qhi), b = Math.max(s.qlo, s.qhi);
    pts.push([s.x[a], s.y[a]]);
    if (b !== a) pts.push([s.x[b], s.y[b]]);
    if (trend) means.push([s.qsx / (j - i), s.qsy / (j - i)]);
    i = j;
  }
  return { pts, means, thinned: true };
}

// Ignoring outliers in the y range (TensorBoard's default): a value further
// from the 5th..95th percentile of the values drawn than 1.5 times that
// spread is off the scale, and the others set the range, with 8% more room
// on a side that lost a value, for the marks of the points off it. No
// outliers: the lowest to the highest value, as without. Fewer than 10
// values tell no bulk from outliers. vals are sorted here.
function bulkRange(vals) {
  vals.sort((a, b) => a - b);
  const n = vals.length;
  let i = 0, j = n - 1;
  if (n >= 10) {
    const qlo = vals[Math.ceil(0.05 * (n - 1))], qhi = vals[Math.floor(0.95 * (n - 1))], d = 1.5 * (qhi - qlo);
    while (vals[i] < qlo - d) i++;
    while (vals[j] > qhi + d) j--;
  }
  let lo = vals[i], hi = vals[j];
  const room = 0.08 * (hi - lo || Math.abs(hi) || 1);
  if (i > 0) lo -= room;
  if (j < n - 1) hi += room;
  return [lo, hi];
}

// Draws series ({ s: a Series, color, width, dots }) on canvas. opts: y0 (the
// bottom of the y axis), ymax (the top at least), fmt (tick labels), robust
// (ignore outliers in the y range), log (a log10 y axis; every y > 0).
// Returns, for the series with dots, the points drawn (a dot each while
// there is room, else the thinned line) and its trend: when it had to be
// thinned, the faded band of its lowest and highest points gets the mean of
// each pixel column drawn over it (else the trend is empty); the y axis
// (scale: lo, hi and log), and the points drawn off it (clipped: x and the
// true y, above or below, and where their mark is, in CSS pixels).
function lineChart(canvas, series, opts) {
  const { g, w, h } = sizeCanvas(canvas, 170);
  g.clearRect(0, 0, w, h);
  const pad = { l: 46, r: 8, t: 8, b: 20 };
  let x0 = Infinity, x1 = -Infinity;
  for (const { s } of series) if (s.n) { x0 = Math.min(x0, s.x[0]); x1 = Math.max(x1, s.x[s.n - 1]); }
  if (x0 === Infinity) {
    g.fillStyle = '#888'; g.fillText('no data yet', pad.l, 30);
    return { drawn: [], trend: [], scale: null, clipped: [] };
  }
  if (x1 === x0) x1 = x0 + 1;
  const columns = Math.max(1, Math.round(w - pad.l - pad.r));
  const thin = series.map((d) => thinSeries(d.s, x0, x1, columns, d.dots));
  // The lowest and highest points of each column are the series' extremes too.
  const T = opts.log ? Math.log10 : (y) => y;
  let y0, y1;
  if (opts.robust) [y0, y1] = bulkRange(thin.flatMap((t) => t.pts.map((p) => T(p[1]))));
  else {
    y0 = Infinity; y1 = -Infinity;
    for (const { s } of series) if (s.n) { s.range(0, s.n); y0 = Math.min(y0, T(s.y[s.qlo])); y1 = Math.max(y1, T(s.y[s.qhi])); }
  }
  if (opts.y0 != null) y0 = opts.y0;
  if (opts.ymax != null) y1 = Math.max(y1, opts.ymax);
  if (y1 === y0) y1 = y0 + 1;
  const X = (x) => pad.l + (x - x0) / (x1 - x0) * (w - pad.l - pad.r);
  const Y = (y) => h - pad.b - (T(y) - y0) / (y1 - y0) * (h - pad.t - pad.b);
  g.strokeStyle = '#eee'; g.fillStyle = '#888'; g.font = '10px system-ui, sans-serif'; g.textBaseline = 'middle';
  for (let k = 0; k <= 4; k++) {
    const t = y0 + (y1 - y0) * k / 4, y = opts.log ? 10 ** t : t, py = h - pad.b - k / 4 * (h - pad.t - pad.b);
    g.beginPath(); g.moveTo(pad.l, py); g.lineTo(w - pad.r, py); g.stroke();
    g.fillText(opts.fmt ? opts.fmt(y) : Math.abs(y) < 1e-3 && y !== 0 ? y.toExponential(1) : y.toPrecision(3), 2, py);
  }
  g.textBaseline = 'top';
  g.fillText('step ' + x0, pad.l, h - pad.b + 4);
  g.textAlign = 'right';
  g.fillText(String(x1), w - pad.r, h - pad.b + 4);
  g.textAlign = 'left';
  let drawn = [], trend = [];
  const clipped = [];
  const stroke = (pts) => {
    g.beginPath();
    pts.forEach((p, i) => (i ? g.lineTo(X(p[0]), Y(p[1])) : g.moveTo(X(p[0]), Y(p[1]))));
    g.stroke();
  };
  // Lines to a point off the scale leave through its edge (a few pixels of
  // slack: a line or dot on the edge is drawn whole).
  g.save();
  g.beginPath(); g.rect(0, pad.t - 3, w, h - pad.t - pad.b + 6); g.clip();
  series.forEach((s, k) => {
    const { pts, means, thinned } = thin[k];
    g.strokeStyle = s.color; g.lineWidth = s.width || 1.5;
    g.globalAlpha = s.dots && thinned ? 0.3 : 1;
    stroke(pts);
    g.globalAlpha = 1;
    for (const p of pts) {
      const t = T(p[1]);
      if (t <= y1 && t >= y0) continue;
      clipped.push({ x: p[0], y: p[1], above: t > y1, px: X(p[0]), py: t > y1 ? pad.t : h - pad.b, color: s.color });
    }
    if (!s.dots) return;
    drawn = pts;
    if (thinned) {
      trend = means;
      stroke(trend);
    } else if (pts.length <= columns / 6) { // else dots would merge into a band
      g.fillStyle = s.color;
      for (const p of pts) { g.beginPath(); g.arc(X(p[0]), Y(p[1]), 2.5, 0, 7); g.fill(); }
    }
  });
  g.restore();
  // A point off the scale: a triangle on the edge it is beyond, pointing at it.
  for (const c of clipped) {
    const d = c.above ? -1 : 1;
    g.fillStyle = c.color;
    g.beginPath(); g.moveTo(c.px, c.py + 2 * d); g.lineTo(c.px - 4, c.py - 6 * d); g.lineTo(c.px + 4, c.py - 6 * d); g.fill();
  }
  g.lineWidth = 1;
  return { drawn, trend, scale: { lo: opts.log ? 10 ** y0 : y0, hi: opts.log ? 10 ** y1 : y1, log: !!opts.log },
    clipped: clipped.map(({ x, y, above, px, py }) => ({ x, y, above, px, py })) };
}

const RANK_COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

// The step charts' series, kept with the steps: before a redraw,
// syncCharts() drops from each series the points from the first step
// mergeStep added or changed since (S.stepsDirty, an index into S.steps) on
// and appends them again from the steps; following a job, that is the
// newest step or two, not the whole job.
function newCharts(n) {
  const C = { world: n, key: null, anyComplete: false, loss: new Series(), bubbleMean: new Series(), bubble: [],
    actMax: new Series(), act: [] };
  if (n <= 16) for (let r = 0; r < n; r++) { C.bubble.push(new Series()); C.act.push(new Series()); }
  return C;
}

// Brings S.charts up to S.steps; returns whether anything changed.
function syncCharts() {
  const n = world();
  if (!S.charts || S.charts.world !== n) { S.charts = newCharts(n); S.stepsDirty = 0; }
  const C = S.charts, from = S.stepsDirty;
  S.stepsDirty = Infinity;
  if (from >= S.steps.length) return false;
  for (const s of [C.loss, C.bubbleMean, C.actMax, ...C.bubble, ...C.act]) s.cut(S.steps[from].step);
  window.__pprun.chartSync.read += S.steps.length - from;
  // A job cut short: the losses of the step it was cut in (no statistics
  // after whole ones) are some of its microbatches', not the step's.
  const cut = S.info && cutShort(S.info.job);
  for (let i = from; i < S.steps.length; i++) {
    const st = S.steps[i], a = st.act_peak_bytes;
    if (st.complete) C.anyComplete = true;
    if (st.loss != null && !(cut && !st.complete && C.anyComplete)) C.loss.push(st.step, st.loss);
    if (st.bubble_ratio_mean != null) {
      C.bubbleMean.push(st.step, st.bubble_ratio_mean);
      C.bubble.forEach((s, r) => { if (st.bubble_ratio && st.bubble_ratio[r] != null) s.push(st.step, st.bubble_ratio[r]); });
    }
    if (a && a.some((b) => b > 0)) {
      C.actMax.push(st.step, a.reduce((m, b) => Math.max(m, b || 0), 0));
      C.act.forEach((s, r) => { if (a[r] != null) s.push(st.step, a[r]); });
    }
  }
  return true;
}

// A step's loss as the note under the chart shows it: its true value.
const fmtLoss = (s, i) => `${s.y[i].toPrecision(4)} at step ${s.x[i]}`;

// Redraws the step charts; with no new or changed step since the last
// time, and the same widths and options, only the per-rank bars.
function drawCharts() {
  const changed = syncCharts(), C = S.charts;
  const key = [$('loss').clientWidth, $('bubble').clientWidth, $('act').clientWidth, window.devicePixelRatio,
    S.lossLog, S.lossOutliers].join();
  if (changed || key !== C.key) {
    C.key = key;
    window.__pprun.chartSync.draws++;
    drawLossChart(C);
    const n = world(), series = C.bubble.map((s, r) => ({ s, color: RANK_COLORS[r % 10] + '80', width: 1 }));
    series.push({ s: C.bubbleMean, color: '#222', width: 2, dots: true });
    let top = 0.05;
    if (C.bubbleMean.n) { C.bubbleMean.range(0, C.bubbleMean.n); top = Math.max(top, C.bubbleMean.y[C.bubbleMean.qhi]); }
    lineChart($('bubble'), series, { y0: 0, ymax: Math.min(1, top * 1.2), fmt: (y) => (100 * y).toFixed(0) + '%' });
    drawActChart(C, n);
  }
  drawStepBars();
}

// Loss per step: outliers off the scale (S.lossOutliers) and a log y axis
// (S.lossLog) while every loss is above 0, both as last chosen while the
// page is open. The note says what is off the scale, or why there is no log
// scale, with true values.
function drawLossChart(C) {
  const s = C.loss, box = $('loss-log'), notes = [];
  if (s.n) s.range(0, s.n);
  const logOk = !s.n || s.y[s.qlo] > 0, log = S.lossLog && logOk;
  const lowest = s.n ? s.qlo : -1, highest = s.n ? s.qhi : -1;
  box.disabled = !logOk; box.checked = log;
  box.parentNode.title = logOk ? 'loss on a log scale' : 'a log scale needs every loss above 0';
  $('loss-outliers').checked = S.lossOutliers;
  const chart = lineChart($('loss'), [{ s, color: '#e15759', dots: true }], { robust: S.lossOutliers, log });
  if (chart.clipped.some((c) => c.above)) notes.push('▲ off the scale: highest ' + fmtLoss(s, highest));
  if (chart.clipped.some((c) => !c.above)) notes.push('▼ off the scale: lowest ' + fmtLoss(s, lowest));
  if (!logOk) notes.push('no log scale: a loss of ' + fmtLoss(s, lowest));
  $('loss-note').textContent = notes.join(' · ');
  window.__pprun.lossPoints = chart.drawn;
  window.__pprun.lossTrend = chart.trend;
  window.__pprun.lossChart = { scale: chart.scale, clipped: chart.clipped, logAvailable: logOk,
    note: $('loss-note').textContent };
}

// Activations held, the peak of each step per rank (the model's own count of
// what F saved for B and W). Older files and jobs without it have only 0s.
function drawActChart(C, n) {
  S.actRecorded = C.actMax.n > 0; // then a W that frees the last microbatch says 0 B, not nothing
  const c = $('act');
  if (!C.actMax.n) {
    const { g, w, h } = sizeCanvas(c, 170);
    g.clearRect(0, 0, w, h); g.fillStyle = '#888'; g.font = '12px system-ui, sans-serif';
    g.fillText(C.anyComplete ? 'not recorded for this job' : 'no data yet', 46, 30);
    window.__pprun.actPoints = [];
    return;
  }
  const series = C.act.map((s, r) => ({ s, color: RANK_COLORS[r % 10], width: 1.5 }));
  series.push({ s: C.actMax, color: '#222', width: n <= 16 ? 0.5 : 2, dots: true });
  window.__pprun.actPoints = lineChart(c, series, { y0: 0, fmt: fmtBytes }).drawn;
}

// The step shown (null: none, a window or following live): the label and
// the per-rank bars follow it.
function setStep(step) {
  S.step = step;
  drawStepBars();
}

// Per rank bars for the step shown, else the latest complete one.
function drawStepBars() {
  const shown = S.step != null && S.stepAt.get(S.step);
  const st = (shown && shown.bubble_ratio ? shown : null) || lastStep((s) => s.bubble_ratio_mean != null);
  const c = $('bubble-ranks');
  const { g, w, h } = sizeCanvas(c, 170);
  g.clearRect(0, 0, w, h);
  $('bubble-step-label').textContent = st ? 'step ' + st.step : 'no complete step yet';
  if (st && st.bubble_ratio) {
    const k = st.bubble_ratio.length, bw = Math.min(40, (w - 50) / k - 6);
    g.font = '10px system-ui, sans-serif';
    st.bubble_ratio.forEach((v, r) => {
      const x = 40 + r * (bw + 6), bh = (h - 40) * (v || 0);
      g.fillStyle = RANK_COLORS[r % 10]; g.fillRect(x, h - 20 - bh, bw, bh);
      g.fillStyle = '#444'; g.fillText((100 * (v || 0)).toFixed(1) + '%', x, h - 24 - bh);
      g.fillText('r' + r, x + bw / 2 - 5, h - 8);
    });
  }
  updateStepLabel();
}

// ---- interaction ---------------------------------------------------------------

// What the pointer is on: an op's block first, then a hand-off line of the
// critical path (it runs across rows and over the thin send/receive marks
// where it leaves), then a mark, a gap or a bin.
function hitTest(x, y) {
  const w = $('timeline').clientWidth;
  if (x < LABEL_W) return null;
  const hit = rowHit(x, y, w);
  if (hit && hit.op) return hit;
  return critEdgeHit(x, y, w) || hit;
}

function rowHit(x, y, w) {
  const n = world();
  const r = Math.floor((y - AXIS_H) / rowPitch());
  if (r < 0 || r >= n) return null;
  const t = tOf(x, w), yin = y - rowY(r);
  const tol = (S.view.to - S.view.from) / (w - LABEL_W) * 2; // 2 px for thin marks
  if (S.gpuLane && y >= gpuY(r) && y < gpuY(r) + GPU_H) {
    const hit = gpuHit(r, t, y - gpuY(r), tol / 2);
    return hit && Object.assign(hit, { op: true });
  }
  if (yin > ROW_H) return null;
  const ev = S.ev;
  let best = null;
  for (let i = 0; i < ev.n; i++) {
    if (ev.rank[i] !== r) continue;
    const ph = ev.phase[i], comm = ph >= 3 && ph <= 6;
    if (comm ? yin < ROW_H - 8 : yin > ROW_H - 8) continue;
    if (t >= ev.start[i] - (comm ? tol : 0) && t <= ev.end[i] + (comm ? tol : 0)) { best = i; if (!comm) break; }
  }
  if (best != null) {
    const i = best, ph = PHASES[ev.phase[i]];
    let text = `rank ${r} · ${ph}` + (ev.mb[i] >= 0 ? ` · microbatch ${ev.mb[i]}` : '') + (ev.stage[i] >= 0 ? ` · stage ${ev.stage[i]}` : '') +
      ` · step ${ev.step[i]}\nstart ${fmtMs(ev.start[i])} · duration ${fmtMs(ev.end[i] - ev.start[i])}`;
    if (ev.peer[i] >= 0) text += `\npeer rank ${ev.peer[i]}`;
    if (['F', 'B', 'W'].includes(ph) && S.actRecorded) text += `\nactivations held after it: ${fmtBytes(ev.bytes[i])}`;
    if (ph === 'OPT' && ev.bytes[i] > 0) text += `\nweights, gradients, optimizer state: ${fmtBytes(ev.bytes[i])}`;
    text += critNote(ev.id[i]);
    return { text, op: ev.phase[i] < 3 || ev.phase[i] > 6 }; // a send/receive mark yields to a hand-off line
  }
  for (const gp of S.gaps || []) {
    if (gp[0] === r && t >= gp[2] && t <= gp[3])
      return { text: `rank ${r} idle ${fmtMs(gp[3] - gp[2])} · step ${gp[1]}\ncause: ${CAUSES[gp[4]] || 'other'}` + (gp[5] ? ` (next: ${gp[5]})` : '') };
  }
  if (S.bins) for (const b of S.bins) {
    if (b[0] === r && t >= b[1] && t < b[2])
      return { text: `rank ${r} · ${fmtMs(b[1])} – ${fmtMs(b[2])}\nbusy ${(100 * b[3] / (b[2] - b[1])).toFixed(1)}%` + (b[9] != null ? ` · step ${b[9]}` : '') };
  }
  return null;
}

// Beside the pointer, flipped to its other side where it would leave the
// window (a block near the right edge), and never off it.
function placeTooltip(tip, x, y) {
  const w = tip.offsetWidth, h = tip.offsetHeight, vw = document.documentElement.clientWidth, vh = window.innerHeight;
  let left = x + 14, top = y + 12;
  if (left + w > vw - 4) left = x - 14 - w;
  if (top + h > vh - 4) top = y - 12 - h;
  tip.style.left = Math.max(4, Math.min(left, vw - 4 - w)) + 'px';
  tip.style.top = Math.max(4, Math.min(top, vh - 4 - h)) + 'px';
}

function setupInteraction() {
  const c = $('timeline'), tip = $('tooltip');
  sqlExample = $('sql-text').value;
  let drag = null;
  c.addEventListener('wheel', (e) => {
    e.preventDefault();
    const w = c.clientWidth, rect = c.getBoundingClientRect();
    const t = tOf(e.clientX - rect.left, w), k = Math.exp(e.deltaY * 0.0015);
    // Out no further than the whole job and a margin (unbounded, 40 notches
    // asked the server for a window of 7e24 ns).
    const end = jobExtent(), span = Math.min(end * (1 + 2 * VIEW_MARGIN), Math.max(1e4, (S.view.to - S.view.from) * k));
    const f = (t - S.view.from) / (S.view.to - S.view.from);
    const from = Math.max(0, Math.min(t - f * span, end * (1 + VIEW_MARGIN) - span));
    S.view = { from, to: from + span };
    S.follow = $('follow').checked = false;
    tip.hidden = true; // it described what was under the pointer before the zoom
    setStep(null); scheduleDraw(); scheduleFetch();
  }, { passive: false });
  c.addEventListener('mousedown', (e) => { drag = { x: e.clientX, view: Object.assign({}, S.view) }; c.classList.add('dragging'); });
  window.addEventListener('mouseup', () => { if (drag) { drag = null; c.classList.remove('dragging'); scheduleFetch(); } });
  window.addEventListener('mousemove', (e) => {
    if (drag) {
      const w = c.clientWidth, dt = (e.clientX - drag.x) / (w - LABEL_W) * (drag.view.to - drag.view.from);
      const span = drag.view.to - drag.view.from;
      const from = Math.max(0, Math.min(drag.view.from - dt, Math.max(drag.view.from, jobExtent() * (1 + VIEW_MARGIN) - span)));
      S.view = { from, to: from + span };
      S.follow = $('follow').checked = false;
      tip.hidden = true;
      setStep(null); scheduleDraw();
      return;
    }
    if (e.target !== c) { tip.hidden = true; return; }
    const rect = c.getBoundingClientRect();
    const hit = hitTest(e.clientX - rect.left, e.clientY - rect.top);
    if (!hit) { tip.hidden = true; return; }
    tip.textContent = hit.text; tip.hidden = false;
    placeTooltip(tip, e.clientX, e.clientY);
  });
  c.addEventListener('mouseleave', () => { tip.hidden = true; });
  $('step-prev').onclick = () => stepBy(-1);
  $('step-next').onclick = () => stepBy(1);
  $('step-all').onclick = () => { S.follow = $('follow').checked = false; setStep(null); showWindow(0, Math.max(1, lastEnd())); };
  $('follow').onchange = (e) => { S.follow = e.target.checked; if (S.follow) { followLatest(); fetchWindow(); } };
  $('critpath-on').onchange = (e) => { if (S.crit) S.crit.on = e.target.checked; scheduleDraw(); };
  $('job-select').onchange = (e) => openJob(Number(e.target.value));
  window.addEventListener('resize', () => { scheduleDraw(); drawCharts(); });
  $('loss-outliers').addEventListener('change', (e) => { S.lossOutliers = e.target.checked; drawCharts(); });
  $('loss-log').addEventListener('change', (e) => { S.lossLog = e.target.checked; drawCharts(); });
  document.querySelectorAll('.tab').forEach((b) => b.onclick = () => {
    document.querySelectorAll('.tab').forEach((x) => x.classList.toggle('active', x === b));
    document.querySelectorAll('.tab-page').forEach((p) => { p.hidden = p.id !== 'tab-' + b.dataset.tab; });
    if (b.dataset.tab === 'timeline') { scheduleDraw(); drawCharts(); }
    if (b.dataset.tab === 'jobs') showJobs().catch((e) => { $('jobs-info').textContent = 'error: ' + e.message; });
  });
  $('sql-run').onclick = runSql;
  $('sql-text').addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) runSql(); });
  $('legend').innerHTML = ['F', 'B', 'W', 'SEND', 'RECV', 'OPT'].map((p, i) => `<span><i style="background:${[PHASE_COLOR[0], PHASE_COLOR[1], PHASE_COLOR[2], PHASE_COLOR[3], PHASE_COLOR[4], PHASE_COLOR[7]][i]}"></i>${p}</span>`).join('') +
    CAUSE_LEGEND.map(([p, k]) => `<span data-cause="${CAUSES[k]}"><i style="background:${CAUSE_COLOR[k]}; border:1px solid #ccc"></i>${p}</span>`).join('') +
    `<span><i style="border:2px solid ${CRIT_COLOR}"></i>critical path</span>` +
    `<span id="legend-gpu" hidden><i style="background:${PHASE_COLOR[0]}; opacity:0.45"></i>GPU (lane under each rank)</span>`;
}

function lastEnd() {
  const s = lastStep((x) => x.end != null);
  return Math.max(s ? s.end : 0, S.info ? S.info.timeline_end : 0);
}

// How far the job's time runs: its last step's end or the newest event the
// page holds (a running job's), at least 1 ms.
const VIEW_MARGIN = 0.05; // the view may run this share of the job past its end
function jobExtent() {
  let e = Math.max(1e6, lastEnd());
  for (let i = 0; S.ev && i < S.ev.n; i++) if (S.ev.end[i] > e) e = S.ev.end[i];
  return e;
}

// ◀ ▶: from the step shown, else from the step at the view's centre (zoomed,
// panned, "all steps", following live): the next after it, or, before it,
// that step itself when the centre is past its end.
function stepBy(d) {
  if (!S.steps.length) return;
  let target;
  if (S.step != null) target = S.step + d;
  else {
    const mid = (S.view.from + S.view.to) / 2, s = lastStep((x) => x.start != null && x.start <= mid);
    if (!s) target = d > 0 ? (S.steps.find((x) => x.start != null) || {}).step : null;
    else target = d > 0 ? s.step + 1 : s.end != null && mid > s.end ? s.step : s.step - 1;
  }
  const s = target != null && S.stepAt.get(target);
  if (s && s.start != null) showStep(s.step);
}

// ---- jobs side by side ------------------------------------------------------------

const JOBS_COMPARED = 50; // the newest; each costs a /summary request

async function showJobs() {
  const info = $('jobs-info'), tbl = $('jobs-table');
  const jobs = S.jobs.slice(0, JOBS_COMPARED);
  info.textContent = 'loading…';
  const sums = await Promise.all(jobs.map((j) => api(`/api/jobs/${j.id}/summary`).catch((e) => ({ error: e.message }))));
  const pct = (x) => (x == null ? '–' : (100 * x).toFixed(1) + '%');
  const cols = ['compare', 'job', 'name', 'status', 'schedule', 'ranks', 'microbatches', 'device', 'steps', 'step time',
    'bubble', 'planned', 'bubble vs plan', 'idle mostly', 'activations', 'with weights', 'in flight', 'loss'];
  tbl.innerHTML = '';
  const head = tbl.createTHead().insertRow();
  for (const c of cols) { const th = document.createElement('th'); th.textContent = c; head.appendChild(th); }
  const body = tbl.createTBody();
  jobs.forEach((j, i) => {
    const s = sums[i], tr = body.insertRow();
    tr.dataset.job = j.id;
    tr.onclick = () => { document.querySelector('.tab[data-tab=timeline]').click(); openJob(j.id); };
    const idle = s.idle_ns_by_cause || {}, total = Object.values(idle).reduce((a, b) => a + b, 0);
    const top = Object.keys(idle).reduce((a, k) => (a == null || idle[k] > idle[a] ? k : a), null);
    const cells = [null, j.id, j.name, j.status, j.schedule + (j.virtual_stages > 1 ? ` (v=${j.virtual_stages})` : ''), j.world_size,
      j.microbatches, j.device, s.error ? s.error : s.steps, s.step_time_ns == null ? '–' : fmtMs(s.step_time_ns),
      pct(s.bubble_ratio), pct(s.sim_bubble_ratio), null,
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
        box.type = 'checkbox'; box.title = 'compare'; box.checked = S.picked.includes(j.id);
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
  window.__pprun.jobsShown = jobs.length;
}

// ---- two jobs compared (GET /compare: `pprun stats --vs` in the page) --------------

// Ticks a job in the Jobs table; with two ticked, the newer is compared
// with the older (as `pprun stats --vs OLDER` does with the newest job).
function pickJob(id, on) {
  S.picked = S.picked.filter((x) => x !== id);
  if (on) S.picked.push(id);
  if (S.picked.length > 2) S.picked.shift(); // the earliest tick gives way
  document.querySelectorAll('#jobs-table td.pick input').forEach((b) => { b.checked = S.picked.includes(Number(b.closest('tr').dataset.job)); });
  showCompare().catch((e) => { $('compare-error').textContent = e.message; $('compare-error').hidden = false; });
}

async function showCompare() {
  const panel = $('compare'), err = $('compare-error');
  window.__pprun.compare = null;
  if (S.picked.length < 2) { panel.hidden = true; return; }
  const job = Math.max(...S.picked), other = Math.min(...S.picked);
  const r = await api(`/api/jobs/${job}/compare?vs=${other}`);
  if (Math.max(...S.picked) !== job || Math.min(...S.picked) !== other) return; // ticks changed meanwhile
  err.hidden = true; panel.hidden = false;
  const o = r.numbers.other, n = r.numbers.job, ch = r.numbers.change;
  const pct = (x) => (x == null ? '–' : (100 * x).toFixed(1) + '%');
  const ms = (x) => (x == null ? '–' : fmtMs(x));
  const times = (x) => (x == null ? '–' : x.toFixed(2) + '×');
  const pp = (x) => (x == null ? '–' : (x >= 0 ? '+' : '') + x.toFixed(1) + ' pp');
  const bytes = (x) => (x ? fmtBytes(x) : '–');
  const lossOf = (s) => (s.loss == null ? '–' : `${s.loss.toFixed(4)} @${s.loss_step}`);
  $('compare-title').textContent = `job ${other} (${o.schedule}) → job ${job} (${n.schedule}): the change from job ${other} to job ${job}`;
  const differs = r.differs.map((d) => `${d.what}: ${d.other} in job ${other}, ${d.job} in job ${job}`);
  if (r.op_sizes_differ) differs.push('an op is one chunk\'s: more chunks per rank, shorter ops; compare step times');
  if (!r.differs.length) differs.push('nothing else differs in their configurations');
  const ul = $('compare-differs');
  ul.innerHTML = '';
  for (const t of differs) { const li = document.createElement('li'); li.textContent = t; ul.appendChild(li); }

  const rows = [['steps compared', o.steps, n.steps, ''],
    ['step time (median)', ms(o.step_time_ns), ms(n.step_time_ns), times(ch.step_time)],
    ['bubble measured', pct(o.bubble_ratio), pct(n.bubble_ratio), pp(ch.bubble_ratio_pp)],
    ['bubble planned', pct(o.sim_bubble_ratio), pct(n.sim_bubble_ratio), pp(ch.sim_bubble_ratio_pp)],
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
  const head = tbl.createTHead().insertRow();
  for (const h of ['', `job ${other}`, `job ${job}`, `${other}→${job}`]) { const th = document.createElement('th'); th.textContent = h; head.appendChild(th); }
  const body = tbl.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    if (row[4]) tr.className = row[4];
    for (let k = 0; k < 4; k++) { const td = tr.insertCell(); td.textContent = String(row[k]); if (k) td.className = 'num'; }
  }

  const p = r.prediction;
  const prediction = p.why_not ? `what if: no prediction: ${p.why_not}`
    : `what if: job ${other} predicted ${p.schedule}${p.tuned ? ' (ordered for its costs)' : ''} at ${ms(p.predicted_step_time_ns)}` +
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
  window.__pprun.compare = { job, other, differs, rows: rows.map((x) => x.slice(0, 4).map(String)), prediction, loss, reply: r };
}

async function runSql() {
  const err = $('sql-error'), tbl = $('sql-result'), info = $('sql-info');
  err.hidden = true; info.textContent = 'running…';
  try {
    const r = await api('/api/sql', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ sql: $('sql-text').value }) });
    tbl.innerHTML = '';
    const head = tbl.createTHead().insertRow();
    for (const c of r.columns) { const th = document.createElement('th'); th.textContent = c; head.appendChild(th); }
    const body = tbl.createTBody();
    for (const row of r.rows) {
      const tr = body.insertRow();
      for (const v of row) { const td = tr.insertCell(); td.textContent = v == null ? 'NULL' : String(v); if (typeof v === 'number') td.className = 'num'; }
    }
    info.textContent = `${r.row_count} rows${r.truncated ? ' (cut at the row limit)' : ''} · ${r.elapsed_ms.toFixed(1)} ms`;
    window.__pprun.sqlRows = r.rows.length;
  } catch (e) {
    err.textContent = e.message; err.hidden = false; info.textContent = '';
    tbl.innerHTML = ''; // the previous query's rows would read as this one's
    window.__pprun.sqlRows = 0;
  }
}

// ---- test hook -------------------------------------------------------------------

window.__pprun = {
  ready: false, drawn: null, lossPoints: [], actPoints: [], planDrawn: 0, planLoads: [], liveEvents: 0, windowFetches: 0, lastWindow: null, sqlRows: 0, lastKernels: null, jobsShown: null, compare: null,
  critpath: null, critFetches: 0, critTable: null, // the overlay drawn, /critpath?step requests, the totals table
  lossChart: null, // the loss chart's y axis, the points off it, and its note
  chartSync: { read: 0, draws: 0 }, // steps read into the charts' series, and times the step charts were drawn
  state: S,
  showStep: (s) => showStep(s),
  // A window of the timeline, as zooming or panning to it leaves it.
  showWindow: (from, to) => { S.follow = $('follow').checked = false; setStep(null); return showWindow(from, to); },
  // A step as the live stream merges it, and the charts redrawn.
  mergeStep: (s) => { mergeStep(s); drawCharts(); },
  // Page coordinates of the centre of a drawn block, for hovering in tests.
  blockCenter(rank, phase, mb, step) {
    const ev = S.ev, ph = PHASES.indexOf(phase), c = $('timeline'), rect = c.getBoundingClientRect();
    for (let i = 0; i < ev.n; i++) {
      if (ev.rank[i] === rank && ev.phase[i] === ph && ev.mb[i] === mb && ev.step[i] === step) {
        const x = (Math.max(LABEL_W, xOf(ev.start[i], c.clientWidth)) + Math.min(c.clientWidth, xOf(ev.end[i], c.clientWidth))) / 2;
        return { x: rect.left + x, y: rect.top + rowY(rank) + (ROW_H - 8) / 2 };
      }
    }
    return null;
  },
  // Page coordinates of the middle of the k-th hand-off line drawn (null: none).
  critEdgeCenter(k) {
    const path = S.crit && S.crit.shown, e = path ? critEdges(path)[k] : null;
    if (!e) return null;
    const c = $('timeline'), rect = c.getBoundingClientRect(), w = c.clientWidth;
    return { x: rect.left + (xOf(e[0].end, w) + xOf(e[1].start, w)) / 2, y: rect.top + (critMidY(e[0].rank) + critMidY(e[1].rank)) / 2 };
  },
  // Page coordinates of time t on a rank's GPU lane (upper half: spans,
  // lower half: kernels), for hovering in tests; null without a lane.
  gpuLaneAt(rank, t, lower) {
    if (!S.gpuLane) return null;
    const c = $('timeline'), rect = c.getBoundingClientRect();
    return { x: rect.left + xOf(t, c.clientWidth), y: rect.top + gpuY(rank) + (lower ? GPU_H * 3 / 4 : GPU_H / 4) };
  },
  // Synthetic load for interactivity checks: n events over the view.
  loadSynthetic(n) {
    const st = new EventStore(n), span = S.view.to - S.view.from, k = world();
    for (let i = 0; i < n; i++) {
      const r = i % k, t = S.view.from + (Math.floor(i / k) / (n / k)) * span;
      st.push([1e12 + i, r, 0, i % 64, r, i % 3, t, t + span / (n / k) * 0.8, -1, 0]);
    }
    S.ev = st; S.gaps = []; S.bins = null; S.mode = 'events';
    const t = performance.now(); draw(); return performance.now() - t;
  },
};

(async function main() {
  setupInteraction();
  try {
    const jobs = await loadJobs();
    const want = Number(new URLSearchParams(location.search).get('job'));
    if (jobs.length) await openJob(want || jobs[0].id);
    else { $('job-meta').textContent = 'no jobs in this database yet'; window.__pprun.ready = true; }
  } catch (e) {
    $('job-meta').textContent = e.status === 401 ? 'this server needs a token: open the URL with #token=TOKEN' : 'error: ' + e.message;
    window.__pprun.error = e.message;
  }
  setInterval(() => loadJobs().catch(() => {}), 5000);
})();

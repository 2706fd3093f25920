// job.js: the job open: the header's list of jobs and its line about the
// job, opening a job (its steps, plan and stream, and where its timeline
// opens), the live stream's frames while it runs, and its end. The
// "Chrome trace" link downloads the steps in view.
import { S, EventStore, cutShort, mergeStep, lastStep, world, RANKS_DRAWN, foldRankPeaks, dropRanks } from './state.js';
import { api, headers, openStream } from './api.js';
import { $, throttled, LIVE_REDRAW_MS } from './util.js';
import { probe } from './probe.js';
import { scheduleDraw } from './timeline.js';
import { resetCritpath } from './critpath.js';
import { drawCharts, resetCharts } from './charts.js';
import { updateStepLabel } from './toolbar.js';
import { setFollow, followLatest, showStep, showWindow, fetchWindow, stepsInView, noteSpans } from './view.js';
import { loadWhatif, whatifDue, resetWhatif } from './whatif.js';
import { showSqlExample } from './sql-tab.js';
import { R, groupBy, defaultGrouping, replicas, filteredRanks } from './rows.js';
import { loadHeatmap, resetHeatmap } from './heatmap.js';

let stream = null;  // the open job's live stream (an AbortController)
let planAt = 0;     // when the plan was last asked for
let layoutRead = false; // the job's pipelines read again once its plans are in (onStepDone)

// The header's list of jobs, the job chosen kept chosen; S.jobs for the Jobs tab.
export async function loadJobs() {
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

export async function openJob(id) {
  if (stream) stream.abort();
  Object.assign(S, { job: id, info: null, steps: [], stepAt: new Map(), plan: null, ev: new EventStore(), gaps: [], bins: null, step: null, gpuLane: false, gpu: [], kernels: null, actRecorded: false, actRankPeak: [], liveRanks: null, stepsDirty: 0,
    spanLane: false, highlight: null });
  resetHeatmap();
  $('legend-spans').hidden = true;
  planAt = 0;
  resetWhatif();
  resetCritpath();
  resetCharts();
  $('job-select').value = String(id);
  showSqlExample(id);
  // The stream first: its hello fixes the cursor, then the history is read;
  // whatever arrives twice is merged by id / step.
  await new Promise((resolve) => {
    stream = openStream(id, { hello: resolve, status: onStatus, events: onEvents, step: onStepDone, losses: onLosses });
  });
  // The job's ranks say whether its steps come with per-rank arrays.
  const infoAsked = api(`/api/jobs/${id}`);
  const [info, , plan] = await Promise.all([infoAsked,
    infoAsked.then((i) => loadSteps(id, 0, i.job.world_size <= RANKS_DRAWN)), api(`/api/jobs/${id}/plan`)]);
  S.info = info; S.plan = plan;
  if (world() > RANKS_DRAWN) S.steps.forEach(dropRanks); // merged before its size was known
  layoutRead = false;
  showReplicas();
  probe.planLoads = [plan.simulated];
  S.gpuLane = !!info.gpu_spans;
  $('legend-gpu').hidden = !S.gpuLane;
  updateHeader();
  const running = info.job.status === 'running';
  setFollow(running);
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
  loadHeatmap(id);
  probe.ready = true;
}

// The replica filter and the grouping, as the job's pipelines are laid out
// (--dp: a group a pipeline, or one of them shown).
function showReplicas() {
  R.replica = -1;
  groupBy(defaultGrouping());
  const dp = replicas().dp;
  $('row-group-replica').hidden = $('replica-filter').hidden = dp <= 1;
  $('replica').innerHTML = '';
  for (let d = -1; d < dp && dp > 1; d++) $('replica').add(new Option(d < 0 ? 'all' : String(d), String(d)));
  $('row-group').value = R.by;
}

// A page opened before the ranks declared their plans took --dp as the
// layout: once a step after the first completes, every rank that declares
// a plan has (a program without one of its own declares the order it ran in
// its first step), so the job's pipelines are read once more, and a --dp
// the plans do not follow becomes one pipeline, as on a page opened now.
async function readLayoutAgain(id) {
  layoutRead = true;
  let info;
  try { info = await api(`/api/jobs/${id}`); } catch (e) { return; }
  if (S.job !== id || !S.info || info.replicas === S.info.replicas) return;
  S.info.replicas = info.replicas;
  S.info.dp_not_laid_out = info.dp_not_laid_out;
  showReplicas();
  updateHeader();
  scheduleDraw();
}

// A gpt job's plan gets simulated times once its first steps are measured
// (runner/job/run_progress.c): a page opened before that asks again as steps
// complete, at most every second (a program's plan never gets them).
async function reloadPlan(id) {
  planAt = Date.now();
  let plan;
  try { plan = await api(`/api/jobs/${id}/plan`); } catch (e) { return; } // the next step asks again
  if (S.job !== id) return;
  S.plan = plan;
  probe.planLoads.push(plan.simulated);
  scheduleDraw();
}

// The header's line about the job open: status, progress, drops, failure.
function updateHeader() {
  if (!S.info) return;
  const j = S.info.job;
  const b = $('job-status');
  b.textContent = j.status; b.className = 'badge ' + j.status;
  const done = S.steps.filter((s) => s.complete !== false).length;
  $('job-meta').textContent = `${j.schedule}, ${j.world_size} ranks, ${j.microbatches} microbatches, ` +
    `${done}/${j.steps} steps, ${j.device}` + (j.events_dropped === null ? ', events dropped unknown (the file holds a count past its bound)'
      : j.events_dropped ? `, ${j.events_dropped} events dropped` : '') + (j.cupti_dropped ? `, ${j.cupti_dropped} CUPTI records dropped` : '') +
    (S.info.dp_not_laid_out ? `, --dp ${S.info.dp_not_laid_out} is not the program's layout: one pipeline` : '') +
    (j.failure ? ` — ${j.failure}` : '');
}

function checkTraceLink(id) {
  // A plain link would be fetched without the Authorization header (a 401
  // with a token): fetch with it, hand the browser the bytes as a blob.
  const a = $('trace-link');
  a.hidden = false;
  a.href = '#';
  a.removeAttribute('download');
  a.textContent = 'Chrome trace';
  a.title = 'Chrome trace JSON (Perfetto) of the steps in the timeline (of the pipeline shown, when one is)';
  a.onclick = async (ev) => {
    ev.preventDefault();
    if (a.dataset.busy) return;
    a.dataset.busy = '1';
    a.textContent = 'Chrome trace…';
    const steps = stepsInView(), range = steps ? `${steps[0]}-${steps[1]}` : '', ranks = filteredRanks();
    const query = [steps ? `steps=${range}` : '', ranks ? `ranks=${ranks}` : ''].filter((q) => q).join('&');
    try {
      const r = await fetch(`/api/jobs/${id}/trace.json` + (query ? '?' + query : ''), { headers: headers() });
      if (!r.ok) {
        let msg = 'HTTP ' + r.status;
        try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
        throw new Error(msg);
      }
      const url = URL.createObjectURL(await r.blob());
      const d = document.createElement('a');
      d.href = url;
      d.download = `pprun-job-${id}` + (steps ? `-steps-${range}` : '') + (ranks ? `-ranks-${ranks}` : '') + '.trace.json';
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

// The steps from since on, a page at a time (a full page has the `limit`
// the server applied); with each rank's bubble ratio and held bytes where
// perRank (by default, by the size of the job open). False when another
// job opened meanwhile.
async function loadSteps(id, since = 0, perRank = world() <= RANKS_DRAWN) {
  for (;;) {
    const r = await api(`/api/jobs/${id}/steps?since=${since}&per_rank=${perRank ? 1 : 0}`);
    if (S.job !== id) return false;
    for (const s of r.steps) mergeStep(s);
    foldRankPeaks(r.act_peak_bytes_by_rank);
    if (r.steps.length < r.limit) return true;
    since = r.steps[r.steps.length - 1].step + 1;
  }
}

// ---- while it runs: the live stream's frames ----------------------------------

// A job's status (and its counts) changed.
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
  loadHeatmap(id);
  S.stepsDirty = 0; // the charts read every step again: a cut job's last loss goes (syncCharts)
  const follow = S.follow, done = lastStep((s) => s.complete);
  setFollow(false);
  updateStepLabel();
  try {
    if (!await loadSteps(id, done ? done.step + 1 : 0)) return; // another job opened meanwhile
  } catch (e) { /* the stream brings them */ }
  updateHeader();
  drawCharts();
  const traced = lastStep((s) => s.start != null);
  if (follow && traced && S.step == null) await showStep(traced.step);
}

// New events: drawn, or followed.
function onEvents(rows) {
  let maxEnd = 0;
  for (const r of rows) { S.ev.push(r); if (r[7] > maxEnd) maxEnd = r[7]; }
  noteSpans(rows);
  probe.liveEvents += rows.length;
  if (S.follow && S.mode === 'events') followLatest(maxEnd);
  else scheduleDraw();
}

const followWindowSoon = throttled(() => { if (S.follow) fetchWindow(); }, LIVE_REDRAW_MS);
const drawChartsSoon = throttled(() => drawCharts(), LIVE_REDRAW_MS);
// The heatmap reads every step's statistics: while following, every 5 s,
// and for a large job (1.6 s at 5,000 steps of 1,024 ranks) at most a
// tenth of the time.
const heatmapSoon = throttled(() => loadHeatmap(S.job), 5000, 9);

// A step completed, with its statistics.
function onStepDone(d) {
  d.complete = true;
  mergeStep(d);
  if (whatifDue()) loadWhatif(S.job);
  if (S.plan && !S.plan.simulated && Date.now() - planAt >= 1000) reloadPlan(S.job);
  if (!layoutRead && d.step >= 1 && replicas().dp > 1) readLayoutAgain(S.job);
  if (S.follow) { followLatest(); followWindowSoon(); } // the window brings the step's gaps
  updateHeader();
  drawChartsSoon();
  heatmapSoon();
}

// Microbatches' losses of steps still running.
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

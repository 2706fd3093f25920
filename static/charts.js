// charts.js: the step charts under the timeline: loss per step (and the
// evaluation loss of the steps an evaluation followed, --eval-every), bubble
// ratio per step (the mean and each rank's; past RANKS_DRAWN ranks the
// least and the most of them), bubble ratio per rank for the step shown,
// and the activations held, with the job's --max-mem bound where it has
// one. Each series is appended as steps arrive (linechart.js), so a redraw
// while following a job costs about the same at any length.
import { S, world, cutShort, lastStep, RANKS_DRAWN } from './state.js';
import { $, fmtBytes, sizeCanvas } from './util.js';
import { api } from './api.js';
import { probe } from './probe.js';
import { Series, lineChart, CHART_H } from './linechart.js';
import { updateStepLabel } from './toolbar.js';

const RANK_COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

let charts = null; // the job open's series: newCharts()
// The loss chart's options, as last chosen: they last while the page is
// open, across jobs, not across a reload.
export const lossOptions = { outliers: true, log: false };

// A job opens: its series are made anew at the next draw.
export function resetCharts() { charts = null; resetStepRanks(); }

// The step charts' series, kept with the steps: before a redraw,
// syncCharts() drops from each series the points from the first step
// mergeStep added or changed since (S.stepsDirty, an index into S.steps) on
// and appends them again from the steps; following a job, that is the
// newest step or two, not the whole job.
function newCharts(n) {
  const C = { world: n, key: null, anyComplete: false, loss: new Series(), evalLoss: new Series(),
    bubbleMean: new Series(), bubbleMin: new Series(), bubbleMax: new Series(), bubble: [], actMax: new Series(), act: [] };
  if (n <= RANKS_DRAWN) for (let r = 0; r < n; r++) { C.bubble.push(new Series()); C.act.push(new Series()); }
  return C;
}

// Brings the series up to S.steps; returns whether anything changed.
function syncCharts() {
  const n = world();
  if (!charts || charts.world !== n) { charts = newCharts(n); S.stepsDirty = 0; }
  const C = charts, from = S.stepsDirty;
  S.stepsDirty = Infinity;
  if (from >= S.steps.length) return false;
  for (const s of [C.loss, C.evalLoss, C.bubbleMean, C.bubbleMin, C.bubbleMax, C.actMax, ...C.bubble, ...C.act]) s.cut(S.steps[from].step);
  probe.chartSync.read += S.steps.length - from;
  // A job cut short: the losses of the step it was cut in (no statistics
  // after whole ones) are some of its microbatches', not the step's.
  const cut = S.info && cutShort(S.info.job);
  for (let i = from; i < S.steps.length; i++) {
    const st = S.steps[i], a = st.act_peak_bytes;
    if (st.complete) C.anyComplete = true;
    if (st.loss != null && !(cut && !st.complete && C.anyComplete)) C.loss.push(st.step, st.loss);
    if (st.eval_losses && st.eval_loss != null) C.evalLoss.push(st.step, st.eval_loss);
    if (st.bubble_ratio_mean != null) {
      C.bubbleMean.push(st.step, st.bubble_ratio_mean);
      C.bubbleMin.push(st.step, st.bubble_ratio_min);
      C.bubbleMax.push(st.step, st.bubble_ratio_max);
      C.bubble.forEach((s, r) => { if (st.bubble_ratio && st.bubble_ratio[r] != null) s.push(st.step, st.bubble_ratio[r]); });
    }
    if (st.act_peak_bytes_max > 0) {
      C.actMax.push(st.step, st.act_peak_bytes_max);
      C.act.forEach((s, r) => { if (a && a[r] != null) s.push(st.step, a[r]); });
    }
  }
  return true;
}

const TRAIN_COLOR = '#e15759', EVAL_COLOR = '#4e79a7';

// A step's loss as the note under the chart shows it: its true value.
const fmtLoss = (s, i) => `${s.y[i].toPrecision(4)} at step ${s.x[i]}`;

// Redraws the step charts; with no new or changed step since the last
// time, and the same widths and options, only the per-rank bars.
export function drawCharts() {
  const changed = syncCharts(), C = charts, bound = actBound(C);
  // the bound comes with the job's config and plan, which may arrive after its steps
  const key = [$('loss').clientWidth, $('bubble').clientWidth, $('act').clientWidth, window.devicePixelRatio,
    lossOptions.log, lossOptions.outliers, bound ? bound.note : ''].join();
  if (changed || key !== C.key) {
    C.key = key;
    probe.chartSync.draws++;
    drawLossChart(C);
    const n = world(), series = C.bubble.map((s, r) => ({ s, color: RANK_COLORS[r % 10] + '80', width: 1 }));
    if (n > RANKS_DRAWN) series.push({ s: C.bubbleMin, color: '#999', width: 1 }, { s: C.bubbleMax, color: '#999', width: 1 });
    series.push({ s: C.bubbleMean, color: '#222', width: 2, dots: true });
    let top = 0.05;
    const highest = n > RANKS_DRAWN ? C.bubbleMax : C.bubbleMean;
    if (highest.n) { highest.range(0, highest.n); top = Math.max(top, highest.y[highest.qhi]); }
    lineChart($('bubble'), series, { y0: 0, ymax: Math.min(1, top * 1.2), fmt: (y) => (100 * y).toFixed(0) + '%' });
    drawActChart(C, n, bound);
  }
  drawStepBars();
}

// Loss per step, and in blue the evaluation loss where there is one:
// outliers off the scale (lossOptions.outliers) and a log y axis
// (lossOptions.log) while every loss is above 0, both as last chosen while
// the page is open. The note says what is off the scale, or why there is
// no log scale, with true values.
function drawLossChart(C) {
  const s = C.loss, e = C.evalLoss, box = $('loss-log'), notes = [];
  if (s.n) s.range(0, s.n);
  if (e.n) e.range(0, e.n);
  const logOk = (!s.n || s.y[s.qlo] > 0) && (!e.n || e.y[e.qlo] > 0), log = lossOptions.log && logOk;
  const lowest = s.n ? s.qlo : -1, highest = s.n ? s.qhi : -1, evalLowest = e.n ? e.qlo : -1;
  box.disabled = !logOk; box.checked = log;
  box.parentNode.title = logOk ? 'loss on a log scale' : 'a log scale needs every loss above 0';
  $('loss-outliers').checked = lossOptions.outliers;
  // The evaluation's first: the chart's drawn points and trend are its last dotted series'.
  const chart = lineChart($('loss'), [{ s: e, color: EVAL_COLOR, dots: true }, { s, color: TRAIN_COLOR, dots: true }],
    { robust: lossOptions.outliers, log });
  if (e.n) notes.push('blue: evaluation loss');
  const own = chart.clipped.filter((c) => c.series === 1); // the evaluation's (0) show as marks only
  if (own.some((c) => c.above)) notes.push('▲ off the scale: highest ' + fmtLoss(s, highest));
  if (own.some((c) => !c.above)) notes.push('▼ off the scale: lowest ' + fmtLoss(s, lowest));
  if (!logOk) {
    notes.push('no log scale: a loss of ' +
      (s.n && s.y[lowest] <= 0 ? fmtLoss(s, lowest) : 'evaluation ' + fmtLoss(e, evalLowest)));
  }
  $('loss-note').textContent = notes.join(' · ');
  probe.lossPoints = chart.drawn;
  probe.evalLossPoints = e.n;
  probe.lossTrend = chart.trend;
  probe.lossChart = { scale: chart.scale, clipped: chart.clipped, logAvailable: logOk,
    note: $('loss-note').textContent };
}

const BOUND_COLOR = '#b5483f'; // the chart notes' colour (style.css)

// The job's --max-mem (config_json's max_mem, docs/cli.md: "25165824B" in
// bytes, "6" in microbatch-stages) in the chart's bytes: { bytes, label,
// note }, bytes null when it cannot be said in bytes yet; null without a
// bound. A bound in microbatch-stages is N times the bytes a
// microbatch-stage held on the rank where one held most (each rank's peak
// over the plan's peak in flight there), as the what-if's memory curve
// puts its bounds in bytes without --recompute (docs/schedules.md, "What
// if"; under recompute the curve counts the most one microbatch holds,
// which the step figures here do not give: docs/dashboard.md).
function actBound(C) {
  const m = S.info && S.info.config && S.info.config.max_mem;
  if (typeof m !== 'string' || !m) return null;
  const inBytes = /^(\d+)B$/.exec(m);
  if (inBytes) {
    const b = Number(inBytes[1]);
    return { bytes: b, label: `--max-mem ${fmtBytes(b)}`, note: `dashed: --max-mem ${fmtBytes(b)} per rank` };
  }
  const n = Number(m);
  if (!Number.isInteger(n) || n < 1) return null;
  const units = ` ${n === 1 ? 'microbatch-stage' : 'microbatch-stages'} per rank`;
  const inflight = (S.plan && S.plan.peak_inflight) || [];
  let unit = 0, rank = -1;
  inflight.forEach((k, r) => { if (k > 0 && S.actRankPeak[r] / k > unit) { unit = S.actRankPeak[r] / k; rank = r; } });
  if (rank < 0) return { bytes: null, label: '', note: `--max-mem ${n}${units} (in bytes once a step is measured)` };
  return { bytes: n * unit, label: `--max-mem ${n} = ${fmtBytes(n * unit)}`,
    note: `dashed: --max-mem ${n}${units}, ${fmtBytes(n * unit)}: ${n} × the ${fmtBytes(unit)} a microbatch-stage held ` +
      `on rank ${rank}` };
}

// Activations held, the peak of each step per rank (the model's own count of
// what F saved for B and W), and the job's --max-mem as a dashed line: the y
// axis always reaches it, above the peaks or not. Older files and jobs
// without it have only 0s.
function drawActChart(C, n, bound) {
  S.actRecorded = C.actMax.n > 0; // then a W that frees the last microbatch says 0 B, not nothing
  const c = $('act');
  $('act-note').textContent = bound ? bound.note : '';
  probe.actChart = { scale: null, bound: null, note: $('act-note').textContent };
  if (!C.actMax.n) {
    const { g, w, h } = sizeCanvas(c, CHART_H);
    g.clearRect(0, 0, w, h); g.fillStyle = '#888'; g.font = '12px system-ui, sans-serif';
    g.fillText(C.anyComplete ? 'not recorded for this job' : 'no data yet', 46, 30);
    probe.actPoints = [];
    return;
  }
  const series = C.act.map((s, r) => ({ s, color: RANK_COLORS[r % 10], width: 1.5 }));
  series.push({ s: C.actMax, color: '#222', width: n <= RANKS_DRAWN ? 0.5 : 2, dots: true });
  const lines = bound && bound.bytes != null ? [{ y: bound.bytes, color: BOUND_COLOR, label: bound.label }] : [];
  const chart = lineChart(c, series, { y0: 0, fmt: fmtBytes, lines });
  probe.actPoints = chart.drawn;
  probe.actChart = { scale: chart.scale, bound: chart.lines[0] || null, note: $('act-note').textContent };
}

// Each rank's bubble ratio in one step, for a job whose steps keep no
// per-rank arrays: asked for one step at a time (/steps?per_rank=1), the
// last answer kept with whether its step was complete (a step shown while
// it runs is asked for again once it completes). null until it is here.
let ranksOf = { job: null, step: null, complete: false, ratios: null, asking: false };
function resetStepRanks() { ranksOf = { job: null, step: null, complete: false, ratios: null, asking: false }; }
function stepRatios(st) {
  if (st.bubble_ratio) return st.bubble_ratio;
  if (st.complete && S.liveRanks && S.liveRanks.step === st.step) return S.liveRanks.ratios; // following live: no ask
  const k = ranksOf, complete = !!st.complete;
  if (k.job === S.job && k.step === st.step && k.complete === complete && k.ratios) return k.ratios;
  if (k.asking) return null; // the step shown then is asked for when this answer is in
  const job = S.job, step = st.step;
  ranksOf = { job, step, complete, ratios: null, asking: true };
  const done = (ratios) => {
    if (ranksOf.job !== job || ranksOf.step !== step) return; // another job opened meanwhile
    ranksOf = { job, step, complete, ratios, asking: false };
    if (ratios) drawStepBars(); // this step's bars, or the ask of the step shown now
  };
  api(`/api/jobs/${job}/steps?since=${step}&limit=1&per_rank=1`).then(
    (r) => done(r.steps[0] && r.steps[0].step === step ? r.steps[0].bubble_ratio : null), () => done(null));
  return null;
}

// Per rank bars for the step shown, else the latest complete one; and the
// toolbar's step label, which names the last step too. Past RANKS_DRAWN
// ranks a bar each without its label, side by side.
export function drawStepBars() {
  const shown = S.step != null && S.stepAt.get(S.step);
  const st = (shown && shown.bubble_ratio_mean != null ? shown : null) || lastStep((s) => s.bubble_ratio_mean != null);
  const ratios = st && stepRatios(st);
  const c = $('bubble-ranks');
  const { g, w, h } = sizeCanvas(c, CHART_H);
  g.clearRect(0, 0, w, h);
  $('bubble-step-label').textContent = st ? 'step ' + st.step : 'no complete step yet';
  probe.stepBars = ratios ? { step: st.step, ranks: ratios.length } : null;
  if (ratios) {
    const k = ratios.length, few = k <= RANKS_DRAWN, gap = few ? 6 : 0, bw = Math.min(40, (w - 50) / k - gap);
    g.font = '10px system-ui, sans-serif';
    ratios.forEach((v, r) => {
      const x = 40 + r * (bw + gap), bh = (h - 40) * (v || 0);
      g.fillStyle = few ? RANK_COLORS[r % 10] : RANK_COLORS[0]; g.fillRect(x, h - 20 - bh, Math.max(bw, 0.5), bh);
      if (!few) return;
      g.fillStyle = '#444'; g.fillText((100 * (v || 0)).toFixed(1) + '%', x, h - 24 - bh);
      g.fillText('r' + r, x + bw / 2 - 5, h - 8);
    });
    if (!few) {
      g.fillStyle = '#444';
      g.fillText('r0', 40, h - 8);
      const last = 'r' + (k - 1);
      g.fillText(last, 40 + k * bw - g.measureText(last).width, h - 8);
      g.fillText(`${k} ranks: least ${(100 * st.bubble_ratio_min).toFixed(1)}%, most ${(100 * st.bubble_ratio_max).toFixed(1)}%`, 40, 12);
    }
  }
  updateStepLabel();
}

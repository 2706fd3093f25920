// view.js: what the timeline shows and how it moves: a step (◀ ▶), a
// window of time (wheel: zoom, drag: pan, "all steps"), or the newest steps
// while following a running job; each view's window fetched from
// /api/jobs/{id}/events (and /kernels, zoomed in on a job with gpu spans)
// into state.js, and drawn (timeline.js).
import { S, KERNEL_SPANS, KERNEL_LIMIT, EventStore, lastStep } from './state.js';
import { api } from './api.js';
import { $ } from './util.js';
import { probe } from './probe.js';
import { LABEL_W, AXIS_H, tOf, rowPitch } from './geometry.js';
import { scheduleDraw } from './timeline.js';
import { hitTest, placeTooltip } from './hover.js';
import { drawStepBars } from './charts.js';
import { SPAN } from './phases.js';
import { R, toggleGroup } from './rows.js';

// Follow mode: the view ends at the newest event and is the last step's
// length and a bit; a step that runs longer than the last one widens it to
// keep its start (and the plan aligned to it) in view.
export function followLatest(end) {
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

// Following live, or not: the state and the toolbar's box.
export function setFollow(on) { S.follow = $('follow').checked = on; }

export async function showStep(step) {
  const s = S.stepAt.get(step);
  setStep(step);
  setFollow(false);
  if (s && s.start != null) {
    const pad = (s.end - s.start) * 0.02;
    S.view = { from: Math.max(0, s.start - pad), to: s.end + pad };
  }
  await fetchWindow();
}

export async function showWindow(from, to) {
  S.view = { from, to };
  await fetchWindow();
}

// A window of the timeline, as zooming or panning to it leaves it: no step
// shown, not following.
export function showCustomWindow(from, to) {
  setFollow(false);
  setStep(null);
  return showWindow(from, to);
}

// The window for a view the pointer is still moving: once it rests 120 ms.
let fetchTimer = null;
function scheduleFetch() {
  clearTimeout(fetchTimer);
  fetchTimer = setTimeout(fetchWindow, 120);
}

let fetchSeq = 0; // the latest window asked for: an answer to an earlier one is dropped

export async function fetchWindow() {
  if (!S.job) return;
  const seq = ++fetchSeq;
  probe.windowFetches++;
  const w = $('timeline').clientWidth || 1000;
  // Whole ns in the range the server takes, whatever the view holds.
  const ns = (x) => Math.min(Number.MAX_SAFE_INTEGER, Math.max(0, Number.isFinite(x) ? x : 0));
  const from = Math.floor(ns(S.view.from)), to = Math.ceil(ns(S.view.to));
  const gpu = S.gpuLane;
  const r = await api(`/api/jobs/${S.job}/events?from=${from}&to=${Math.max(to, from + 1)}&buckets=${Math.min(4000, Math.max(10, Math.floor(w)))}` + (gpu ? '&gpu=1' : ''));
  if (seq !== fetchSeq) return; // a newer view was asked for
  // Kernels only when zoomed in: a few hundred ops' worth.
  let kr = null;
  if (gpu && r.mode === 'events' && r.gpu && r.gpu.length <= KERNEL_SPANS) {
    kr = await api(`/api/jobs/${S.job}/kernels?from=${from}&to=${Math.max(to, from + 1)}&limit=${KERNEL_LIMIT}`);
    if (seq !== fetchSeq) return;
  }
  S.gpu = r.mode === 'events' && r.gpu ? r.gpu : [];
  S.kernels = kr ? kr.kernels : null;
  probe.lastKernels = kr ? { count: kr.count, truncated: kr.truncated } : null;
  probe.lastWindow = { mode: r.mode, count: r.count, from: r.from, to: r.to };
  S.mode = r.mode;
  if (r.mode === 'events') {
    const st = new EventStore(Math.max(1024, r.events.length));
    for (const row of r.events) st.push(row);
    noteSpans(r.events);
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
    S.bins = r.bins; S.gaps = [];
    S.ev = new EventStore();
  }
  scheduleDraw();
}

// A lane for the program's own spans under each rank, from the first of
// the job's spans the page sees on (it stays: the rows do not jump as the
// view moves between steps with and without spans).
export function noteSpans(rows) {
  if (S.spanLane || !rows.some((x) => x[5] === SPAN)) return;
  S.spanLane = true;
  $('legend-spans').hidden = false;
}

// The step shown (null: none, a window or following live): the label and
// the per-rank bars follow it.
function setStep(step) {
  S.step = step;
  drawStepBars();
}

// The steps the timeline shows, [first, last], or null when it shows them
// all: a long job's whole trace is more than Perfetto can open. A step
// counts when its middle is in view (the margin around a step shown shows
// bits of its neighbours), or, zoomed in between two, when any of it is.
export function stepsInView() {
  const { from, to } = S.view;
  const seen = S.steps.filter((s) => s.start != null && s.end != null && s.end >= from && s.start <= to);
  const mostly = seen.filter((s) => (s.start + s.end) / 2 >= from && (s.start + s.end) / 2 <= to);
  const shown = mostly.length ? mostly : seen;
  if (!shown.length || shown.length === S.steps.length) return null;
  return [shown[0].step, shown[shown.length - 1].step];
}

export function lastEnd() {
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
export function stepBy(d) {
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

// Wheel: zoom around the pointer; drag: pan; hover: the tooltip.
export function setupTimelineMouse() {
  const c = $('timeline'), tip = $('tooltip');
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
    setFollow(false);
    tip.hidden = true; // it described what was under the pointer before the zoom
    setStep(null); scheduleDraw(); scheduleFetch();
  }, { passive: false });
  // A group's label: fold or unfold it.
  c.addEventListener('click', (e) => {
    const rect = c.getBoundingClientRect(), x = e.clientX - rect.left, row = R.rows[Math.floor((e.clientY - rect.top - AXIS_H) / rowPitch())];
    if (x >= LABEL_W || !row || row.group == null) return;
    toggleGroup(R.groups[row.group].key);
    scheduleDraw();
  });
  c.addEventListener('mousedown', (e) => { drag = { x: e.clientX, view: Object.assign({}, S.view) }; c.classList.add('dragging'); });
  window.addEventListener('mouseup', () => { if (drag) { drag = null; c.classList.remove('dragging'); scheduleFetch(); } });
  window.addEventListener('mousemove', (e) => {
    if (drag) {
      const w = c.clientWidth, dt = (e.clientX - drag.x) / (w - LABEL_W) * (drag.view.to - drag.view.from);
      const span = drag.view.to - drag.view.from;
      const from = Math.max(0, Math.min(drag.view.from - dt, Math.max(drag.view.from, jobExtent() * (1 + VIEW_MARGIN) - span)));
      S.view = { from, to: from + span };
      setFollow(false);
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
}

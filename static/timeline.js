// timeline.js: draws the timeline: the measured rows (a row per rank, its
// ops coloured by phase, idle gaps shaded by cause, a lane of the program's
// own named spans under it for a job that has them, a GPU lane for a job
// with gpu spans; zoomed out, bars of busy share; grouped (rows.js), a
// summary lane per group of the share of its ranks idle), the critical path
// over them (critpath.js), and the plan's simulated rows aligned to the
// step in view. What is drawn is the window in state.js; view.js moves the
// view and fetches the window.
//
// Drawing keeps the window in typed arrays (EventStore) and draws one pass
// per colour, blocks narrower than a pixel merged per pixel column and
// everything off-screen skipped, so 100,000 visible events stay interactive.
// With compact rows (more than 64 ranks) that includes the rows scrolled
// out of the window: only the rows on screen are cleared and drawn (the
// page redraws as it scrolls). With 1,024 rows, drawing all of them took
// 90-130 ms a redraw here; the rows on screen, see docs/dashboard.md.
import { S, KERNEL_LIMIT, EventStore, world, lastStep } from './state.js';
import { $, fmtMs, sizeCanvas, throttled, LIVE_REDRAW_MS } from './util.js';
import { probe } from './probe.js';
import { PHASES, PHASE_COLOR, CAUSE_COLOR, CAUSE_OTHER, BW, EVAL_F, SPAN, isBlock, isComm, spanColor } from './phases.js';
import { ROW_H, ROW_GAP, AXIS_H, LABEL_W, GPU_H, SPAN_H, rowPitch, rowY, slotY, rowCount, fitRows, gpuY, spanY, xOf, blockY, blockMidY, lanesOf } from './geometry.js';
import { R, layoutRows } from './rows.js';
import { drawCritpath, fetchCritpath } from './critpath.js';

let drawPending = false;
export function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; draw(); });
}

// The critical path of the step in view is asked for through a throttle
// (following a fast job, that step changes faster than the page should send
// requests), and drawn when its answer comes.
const critFetchSoon = throttled(async () => { if (await fetchCritpath()) scheduleDraw(); }, LIVE_REDRAW_MS);

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

function drawRowLabels(g, n, prefix, ry = rowY, lanes = S.gpuLane, spans = S.spanLane) {
  g.fillStyle = '#444'; g.font = ROW_H < 20 ? '10px system-ui, sans-serif' : '12px system-ui, sans-serif'; g.textBaseline = 'middle';
  for (let r = 0; r < n; r++) {
    if (ry(r) < 0) continue; // folded into its group's lane
    g.fillStyle = '#fff'; g.fillRect(0, ry(r) - ROW_GAP / 2, LABEL_W - 2, ROW_H + ROW_GAP);
    g.fillStyle = '#444'; g.fillText(prefix + r, 6, ry(r) + ROW_H / 2);
    if (spans) {
      g.fillStyle = '#fff'; g.fillRect(0, spanY(r), LABEL_W - 2, SPAN_H);
      g.fillStyle = '#888'; g.font = '10px system-ui, sans-serif'; g.fillText('spans', 22, spanY(r) + SPAN_H / 2);
      g.font = '12px system-ui, sans-serif';
    }
    if (lanes) {
      g.fillStyle = '#fff'; g.fillRect(0, gpuY(r), LABEL_W - 2, GPU_H);
      g.fillStyle = '#888'; g.font = '10px system-ui, sans-serif'; g.fillText('gpu', 22, gpuY(r) + GPU_H / 2);
      g.font = '12px system-ui, sans-serif';
    }
  }
}

// The events' lanes (lanesOf), kept with the store until it grows; sets
// S.twoLanes, which the row's geometry follows.
export function eventLanes(ev) {
  if (!ev.lanes || ev.lanesN !== ev.n) {
    ev.lanes = lanesOf(ev.n, (i) => [ev.rank[i], ev.phase[i], ev.start[i], ev.end[i]], isBlock, (ph) => ph === 0);
    ev.lanesN = ev.n;
    ev.twoLanes = ev.lanes.includes(1);
  }
  S.twoLanes = ev.twoLanes;
  return ev.lanes;
}

// The measured timeline's canvas as high as its rows (rows.js) need. Also
// before a scroll to a row whose layout just changed: the page below the
// canvas must have moved first, or the browser's scroll anchoring moves
// the view on when the next draw resizes it.
export function sizeTimeline() {
  fitRows(world());
  return sizeCanvas($('timeline'), AXIS_H + rowCount() * rowPitch() + 4);
}

function draw() {
  if (!S.info) return;
  const began = performance.now();
  const n = world();
  if (R.slot.length !== n) layoutRows();
  const { g, w, h } = sizeTimeline();
  // The band of the canvas on screen (all of it for a small job).
  const cull = ROW_H < 20, rect = cull ? $('timeline').getBoundingClientRect() : null;
  const top = cull ? Math.max(0, Math.floor(-rect.top) - ROW_H) : 0, bottom = cull ? Math.min(h, Math.ceil(window.innerHeight - rect.top) + ROW_H) : h;
  const onScreen = (y) => y + ROW_H + ROW_GAP >= top && y <= bottom;
  g.clearRect(0, top, w, Math.max(0, bottom - top));
  drawAxis(g, w, h);
  if (S.highlight != null && R.slot[S.highlight] >= 0) { // the rank a heatmap cell jumped to
    g.fillStyle = 'rgba(255, 214, 0, 0.25)'; g.fillRect(0, rowY(S.highlight) - ROW_GAP / 2, w, ROW_H + ROW_GAP);
  }
  const drawn = { F: new Array(n).fill(0), B: new Array(n).fill(0), W: new Array(n).fill(0), BW: new Array(n).fill(0),
    EVAL_F: new Array(n).fill(0), comm: 0, opt: 0, gaps: 0,
    bins: 0, steps: new Set(), gpu: new Array(n).fill(0), kernels: 0, spans: new Array(n).fill(0) };
  const left = LABEL_W, right = w;
  // Idle gaps, shaded by cause.
  for (const gp of S.gaps || []) {
    const x0 = Math.max(left, xOf(gp[2], w)), x1 = Math.min(right, xOf(gp[3], w));
    if (x1 <= x0 || R.slot[gp[0]] < 0 || !onScreen(rowY(gp[0]))) continue;
    g.fillStyle = CAUSE_COLOR[gp[4]] || CAUSE_COLOR[CAUSE_OTHER];
    g.fillRect(x0, rowY(gp[0]), x1 - x0, ROW_H);
    drawn.gaps++;
  }
  if (S.bins) drawBins(g, w, drawn, onScreen);
  const ev = S.ev, lanes = eventLanes(ev);
  // One pass per phase: no fillStyle churn; sub-pixel blocks merged (per
  // lane: with two, ops of one rank ran at once). A program's spans are
  // drawn on their own lane (drawSpans).
  const lastPx = new Float64Array(2 * n * PHASES.length).fill(-1);
  let lane2 = 0;
  let inView = 0; // events in the view (the store keeps some from earlier windows)
  for (let ph = 0; ph < PHASES.length; ph++) {
    if (ph === SPAN) continue;
    g.fillStyle = PHASE_COLOR[ph];
    const comm = isComm(ph);
    for (let i = 0; i < ev.n; i++) {
      if (ev.phase[i] !== ph) continue;
      if (ev.end[i] < S.view.from || ev.start[i] > S.view.to) continue;
      inView++;
      const r = ev.rank[i];
      if (r < 0 || r >= n || R.slot[r] < 0) continue;
      const y = rowY(r);
      if (!onScreen(y)) continue;
      let x0 = xOf(ev.start[i], w), x1 = xOf(ev.end[i], w);
      if (x0 < left) x0 = left;
      if (x1 > right) x1 = right;
      if (x1 - x0 < 1) {
        const px = Math.floor(x0), k = (lanes[i] * n + r) * PHASES.length + ph;
        if (lastPx[k] === px) continue;
        lastPx[k] = px; x1 = x0 + 1;
      }
      if (comm) { g.fillRect(x0, y + ROW_H - (ph === 3 || ph === 5 || ph === 11 ? 3 : 6), x1 - x0, 3); drawn.comm++; }
      else if (ph === 7) { g.fillRect(x0, y + 4, x1 - x0, ROW_H - 12); drawn.opt++; }
      else {
        const [by, bh] = blockY(r, PHASES[ph], lanes[i]);
        g.fillRect(x0, by, x1 - x0 - (x1 - x0 > 3 ? 0.5 : 0), bh);
        drawn[PHASES[ph]][r]++; drawn.steps.add(ev.step[i]); lane2 += lanes[i];
      }
    }
  }
  if (S.spanLane) drawSpans(g, w, n, drawn);
  if (S.gpuLane) drawGpu(g, w, n, drawn);
  drawGroupLanes(g, w, drawn);
  // Microbatch labels where they fit (not on compact rows).
  g.fillStyle = '#fff'; g.font = '11px system-ui, sans-serif'; g.textBaseline = 'middle'; g.textAlign = 'center';
  for (let i = 0; ROW_H >= 20 && i < ev.n; i++) {
    const ph = ev.phase[i];
    if (!isBlock(ph) || ev.end[i] < S.view.from || ev.start[i] > S.view.to || R.slot[ev.rank[i]] < 0) continue;
    const x0 = Math.max(left, xOf(ev.start[i], w)), x1 = Math.min(right, xOf(ev.end[i], w));
    if (x1 - x0 < 14) continue;
    g.fillText(String(ev.mb[i]), (x0 + x1) / 2, blockMidY(ev.rank[i], lanes[i]));
  }
  g.textAlign = 'left';
  const anchor = viewAnchor();
  if (drawCritpath(g, w, h, n, anchor)) critFetchSoon();
  drawRowLabels(g, n, 'rank ', (r) => { const y = rowY(r); return onScreen(y) ? y : -1; });
  drawGroupLabels(g);
  probe.drawn = { F: drawn.F, B: drawn.B, W: drawn.W, BW: drawn.BW, EVAL_F: drawn.EVAL_F, comm: drawn.comm, opt: drawn.opt, gaps: drawn.gaps, bins: drawn.bins,
    steps: [...drawn.steps].sort((a, b) => a - b), inView, gpuLane: S.gpuLane, gpu: drawn.gpu, kernels: drawn.kernels,
    spanLane: S.spanLane, spans: drawn.spans, lane2, rows: rowCount(), rankRows: R.rows.filter((x) => x.rank != null).length, lanes: drawn.lanes };
  $('window-label').textContent = `${fmtMs(S.view.from)} – ${fmtMs(S.view.to)} · ${S.mode === 'events' ? inView + ' events' : 'aggregated (' + S.mode + ')'}` +
    (S.gpuLane ? (S.mode === 'events' ? ` · ${S.gpu.length} gpu spans` + (S.kernels ? `, ${S.kernels.length} kernels` + (probe.lastKernels && probe.lastKernels.truncated ? ` (cut at ${KERNEL_LIMIT.toLocaleString('en-US')}: zoom in)` : '') : '') : ' · gpu lane: zoom in') : '');
  drawPlan(anchor);
  probe.drawMs = performance.now() - began; // the whole redraw, for tests/browser/dashboard.mjs "scale"
}

// The spans lanes: a light track, each of the program's spans in its name's
// colour with its name where it fits; a span inside another is drawn over
// it (the longer first), a little lower, so both show.
function drawSpans(g, w, n, drawn) {
  const left = LABEL_W, right = w, ev = S.ev;
  g.fillStyle = '#f6f6f6';
  for (let r = 0; r < n; r++) g.fillRect(left, spanY(r), right - left, SPAN_H);
  const shown = [];
  for (let i = 0; i < ev.n; i++) {
    if (ev.phase[i] !== SPAN || ev.end[i] < S.view.from || ev.start[i] > S.view.to) continue;
    if (ev.rank[i] < 0 || ev.rank[i] >= n) continue;
    shown.push(i);
  }
  shown.sort((a, b) => (ev.end[b] - ev.start[b]) - (ev.end[a] - ev.start[a]));
  g.font = '10px system-ui, sans-serif'; g.textBaseline = 'middle';
  for (let k = 0; k < shown.length; k++) {
    const i = shown[k], r = ev.rank[i];
    let depth = 0; // the longer spans before it in `shown` that hold it
    for (let j = 0; j < k; j++) {
      const o = shown[j];
      if (ev.rank[o] === r && ev.start[o] <= ev.start[i] && ev.end[o] >= ev.end[i]) depth++;
    }
    const x0 = Math.max(left, xOf(ev.start[i], w)), x1 = Math.min(right, xOf(ev.end[i], w));
    const y = spanY(r) + Math.min(depth, 3) * 2, hgt = SPAN_H - Math.min(depth, 3) * 2;
    g.fillStyle = spanColor(ev.name[i]);
    g.fillRect(x0, y, Math.max(1, x1 - x0 - (x1 - x0 > 3 ? 0.5 : 0)), hgt);
    const label = ev.name[i] != null ? String(ev.name[i]) : 'span';
    if (x1 - x0 > 12) {
      g.save(); g.beginPath(); g.rect(x0, y, x1 - x0, hgt); g.clip();
      g.fillStyle = '#333'; g.fillText(label, x0 + 3, y + hgt / 2);
      g.restore();
    }
    drawn.spans[r]++;
  }
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

// The groups' summary lanes: per pixel column the share of the group's
// ranks idle (not in an F, B, W, BW or OPT), drawn up from the lane's
// bottom, over the columns between the group's first op start and last op
// end in the window. Zoomed out (bins), a bin's busy time is spread evenly
// over it. Kept for the tooltip (laneIdle).
export const laneIdle = { idle: [] };
function drawGroupLanes(g, w, drawn) {
  drawn.lanes = [];
  laneIdle.idle = [];
  if (!R.groups.length) return;
  const left = LABEL_W, W = Math.max(1, Math.ceil(w - left)), ng = R.groups.length;
  const diff = new Float64Array(ng * (W + 2)), part = new Float64Array(ng * (W + 2));
  const lo = new Float64Array(ng).fill(Infinity), hi = new Float64Array(ng).fill(-Infinity);
  const add = (gi, s, e, k) => { // k busy per rank over [s, e) ns
    let a = xOf(s, w) - left, b = xOf(e, w) - left;
    if (b <= 0 || a >= W) return;
    a = Math.max(0, a); b = Math.min(W, b);
    if (a < lo[gi]) lo[gi] = a;
    if (b > hi[gi]) hi[gi] = b;
    const o = gi * (W + 2), ia = Math.floor(a), ib = Math.floor(b);
    if (ia === ib) { part[o + ia] += (b - a) * k; return; }
    part[o + ia] += (ia + 1 - a) * k; diff[o + ia + 1] += k; diff[o + ib] -= k; part[o + ib] += (b - ib) * k;
  };
  // A rank busy is busy once: the union of its ops (a DualPipeV pair's F
  // and backward run at once and would count it twice).
  const ev = S.ev, byRank = new Map();
  for (let i = 0; i < ev.n; i++) {
    const ph = ev.phase[i], r = ev.rank[i];
    if (!(isBlock(ph) || ph === 7) || ev.end[i] < S.view.from || ev.start[i] > S.view.to || R.groupOf[r] < 0) continue;
    if (!byRank.has(r)) byRank.set(r, []);
    byRank.get(r).push([ev.start[i], ev.end[i]]);
  }
  for (const [r, iv] of byRank) {
    iv.sort((x, y) => x[0] - y[0]);
    let [s, e] = iv[0];
    for (const [a, b] of iv) {
      if (a > e) { add(R.groupOf[r], s, e, 1); s = a; e = b; } else if (b > e) e = b;
    }
    add(R.groupOf[r], s, e, 1);
  }
  for (const b of S.bins || []) {
    const gi = R.groupOf[b[0]];
    if (gi >= 0 && b[2] > b[1]) add(gi, b[1], b[2], Math.min(1, b[3] / (b[2] - b[1])));
  }
  g.fillStyle = '#c0504d';
  for (let gi = 0; gi < ng; gi++) {
    const grp = R.groups[gi], y = slotY(grp.slot), o = gi * (W + 2), idle = new Float32Array(W).fill(NaN);
    g.save(); g.fillStyle = '#f1f1f1'; g.fillRect(left, y, W, ROW_H); g.restore();
    let run = 0, sum = 0, cols = 0;
    for (let x = Math.max(0, Math.floor(lo[gi])); x < Math.min(W, Math.ceil(hi[gi])); x++) {
      run += diff[o + x];
      const share = Math.max(0, Math.min(1, 1 - (run + part[o + x]) / grp.ranks.length));
      idle[x] = share; sum += share; cols++;
      const hh = share * (ROW_H - 2);
      if (hh >= 0.5) g.fillRect(left + x, y + ROW_H - hh, 1, hh);
    }
    laneIdle.idle[gi] = idle;
    drawn.lanes.push({ key: grp.key, ranks: grp.ranks.length, folded: R.folded.has(grp.key), idle: cols ? sum / cols : null });
  }
}

// The groups' labels, "▸ node 3" folded and "▾ node 3" open: a click on
// one folds or unfolds it (view.js).
function drawGroupLabels(g) {
  g.font = ROW_H < 20 ? 'bold 10px system-ui, sans-serif' : 'bold 12px system-ui, sans-serif'; g.textBaseline = 'middle';
  for (const grp of R.groups) {
    const y = slotY(grp.slot);
    g.fillStyle = '#fff'; g.fillRect(0, y - ROW_GAP / 2, LABEL_W - 2, ROW_H + ROW_GAP);
    g.fillStyle = '#333'; g.fillText((R.folded.has(grp.key) ? '▸ ' : '▾ ') + grp.label, 2, y + ROW_H / 2);
  }
}

function drawBins(g, w, drawn, onScreen) {
  // Aggregated: a bar per bin, its height the busy share, coloured by the
  // dominant phase (grey when the split is unknown: per-step bins).
  for (const b of S.bins) {
    if (R.slot[b[0]] < 0 || !onScreen(rowY(b[0]))) continue;
    const x0 = Math.max(LABEL_W, xOf(b[1], w)), x1 = Math.min(w, xOf(b[2], w));
    if (x1 <= x0) continue;
    const frac = Math.min(1, b[3] / Math.max(1, b[2] - b[1]));
    let ph = -1, best = -1;
    for (let k = 0; k < 3; k++) if (b[4 + k] != null && b[4 + k] > best) { best = b[4 + k]; ph = k; }
    if (b[10] != null && b[10] > best) { best = b[10]; ph = BW; } // bins[10]: BW time, PyTorch's full backward
    if (b[11] != null && b[11] > best) ph = EVAL_F; // bins[11]: an evaluation's forwards
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
  const n = world(), none = !S.plan || !S.plan.simulated || S.plan.actions_left_out > 0; // nothing to draw: a line, not a row per rank
  const { g, w, h } = sizeCanvas(c, none ? 32 : AXIS_H + n * (ROW_H + ROW_GAP) + 4);
  g.clearRect(0, 0, w, h);
  probe.planDrawn = 0;
  const planY = (rank) => AXIS_H + rank * (ROW_H + ROW_GAP); // the plan has no GPU lanes
  if (none) {
    g.fillStyle = '#888'; g.font = '12px system-ui, sans-serif';
    g.fillText(S.plan && S.plan.actions_left_out ? `the plan has ${S.plan.actions_left_out} actions, more than the dashboard draws: pprun stats and SQL (the plan table) have them`
      : S.plan && S.plan.actions.length ? 'the plan has no simulated times' : 'no plan stored for this job', LABEL_W, 20);
    return;
  }
  probe.planAnchor = anchor ? anchor.step : null;
  const t0 = anchor ? anchor.start : 0;
  g.fillStyle = '#888'; g.font = '11px system-ui, sans-serif'; g.textBaseline = 'top';
  g.fillText(`makespan ${fmtMs(S.plan.sim_makespan_ns)} · bubble ${S.plan.sim_bubble_ratio.map((x) => (100 * x).toFixed(1) + '%').join(' ')}` +
    (S.plan.peak_inflight && S.plan.peak_inflight.length ? ` · in flight at most ${S.plan.peak_inflight.join(' ')} microbatch-stages` : '') +
    (anchor ? ` · aligned to step ${anchor.step}` : ''), LABEL_W + 4, 4);
  g.textBaseline = 'middle'; g.textAlign = 'center';
  // the plan's overlapped pairs on two lanes too, each op half the row
  const acts = S.plan.actions, lanes = lanesOf(acts.length, (i) => [acts[i].rank, acts[i].phase, acts[i].sim_start, acts[i].sim_end], () => true,
    (ph) => ph === 'F');
  const two = lanes.includes(1), bh = two ? (ROW_H - 8) / 2 : ROW_H - 8;
  probe.planLane2 = 0;
  acts.forEach((a, i) => {
    const ph = PHASES.indexOf(a.phase);
    const x0 = Math.max(LABEL_W, xOf(t0 + a.sim_start, w)), x1 = Math.min(w, xOf(t0 + a.sim_end, w));
    if (x1 <= x0) return;
    const y = planY(a.rank) + lanes[i] * bh;
    g.fillStyle = PHASE_COLOR[ph] || '#999';
    g.globalAlpha = 0.75;
    g.fillRect(x0, y, x1 - x0 - 0.5, two ? bh - 0.5 : bh);
    g.globalAlpha = 1;
    if (x1 - x0 >= 14) { g.fillStyle = '#fff'; g.fillText(String(a.microbatch), (x0 + x1) / 2, y + bh / 2); }
    probe.planDrawn++;
    probe.planLane2 += lanes[i];
  });
  g.textAlign = 'left';
  drawRowLabels(g, n, 'rank ', planY, false, false);
}


// ---- for the tests ---------------------------------------------------------------

// Page coordinates of the centre of a drawn block (of that stage, when
// given), for hovering in tests.
export function blockCenter(rank, phase, mb, step, stage) {
  const ev = S.ev, ph = PHASES.indexOf(phase), c = $('timeline'), rect = c.getBoundingClientRect(), lanes = eventLanes(ev);
  for (let i = 0; i < ev.n; i++) {
    if (ev.rank[i] === rank && ev.phase[i] === ph && ev.mb[i] === mb && ev.step[i] === step && (stage == null || ev.stage[i] === stage)) {
      const x = (Math.max(LABEL_W, xOf(ev.start[i], c.clientWidth)) + Math.min(c.clientWidth, xOf(ev.end[i], c.clientWidth))) / 2;
      return { x: rect.left + x, y: rect.top + blockMidY(rank, lanes[i]) };
    }
  }
  return null;
}

// Page coordinates of the middle of a rank's span of that name in a step
// (on its spans lane), for hovering in tests; null when none is drawn.
export function spanCenter(rank, name, step) {
  const ev = S.ev, c = $('timeline'), rect = c.getBoundingClientRect(), w = c.clientWidth;
  if (!S.spanLane) return null;
  for (let i = 0; i < ev.n; i++) {
    if (ev.phase[i] !== SPAN || ev.rank[i] !== rank || ev.name[i] !== name || ev.step[i] !== step) continue;
    const x0 = Math.max(LABEL_W, xOf(ev.start[i], w)), x1 = Math.min(w, xOf(ev.end[i], w));
    if (x1 <= x0) continue;
    return { x: rect.left + (x0 + x1) / 2, y: rect.top + spanY(rank) + SPAN_H - 3 };
  }
  return null;
}

// Page coordinates of time t on a rank's GPU lane (upper half: spans,
// lower half: kernels), for hovering in tests; null without a lane.
export function gpuLaneAt(rank, t, lower) {
  if (!S.gpuLane) return null;
  const c = $('timeline'), rect = c.getBoundingClientRect();
  return { x: rect.left + xOf(t, c.clientWidth), y: rect.top + gpuY(rank) + (lower ? GPU_H * 3 / 4 : GPU_H / 4) };
}

// Window coordinates of a group's label (clicking it folds or unfolds the
// group), scrolled into view, for tests; null when there is no such group.
export function groupLabelCenter(key) {
  const grp = R.groups.find((x) => x.key === key);
  if (!grp) return null;
  window.scrollBy(0, $('timeline').getBoundingClientRect().top + slotY(grp.slot) - window.innerHeight / 2);
  const rect = $('timeline').getBoundingClientRect();
  return { x: rect.left + 20, y: rect.top + slotY(grp.slot) + ROW_H / 2 };
}

// Synthetic load for interactivity checks: n events over the view; returns
// the milliseconds one draw took.
export function loadSynthetic(n) {
  const st = new EventStore(n), span = S.view.to - S.view.from, k = world();
  for (let i = 0; i < n; i++) {
    const r = i % k, t = S.view.from + (Math.floor(i / k) / (n / k)) * span;
    st.push([1e12 + i, r, 0, i % 64, r, i % 3, t, t + span / (n / k) * 0.8, -1, 0]);
  }
  S.ev = st; S.gaps = []; S.bins = null; S.mode = 'events';
  const t = performance.now(); draw(); return performance.now() - t;
}

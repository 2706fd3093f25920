// critpath.js: the critical path, the chain of ops a step's end waited on
// (docs/schema.md has the walk). Over the timeline, the path of the step it
// shows (GET /critpath?step=N); under the what-if, its totals over the
// latest complete steps (GET /critpath), as `pprun stats` prints them.
import { S } from './state.js';
import { api } from './api.js';
import { $, fmtMs, headerRow } from './util.js';
import { probe } from './probe.js';
import { LABEL_W, xOf, blockY, blockMidY } from './geometry.js';

// ---- over the timeline -------------------------------------------------------

// The path of the step the timeline shows (GET /critpath?step=N), drawn
// over the measured rows: each op on it outlined, each hand-off from another
// rank (via "data") a line from the producer's end to the consumer's start.
// One answer per step is kept, so stepping back and forth asks nothing
// again. A step is asked for only once it is complete (a running step's
// path changes with each op), and through a throttle: following a fast
// job, the step in view changes faster than the page should send requests
// (timeline.js holds the throttle: it draws again when an answer comes).
const CRIT_KEEP = 64;             // answers kept per job; a long follow drops the oldest
export const CRIT_COLOR = '#111'; // the outline: dark on every phase colour
const CRIT_EDGE = '#d62728';      // the hand-offs: apart from the outlines and the row colours

let overlay = null; // the job open's: the answers by step, the step wanted, the path drawn (resetCritpath)

// A job opens: nothing asked yet; drawn or not as the toolbar's box says.
export function resetCritpath() {
  overlay = { on: $('critpath-on').checked, byStep: new Map(), want: null, shown: null };
}

// The toolbar's "critical path" box.
export function showCritpath(on) { if (overlay) overlay.on = on; }

// Asks for the step last wanted, unless it was asked for; true when its
// answer came while its job is still open: the timeline is to be drawn again.
export async function fetchCritpath() {
  const crit = overlay, job = S.job, step = crit && crit.want;
  if (step == null || crit.byStep.has(step)) return false;
  crit.byStep.set(step, { pending: true }); // asked once, whatever comes back
  probe.critFetches++;
  let r;
  try { r = await api(`/api/jobs/${job}/critpath?step=${step}`); } catch (e) { r = { error: e.message }; }
  if (overlay !== crit) return false; // another job opened meanwhile
  if (r.ops) r.byId = new Map(r.ops.map((o, i) => [o.id, i]));
  crit.byStep.delete(step); // re-inserted last: the Map's order is the age to drop by
  crit.byStep.set(step, r);
  for (const k of crit.byStep.keys()) { if (crit.byStep.size <= CRIT_KEEP) break; crit.byStep.delete(k); }
  return true;
}

// The step in view (anchor: viewAnchor() in timeline.js) when its path is
// to be drawn: a complete step, zoomed in to events, the overlay on; else null.
function critStep(anchor) {
  if (!overlay || !overlay.on || S.mode !== 'events' || !anchor) return null;
  const s = S.stepAt.get(anchor.step);
  return s && s.complete !== false && s.start != null ? anchor.step : null; // running: no path yet
}

// The hand-offs between ranks of a path: [producer, consumer] pairs of its
// ops, an output taken ('data') or another replica's backward that an OPT's
// all-reduce waited for ('dp').
function critEdges(path) {
  const out = [];
  for (let i = 1; i < path.ops.length; i++) {
    const via = path.ops[i].via;
    if (via === 'data' || via === 'dp') out.push([path.ops[i - 1], path.ops[i]]);
  }
  return out;
}

// Draws the path of the step in view over the measured rows. Returns true
// when that step is yet to be asked for (it is now overlay.want): the
// caller asks, fetchCritpath() through a throttle.
export function drawCritpath(g, w, h, n, anchor) {
  const step = critStep(anchor), got = step == null ? undefined : overlay.byStep.get(step);
  if (step != null && !got) overlay.want = step;
  const path = got && got.ops ? got : undefined; // else pending, no compute op (404) or an error
  const out = { on: !!(overlay && overlay.on), step: path ? path.step : null, ops: 0, outlined: 0, edges: 0, dataEdges: 0 };
  if (overlay) overlay.shown = path || null; // what the tooltips describe
  probe.critpath = out;
  if (!path) return step != null && !got;
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
    const xa = xOf(p.end, w), xb = xOf(o.start, w), ya = blockMidY(p.rank), yb = blockMidY(o.rank);
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
  return false;
}

// The tooltip's line for a block on the drawn path ('' off it).
export function critNote(id) {
  const path = overlay && overlay.shown, i = path ? path.byId.get(id) : undefined;
  if (i === undefined) return '';
  const o = path.ops[i], p = path.ops[i - 1];
  if (o.via === 'data') return `\non the critical path: waited ${fmtMs(o.lead_ns)} for rank ${p.rank}'s ${p.phase}`;
  if (o.via === 'dp') return `\non the critical path: waited ${fmtMs(o.lead_ns)} for the all-reduce after rank ${p.rank}'s ${p.phase}`;
  if (o.via === 'first') return "\non the critical path: the step's first op";
  return "\non the critical path: after the rank's previous op" + (o.lead_ns > 0 ? `, ${fmtMs(o.lead_ns)} later` +
    [[o.lead_comm_ns, 'sending or receiving'], [o.lead_allreduce_ns, 'in its all-reduce']]
      .filter(([ns]) => ns > 0).map(([ns, what]) => ` (${fmtMs(ns)} of it ${what})`).join('') : '');
}

// Hover on a hand-off line (within 4 px of it).
export function critEdgeHit(x, y, w) {
  const path = overlay && overlay.shown;
  if (!path) return null;
  for (const [p, o] of critEdges(path)) {
    const xa = xOf(p.end, w), xb = xOf(o.start, w), ya = blockMidY(p.rank), yb = blockMidY(o.rank);
    const dx = xb - xa, dy = yb - ya, len2 = dx * dx + dy * dy;
    const k = len2 ? Math.max(0, Math.min(1, ((x - xa) * dx + (y - ya) * dy) / len2)) : 0;
    if (Math.hypot(x - xa - k * dx, y - ya - k * dy) > 4) continue;
    return { text: `critical path · step ${path.step}: rank ${o.rank}'s ${o.phase} of microbatch ${o.microbatch}\n` +
      `waited ${fmtMs(o.lead_ns)} for rank ${p.rank}'s ${p.phase}` };
  }
  return null;
}

// Page coordinates of the middle of the k-th hand-off line drawn (null: none), for hovering in tests.
export function critEdgeCenter(k) {
  const path = overlay && overlay.shown, e = path ? critEdges(path)[k] : null;
  if (!e) return null;
  const c = $('timeline'), rect = c.getBoundingClientRect(), w = c.clientWidth;
  return { x: rect.left + (xOf(e[0].end, w) + xOf(e[1].start, w)) / 2, y: rect.top + (blockMidY(e[0].rank) + blockMidY(e[1].rank)) / 2 };
}

// ---- totals ----------------------------------------------------------------------

// The critical path over the latest complete steps (GET /critpath), as
// `pprun stats` prints it: per rank its F, B, W, BW (a column only for a
// job with BW on the path: PyTorch's full backward) and OPT on the path,
// the mean per step, and its share of the step; then where the rest of the
// step went; hidden until a step is complete.
export async function loadCritTotals(id) {
  let r;
  try { r = await api(`/api/jobs/${id}/critpath`); } catch (e) {
    $('critpath').hidden = false; $('critpath-table').innerHTML = ''; $('critpath-info').textContent = '— error: ' + e.message;
    return;
  }
  if (S.job !== id) return;
  showCritTotals(r);
}

function critRankNs(x) { return x.F + x.B + x.W + x.OPT + (x.BW || 0); }

function showCritTotals(r) {
  const box = $('critpath'), tbl = $('critpath-table');
  tbl.innerHTML = '';
  $('critpath-info').textContent = '';
  box.hidden = !r.steps;
  probe.critTable = null;
  if (!r.steps) return;
  const per = (ns) => fmtMs(ns / r.steps), share = (ns) => (r.span_ns > 0 ? (100 * ns / r.span_ns).toFixed(1) + '%' : '–');
  $('critpath-info').textContent = `— steps ${r.first_step}–${r.last_step}, ${fmtMs(r.span_ns / r.steps)} a step (mean)`;
  const bw = r.ranks.some((x) => x.BW > 0);
  headerRow(tbl, ['rank', 'F', 'B', 'W', ...(bw ? ['BW'] : []), 'OPT', 'all', 'share']);
  const body = tbl.createTBody(), rows = [];
  const add = (cls, cells, span) => { // span: the first cell runs over the op columns
    const tr = body.insertRow();
    if (cls) tr.className = cls;
    cells.forEach((v, k) => {
      const td = tr.insertCell();
      td.textContent = String(v);
      if (span && k === 0) td.colSpan = bw ? 6 : 5;
      else if (k > 0 || !span) td.className = 'num';
    });
    rows.push([cls, ...cells.map(String)]);
  };
  const shown = r.ranks.filter((x) => x.listed), most = Math.max(0, ...r.ranks.map(critRankNs));
  let listed = 0;
  for (const x of shown) {
    const all = critRankNs(x);
    listed += all;
    add(all === most ? 'most' : '', [x.rank, per(x.F), per(x.B), per(x.W), ...(bw ? [per(x.BW)] : []), per(x.OPT), per(all), share(all)]);
  }
  const ops = r.ranks.reduce((a, x) => a + critRankNs(x), 0);
  if (ops > listed) add('', ['the other ranks', per(ops - listed), share(ops - listed)], true);
  // the all-reduce's row where a job has one (--dp), so that the rows add up to the step
  for (const [what, ns] of [['hand-offs: an output crossing to another rank', r.handoff_ns],
    ['on a rank between its ops, sending or receiving', r.comm_ns], ['on a rank between its ops, the rest', r.other_ns],
    ...(r.allreduce_ns > 0 ? [["the all-reduce: before an OPT, its own or another replica's backward", r.allreduce_ns]] : [])])
    add('wait', [what, per(ns), share(ns)], true);
  probe.critTable = { steps: r.steps, first_step: r.first_step, last_step: r.last_step,
    info: $('critpath-info').textContent, rows };
}

// hover.js: what the pointer is on in the timeline, for its tooltip: an op
// (with what the critical path says of it), a send or receive mark, a
// hand-off line of the critical path, an idle gap, a bin of busy share, on
// a spans lane one of the program's named spans, or on a GPU lane a gpu
// span or a kernel.
import { S, world } from './state.js';
import { $, fmtMs, fmtBytes } from './util.js';
import { PHASES, CAUSES, SPAN, isBlock, isComm } from './phases.js';
import { ROW_H, AXIS_H, LABEL_W, GPU_H, SPAN_H, rowPitch, rowY, gpuY, spanY, tOf } from './geometry.js';
import { eventLanes } from './timeline.js';
import { critNote, critEdgeHit } from './critpath.js';
import { R } from './rows.js';
import { laneIdle } from './timeline.js';

// A group's summary lane: its ranks and the share of them idle there.
function laneHit(gi, x) {
  const grp = R.groups[gi], idle = laneIdle.idle[gi], v = idle ? idle[Math.floor(x - LABEL_W)] : NaN;
  return { text: `${grp.label} · ${grp.ranks.length} ranks (${grp.ranks.slice(0, 8).join(', ')}${grp.ranks.length > 8 ? ', …' : ''})` +
    (Number.isFinite(v) ? `\nidle here: ${(100 * v).toFixed(0)}% of its ranks` : '') + `\nclick its label to ${R.folded.has(grp.key) ? 'unfold' : 'fold'} it`, op: true };
}

// What the pointer is on: an op's block first, then a hand-off line of the
// critical path (it runs across rows and over the thin send/receive marks
// where it leaves), then a mark, a gap or a bin.
export function hitTest(x, y) {
  const w = $('timeline').clientWidth;
  if (x < LABEL_W) return null;
  const hit = rowHit(x, y, w);
  if (hit && hit.op) return hit;
  return critEdgeHit(x, y, w) || hit;
}

// On a rank's row or its GPU lane; op: on an op's block or a GPU lane, which
// comes before a hand-off line of the critical path.
function rowHit(x, y, w) {
  const n = world();
  const k = Math.floor((y - AXIS_H) / rowPitch()), row = R.rows.length ? R.rows[k] : { rank: k };
  if (!row) return null;
  if (row.group != null) return laneHit(row.group, x);
  const r = row.rank;
  if (r < 0 || r >= n) return null;
  const t = tOf(x, w), yin = y - rowY(r);
  const tol = (S.view.to - S.view.from) / (w - LABEL_W) * 2; // 2 px for thin marks
  if (S.gpuLane && y >= gpuY(r) && y < gpuY(r) + GPU_H) {
    const hit = gpuHit(r, t, y - gpuY(r), tol / 2);
    return hit && Object.assign(hit, { op: true });
  }
  if (S.spanLane && y >= spanY(r) && y < spanY(r) + SPAN_H) {
    const hit = spanHit(r, t, tol / 2);
    return hit && Object.assign(hit, { op: true });
  }
  if (yin > ROW_H) return null;
  const ev = S.ev, lanes = eventLanes(ev), lane = S.twoLanes && yin >= (ROW_H - 8) / 2 ? 1 : 0;
  let best = null;
  for (let i = 0; i < ev.n; i++) {
    if (ev.rank[i] !== r || ev.phase[i] === SPAN) continue;
    const ph = ev.phase[i], comm = isComm(ph);
    if (comm ? yin < ROW_H - 8 : yin > ROW_H - 8) continue;
    if (isBlock(ph) && lanes[i] !== lane) continue; // two lanes: the op on the half the pointer is on
    if (t >= ev.start[i] - (comm ? tol : 0) && t <= ev.end[i] + (comm ? tol : 0)) { best = i; if (!comm) break; }
  }
  if (best != null) {
    const i = best, ph = PHASES[ev.phase[i]];
    let text = `rank ${r} · ${opLabel(ev.phase[i], ev.mb[i], ev.stage[i], ev.step[i])}\n` +
      `start ${fmtMs(ev.start[i])} · duration ${fmtMs(ev.end[i] - ev.start[i])}`;
    if (ev.peer[i] >= 0) text += `\npeer rank ${ev.peer[i]}`;
    if (ph === 'BW') text += '\nfull backward: input and weight gradients in one op (PyTorch; DualPipeV)';
    if (ph === 'EVAL_F') text += `\nan evaluation's forward (after step ${ev.step[i]}: no backward)`;
    if (isBlock(ev.phase[i]) && S.actRecorded) text += `\nactivations held after it: ${fmtBytes(ev.bytes[i])}`;
    if (ph === 'OPT' && ev.bytes[i] > 0) text += `\nweights, gradients, optimizer state: ${fmtBytes(ev.bytes[i])}`;
    text += critNote(ev.id[i]);
    return { text, op: !isComm(ev.phase[i]) }; // a send/receive mark yields to a hand-off line
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
export function placeTooltip(tip, x, y) {
  const w = tip.offsetWidth, h = tip.offsetHeight, vw = document.documentElement.clientWidth, vh = window.innerHeight;
  let left = x + 14, top = y + 12;
  if (left + w > vw - 4) left = x - 14 - w;
  if (top + h > vh - 4) top = y - 12 - h;
  tip.style.left = Math.max(4, Math.min(left, vw - 4 - w)) + 'px';
  tip.style.top = Math.max(4, Math.min(top, vh - 4 - h)) + 'px';
}

// Hover on a spans lane: the innermost of the rank's spans at t (one
// within tol of it, a span too short to aim at, only when none holds t),
// with its name, step and what the program gave it (microbatch, stage,
// peer, bytes).
function spanHit(r, t, tol) {
  const ev = S.ev;
  let best = -1, bestExact = false;
  for (let i = 0; i < ev.n; i++) {
    if (ev.phase[i] !== SPAN || ev.rank[i] !== r || t < ev.start[i] - tol || t > ev.end[i] + tol) continue;
    const exact = t >= ev.start[i] && t <= ev.end[i];
    if (best < 0 || (exact && !bestExact) ||
        (exact === bestExact && ev.end[i] - ev.start[i] < ev.end[best] - ev.start[best])) { best = i; bestExact = exact; }
  }
  if (best < 0) return null;
  const i = best, name = ev.name[i] != null ? ev.name[i] : '(no name)';
  let text = `rank ${r} · span "${name}" · step ${ev.step[i]}\nstart ${fmtMs(ev.start[i])} · duration ${fmtMs(ev.end[i] - ev.start[i])}`;
  if (ev.mb[i] >= 0) text += ` · microbatch ${ev.mb[i]}`;
  if (ev.stage[i] >= 0) text += ` · stage ${ev.stage[i]}`;
  if (ev.peer[i] >= 0) text += `\npeer rank ${ev.peer[i]}`;
  if (ev.bytes[i] > 0) text += ` · ${fmtBytes(ev.bytes[i])}`;
  return { text };
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
        (span ? `\nin ${opLabel(span[5], span[3], span[4], span[2])}` : '\noutside any op (optimizer or set-up)') };
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
    let text = `rank ${r} · GPU · ${opLabel(x[5], x[3], x[4], x[2])}\nGPU ${fmtMs(x[7] - x[6])} (first kernel start to last end)`;
    if (host >= 0) text += ` · host ${fmtMs(ev.end[host] - ev.start[host])}\nGPU starts ${fmtMs(x[6] - ev.start[host])} after the host op`;
    return { text };
  }
  return null;
}

// An op as the tooltips name it: its phase, its microbatch and stage when it
// has them, its step.
function opLabel(phase, mb, stage, step) {
  return PHASES[phase] + (mb >= 0 ? ` · microbatch ${mb}` : '') + (stage >= 0 ? ` · stage ${stage}` : '') + ` · step ${step}`;
}

// geometry.js: where things are on the timeline's canvases: a row per rank
// (with a lane of the program's own spans under it when the job has them,
// and a GPU lane under that when it has gpu spans) under the time axis,
// and the view's time range across the width right of the row labels.
// Rows are slots of rows.js's layout: a rank's row, or a group's summary
// lane; a job of more than 64 ranks has compact rows (16 px rather than
// 40: 1,024 rows stay under the 32,767 px a canvas may be high), folded
// or not, so that folding moves no row's height.
import { S } from './state.js';
import { R } from './rows.js';

export let ROW_H = 34, ROW_GAP = 6;
export const AXIS_H = 22, LABEL_W = 64;
export const COMPACT_ABOVE = 64;
// Row heights for a job of n ranks (live bindings: every module sees the new ones).
export function fitRows(n) {
  const compact = n > COMPACT_ABOVE;
  ROW_H = compact ? 14 : 34; ROW_GAP = compact ? 2 : 6;
}
export const GPU_H = 12; // the GPU lane under a rank's row: spans on it, kernels on its lower half
export const SPAN_H = 14; // the spans lane under a rank's row: a program's named spans (pprun.span)

export function rowPitch() { return ROW_H + ROW_GAP + (S.spanLane ? SPAN_H + 2 : 0) + (S.gpuLane ? GPU_H + 2 : 0); }
// A rank's row; a folded rank's is far above the canvas, so that what is
// drawn for it there (a critical path's outline) is never seen.
export function rowY(rank) { const k = R.slot[rank]; return k == null ? AXIS_H + rank * rowPitch() : k < 0 ? -1e6 : slotY(k); }
export function slotY(k) { return AXIS_H + k * rowPitch(); }
export function rowCount() { return R.rows.length || (S.info ? S.info.job.world_size : 1); }
export function spanY(rank) { return rowY(rank) + ROW_H + 1; } // top of the rank's spans lane
export function gpuY(rank) { return rowY(rank) + ROW_H + 1 + (S.spanLane ? SPAN_H + 2 : 0); } // top of the rank's GPU lane
// A block's top and height on its rank's row (an OPT is thinner), and the
// middle of an F, B, W or BW: where its microbatch is written. With two
// lanes (S.twoLanes: ops of one rank ran at once, lanesOf) an op takes the
// upper or the lower half of the row, its lane's; without a lane given,
// the whole row (the critical path's outline, which knows no lanes).
export function blockY(rank, phase, lane) {
  if (phase === 'OPT') return [rowY(rank) + 4, ROW_H - 12];
  if (!S.twoLanes || lane == null) return [rowY(rank), ROW_H - 8];
  const h = (ROW_H - 8) / 2;
  return [rowY(rank) + lane * h, h - 0.5];
}
export function blockMidY(rank, lane) { const [y, h] = blockY(rank, 'F', lane); return y + h / 2; }

// Each op's lane on its rank's row: where two ops of a rank ran at once
// (an overlapped pair: DualPipeV's F and BW of two microbatches,
// docs/schedules.md) the F is on lane 0, the upper half, and the other on
// lane 1 (of two others, the later); every other op is on lane 0. The n
// rows come as get(i) -> [rank, phase, start, end]; isOp(phase) says
// which are ops (the others stay on 0), isF(phase) which are an F.
export function lanesOf(n, get, isOp, isF) {
  const idx = [], row = [];
  for (let i = 0; i < n; i++) { row.push(get(i)); if (isOp(row[i][1])) idx.push(i); }
  idx.sort((a, b) => row[a][0] - row[b][0] || row[a][2] - row[b][2]);
  const lane = new Int8Array(n);
  let prev = -1; // the op of the rank that ends last so far
  for (const i of idx) {
    if (prev < 0 || row[prev][0] !== row[i][0]) { prev = i; continue; }
    if (row[i][2] < row[prev][3]) lane[isF(row[i][1]) && !isF(row[prev][1]) ? prev : i] = 1; // ran at once
    if (row[i][3] > row[prev][3]) prev = i;
  }
  return lane;
}

// Time t's x on a canvas w wide, and back.
export function xOf(t, w) { return LABEL_W + (t - S.view.from) / (S.view.to - S.view.from) * (w - LABEL_W); }
export function tOf(x, w) { return S.view.from + (x - LABEL_W) / (w - LABEL_W) * (S.view.to - S.view.from); }

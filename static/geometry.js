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
// middle of an F, B, W or BW: where its microbatch is written.
export function blockY(rank, phase) { return phase === 'OPT' ? [rowY(rank) + 4, ROW_H - 12] : [rowY(rank), ROW_H - 8]; }
export function blockMidY(rank) { return rowY(rank) + (ROW_H - 8) / 2; }
// Time t's x on a canvas w wide, and back.
export function xOf(t, w) { return LABEL_W + (t - S.view.from) / (S.view.to - S.view.from) * (w - LABEL_W); }
export function tOf(x, w) { return S.view.from + (x - LABEL_W) / (w - LABEL_W) * (S.view.to - S.view.from); }

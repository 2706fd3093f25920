// phases.js: what the numbers in the API's event and gap rows stand for, and
// their colours on the timeline and in its legend: an event's phase (an
// index into PHASES) and an idle gap's cause (into CAUSES; docs/schema.md,
// `gaps`). BW is PyTorch's full backward (B and W in one op), SPAN a
// program's own named span (drawn on its rank's spans lane, coloured by
// its name), EVAL_F and its sends an evaluation's (--eval-every: forwards
// only, between training steps).

export const PHASES = ['F', 'B', 'W', 'SEND_F', 'RECV_F', 'SEND_B', 'RECV_B', 'OPT', 'BW', 'SPAN', 'EVAL_F',
  'EVAL_SEND_F', 'EVAL_RECV_F'];
export const PHASE_COLOR = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#b07aa1', '#76b7b2', '#9c755f',
  '#d37295', '#bab0ac', '#a0cbe8', '#b07aa1', '#76b7b2'];
export const BW = 8, SPAN = 9, EVAL_F = 10; // their indexes into PHASES
// A compute op drawn as a block on its rank's row (F, B, W, BW, EVAL_F), with its microbatch on it.
export function isBlock(ph) { return ph <= 2 || ph === BW || ph === EVAL_F; }
// A send or receive, drawn as a thin mark at the bottom of the row (an evaluation's too).
export function isComm(ph) { return (ph >= 3 && ph <= 6) || ph === 11 || ph === 12; }
// A span's colour: one of a few light colours, the same for the same name.
const SPAN_COLORS = ['#c6dbef', '#fdd0a2', '#c7e9c0', '#dadaeb', '#fcbba1', '#d9d9d9', '#fde0ef', '#ccebc5'];
export function spanColor(name) {
  let h = 0;
  for (const ch of String(name)) h = (h * 31 + ch.codePointAt(0)) >>> 0;
  return SPAN_COLORS[h % SPAN_COLORS.length];
}
export const CAUSES = ['warmup', 'cooldown', 'wait_activation', 'wait_gradient', 'wait_dp', 'wait_cpu', 'comm',
  'other'];
export const CAUSE_OTHER = CAUSES.length - 1;
export const CAUSE_COLOR = ['rgba(150,150,150,0.22)', 'rgba(150,150,150,0.22)', 'rgba(225,87,89,0.22)',
  'rgba(237,201,72,0.32)', 'rgba(89,161,79,0.3)', 'rgba(242,142,43,0.3)', 'rgba(176,122,161,0.4)',
  'rgba(64,160,200,0.2)'];
// The legend's entries for the causes: [label, index into CAUSES] (warm-up and cool-down share a colour).
export const CAUSE_LEGEND = [['warm-up/cool-down', 0], ['wait activation', 2], ['wait gradient', 3],
  ['wait all-reduce (--dp)', 4], ['wait for a core', 5], ['comm (sending/receiving)', 6], ['other idle', CAUSE_OTHER]];

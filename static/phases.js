// phases.js: what the numbers in the API's event and gap rows stand for, and
// their colours on the timeline and in its legend: an event's phase (an
// index into PHASES) and an idle gap's cause (into CAUSES; docs/schema.md,
// `gaps`).

export const PHASES = ['F', 'B', 'W', 'SEND_F', 'RECV_F', 'SEND_B', 'RECV_B', 'OPT'];
export const PHASE_COLOR = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#b07aa1', '#76b7b2', '#9c755f'];
export const CAUSES = ['warmup', 'cooldown', 'wait_activation', 'wait_gradient', 'comm', 'other'];
export const CAUSE_COLOR = ['rgba(150,150,150,0.22)', 'rgba(150,150,150,0.22)', 'rgba(225,87,89,0.22)',
  'rgba(237,201,72,0.32)', 'rgba(176,122,161,0.4)', 'rgba(64,160,200,0.2)'];
// The legend's entries for the causes: [label, index into CAUSES] (warm-up and cool-down share a colour).
export const CAUSE_LEGEND = [['warm-up/cool-down', 0], ['wait activation', 2], ['wait gradient', 3], ['comm (sending/receiving)', 4],
  ['other idle', 5]];

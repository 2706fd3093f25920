// toolbar.js: the text of the timeline's toolbar: the label of the step
// shown (or "following live", "custom window") and the legend of colours.
import { S } from './state.js';
import { $ } from './util.js';
import { PHASE_COLOR, CAUSES, CAUSE_COLOR, CAUSE_LEGEND, BW, EVAL_F, spanColor } from './phases.js';
import { CRIT_COLOR } from './critpath.js';

export function updateStepLabel() {
  const last = S.steps.length ? S.steps[S.steps.length - 1].step : null;
  $('step-label').textContent = S.step != null ? `step ${S.step}${last != null ? ' / ' + last : ''}` : (S.follow ? 'following live' : 'custom window');
}

// The phases, the idle causes, the critical path's outline and (shown for a
// job with gpu spans, or with spans of its own) the GPU and spans lanes.
export function fillLegend() {
  $('legend').innerHTML = [['F', 0], ['B', 1], ['W', 2], ['BW', BW, 'full backward (B and W in one op: PyTorch)'], ['SEND', 3], ['RECV', 4], ['OPT', 7],
    ['EVAL', EVAL_F, "an evaluation's forward (--eval-every: no backward)"]]
    .map(([p, i, title]) => `<span${title ? ` title="${title}"` : ''}><i style="background:${PHASE_COLOR[i]}"></i>${p}</span>`).join('') +
    CAUSE_LEGEND.map(([p, k]) => `<span data-cause="${CAUSES[k]}"><i style="background:${CAUSE_COLOR[k]}; border:1px solid #ccc"></i>${p}</span>`).join('') +
    `<span><i style="border:2px solid ${CRIT_COLOR}"></i>critical path</span>` +
    `<span id="legend-spans" hidden><i style="background:${spanColor('')}"></i>spans (the program's, lane under each rank)</span>` +
    `<span id="legend-gpu" hidden><i style="background:${PHASE_COLOR[0]}; opacity:0.45"></i>GPU (lane under each rank)</span>`;
}

// toolbar.js: the text of the timeline's toolbar: the label of the step
// shown (or "following live", "custom window") and the legend of colours.
import { S } from './state.js';
import { $ } from './util.js';
import { PHASE_COLOR, CAUSES, CAUSE_COLOR, CAUSE_LEGEND } from './phases.js';
import { CRIT_COLOR } from './critpath.js';

export function updateStepLabel() {
  const last = S.steps.length ? S.steps[S.steps.length - 1].step : null;
  $('step-label').textContent = S.step != null ? `step ${S.step}${last != null ? ' / ' + last : ''}` : (S.follow ? 'following live' : 'custom window');
}

// The phases, the idle causes, the critical path's outline and (shown for a
// job with gpu spans) the GPU lane.
export function fillLegend() {
  $('legend').innerHTML = ['F', 'B', 'W', 'SEND', 'RECV', 'OPT'].map((p, i) => `<span><i style="background:${[PHASE_COLOR[0], PHASE_COLOR[1], PHASE_COLOR[2], PHASE_COLOR[3], PHASE_COLOR[4], PHASE_COLOR[7]][i]}"></i>${p}</span>`).join('') +
    CAUSE_LEGEND.map(([p, k]) => `<span data-cause="${CAUSES[k]}"><i style="background:${CAUSE_COLOR[k]}; border:1px solid #ccc"></i>${p}</span>`).join('') +
    `<span><i style="border:2px solid ${CRIT_COLOR}"></i>critical path</span>` +
    `<span id="legend-gpu" hidden><i style="background:${PHASE_COLOR[0]}; opacity:0.45"></i>GPU (lane under each rank)</span>`;
}

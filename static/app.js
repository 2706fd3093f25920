// app.js: the pprun dashboard's entry point, loaded by index.html as a
// module: wires the page's controls to the modules that act on them, adds
// to window.__pprun what the tests call, and opens the first job. Plain
// JavaScript modules, no build step; docs/dashboard.md says which module
// does what.
import { S, mergeStep } from './state.js';
import { $ } from './util.js';
import { probe } from './probe.js';
import { scheduleDraw, sizeTimeline, blockCenter, gpuLaneAt, spanCenter, loadSynthetic, groupLabelCenter } from './timeline.js';
import { R, groupBy, revealRank, showReplica } from './rows.js';
import { setupHeatmap, setHeatmapPick, heatCellCenter } from './heatmap.js';
import { rowY, ROW_H } from './geometry.js';
import { showCritpath, critEdgeCenter } from './critpath.js';
import { drawCharts, lossOptions } from './charts.js';
import { fillLegend } from './toolbar.js';
import { followLatest, showStep, showCustomWindow, fetchWindow, stepBy, lastEnd, setupTimelineMouse } from './view.js';
import { setupSql } from './sql-tab.js';
import { showJobs } from './jobs-tab.js';
import { loadJobs, openJob } from './job.js';

function setupControls() {
  setupSql();
  setupTimelineMouse();
  $('step-prev').onclick = () => stepBy(-1);
  $('step-next').onclick = () => stepBy(1);
  $('step-all').onclick = () => showCustomWindow(0, Math.max(1, lastEnd()));
  $('follow').onchange = (e) => { S.follow = e.target.checked; if (S.follow) { followLatest(); fetchWindow(); } };
  $('row-group').onchange = (e) => { groupBy(e.target.value); scheduleDraw(); };
  $('replica').onchange = (e) => { showReplica(Number(e.target.value)); scheduleDraw(); };
  setupHeatmap();
  // A heatmap cell: its step on the timeline, the rank's row unfolded, highlighted and scrolled to.
  setHeatmapPick(async (rank, step) => {
    revealRank(rank);
    $('replica').value = String(R.replica); // every replica again when the rank's was filtered away
    S.highlight = rank;
    await showStep(step);
    sizeTimeline(); // its rows unfolded: the canvas grown before the scroll
    const c = $('timeline');
    window.scrollTo({ top: window.scrollY + c.getBoundingClientRect().top + rowY(rank) - 120 });
    probe.picked = { rank, step };
  });
  $('critpath-on').onchange = (e) => { showCritpath(e.target.checked); scheduleDraw(); };
  $('job-select').onchange = (e) => openJob(Number(e.target.value));
  window.addEventListener('resize', () => { scheduleDraw(); drawCharts(); });
  // Compact rows are drawn only where they are on screen (timeline.js): scrolling brings others.
  window.addEventListener('scroll', () => { if (ROW_H < 20) scheduleDraw(); }, { passive: true });
  $('loss-outliers').addEventListener('change', (e) => { lossOptions.outliers = e.target.checked; drawCharts(); });
  $('loss-log').addEventListener('change', (e) => { lossOptions.log = e.target.checked; drawCharts(); });
  document.querySelectorAll('.tab').forEach((b) => b.onclick = () => {
    document.querySelectorAll('.tab').forEach((x) => x.classList.toggle('active', x === b));
    document.querySelectorAll('.tab-page').forEach((p) => { p.hidden = p.id !== 'tab-' + b.dataset.tab; });
    if (b.dataset.tab === 'timeline') { scheduleDraw(); drawCharts(); }
    if (b.dataset.tab === 'jobs') showJobs().catch((e) => { $('jobs-info').textContent = 'error: ' + e.message; });
  });
  fillLegend();
}

// ---- test hook -------------------------------------------------------------------

Object.assign(probe, {
  state: S,
  showStep,
  showWindow: showCustomWindow,
  // A step as the live stream merges it, and the charts redrawn.
  mergeStep: (s) => { mergeStep(s); drawCharts(); },
  // Each alone, for tests/browser/charts-bench.mjs to time the redraw.
  bench: { mergeStep, drawCharts },
  blockCenter, critEdgeCenter, gpuLaneAt, spanCenter, loadSynthetic, groupLabelCenter, heatCellCenter,
  rows: () => ({ by: R.by, folded: [...R.folded], groups: R.groups.length, rows: R.rows.length, replica: R.replica,
    ranks: R.rows.filter((x) => x.rank != null).map((x) => x.rank) }),
});

(async function main() {
  setupControls();
  try {
    const jobs = await loadJobs();
    const want = Number(new URLSearchParams(location.search).get('job'));
    if (jobs.length) await openJob(want || jobs[0].id);
    else { $('job-meta').textContent = 'no jobs in this database yet'; probe.ready = true; }
  } catch (e) {
    $('job-meta').textContent = e.status === 401 ? 'this server needs a token: open the URL with #token=TOKEN' : 'error: ' + e.message;
    probe.error = e.message;
  }
  setInterval(() => loadJobs().catch(() => {}), 5000);
})();

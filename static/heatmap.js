// heatmap.js: the rank × step heatmap of bubble ratio (/api/jobs/{id}/heatmap,
// steps merged into columns when there are many): a cell per rank and
// column, coloured by how far its bubble ratio is from the median of its
// column. A slow rank is the one the others wait for: it idles least, far
// below the median, while its peers' bubbles rise together; a rank with too
// little work stands out above it. Either is the hottest cell: the one to
// look at (the note says which way it differs). With more ranks than the
// canvas has pixel rows, a pixel row holds several ranks and shows the
// hottest of them, so one slow rank of 1,024 stays visible. A click on a
// cell shows its step on the timeline and the rank's row (its group
// unfolded), highlighted.
import { S, world } from './state.js';
import { api } from './api.js';
import { $, sizeCanvas, fmtPct } from './util.js';
import { probe } from './probe.js';
import { LABEL_W } from './geometry.js';
import { placeTooltip } from './hover.js';

const MAX_H = 512; // css px: a rank a pixel row up to 512 ranks, then several
let H = null;      // the answer, with heat[rank][col] and the hottest cell
let onPick = null; // (rank, step): what a click on a cell does (app.js)

export function setHeatmapPick(fn) { onPick = fn; }

export function resetHeatmap() { H = null; probe.heatmap = null; draw(); }

export async function loadHeatmap(id) {
  const w = $('heatmap').clientWidth || 1000;
  let h;
  try { h = await api(`/api/jobs/${id}/heatmap?buckets=${Math.max(10, Math.min(1000, Math.floor(w - LABEL_W)))}`); } catch (e) { return; }
  if (S.job !== id) return;
  H = h;
  score(H);
  draw();
}

function median(xs) {
  const a = xs.filter((x) => x != null).sort((p, q) => p - q);
  const h = a.length >> 1; // of an even count the middle two's mean, as every median pprun reports
  return !a.length ? null : a.length % 2 ? a[h] : (a[h - 1] + a[h]) / 2;
}

// heat = |ratio - column median| / the largest such distance (0..1).
function score(h) {
  const cols = h.steps.length;
  h.med = [];
  for (let c = 0; c < cols; c++) h.med.push(median(h.ratio.map((row) => row[c])));
  let most = 0;
  h.hottest = null;
  h.heat = h.ratio.map((row, r) => row.map((v, c) => {
    if (v == null || h.med[c] == null) return null;
    const d = Math.abs(v - h.med[c]);
    if (d > most) { most = d; h.hottest = { rank: r, col: c, step: h.steps[c], ratio: v, median: h.med[c] }; }
    return d;
  }));
  for (const row of h.heat) for (let c = 0; c < cols; c++) if (row[c] != null) row[c] = most > 0 ? row[c] / most : 0;
}

function color(x) { // white to dark red
  const t = Math.max(0, Math.min(1, x));
  return `rgb(${Math.round(255 - 75 * t)},${Math.round(250 - 230 * t)},${Math.round(245 - 215 * t)})`;
}

function layout() {
  const n = world(), rowsPx = Math.min(MAX_H, Math.max(60, n * Math.max(1, Math.min(10, Math.floor(MAX_H / n)))));
  return { n, rowsPx };
}

function draw() {
  const c = $('heatmap');
  if (!c) return;
  const { n, rowsPx } = layout();
  const { g, w } = sizeCanvas(c, rowsPx + 4);
  g.clearRect(0, 0, w, rowsPx + 4);
  const note = $('heatmap-note');
  probe.heatmap = null;
  if (!H || !H.steps.length) { note.textContent = H ? 'no step statistics yet' : ''; return; }
  const cols = H.steps.length, cw = (w - LABEL_W) / cols;
  // A band per rank while ranks fit; else per pixel row, the hottest of its ranks.
  const bands = Math.min(n, rowsPx);
  for (let b = 0; b < bands; b++) {
    const r0 = Math.floor(b * n / bands), r1 = Math.floor((b + 1) * n / bands);
    const y0 = b * rowsPx / bands, y1 = (b + 1) * rowsPx / bands;
    for (let col = 0; col < cols; col++) {
      let v = null;
      for (let r = r0; r < r1; r++) { const x = H.heat[r][col]; if (x != null && (v == null || x > v)) v = x; }
      g.fillStyle = v == null ? '#e8e8e8' : color(v);
      g.fillRect(LABEL_W + col * cw, y0, Math.ceil(cw), Math.max(1, y1 - y0));
    }
  }
  g.fillStyle = '#444'; g.font = '11px system-ui, sans-serif'; g.textBaseline = 'top';
  g.fillText('rank 0', 4, 0);
  g.textBaseline = 'bottom'; g.fillText('rank ' + (n - 1), 4, rowsPx);
  const hot = H.hottest;
  if (hot) { // ringed: at 1,024 ranks its band is one pixel high
    const y = Math.floor(hot.rank * Math.min(n, rowsPx) / n) * rowsPx / Math.min(n, rowsPx);
    g.strokeStyle = '#000'; g.lineWidth = 1.5;
    g.strokeRect(LABEL_W + hot.col * cw - 3, y - 3, Math.max(cw, 1) + 6, Math.max(1, rowsPx / n) + 6);
  }
  note.textContent = `steps ${H.first_step}–${H.last_step}` + (H.step_width > 1 ? `, ${H.step_width} a column` : '') +
    (hot ? ` · stands out most: rank ${hot.rank}, step${H.step_width > 1 ? 's ' + hot.step + '–' + Math.min(H.last_step, hot.step + H.step_width - 1) : ' ' + hot.step}: ` +
      `bubble ${fmtPct(hot.ratio)} against a median of ${fmtPct(hot.median)} (${hot.ratio < hot.median ? 'it idles least: the others wait for it' : 'it idles most'})` : '');
  probe.heatmap = { cols, rows: n, stepWidth: H.step_width, hottest: hot && { rank: hot.rank, step: hot.step, ratio: hot.ratio, median: hot.median } };
}

// The rank and column under a point of the canvas.
function cellAt(x, y) {
  if (!H || !H.steps.length || x < LABEL_W) return null;
  const { n, rowsPx } = layout(), c = $('heatmap'), cols = H.steps.length;
  const col = Math.floor((x - LABEL_W) / ((c.clientWidth - LABEL_W) / cols)), r0 = Math.floor(y / (rowsPx / n));
  if (col < 0 || col >= cols || r0 < 0 || r0 >= n) return null;
  // Several ranks to a pixel row: the hottest of them, as drawn.
  const bands = Math.min(n, rowsPx), b = Math.floor(y / (rowsPx / bands));
  let rank = r0, best = -1;
  for (let r = Math.floor(b * n / bands); r < Math.floor((b + 1) * n / bands); r++) {
    const v = H.heat[r][col];
    if (v != null && v > best) { best = v; rank = r; }
  }
  return { rank, col, step: H.steps[col] };
}

export function setupHeatmap() {
  const c = $('heatmap'), tip = $('tooltip');
  c.addEventListener('click', (e) => {
    const rect = c.getBoundingClientRect(), cell = cellAt(e.clientX - rect.left, e.clientY - rect.top);
    if (cell && onPick) onPick(cell.rank, cell.step);
  });
  c.addEventListener('mousemove', (e) => {
    const rect = c.getBoundingClientRect(), cell = cellAt(e.clientX - rect.left, e.clientY - rect.top);
    if (!cell) { tip.hidden = true; return; }
    const v = H.ratio[cell.rank][cell.col];
    tip.textContent = `rank ${cell.rank} · step ${cell.step}${H.step_width > 1 ? '–' + Math.min(H.last_step, cell.step + H.step_width - 1) : ''}\n` +
      `bubble ${fmtPct(v)} · median of the ranks ${fmtPct(H.med[cell.col])}\nclick: show it on the timeline`;
    tip.hidden = false;
    placeTooltip(tip, e.clientX, e.clientY);
  });
  c.addEventListener('mouseleave', () => { tip.hidden = true; });
}

// Window coordinates of a rank's cell in the column holding step,
// scrolled into view, for tests.
export function heatCellCenter(rank, step) {
  if (!H) return null;
  const c = $('heatmap');
  window.scrollBy(0, c.getBoundingClientRect().top - 50);
  const { n, rowsPx } = layout(), rect = c.getBoundingClientRect(), cols = H.steps.length;
  const col = Math.min(cols - 1, Math.floor((step - H.first_step) / H.step_width)), cw = (c.clientWidth - LABEL_W) / cols;
  const x = Math.round(rect.left + LABEL_W + (col + 0.5) * cw), y = Math.round(rect.top + (rank + 0.5) * rowsPx / n);
  // A pointer is at whole pixels and a band of ranks may be one pixel high:
  // the nearest whole pixel that is this rank's cell.
  for (const dy of [0, -1, 1, -2, 2]) {
    const cell = cellAt(x - rect.left, y + dy - rect.top);
    if (cell && cell.rank === rank) return { x, y: y + dy };
  }
  return { x, y };
}

// linechart.js: a line chart on a canvas for series of any length: each
// series (Series) keeps its points in typed arrays with a segment tree over
// them, so a job of 100,000 steps thins to its pixel columns, and redraws,
// in about the time of a job of 1,000.
import { sizeCanvas } from './util.js';

// The pixel column (0 .. columns-1) that x falls in.
function columnOf(x, x0, x1, columns) {
  return Math.min(columns - 1, Math.floor((x - x0) / (x1 - x0) * columns));
}

// A chart series: [x, y] points in x order, appended as steps arrive, with a
// segment tree over them that gives the lowest and the highest point (the
// first of equals) and the sums of any run of points in O(log n). Thinning a
// job to its pixel columns then costs about the same at 100,000 steps as at
// 1,000; it was a pass over every step at every redraw, four times a second
// while following a job (125 ms at 100,000 steps).
export function Series() { this.n = 0; this.grow(1024); }
Series.prototype.grow = function (cap) {
  const n = this.n, x = this.x, y = this.y;
  this.cap = cap; this.x = new Float64Array(cap); this.y = new Float64Array(cap);
  this.lo = new Int32Array(2 * cap).fill(-1); this.hi = new Int32Array(2 * cap).fill(-1);
  this.sx = new Float64Array(2 * cap); this.sy = new Float64Array(2 * cap);
  this.n = 0;
  for (let i = 0; i < n; i++) this.push(x[i], y[i]);
};
// Of two point indices (-1: none), the one with the lower (higher) y; the first of equals.
Series.prototype.lower = function (a, b) {
  return a < 0 ? b : b < 0 ? a : this.y[b] < this.y[a] || (this.y[b] === this.y[a] && b < a) ? b : a;
};
Series.prototype.higher = function (a, b) {
  return a < 0 ? b : b < 0 ? a : this.y[b] > this.y[a] || (this.y[b] === this.y[a] && b < a) ? b : a;
};
Series.prototype.push = function (x, y) {
  if (this.n === this.cap) this.grow(2 * this.cap);
  const i = this.n++;
  this.x[i] = x; this.y[i] = y;
  let k = this.cap + i;
  this.lo[k] = this.hi[k] = i; this.sx[k] = x; this.sy[k] = y;
  // Nodes over points past n (dropped by cut, not yet pushed again) are never
  // read whole: range() asks only for runs below n.
  for (k >>= 1; k >= 1; k >>= 1) {
    const a = 2 * k, b = a + 1;
    this.lo[k] = this.lower(this.lo[a], this.lo[b]); this.hi[k] = this.higher(this.hi[a], this.hi[b]);
    this.sx[k] = this.sx[a] + this.sx[b]; this.sy[k] = this.sy[a] + this.sy[b];
  }
};
// Drops the points from x = at on (a step that changed, and those after it).
Series.prototype.cut = function (at) {
  let lo = 0, hi = this.n;
  while (lo < hi) { const m = (lo + hi) >> 1; if (this.x[m] < at) lo = m + 1; else hi = m; }
  this.n = lo;
};
// Points i .. j-1: this.qlo and this.qhi, the indices of the lowest and the
// highest, and this.qsx, this.qsy, the sums of their x and y.
Series.prototype.range = function (i, j) {
  let lo = -1, hi = -1, sx = 0, sy = 0;
  for (let l = i + this.cap, r = j + this.cap; l < r; l >>= 1, r >>= 1) {
    if (l & 1) { lo = this.lower(lo, this.lo[l]); hi = this.higher(hi, this.hi[l]); sx += this.sx[l]; sy += this.sy[l]; l++; }
    if (r & 1) { r--; lo = this.lower(lo, this.lo[r]); hi = this.higher(hi, this.hi[r]); sx += this.sx[r]; sy += this.sy[r]; }
  }
  this.qlo = lo; this.qhi = hi; this.qsx = sx; this.qsy = sy;
};

// What a series draws: each point while there are at most two per pixel
// column, else the lowest and the highest point of each column in x order
// (a long job draws in bounded time and its spikes stay visible) and, with
// trend, the mean of each column, which step-to-step noise would bury.
function thinSeries(s, x0, x1, columns, trend) {
  const pts = [], means = [];
  if (s.n <= 2 * columns) {
    for (let i = 0; i < s.n; i++) pts.push([s.x[i], s.y[i]]);
    return { pts, means, thinned: false };
  }
  // x are steps, whole and distinct: a column holds at most this many.
  const most = Math.ceil((x1 - x0) / columns) + 1;
  for (let i = 0; i < s.n;) {
    const c = columnOf(s.x[i], x0, x1, columns);
    let j = i + 1, k = Math.min(s.n, i + most + 1); // j: the first point past column c
    while (j < k) { const m = (j + k) >> 1; if (columnOf(s.x[m], x0, x1, columns) > c) k = m; else j = m + 1; }
    s.range(i, j);
    const a = Math.min(s.qlo, s.qhi), b = Math.max(s.qlo, s.qhi);
    pts.push([s.x[a], s.y[a]]);
    if (b !== a) pts.push([s.x[b], s.y[b]]);
    if (trend) means.push([s.qsx / (j - i), s.qsy / (j - i)]);
    i = j;
  }
  return { pts, means, thinned: true };
}

// Ignoring outliers in the y range (TensorBoard's default): a value further
// from the 5th..95th percentile of the values drawn than 1.5 times that
// spread is off the scale, and the others set the range, with 8% more room
// on a side that lost a value, for the marks of the points off it. No
// outliers: the lowest to the highest value, as without. Fewer than 10
// values tell no bulk from outliers. vals are sorted here.
function bulkRange(vals) {
  vals.sort((a, b) => a - b);
  const n = vals.length;
  let i = 0, j = n - 1;
  if (n >= 10) {
    const qlo = vals[Math.ceil(0.05 * (n - 1))], qhi = vals[Math.floor(0.95 * (n - 1))], d = 1.5 * (qhi - qlo);
    while (vals[i] < qlo - d) i++;
    while (vals[j] > qhi + d) j--;
  }
  let lo = vals[i], hi = vals[j];
  const room = 0.08 * (hi - lo || Math.abs(hi) || 1);
  if (i > 0) lo -= room;
  if (j < n - 1) hi += room;
  return [lo, hi];
}

export const CHART_H = 170; // a chart's height in CSS pixels

// Draws series ({ s: a Series, color, width, dots }) on canvas. opts: y0 (the
// bottom of the y axis), ymax (the top at least), fmt (tick labels), robust
// (ignore outliers in the y range), log (a log10 y axis; every y > 0),
// lines (horizontal lines at a value, { y, color, label }, dashed across the
// chart with the label above them at the right: the y axis always holds
// them, whatever the series span, with room for the label).
// Returns, for the series with dots, the points drawn (a dot each while
// there is room, else the thinned line) and its trend: when it had to be
// thinned, the faded band of its lowest and highest points gets the mean of
// each pixel column drawn over it (else the trend is empty); the y axis
// (scale: lo, hi and log), and the points drawn off it (clipped: x and the
// true y, above or below, where their mark is, in CSS pixels, and the index
// in `series` of theirs), and the lines drawn (y, label and py, where in CSS
// pixels).
export function lineChart(canvas, series, opts) {
  const { g, w, h } = sizeCanvas(canvas, CHART_H);
  g.clearRect(0, 0, w, h);
  const pad = { l: 46, r: 8, t: 8, b: 20 };
  let x0 = Infinity, x1 = -Infinity;
  for (const { s } of series) if (s.n) { x0 = Math.min(x0, s.x[0]); x1 = Math.max(x1, s.x[s.n - 1]); }
  if (x0 === Infinity) {
    g.fillStyle = '#888'; g.fillText('no data yet', pad.l, 30);
    return { drawn: [], trend: [], scale: null, clipped: [], lines: [] };
  }
  if (x1 === x0) x1 = x0 + 1;
  const columns = Math.max(1, Math.round(w - pad.l - pad.r));
  const thin = series.map((d) => thinSeries(d.s, x0, x1, columns, d.dots));
  // The lowest and highest points of each column are the series' extremes too.
  const T = opts.log ? Math.log10 : (y) => y;
  let y0, y1;
  if (opts.robust) [y0, y1] = bulkRange(thin.flatMap((t) => t.pts.map((p) => T(p[1]))));
  else {
    y0 = Infinity; y1 = -Infinity;
    for (const { s } of series) if (s.n) { s.range(0, s.n); y0 = Math.min(y0, T(s.y[s.qlo])); y1 = Math.max(y1, T(s.y[s.qhi])); }
  }
  if (opts.y0 != null) y0 = opts.y0;
  if (opts.ymax != null) y1 = Math.max(y1, opts.ymax);
  // A line is in range, never off the top (where a bound above every point
  // would go unseen) nor on it (where its label would be cut off).
  const lines = opts.lines || [];
  for (const l of lines) {
    const t = T(l.y);
    if (opts.y0 == null) y0 = Math.min(y0, t);
    if (t > y0 && t > y1 - 0.08 * (y1 - y0)) y1 = y0 + (t - y0) / 0.92;
  }
  if (y1 === y0) y1 = y0 + 1;
  const X = (x) => pad.l + (x - x0) / (x1 - x0) * (w - pad.l - pad.r);
  const Y = (y) => h - pad.b - (T(y) - y0) / (y1 - y0) * (h - pad.t - pad.b);
  g.strokeStyle = '#eee'; g.fillStyle = '#888'; g.font = '10px system-ui, sans-serif'; g.textBaseline = 'middle';
  for (let k = 0; k <= 4; k++) {
    const t = y0 + (y1 - y0) * k / 4, y = opts.log ? 10 ** t : t, py = h - pad.b - k / 4 * (h - pad.t - pad.b);
    g.beginPath(); g.moveTo(pad.l, py); g.lineTo(w - pad.r, py); g.stroke();
    g.fillText(opts.fmt ? opts.fmt(y) : Math.abs(y) < 1e-3 && y !== 0 ? y.toExponential(1) : y.toPrecision(3), 2, py);
  }
  g.textBaseline = 'top';
  g.fillText('step ' + x0, pad.l, h - pad.b + 4);
  g.textAlign = 'right';
  g.fillText(String(x1), w - pad.r, h - pad.b + 4);
  g.textAlign = 'left';
  let drawn = [], trend = [];
  const clipped = [];
  const stroke = (pts) => {
    g.beginPath();
    pts.forEach((p, i) => (i ? g.lineTo(X(p[0]), Y(p[1])) : g.moveTo(X(p[0]), Y(p[1]))));
    g.stroke();
  };
  // Lines to a point off the scale leave through its edge (a few pixels of
  // slack: a line or dot on the edge is drawn whole).
  g.save();
  g.beginPath(); g.rect(0, pad.t - 3, w, h - pad.t - pad.b + 6); g.clip();
  series.forEach((s, k) => {
    const { pts, means, thinned } = thin[k];
    g.strokeStyle = s.color; g.lineWidth = s.width || 1.5;
    g.globalAlpha = s.dots && thinned ? 0.3 : 1;
    stroke(pts);
    g.globalAlpha = 1;
    for (const p of pts) {
      const t = T(p[1]);
      if (t <= y1 && t >= y0) continue;
      clipped.push({ x: p[0], y: p[1], above: t > y1, px: X(p[0]), py: t > y1 ? pad.t : h - pad.b, color: s.color, k });
    }
    if (!s.dots) return;
    drawn = pts;
    if (thinned) {
      trend = means;
      stroke(trend);
    } else if (pts.length <= columns / 6) { // else dots would merge into a band
      g.fillStyle = s.color;
      for (const p of pts) { g.beginPath(); g.arc(X(p[0]), Y(p[1]), 2.5, 0, 7); g.fill(); }
    }
  });
  g.restore();
  // Lines over the series, dashed so that a series under one shows through;
  // 2 pixels wide on whole pixel rows, so that its colour is its own, not
  // blended into the white.
  g.font = '10px system-ui, sans-serif'; g.textBaseline = 'bottom'; g.textAlign = 'right';
  const linesDrawn = lines.map((l) => {
    const py = Math.round(Y(l.y));
    g.strokeStyle = g.fillStyle = l.color; g.lineWidth = 2; g.setLineDash([6, 4]);
    g.beginPath(); g.moveTo(pad.l, py); g.lineTo(w - pad.r, py); g.stroke();
    g.setLineDash([]);
    if (l.label) g.fillText(l.label, w - pad.r - 2, py - 2);
    return { y: l.y, label: l.label || '', py };
  });
  g.textAlign = 'left'; g.textBaseline = 'alphabetic';
  // A point off the scale: a triangle on the edge it is beyond, pointing at it.
  for (const c of clipped) {
    const d = c.above ? -1 : 1;
    g.fillStyle = c.color;
    g.beginPath(); g.moveTo(c.px, c.py + 2 * d); g.lineTo(c.px - 4, c.py - 6 * d); g.lineTo(c.px + 4, c.py - 6 * d); g.fill();
  }
  g.lineWidth = 1;
  return { drawn, trend, scale: { lo: opts.log ? 10 ** y0 : y0, hi: opts.log ? 10 ** y1 : y1, log: !!opts.log },
    clipped: clipped.map(({ x, y, above, px, py, k }) => ({ x, y, above, px, py, series: k })), lines: linesDrawn };
}

// util.js: the small helpers every part of the dashboard uses: an element by
// id, times, sizes and shares written as `pprun stats` writes them, a
// table's header row, a canvas sized for the screen, and a throttle for what
// a live job would do too often.

export const $ = (id) => document.getElementById(id);
export const fmtMs = (ns) => (ns / 1e6).toFixed(ns < 1e7 ? 3 : ns < 1e9 ? 2 : 0) + ' ms';
// As `pprun stats` writes them: "768 KiB", "1.5 MiB".
export const fmtBytes = (b) => {
  let k = 0;
  for (; b >= 1024 && k < 4; k++) b /= 1024;
  return (k === 0 || b >= 100 || Math.round(b * 10) % 10 === 0 ? b.toFixed(0) : b.toFixed(1)) + ' ' + ['B', 'KiB', 'MiB', 'GiB', 'TiB'][k];
};
// A share as a percentage, "–" when there is none.
export const fmtPct = (x) => (x == null ? '–' : (100 * x).toFixed(1) + '%');

// A table's header row: a th per name.
export function headerRow(tbl, names) {
  const head = tbl.createTHead().insertRow();
  for (const h of names) { const th = document.createElement('th'); th.textContent = h; head.appendChild(th); }
}

// The canvas cssH pixels high and as wide as its box, at the screen's pixel
// density; its context drawn on in CSS pixels.
export function sizeCanvas(c, cssH) {
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth;
  c.style.height = cssH + 'px';
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(cssH * dpr)) {
    c.width = Math.round(w * dpr); c.height = Math.round(cssH * dpr);
  }
  const g = c.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { g, w, h: cssH };
}

// Runs fn at most once every ms, and always after the last call: a fast job
// completes steps far more often than a page should redraw its charts or
// ask the server for its window (at 3 ms a step, one request per step was
// 75 a second).
export function throttled(fn, ms, slow = 0) {
  // A call while the promise fn returns is pending runs it once more after
  // (never two at once: a large job's heatmap or critical path takes
  // seconds), ms from the end of the one before, or `slow` times as long as
  // that one took where that is longer: a request of seconds is then asked
  // for at most 1 / (1 + slow) of the time (the live heatmap of a 1,024-rank
  // job: every rank's every step, read while the job runs on that machine).
  // An fn that returns no promise is done when it returns.
  let last = 0, gap = ms, timer = null, running = false, again = false;
  const run = async () => {
    timer = null; running = true;
    const t0 = Date.now();
    try { await fn(); } finally {
      running = false; last = Date.now(); gap = Math.max(ms, slow * (last - t0));
      if (again) { again = false; call(); }
    }
  };
  const call = () => {
    if (running) { again = true; return; }
    if (!timer) timer = setTimeout(run, Math.max(0, last + gap - Date.now()));
  };
  return call;
}
export const LIVE_REDRAW_MS = 250; // following a job: redraws and window requests at most this often

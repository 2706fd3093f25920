// state.js: what the page knows of the job open, shared by the modules that
// fetch it, draw it and follow it live: the job and its steps, the
// timeline's view, and the window of events fetched for that view. Times
// are ns since the job's start. What only one module needs, that module
// keeps (the charts' series, the critical path's answers, the what-if,
// the jobs ticked to compare, the SQL tab's example).

export const S = {
  jobs: [], // the database's jobs, newest first (/api/jobs)
  job: null, info: null, plan: null, // the job open: its id, /api/jobs/{id}, /api/jobs/{id}/plan
  steps: [], stepAt: new Map(), // steps sorted by number, and by number
  stepsDirty: 0, // the first index into steps that the charts have not read since it changed (charts.js)
  view: { from: 0, to: 1 }, follow: false, step: null, // the time range shown, following live, the step shown (null: none)
  highlight: null, // the rank a heatmap cell jumped to (its row highlighted)
  // The window fetched for the view (/api/jobs/{id}/events): its events (an
  // EventStore) and idle gaps, or, zoomed out, bins; mode: the server's
  // ('events', 'buckets' or 'steps').
  ev: null, gaps: null, bins: null, mode: 'events',
  gpuLane: false, gpu: [], kernels: null, // gpu: rows [id,rank,step,mb,stage,phase,start,end]; kernels: [rank,start,end,stream,event_id,name]
  twoLanes: false, // ops of one rank ran at once (DualPipeV's pairs): each op on the upper or lower half of its row (lanesOf)
  spanLane: false, // a lane under each rank for the program's own spans: once the page has seen one of the job's
  actRecorded: false, // the steps record the activations held (charts.js): a W's 0 B is then worth saying
  actRankPeak: [], // the most each rank held in any step so far (the --max-mem bound's unit: charts.js)
  liveRanks: null, // past RANKS_DRAWN ranks, the newest live step's { step, ratios } before they were dropped (charts.js)
};

// The most ranks the step charts draw one by one (a line and a bar each).
// Past it they draw the least, the mean and the most of the ranks, and the
// steps keep no per-rank arrays: 5,000 steps of 1,024 ranks were 148 MB
// (docs/dashboard.md, "At scale").
export const RANKS_DRAWN = 16;

export const KERNEL_SPANS = 400;   // kernels are fetched when at most this many gpu spans are in the window
export const KERNEL_LIMIT = 20000; // at most this many kernels per window (the server allows 25000)

// A growable column store for events: parallel typed arrays.
export function EventStore(cap) {
  this.n = 0; this.cap = 0; this.grow(cap || 1024); this.ids = new Set();
}
EventStore.prototype.grow = function (cap) {
  const old = this;
  const make = (T, a) => { const x = new T(cap); if (a) x.set(a.subarray(0, old.n)); return x; };
  this.id = make(Float64Array, this.id); this.start = make(Float64Array, this.start); this.end = make(Float64Array, this.end);
  this.rank = make(Int32Array, this.rank); this.phase = make(Int8Array, this.phase);
  this.mb = make(Int32Array, this.mb); this.stage = make(Int32Array, this.stage);
  this.step = make(Int32Array, this.step); this.peer = make(Int32Array, this.peer);
  this.bytes = make(Float64Array, this.bytes); // F/B/W/BW: activations the rank held after the op
  this.name = this.name || []; // a SPAN's name (a plain array: most rows have none)
  this.cap = cap;
};
EventStore.prototype.push = function (row) { // [id,rank,step,mb,stage,phase,start,end,peer,bytes,name]
  if (this.ids.has(row[0])) return;
  this.ids.add(row[0]);
  if (this.n === this.cap) this.grow(this.cap * 2);
  const i = this.n++;
  this.id[i] = row[0]; this.rank[i] = row[1]; this.step[i] = row[2]; this.mb[i] = row[3]; this.stage[i] = row[4];
  this.phase[i] = row[5]; this.start[i] = row[6]; this.end[i] = row[7]; this.peer[i] = row[8]; this.bytes[i] = row[9];
  if (row[10] != null) this.name[i] = row[10];
};
EventStore.prototype.row = function (i) {
  return [this.id[i], this.rank[i], this.step[i], this.mb[i], this.stage[i], this.phase[i], this.start[i], this.end[i], this.peer[i], this.bytes[i],
    this.name[i] != null ? this.name[i] : null];
};

// A job that ended before its last step: its last steps were cut short
// (events, no statistics: docs/schema.md, "When the analyses run").
export function cutShort(job) { return ['failed', 'stopped', 'lost'].includes(job.status); }

// The ranks of the job open.
export function world() { return S.info ? S.info.job.world_size : 1; }

// Steps arrive in order, some twice (history and live): an index by number
// and an append make each new step's merge O(1), so a job of 100,000 steps
// opens in a moment (one out of order is inserted where it belongs, one
// seen again is found by bisection).
export function mergeStep(s) {
  const a = S.steps, old = S.stepAt.get(s.step);
  if (s.act_peak_bytes) foldRankPeaks(s.act_peak_bytes);
  if (world() > RANKS_DRAWN) {
    if (s.bubble_ratio && s.complete) S.liveRanks = { step: s.step, ratios: s.bubble_ratio };
    dropRanks(s);
  }
  let lo = a.length;
  if (lo && a[lo - 1].step >= s.step) {
    lo = 0;
    for (let hi = a.length; lo < hi;) { const m = (lo + hi) >> 1; if (a[m].step < s.step) lo = m + 1; else hi = m; }
  }
  S.stepsDirty = Math.min(S.stepsDirty, lo); // the charts take their points again from here (syncCharts)
  if (old) { Object.assign(old, s); return; }
  S.stepAt.set(s.step, s);
  a.splice(lo, 0, s);
}

// A step's or a page's most held bytes per rank (null: none) into
// S.actRankPeak.
export function foldRankPeaks(a) {
  for (let r = 0; r < a.length; r++) if (a[r] != null && !(S.actRankPeak[r] >= a[r])) S.actRankPeak[r] = a[r];
}

// A step without its per-rank arrays (a job of more than RANKS_DRAWN ranks).
export function dropRanks(s) { delete s.bubble_ratio; delete s.act_peak_bytes; }

// The newest step for which pred holds.
export function lastStep(pred) {
  for (let i = S.steps.length - 1; i >= 0; i--) if (pred(S.steps[i])) return S.steps[i];
  return null;
}

// probe.js: window.__pprun, what the page fetched and drew, for the browser
// tests (tests/browser/dashboard.mjs, checked by tests/test_browser.c) and
// tests/browser/charts-bench.mjs. Each module writes its own entries here;
// app.js adds the state and the functions the tests call.

export const probe = window.__pprun = {
  ready: false, drawn: null, lossPoints: [], evalLossPoints: 0, actPoints: [], planDrawn: 0, planLane2: 0, planLoads: [], liveEvents: 0, windowFetches: 0, lastWindow: null, sqlRows: 0, lastKernels: null, jobsShown: null, compare: null,
  critpath: null, critFetches: 0, critTable: null, // the overlay drawn, /critpath?step requests, the totals table
  lossChart: null, // the loss chart's y axis, the points off it, and its note
  actChart: null, // the activations chart's y axis, its --max-mem line (value, label, where) and its note
  chartSync: { read: 0, draws: 0 }, // steps read into the charts' series, and times the step charts were drawn
  stepBars: null, // the per-rank bars drawn: { step, ranks }
};

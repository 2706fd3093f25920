// dashboard.mjs: drives Debian's chromium (headless, through playwright-core)
// against a running `pprun serve`; run by tests/test_browser.c, which makes
// the assertions on the JSON this prints.
//
//   node dashboard.mjs finished URL SCREENSHOT.png
//   node dashboard.mjs live URL SCREENSHOT.png READY_FILE
//   node dashboard.mjs job URL SCREENSHOT.png      (a real running job)
//   node dashboard.mjs gpu URL SCREENSHOT.png      (fixture job 2 with gpu spans, then CPU job 1, then
//                                                  the Jobs tab and the two compared: SCREENSHOT-compare.png)
//   node dashboard.mjs long URL SCREENSHOT.png     (a job with 30,000 steps)
//   node dashboard.mjs balance URL SCREENSHOT.png  (the what-if panel: stage balance, data parallel; SCREENSHOT
//                                                  is of that panel)
//   node dashboard.mjs critpath URL SCREENSHOT.png (step 1's critical path over the timeline, its totals table)
//   node dashboard.mjs outliers URL SCREENSHOT.png (job 1's loss chart with an outlier, linear and log
//                                                  (SCREENSHOT-log.png); then job 2, a loss <= 0; then job 1 again)
//   node dashboard.mjs lanes URL SCREENSHOT.png    (a DualPipeV job: its overlapped F and BW on two lanes of a row)
//   node dashboard.mjs maxmem URL SCREENSHOT.png N (jobs 1..N's activations charts: the --max-mem line, its label
//                                                  and note; SCREENSHOT-jobK.png of each chart)
//   node dashboard.mjs scale URL SCREENSHOT.png    (a job of 1,024 ranks grouped: folding, one replica, the heatmap,
//                                                  a pan and a zoom's redraw times with a row per rank and
//                                                  100,000 events)
//   node dashboard.mjs relayout URL SCREENSHOT.png READY_FILE
//                                                 (a running --dp 2 job opened before its plans: READY_FILE
//                                                  created, the test adds plans of one pipeline and a step)
//   node dashboard.mjs torch URL SCREENSHOT.png F1,T1,F2,T2
//                                                 (real PyTorch jobs with spans: job 1 GPipe (BW), job 2
//                                                  ZBVZeroBubble (B and W), each in the window [F, T) (ns) that
//                                                  holds its step 1, spans included; SCREENSHOT-zbv.png)
//
// "live": after the page is ready it creates READY_FILE; the test then
// appends steps to the database and this script waits for them to appear;
// then it creates READY_FILE.2, and the test appends a running step; then
// READY_FILE.3, and the test marks the job succeeded.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const [mode, url, shot, readyFile] = process.argv.slice(2);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'pprun-chromium-'));
const out = { mode };
// A fresh profile directory per run (playwright passes it as --user-data-dir).
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.PPRUN_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(mode === 'gpu' ? url + '?job=2' : mode === 'outliers' || mode === 'torch' || mode === 'maxmem' ? url + '?job=1' : url);
  await page.waitForFunction(() => window.__pprun && window.__pprun.ready && window.__pprun.drawn, null, { timeout: mode === 'long' ? 60000 : 20000 });
  out.sqlExample = await page.inputValue('#sql-text'); // the SQL tab's example query, about the job open
  out.meta = await page.textContent('#job-meta');

  // The what-if table: each schedule at the job's measured costs.
  const whatifTable = async (measured) => {
    await page.waitForFunction((m) => window.__pprun.whatif && window.__pprun.whatif.measured === m, measured, { timeout: 30000 });
    out.whatifInfo = await page.textContent('#whatif-info');
    out.whatifHead = await page.$$eval('#whatif-table thead th', (th) => th.map((t) => t.textContent));
    out.whatifRows = await page.$$eval('#whatif-table tbody tr', (trs) => trs.map((tr) => [tr.className, ...[...tr.cells].map((td) => td.textContent)]));
    out.whatifTuned = await page.textContent('#whatif-tuned');
    // Stage balance, filled from the same answer.
    out.balance = {
      hidden: await page.evaluate(() => document.getElementById('balance').hidden),
      info: await page.textContent('#balance-info'),
      head: await page.$$eval('#balance-table thead th', (th) => th.map((t) => t.textContent)),
      rows: await page.$$eval('#balance-table tbody tr', (trs) => trs.map((tr) => [tr.className, ...[...tr.cells].map((td) => td.textContent)])),
      sim: await page.textContent('#balance-sim'),
      layer: await page.textContent('#balance-layer'),
      cuts: await page.textContent('#balance-cuts'),
    };
    // More pipelines or microbatches, for a job of several, and the toolbar's replica filter.
    out.dp = {
      hidden: await page.evaluate(() => document.getElementById('dp').hidden),
      filterHidden: await page.evaluate(() => document.getElementById('replica-filter').hidden),
      filterOptions: await page.$$eval('#replica option', (o) => o.map((x) => x.textContent)),
      info: await page.textContent('#dp-info'),
      rows: await page.$$eval('#dp-table tbody tr', (trs) => trs.map((tr) => [tr.className, ...[...tr.cells].map((td) => td.textContent)])),
    };
  };

  if (mode === 'finished') {
    out.openedAt = [await page.textContent('#step-label'), await page.textContent('#bubble-step-label')];
    await whatifTable(true);
    await page.evaluate(() => window.__pprun.showStep(0));
    await page.waitForFunction(() => window.__pprun.drawn && window.__pprun.drawn.steps.length === 1 && window.__pprun.drawn.steps[0] === 0, null, { timeout: 10000 });
    out.drawn = await page.evaluate(() => window.__pprun.drawn);
    out.window = await page.evaluate(() => window.__pprun.lastWindow);
    out.planDrawn = await page.evaluate(() => window.__pprun.planDrawn);
    out.lossPoints = await page.evaluate(() => window.__pprun.lossPoints.length);
    out.evalLossPoints = await page.evaluate(() => window.__pprun.evalLossPoints);
    out.lossNote = await page.textContent('#loss-note');
    const c = await page.evaluate(() => window.__pprun.blockCenter(1, 'F', 3, 0));
    await page.mouse.move(c.x, c.y);
    await page.waitForSelector('#tooltip:not([hidden])', { timeout: 5000 });
    out.tooltip = await page.textContent('#tooltip');
    const o = await page.evaluate(() => window.__pprun.blockCenter(2, 'OPT', -1, 0));
    await page.mouse.move(o.x, o.y);
    await page.waitForFunction(() => /OPT/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.optTooltip = await page.textContent('#tooltip');
    // The rightmost block's tooltip stays inside the window.
    const right = await page.evaluate(() => {
      let best = null;
      for (const r of [0, 1, 2, 3]) { const c = window.__pprun.blockCenter(r, 'OPT', -1, 0); if (c && (!best || c.x > best.x)) best = c; }
      return best;
    });
    await page.mouse.move(right.x, right.y);
    await page.waitForFunction(() => /OPT/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.edgeTip = await page.evaluate((x) => { const b = document.getElementById('tooltip').getBoundingClientRect();
      return { x, left: b.left, right: b.right, top: b.top, bottom: b.bottom, width: window.innerWidth, height: window.innerHeight }; }, right.x);
    // The legend: an entry per idle cause, each in its own colour.
    out.legendCauses = await page.$$eval('#legend span[data-cause]', (ss) => ss.map((x) => [x.dataset.cause, x.textContent,
      getComputedStyle(x.querySelector('i')).backgroundColor]));
    // A gap: rank 3 idles 3 ms before its first forward (warm-up).
    const g = await page.evaluate(() => {
      const f = window.__pprun.blockCenter(3, 'F', 0, 0);
      return { x: f.x - 40, y: f.y };
    });
    await page.mouse.move(g.x, g.y);
    await page.waitForFunction(() => /idle/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.gapTooltip = await page.textContent('#tooltip');
    await page.mouse.move(5, 5);
    await page.screenshot({ path: shot, fullPage: true });
    // "Chrome trace" downloads the step in view.
    const [dl] = await Promise.all([page.waitForEvent('download', { timeout: 20000 }), page.click('#trace-link')]);
    out.traceFile = dl.suggestedFilename();
    const trace = JSON.parse(fs.readFileSync(await dl.path(), 'utf8'));
    out.traceSteps = [...new Set(trace.traceEvents.filter((e) => e.ph === 'X').map((e) => e.args.step))];
    // A tooltip does not outlive a zoom (it described what was under the pointer).
    const f3 = await page.evaluate(() => window.__pprun.blockCenter(1, 'F', 3, 0));
    await page.mouse.move(f3.x, f3.y);
    await page.waitForSelector('#tooltip:not([hidden])', { timeout: 5000 });
    await page.mouse.wheel(0, -100);
    out.tooltipAfterWheel = await page.waitForSelector('#tooltip[hidden]', { state: 'attached', timeout: 5000 }).then(() => 'hidden', () => 'shown');
    // Zoomed in, the window label counts the events in view, not every one the page keeps.
    await page.waitForFunction(() => window.__pprun.lastWindow.to - window.__pprun.lastWindow.from < 30e6 &&
      window.__pprun.lastWindow.to === Math.ceil(window.__pprun.state.view.to), null, { timeout: 10000 });
    await page.waitForFunction(() => window.__pprun.drawn.inView > 0, null, { timeout: 5000 });
    out.zoomedIn = await page.evaluate(() => ({ label: document.getElementById('window-label').textContent,
      inView: window.__pprun.drawn.inView, kept: window.__pprun.state.ev.n }));
    // Zoom out with the wheel: a new window is fetched.
    const box = await page.locator('#timeline').boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + 40);
    const before = await page.evaluate(() => window.__pprun.lastWindow.to - window.__pprun.lastWindow.from);
    await page.mouse.wheel(0, 1200);
    await page.waitForFunction((b) => window.__pprun.lastWindow.to - window.__pprun.lastWindow.from > b * 2, before, { timeout: 10000 });
    out.zoomedSpanRatio = await page.evaluate((b) => (window.__pprun.lastWindow.to - window.__pprun.lastWindow.from) / b, before);
    // Far out (60 notches): the view stops at the whole job and a margin; every
    // window asked for is answered (no 400, no uncaught error).
    for (let i = 0; i < 60; i++) await page.mouse.wheel(0, 300);
    await page.waitForFunction(() => window.__pprun.lastWindow.from === Math.floor(window.__pprun.state.view.from) &&
      window.__pprun.lastWindow.to === Math.ceil(window.__pprun.state.view.to), null, { timeout: 10000 }).catch(() => {});
    out.zoomedOut = await page.evaluate(() => ({ from: window.__pprun.state.view.from, to: window.__pprun.state.view.to,
      window: window.__pprun.lastWindow, jobEnd: Math.max(...window.__pprun.state.steps.map((s) => s.end)) }));
    // SQL tab.
    await page.click('button[data-tab=sql]');
    await page.fill('#sql-text', "SELECT rank, count(*) AS n FROM events WHERE phase = 'W' GROUP BY rank");
    await page.click('#sql-run');
    await page.waitForFunction(() => document.querySelectorAll('#sql-result tbody tr').length > 0, null, { timeout: 5000 });
    out.sqlCells = await page.$$eval('#sql-result tbody td', (tds) => tds.map((t) => t.textContent));
    await page.fill('#sql-text', 'DELETE FROM events');
    await page.click('#sql-run');
    await page.waitForSelector('#sql-error:not([hidden])', { timeout: 5000 });
    out.sqlError = await page.textContent('#sql-error');
    out.sqlRowsAfterError = await page.$$eval('#sql-result tr', (trs) => trs.length);
    // A reload that took long (a large job's live heatmap) runs again only
    // after `slow` times as long (util.js's throttled): one of 50 ms, slow 4.
    out.throttle = await page.evaluate(async () => {
      const { throttled } = await import('./util.js');
      const runs = [];
      let done;
      const both = new Promise((r) => { done = r; });
      const f = throttled(async () => {
        const t0 = Date.now();
        while (Date.now() - t0 < 50);
        runs.push([t0, Date.now()]);
        if (runs.length === 2) done();
      }, 1, 4);
      f();
      await new Promise((r) => setTimeout(r, 5));
      f();
      await both;
      return { took: runs[0][1] - runs[0][0], gap: runs[1][0] - runs[0][1] };
    });
    // 100,000 events in view: drawn from typed arrays in one frame.
    await page.click('button[data-tab=timeline]');
    out.synthetic100kMs = await page.evaluate(() => window.__pprun.loadSynthetic(100000));
    out.syntheticDrawn = await page.evaluate(() => window.__pprun.drawn.F.reduce((a, b) => a + b, 0) + window.__pprun.drawn.B.reduce((a, b) => a + b, 0) + window.__pprun.drawn.W.reduce((a, b) => a + b, 0));
    // Step through with the buttons: the per-rank bars follow the step shown.
    out.stepping = [];
    // From a zoomed window around the middle of step 1: ▶ ◀ "all steps" ▶.
    await page.evaluate(() => { const s = window.__pprun.state.stepAt.get(1), m = (s.start + s.end) / 2;
      window.__pprun.showWindow(m - 5e6, m + 5e6); });
    for (const button of ['#step-next', '#step-prev', '#step-all', '#step-next']) {
      const before = await page.textContent('#step-label');
      await page.click(button);
      await page.waitForFunction((b) => document.getElementById('step-label').textContent !== b, before, { timeout: 5000 });
      out.stepping.push([await page.textContent('#step-label'), await page.textContent('#bubble-step-label')]);
    }
    // 700 px wide: the header wraps, nothing is off to the right.
    await page.setViewportSize({ width: 700, height: 900 });
    await page.waitForTimeout(100);
    out.narrow = await page.evaluate(() => ({ pageWidth: document.documentElement.scrollWidth,
      traceRight: document.getElementById('trace-link').getBoundingClientRect().right,
      sqlTabRight: document.querySelector('button[data-tab=sql]').getBoundingClientRect().right }));
    await page.screenshot({ path: shot.replace(/\.png$/, '-700.png') });
  } else if (mode === 'critpath') {
    // Step 1's path outlined, its hand-offs drawn; the API's answer beside it.
    await page.evaluate(() => window.__pprun.showStep(1));
    await page.waitForFunction(() => window.__pprun.critpath && window.__pprun.critpath.step === 1 &&
      window.__pprun.critpath.outlined > 0, null, { timeout: 10000 });
    out.critpath = await page.evaluate(() => window.__pprun.critpath);
    out.api = await page.evaluate(async () => {
      const r = await (await fetch('/api/jobs/1/critpath?step=1')).json();
      return { ops: r.ops.length, data: r.ops.filter((o) => o.via === 'data').length };
    });
    // Hover: rank 3's F of microbatch 0 took rank 2's output; rank 3's F
    // of microbatch 4 came after rank 3's previous op; rank 1's W of
    // microbatch 0 is off the path.
    out.tooltips = {};
    for (const [key, rank, phase, mb] of [['data', 3, 'F', 0], ['rank', 3, 'F', 4], ['off', 1, 'W', 0]]) {
      const c = await page.evaluate(([r, p, m]) => window.__pprun.blockCenter(r, p, m, 1), [rank, phase, mb]);
      await page.mouse.move(c.x, c.y);
      await page.waitForFunction((want) => !document.getElementById('tooltip').hidden &&
        document.getElementById('tooltip').textContent.startsWith(want), `rank ${rank} · ${phase} · microbatch ${mb}`, { timeout: 5000 });
      out.tooltips[key] = await page.textContent('#tooltip');
    }
    // A hand-off line itself: the last one, microbatch 7's B from rank 1 up to rank 0.
    const e = await page.evaluate(() => window.__pprun.critEdgeCenter(window.__pprun.critpath.edges - 1));
    await page.mouse.move(e.x, e.y);
    await page.waitForFunction(() => /^critical path/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.edgeTooltip = await page.textContent('#tooltip');
    await page.mouse.move(5, 5);
    // The totals table, read with the what-if.
    await page.waitForFunction(() => window.__pprun.critTable, null, { timeout: 10000 });
    out.table = {
      hidden: await page.evaluate(() => document.getElementById('critpath').hidden),
      info: await page.textContent('#critpath-info'),
      head: await page.$$eval('#critpath-table thead th', (th) => th.map((t) => t.textContent)),
      rows: await page.$$eval('#critpath-table tbody tr', (trs) => trs.map((tr) => [tr.className, ...[...tr.cells].map((td) => td.textContent)])),
      exposed: await page.evaluate(() => window.__pprun.critTable.rows),
    };
    await page.screenshot({ path: shot, fullPage: true });
    // Unticked: nothing drawn, nothing on the tooltips.
    const fetches = await page.evaluate(() => window.__pprun.critFetches);
    await page.uncheck('#critpath-on');
    await page.waitForFunction(() => window.__pprun.critpath.on === false, null, { timeout: 5000 });
    out.off = await page.evaluate(() => window.__pprun.critpath);
    const c = await page.evaluate(() => window.__pprun.blockCenter(3, 'F', 0, 1));
    await page.mouse.move(c.x, c.y);
    await page.waitForFunction(() => /^rank 3 · F · microbatch 0/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.offTooltip = await page.textContent('#tooltip');
    // Ticked again: drawn from what was fetched, no new request.
    await page.check('#critpath-on');
    await page.waitForFunction(() => window.__pprun.critpath.on && window.__pprun.critpath.step === 1, null, { timeout: 5000 });
    out.again = await page.evaluate(() => window.__pprun.critpath);
    out.refetched = await page.evaluate((f) => window.__pprun.critFetches - f, fetches);
    // The whole job: more events than a window holds, so the server
    // aggregates; no blocks, no path.
    await page.click('#step-all');
    await page.waitForFunction(() => window.__pprun.lastWindow && window.__pprun.lastWindow.mode !== 'events' &&
      window.__pprun.drawn.bins > 0, null, { timeout: 10000 });
    out.aggregated = await page.evaluate(() => ({ mode: window.__pprun.lastWindow.mode, critpath: window.__pprun.critpath }));
  } else if (mode === 'outliers') {
    // The loss chart as window.__pprun.lossChart has it, the boxes, and the
    // part of the chart's height the losses after step 0 span.
    const chart = () => page.evaluate(() => {
      const c = window.__pprun.lossChart, T = c.scale.log ? Math.log10 : (y) => y, box = (id) => document.getElementById(id);
      const later = window.__pprun.state.steps.filter((s) => s.step > 0 && s.loss != null).map((s) => T(s.loss));
      return { scale: c.scale, clipped: c.clipped, logAvailable: c.logAvailable, note: c.note,
        spread: (Math.max(...later) - Math.min(...later)) / (T(c.scale.hi) - T(c.scale.lo)),
        outliersBox: box('loss-outliers').checked, logBox: box('loss-log').checked, logDisabled: box('loss-log').disabled,
        logTitle: box('loss-log').parentNode.title };
    });
    // The colour on the canvas just left of where the first point off the
    // scale has its mark (the line to that point runs to its right).
    const markPixel = () => page.evaluate(() => {
      const c = window.__pprun.lossChart.clipped[0], cv = document.getElementById('loss'), d = window.devicePixelRatio || 1;
      if (!c) return null;
      const dy = c.above ? 4.5 : -4.5;
      return [...cv.getContext('2d').getImageData(Math.round((c.px - 2.5) * d), Math.round((c.py + dy) * d), 1, 1).data];
    });
    out.linear = await chart();
    out.linearMark = await markPixel();
    await page.locator('.charts').screenshot({ path: shot });
    await page.check('#loss-log');
    await page.waitForFunction(() => window.__pprun.lossChart.scale.log, null, { timeout: 5000 });
    out.log = await chart();
    out.logMark = await markPixel();
    await page.locator('.charts').screenshot({ path: shot.replace(/\.png$/, '-log.png') });
    await page.uncheck('#loss-outliers');
    await page.waitForFunction(() => window.__pprun.lossChart.clipped.length === 0, null, { timeout: 5000 });
    out.logAll = await chart();
    await page.check('#loss-outliers');
    // Job 2 has a loss below 0: no log scale there, and the page says why.
    await page.selectOption('#job-select', '2');
    await page.waitForFunction(() => window.__pprun.state.info && window.__pprun.state.info.job.id === 2 &&
      window.__pprun.lossChart.logAvailable === false, null, { timeout: 10000 });
    out.job2 = await chart();
    // Back to job 1: the log scale chosen before.
    await page.selectOption('#job-select', '1');
    await page.waitForFunction(() => window.__pprun.state.info && window.__pprun.state.info.job.id === 1 &&
      window.__pprun.lossChart.logAvailable === true, null, { timeout: 10000 });
    out.back = await chart();
  } else if (mode === 'maxmem') {
    // Each job's activations chart as the user sees it: the note beside
    // its title, its y axis, the --max-mem line the chart says it drew
    // (value, label, pixel row), and the canvas itself: the colour in the
    // middle of each dash along that row (the dashes start at the plot's
    // left edge, 46 px, 6 on and 4 off), against the note's colour.
    out.jobs = [];
    for (let job = 1; job <= Number(readyFile); job++) {
      if (job !== 1) {
        await page.evaluate(() => { window.__pprun.ready = false; });
        await page.selectOption('#job-select', String(job));
      }
      await page.waitForFunction((j) => window.__pprun.ready && window.__pprun.state.info.job.id === j &&
        window.__pprun.actPoints.length >= 2, job, { timeout: 20000 });
      out.jobs.push(await page.evaluate(() => {
        const chart = window.__pprun.actChart || {}, note = document.getElementById('act-note'), c = document.getElementById('act');
        const hex = getComputedStyle(note || document.body).color.match(/\d+/g).map(Number);
        const d = window.devicePixelRatio || 1, g = c.getContext('2d'), line = chart.bound, dashes = [];
        for (let x = 49; line && x < c.clientWidth - 8; x += 10) {
          const p = g.getImageData(Math.round(x * d), Math.round((line.py - 0.5) * d), 1, 1).data;
          dashes.push(Math.abs(p[0] - hex[0]) <= 8 && Math.abs(p[1] - hex[1]) <= 8 && Math.abs(p[2] - hex[2]) <= 8);
        }
        return { note: note ? note.textContent : null, scale: chart.scale || null, bound: line || null,
          height: c.clientHeight, dashes: dashes.length, dashesInColour: dashes.filter(Boolean).length };
      }));
      await page.locator('#act').screenshot({ path: shot.replace(/\.png$/, `-job${job}.png`) });
    }
    await page.locator('.charts').screenshot({ path: shot });
  } else if (mode === 'balance') {
    // A layered job with an uneven first stage: the stage balance block.
    await whatifTable(true);
    await page.locator('.whatif').screenshot({ path: shot });
  } else if (mode === 'gpu') {
    await page.evaluate(() => window.__pprun.showStep(0));
    await page.waitForFunction(() => window.__pprun.drawn && window.__pprun.drawn.steps.length === 1 &&
      window.__pprun.drawn.steps[0] === 0 && window.__pprun.drawn.kernels > 0, null, { timeout: 10000 });
    out.drawn = await page.evaluate(() => window.__pprun.drawn);
    out.lastKernels = await page.evaluate(() => window.__pprun.lastKernels);
    // rank 1's 1F3 of step 0: its gpu span (upper half of the lane), then its
    // first kernel (lower half, 200 us into the span).
    const span = await page.evaluate(() => window.__pprun.state.gpu.find((x) => x[1] === 1 && x[5] === 0 && x[3] === 3 && x[2] === 0));
    let p = await page.evaluate((t) => window.__pprun.gpuLaneAt(1, t, false), (span[6] + span[7]) / 2);
    await page.mouse.move(p.x, p.y);
    await page.waitForFunction(() => /GPU ·/.test(document.getElementById('tooltip').textContent) &&
      !document.getElementById('tooltip').hidden, null, { timeout: 5000 });
    out.spanTooltip = await page.textContent('#tooltip');
    p = await page.evaluate((t) => window.__pprun.gpuLaneAt(1, t, true), span[6] + 200000);
    await page.mouse.move(p.x, p.y);
    await page.waitForFunction(() => /kernel/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.kernelTooltip = await page.textContent('#tooltip');
    // The host block above is still the host op.
    const c = await page.evaluate(() => window.__pprun.blockCenter(1, 'F', 3, 0));
    await page.mouse.move(c.x, c.y);
    await page.waitForFunction(() => /^rank 1 · F/.test(document.getElementById('tooltip').textContent), null, { timeout: 5000 });
    out.hostTooltip = await page.textContent('#tooltip');
    await page.screenshot({ path: shot, fullPage: true });
    // The CPU job: no lane.
    await page.selectOption('#job-select', '1');
    await page.waitForFunction(() => window.__pprun.state.info && window.__pprun.state.info.job.id === 1 &&
      window.__pprun.drawn && window.__pprun.drawn.steps.length > 0 && window.__pprun.drawn.gpuLane === false, null, { timeout: 10000 });
    out.cpuDrawn = await page.evaluate(() => window.__pprun.drawn);
    out.cpuLane = await page.evaluate(() => window.__pprun.gpuLaneAt(0, 6e6, false));
    out.cpuKernels = await page.evaluate(() => window.__pprun.lastKernels);
    // The Jobs tab: both jobs side by side; a click opens one in the timeline.
    await page.click('button[data-tab=jobs]');
    await page.waitForFunction(() => window.__pprun.jobsShown === 2, null, { timeout: 10000 });
    out.jobsHead = await page.$$eval('#jobs-table thead th', (th) => th.map((t) => t.textContent));
    out.jobsRows = await page.$$eval('#jobs-table tbody tr', (trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
    // Tick both jobs: the Compare panel holds job 2 against job 1.
    await page.check('#jobs-table tbody tr[data-job="1"] td.pick input');
    await page.check('#jobs-table tbody tr[data-job="2"] td.pick input');
    await page.waitForFunction(() => window.__pprun.compare && window.__pprun.compare.job === 2, null, { timeout: 10000 });
    out.compare = await page.evaluate(() => { const c = window.__pprun.compare; return { job: c.job, other: c.other, differs: c.differs, rows: c.rows, prediction: c.prediction, loss: c.loss }; });
    out.compareDom = {
      differs: await page.$$eval('#compare-differs li', (li) => li.map((x) => x.textContent)),
      rows: await page.$$eval('#compare-table tbody tr', (trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent))),
      prediction: await page.textContent('#compare-prediction'),
      loss: await page.textContent('#compare-loss'),
      stillOnJobs: await page.evaluate(() => !document.getElementById('tab-jobs').hidden),
    };
    await page.locator('#compare').screenshot({ path: shot.replace(/\.png$/, '-compare.png') });
    await page.click('#jobs-table tbody tr[data-job="2"]');
    await page.waitForFunction(() => window.__pprun.state.info && window.__pprun.state.info.job.id === 2 &&
      !document.getElementById('tab-timeline').hidden, null, { timeout: 10000 });
    out.openedFromJobs = await page.evaluate(() => window.__pprun.state.info.job.id);
  } else if (mode === 'torch') {
    // Step 1 of a job, in the window the test gives (its ops and its
    // spans, which may lie just outside the step's own span: a rank
    // fetches its next batch while another still finishes the step):
    // what is drawn; the blocks the page holds for the step ([rank, phase,
    // stage, microbatch]) and whether each is in view; the blocks in view
    // of any step per phase and rank (the window's edges show the ends of
    // steps 0 and 2, which overlap step 1 on a V); the spans in view; the
    // plan's phases.
    const win = (readyFile || '').split(',').map(Number);
    const stepOne = async (job) => {
      if (job !== 1) {
        await page.selectOption('#job-select', String(job));
        await page.waitForFunction((j) => window.__pprun.state.info && window.__pprun.state.info.job.id === j &&
          window.__pprun.ready, job, { timeout: 10000 });
      }
      await page.evaluate(([f, t]) => window.__pprun.showWindow(f, t), [win[2 * job - 2], win[2 * job - 1]]);
      await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
      await page.waitForFunction(() => window.__pprun.drawn && window.__pprun.drawn.steps.includes(1) &&
        window.__pprun.planDrawn > 0, null, { timeout: 10000 });
      return page.evaluate(() => {
        const S = window.__pprun.state, ev = S.ev, blocks = [], spans = [], inView = { F: [0, 0], B: [0, 0], W: [0, 0], BW: [0, 0] };
        const names = { 0: 'F', 1: 'B', 2: 'W', 8: 'BW' };
        let outside = 0;
        for (let i = 0; i < ev.n; i++) {
          const shown = !(ev.end[i] < S.view.from || ev.start[i] > S.view.to), ph = names[ev.phase[i]];
          if (ph && shown) inView[ph][ev.rank[i]]++;
          if (ev.phase[i] === 9 && shown) spans.push([ev.rank[i], ev.name[i], ev.step[i]]);
          if (ev.step[i] !== 1) continue;
          if (ph) { blocks.push([ev.rank[i], ev.phase[i], ev.stage[i], ev.mb[i]]); outside += !shown; }
        }
        const planPhases = {};
        for (const a of S.plan.actions) planPhases[a.phase] = (planPhases[a.phase] || 0) + 1;
        return { drawn: window.__pprun.drawn, blocks, outside, inView, spans, view: S.view, planPhases, planDrawn: window.__pprun.planDrawn,
          legendSpans: !document.getElementById('legend-spans').hidden, schedule: S.info.job.schedule };
      });
    };
    // Hovers p (page coordinates); the tooltip once it matches re.
    const tooltipAt = async (p, re) => {
      await page.mouse.move(p.x, p.y);
      await page.waitForFunction((src) => new RegExp(src).test(document.getElementById('tooltip').textContent) &&
        !document.getElementById('tooltip').hidden, re, { timeout: 5000 });
      return page.textContent('#tooltip');
    };
    out.gpipe = await stepOne(1);
    out.bwTooltip = await tooltipAt(await page.evaluate(() => window.__pprun.blockCenter(1, 'BW', 0, 1)), '^rank 1 · BW');
    await page.mouse.move(5, 5);
    await page.waitForFunction(() => window.__pprun.critTable, null, { timeout: 10000 });
    out.critHead = await page.$$eval('#critpath-table thead th', (th) => th.map((t) => t.textContent));
    await whatifTable(true);
    await page.screenshot({ path: shot, fullPage: true });
    // Rank 0's data span of step 1, zoomed in on (a span of 0.1 ms is a
    // pixel or two at a step's width, beside the log span of step 0).
    const data = await page.evaluate(() => {
      const ev = window.__pprun.state.ev;
      for (let i = 0; i < ev.n; i++) if (ev.phase[i] === 9 && ev.rank[i] === 0 && ev.name[i] === 'data' && ev.step[i] === 1) return [ev.start[i], ev.end[i]];
      return null;
    });
    const len = data[1] - data[0];
    await page.evaluate(([f, t]) => window.__pprun.showWindow(f, t), [data[0] - len, data[1] + len]);
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    out.spanTooltip = await tooltipAt(await page.evaluate(() => window.__pprun.spanCenter(0, 'data', 1)), '^rank 0 · span');
    await page.mouse.move(5, 5);
    out.zbv = await stepOne(2);
    out.wTooltip = await tooltipAt(await page.evaluate(() => window.__pprun.blockCenter(1, 'W', 0, 1)), '^rank 1 · W');
    await page.screenshot({ path: shot.replace(/\.png$/, '-zbv.png'), fullPage: true });
  } else if (mode === 'long') {
    // Every step loaded; the charts drawn thinned, the extremes kept.
    out.steps = await page.evaluate(() => window.__pprun.state.steps.length);
    out.lossPoints = await page.evaluate(() => window.__pprun.lossPoints.length);
    out.lossCanvasWidth = await page.evaluate(() => document.getElementById('loss').clientWidth);
    const ext = (pts) => pts.reduce((m, p) => ({ lo: Math.min(m.lo, p[1]), hi: Math.max(m.hi, p[1]), hiStep: p[1] > m.hi ? p[0] : m.hiStep }),
      { lo: Infinity, hi: -Infinity, hiStep: null });
    out.drawnLoss = await page.evaluate(`(${ext})(window.__pprun.lossPoints)`);
    out.allLoss = await page.evaluate(`(${ext})(window.__pprun.state.steps.filter((s) => s.loss != null).map((s) => [s.step, s.loss]))`);
    const mean = (ys) => ys.reduce((a, y) => a + y, 0) / ys.length;
    out.lossTrend = await page.evaluate(`((mean) => { const t = window.__pprun.lossTrend;
      return { n: t.length, hi: Math.max(...t.map((p) => p[1])), mean: mean(t.map((p) => p[1])),
        all: mean(window.__pprun.state.steps.filter((s) => s.loss != null).map((s) => s.loss)) }; })(${mean})`);
    out.barsLabel = await page.textContent('#bubble-step-label');
    out.meta = await page.textContent('#job-meta');
    await page.screenshot({ path: shot, fullPage: true });
    // Redrawn with nothing new, then with a new step at the end, then with
    // a step in the middle changed: the steps the charts read again, and
    // whether they were drawn.
    out.redraws = await page.evaluate(`((ext) => {
      const p = window.__pprun, steps = p.state.steps, out = {};
      const since = (f) => { const r = p.chartSync.read, d = p.chartSync.draws; f(); return { read: p.chartSync.read - r, draws: p.chartSync.draws - d }; };
      out.unchanged = since(() => window.dispatchEvent(new Event('resize')));
      const last = steps[steps.length - 1];
      out.newStep = since(() => p.mergeStep(Object.assign(JSON.parse(JSON.stringify(last)), { step: last.step + 1, loss: 0.25 })));
      out.newStepDrawn = p.lossPoints[p.lossPoints.length - 1];
      out.middle = since(() => p.mergeStep({ step: 12345, loss: 60 }));
      out.middleLoss = ext(p.lossPoints);
      return out; })(${ext})`);
  } else if (mode === 'lanes') {
    // Step 1: its pairs (an F and a BW of one rank that ran at once) on the
    // upper and the lower half of the row, in the plan's rows too; the
    // tooltip says which op is under the pointer.
    await page.evaluate(() => window.__pprun.showStep(1));
    await page.waitForFunction(() => window.__pprun.drawn && window.__pprun.drawn.steps.includes(1), null, { timeout: 10000 });
    out.drawn = await page.evaluate(() => window.__pprun.drawn);
    out.planDrawn = await page.evaluate(() => window.__pprun.planDrawn);
    out.planLane2 = await page.evaluate(() => window.__pprun.planLane2);
    out.pair = await page.evaluate(() => {
      const ev = window.__pprun.state.ev, F = 0, BW = 8;
      for (let i = 0; i < ev.n; i++) {
        if (ev.phase[i] !== F || ev.step[i] !== 1) continue;
        for (let j = 0; j < ev.n; j++)
          if (ev.phase[j] === BW && ev.rank[j] === ev.rank[i] && ev.step[j] === 1 && ev.start[j] < ev.end[i] && ev.start[i] < ev.end[j])
            return { rank: ev.rank[i], f: [ev.stage[i], ev.mb[i]], bw: [ev.stage[j], ev.mb[j]],
              fc: window.__pprun.blockCenter(ev.rank[i], 'F', ev.mb[i], 1, ev.stage[i]),
              bwc: window.__pprun.blockCenter(ev.rank[j], 'BW', ev.mb[j], 1, ev.stage[j]) };
      }
      return null;
    });
    // the tooltip at a point, once it says `want` (or what it says after 5 s)
    const tip = async (c, want) => {
      if (!c) return null;
      await page.mouse.move(c.x, c.y);
      await page.waitForFunction((w) => { const t = document.getElementById('tooltip'); return !t.hidden && t.textContent.startsWith(w); },
        want, { timeout: 5000 }).catch(() => {});
      return page.textContent('#tooltip');
    };
    if (out.pair) {
      out.fTip = await tip(out.pair.fc, `rank ${out.pair.rank} · F`);
      out.bwTip = await tip(out.pair.bwc, `rank ${out.pair.rank} · BW`);
    }
    await page.screenshot({ path: shot, fullPage: false });
  } else if (mode === 'scale') {
    const rows = () => page.evaluate(() => { const d = window.__pprun.drawn;
      return { by: window.__pprun.rows().by, rows: d.rows, rankRows: d.rankRows, lanes: d.lanes }; });
    const redrawn = (before) => page.waitForFunction((b) => window.__pprun.drawn.rows !== b, before, { timeout: 10000 });
    out.opened = await rows();
    // node 39's label: a click unfolds it, another folds it again
    let c = await page.evaluate(() => window.__pprun.groupLabelCenter(39));
    await page.mouse.click(c.x, c.y);
    await redrawn(out.opened.rows);
    out.unfolded = await rows();
    await page.mouse.move(c.x + 200, c.y);
    await page.waitForSelector('#tooltip:not([hidden])', { timeout: 5000 }).catch(() => {});
    out.laneTooltip = await page.textContent('#tooltip');
    c = await page.evaluate(() => window.__pprun.groupLabelCenter(39));
    await page.mouse.click(c.x, c.y);
    await redrawn(out.unfolded.rows);
    out.folded = await rows();
    await page.selectOption('#row-group', 'stage');
    await redrawn(out.folded.rows);
    out.byStage = await rows();
    await page.selectOption('#row-group', 'replica');
    await redrawn(out.byStage.rows);
    out.byReplica = await rows();
    // the replica filter: replica 5's 8 ranks, a row each; then by node,
    // replica 5's one node's lane, still filtered when the heatmap is clicked
    await page.selectOption('#row-group', 'rank');
    await redrawn(out.byReplica.rows);
    await page.selectOption('#replica', '5');
    await page.waitForFunction(() => window.__pprun.drawn.rows === 8, null, { timeout: 10000 });
    out.oneReplica = await page.evaluate(() => window.__pprun.rows());
    out.replicaOptions = await page.$$eval('#replica option', (o) => o.length);
    // "Chrome trace" of replica 5: its ranks' threads only
    const [dl] = await Promise.all([page.waitForEvent('download', { timeout: 30000 }), page.click('#trace-link')]);
    const rtrace = JSON.parse(fs.readFileSync(await dl.path(), 'utf8'));
    out.replicaTrace = { file: dl.suggestedFilename(), ranks: [...new Set(rtrace.traceEvents
      .filter((e) => e.ph === 'M' && e.name === 'thread_name').map((e) => parseInt(e.args.name.split(' ')[1], 10)))] };
    await page.selectOption('#row-group', 'node');
    await page.waitForFunction(() => window.__pprun.rows().by === 'node', null, { timeout: 10000 });
    out.oneReplicaByNode = await page.evaluate(() => window.__pprun.rows());
    // the heatmap's hottest cell, clicked: its step, its rank's row
    await page.waitForFunction(() => window.__pprun.heatmap && window.__pprun.heatmap.hottest, null, { timeout: 20000 });
    out.heatmap = await page.evaluate(() => window.__pprun.heatmap);
    out.heatNote = await page.textContent('#heatmap-note');
    await page.locator('#heatmap').screenshot({ path: shot.replace(/\.png$/, '-heatmap.png') });
    const hot = out.heatmap.hottest;
    // The cell's centre, clicked once the pointer over it says its rank:
    // the page may still be laying out what loads above the heatmap.
    for (let tries = 0; tries < 20; tries++) {
      c = await page.evaluate((h) => window.__pprun.heatCellCenter(h.rank, h.step), hot);
      await page.mouse.move(c.x, c.y);
      const tip = await page.textContent('#tooltip');
      if (tip && tip.startsWith(`rank ${hot.rank} ·`)) break;
      await page.waitForTimeout(100);
    }
    await page.mouse.click(c.x, c.y);
    // picked is set once the step's window came back (showStep awaits it)
    await page.waitForFunction(() => window.__pprun.picked && window.__pprun.state.step === window.__pprun.picked.step, null, { timeout: 20000 });
    await new Promise((res) => setTimeout(res, 100)); // its frame drawn
    out.picked = await page.evaluate(() => { const p = window.__pprun, r = p.picked.rank;
      return { rank: r, step: p.picked.step, highlight: p.state.highlight, shownStep: p.state.step,
        slowDrawn: p.drawn.F[r] + p.drawn.B[r] + p.drawn.W[r] + p.drawn.bins, rows: p.drawn.rows,
        replica: p.rows().replica, replicaShown: document.getElementById('replica').value }; });
    // its per-rank bars: the step's 1,024 ratios, asked for that step alone
    await page.waitForFunction(() => { const b = window.__pprun.stepBars;
      return b && b.step === window.__pprun.state.step; }, null, { timeout: 20000 });
    out.stepBars = await page.evaluate(() => window.__pprun.stepBars);
    await page.locator('#bubble-ranks').screenshot({ path: shot.replace(/\.png$/, '-bars.png') });
    await page.locator('#bubble').screenshot({ path: shot.replace(/\.png$/, '-bubble.png') });
    out.stepsKept = await page.evaluate(() => { const S = window.__pprun.state, last = S.steps[S.steps.length - 1];
      return { n: S.steps.length, withRanks: S.steps.filter((s) => s.bubble_ratio || s.act_peak_bytes).length,
        min: last.bubble_ratio_min, mean: last.bubble_ratio_mean, max: last.bubble_ratio_max }; });
    await page.screenshot({ path: shot.replace(/\.png$/, '-picked.png') });
    // A row per rank and 100,000 events in view: a pan (a drag's moves)
    // and a zoom (a wheel notch), each redraw timed by the page itself; read
    // in the frame after each, before the window asked for (120 ms after
    // the pointer rests) replaces the events.
    await page.selectOption('#row-group', 'rank');
    await page.waitForFunction(() => window.__pprun.drawn.rows === 1024, null, { timeout: 10000 });
    out.redraw = await page.evaluate(async () => {
      const p = window.__pprun, c = document.getElementById('timeline'), rect = c.getBoundingClientRect();
      const frame = () => new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res)));
      const firstMs = p.loadSynthetic(100000);
      const y = rect.top + 100, x = rect.left + rect.width / 2, times = [];
      c.dispatchEvent(new MouseEvent('mousedown', { clientX: x, clientY: y, bubbles: true }));
      let inView = 0;
      for (let k = 1; k <= 5; k++) {
        window.dispatchEvent(new MouseEvent('mousemove', { clientX: x - 4 * k, clientY: y, bubbles: true }));
        await frame();
        times.push(p.drawMs); inView = p.drawn.inView;
      }
      window.dispatchEvent(new MouseEvent('mouseup', { clientX: x - 20, clientY: y, bubbles: true }));
      times.sort((a, b) => a - b);
      p.loadSynthetic(100000);
      c.dispatchEvent(new WheelEvent('wheel', { clientX: x, clientY: y, deltaY: -100, bubbles: true, cancelable: true }));
      await frame();
      return { rows: p.drawn.rows, firstMs, panMs: times[times.length >> 1], panMax: times[times.length - 1], panMoves: times.length,
        panInView: inView, zoomMs: p.drawMs, zoomInView: p.drawn.inView };
    });
    await page.screenshot({ path: shot });
  } else if (mode === 'failed') {
    // A job killed in the middle of a step: where it opens.
    out.opened = await page.evaluate(() => {
      const S = window.__pprun.state, whole = S.steps.filter((s) => s.start != null);
      const last = whole[whole.length - 1];
      let cut = 0; // events drawn after the last whole step: the step the job was cut in
      for (let i = 0; i < S.ev.n; i++) if (S.ev.start[i] >= last.end && S.ev.start[i] <= S.view.to) cut++;
      return { view: S.view, step: S.step, lastWhole: last.step, lastStart: last.start, lastEnd: last.end,
        timelineEnd: S.info.timeline_end, cutEvents: cut, status: S.info.job.status,
        label: document.getElementById('step-label').textContent,
        lossSteps: window.__pprun.lossPoints.map((p) => p[0]) };
    });
    await page.screenshot({ path: shot, fullPage: false });
  } else if (mode === 'job') {
    // A real `pprun run --serve` job: steps appear while it runs.
    const complete = () => (window.__pprun && window.__pprun.state && window.__pprun.state.steps
      ? window.__pprun.state.steps.filter((s) => s.complete).length : 0);
    await page.waitForFunction(complete, null, { timeout: 60000 });
    out.stepsBefore = await page.evaluate(complete);
    await page.waitForFunction((n) => (window.__pprun.state.steps.filter((s) => s.complete).length >= n + 2),
      out.stepsBefore, { timeout: 60000 });
    out.stepsAfter = await page.evaluate(complete);
    out.follow = await page.evaluate(() => document.getElementById('follow').checked);
    // While following, the plan is aligned to a step in view: never empty.
    out.planSamples = [];
    for (let i = 0; i < 12; i++) {
      out.planSamples.push(await page.evaluate(() => ({ drawn: window.__pprun.planDrawn, anchor: window.__pprun.planAnchor })));
      await page.waitForTimeout(150);
    }
    out.lossPoints = await page.evaluate(() => window.__pprun.lossPoints.length);
    out.drawn = await page.evaluate(() => window.__pprun.drawn);
    // The activations chart fills from the live steps too.
    await page.waitForFunction(() => window.__pprun.actPoints.length >= 2, null, { timeout: 30000 });
    out.actPoints = await page.evaluate(() => window.__pprun.actPoints);
    out.stepActBytes = await page.evaluate(() => window.__pprun.state.steps.filter((s) => s.complete).map((s) => s.act_peak_bytes));
    await whatifTable(true); // filled in once a step is complete, without a reload
    await page.screenshot({ path: shot, fullPage: true });
    // The Jobs tab: measured peak and the plan's in-flight count.
    await page.click('button[data-tab=jobs]');
    await page.waitForFunction(() => window.__pprun.jobsShown === 1, null, { timeout: 10000 });
    out.jobsHead = await page.$$eval('#jobs-table thead th', (th) => th.map((t) => t.textContent));
    out.jobsRows = await page.$$eval('#jobs-table tbody tr', (trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
  } else if (mode === 'relayout') {
    // Opened before any rank declared its plan: --dp 2's replica filter;
    // then the plans (one pipeline) and a step come in.
    const filter = () => page.evaluate(() => ({ hidden: document.getElementById('replica-filter').hidden,
      options: [...document.querySelectorAll('#replica option')].map((o) => o.textContent),
      meta: document.getElementById('job-meta').textContent }));
    out.before = await filter();
    fs.writeFileSync(readyFile, 'ready\n');
    await page.waitForFunction(() => document.getElementById('replica-filter').hidden, null, { timeout: 30000 }).catch(() => {});
    out.after = await filter();
    await page.screenshot({ path: shot, fullPage: true });
  } else {
    out.follow = await page.evaluate(() => document.getElementById('follow').checked);
    out.stepsBefore = await page.evaluate(() => window.__pprun.state.steps.filter((s) => s.complete).length);
    // The writer adds step 2, then steps 3-26 at once (test_browser.c's LIVE_BURST).
    const fetches = await page.evaluate(() => window.__pprun.windowFetches), t0 = Date.now();
    const critFetches = await page.evaluate(() => window.__pprun.critFetches);
    fs.writeFileSync(readyFile, 'ready\n');
    await page.waitForFunction(() => window.__pprun.state.steps.filter((s) => s.complete).length >= 27 &&
      window.__pprun.drawn.steps.includes(26), null, { timeout: 30000 });
    out.burstFetches = await page.evaluate((f) => window.__pprun.windowFetches - f, fetches);
    out.burstCritFetches = await page.evaluate((f) => window.__pprun.critFetches - f, critFetches);
    out.burstMs = Date.now() - t0;
    out.stepsAfter = await page.evaluate(() => window.__pprun.state.steps.filter((s) => s.complete).length);
    out.liveEvents = await page.evaluate(() => window.__pprun.liveEvents);
    out.drawnSteps = await page.evaluate(() => window.__pprun.drawn.steps);
    out.lossPoints = await page.evaluate(() => window.__pprun.lossPoints.length);
    // Then step 27 starts (events, no stats yet): the plan follows it.
    fs.writeFileSync(readyFile + '.2', 'ready\n');
    await page.waitForFunction(() => window.__pprun.drawn.steps.includes(27), null, { timeout: 30000 });
    out.plan = await page.evaluate(() => ({ drawn: window.__pprun.planDrawn, anchor: window.__pprun.planAnchor }));
    out.planLoads = await page.evaluate(() => window.__pprun.planLoads);
    await page.screenshot({ path: shot, fullPage: true });
    // Then the job ends (READY_FILE.3: the test marks it succeeded): the
    // what-if and the critical path totals are read again, following stops.
    fs.writeFileSync(readyFile + '.3', 'ready\n');
    await page.waitForFunction(() => document.getElementById('job-status').textContent === 'succeeded', null, { timeout: 30000 });
    await page.waitForFunction(() => window.__pprun.whatif && window.__pprun.whatif.last_step === 26 &&
      window.__pprun.critTable && window.__pprun.critTable.last_step === 26, null, { timeout: 10000 }).catch(() => {});
    await page.waitForFunction(() => !/following/.test(document.getElementById('step-label').textContent), null, { timeout: 10000 }).catch(() => {});
    out.ended = await page.evaluate(() => ({ follow: document.getElementById('follow').checked,
      stepLabel: document.getElementById('step-label').textContent, whatif: document.getElementById('whatif-info').textContent,
      whatifLast: window.__pprun.whatif && window.__pprun.whatif.last_step,
      critLast: window.__pprun.critTable && window.__pprun.critTable.last_step,
      balance: document.getElementById('balance-info').textContent }));
  }
  out.errors = errors;
} catch (e) {
  out.failure = String(e && e.stack || e);
} finally {
  await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(out));
process.exit(out.failure ? 1 : 0);

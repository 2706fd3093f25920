// charts-bench.mjs: what one redraw of the step charts costs while a job is
// followed live, in Debian's chromium (headless, through playwright-core);
// a measurement for docs/dashboard.md, not a test.
//
//   node charts-bench.mjs URL [ROUNDS]
//
// Opens the page (a finished job of many steps, `pprun serve`), then ROUNDS
// times: merges one new complete step, as the live stream does, and times
// drawCharts(); then times drawCharts() with nothing new, and once after the
// chart width changed (both from window.__pprun.bench: the page's modules
// keep their functions to themselves). Prints JSON: milliseconds, median and
// max.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const [url, roundsArg] = process.argv.slice(2);
const rounds = Number(roundsArg || 40);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'pprun-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.PPRUN_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
});
const out = {};
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(url);
  await page.waitForFunction(() => window.__pprun && window.__pprun.ready && window.__pprun.drawn, null, { timeout: 120000 });
  out.steps = await page.evaluate(() => window.__pprun.state.steps.length);
  const stats = (ms) => { const s = [...ms].sort((a, b) => a - b); return { median: +s[s.length >> 1].toFixed(2), max: +s[s.length - 1].toFixed(2) }; };
  // Each round a step past the last one, a copy of it (loss, bubble ratios, activations).
  const live = await page.evaluate((n) => {
    const ms = [];
    for (let i = 0; i < n; i++) {
      const last = window.__pprun.state.steps[window.__pprun.state.steps.length - 1];
      const { mergeStep, drawCharts } = window.__pprun.bench;
      mergeStep(Object.assign(JSON.parse(JSON.stringify(last)), { step: last.step + 1, loss: last.loss * (1 + 0.01 * (i % 7)) }));
      const t = performance.now(); drawCharts(); ms.push(performance.now() - t);
    }
    return ms;
  }, rounds);
  out.liveStepMs = stats(live);
  out.unchangedMs = stats(await page.evaluate((n) => {
    const ms = [];
    const { drawCharts } = window.__pprun.bench;
    for (let i = 0; i < n; i++) { const t = performance.now(); drawCharts(); ms.push(performance.now() - t); }
    return ms;
  }, rounds));
  out.resizedMs = await page.evaluate(() => {
    document.querySelector('.charts').style.width = '1200px'; // no resize event: the next drawCharts finds it
    const t = performance.now(); window.__pprun.bench.drawCharts(); return +(performance.now() - t).toFixed(2);
  });
  out.errors = errors;
} catch (e) {
  out.failure = String(e && e.stack || e);
} finally {
  await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(out));

// rows.js: which rows the timeline has. A row per rank (the default up to
// 64 ranks), or the ranks grouped by node, by pipeline stage (the job's
// ranks table says each rank's node and stages; a rank's stage is its
// first) or, for a job of several pipelines (--dp), by replica (global rank
// r is replica r / P, P ranks a pipeline: docs/cli.md): each group a summary lane of its bubble, the share of its ranks
// idle in each pixel column, with the group's rank rows under it unless it
// is folded. A job of more than 64 ranks opens grouped, every group folded
// (by node when it ran on more than one, else by stage). A job of several
// pipelines can show one of them only (the replica filter). The layout maps
// a rank to its slot, the row it is drawn on (-1: folded or filtered away).
import { S, world } from './state.js';

export const R = {
  by: 'rank',          // 'rank', 'node', 'stage' or 'replica'
  folded: new Set(),   // the keys of the groups folded
  slot: new Int32Array(0), // per rank: its row, -1 when its group is folded
  rows: [],            // per row: { rank } or { group }
  groups: [],          // { key, label, ranks: [..], slot }
  groupOf: new Int32Array(0), // per rank: its group's index (-1: ungrouped)
  replica: -1,         // the one pipeline shown (--dp), -1: all of them
};

export const GROUPED_ABOVE = 64; // ranks: a bigger job opens grouped

// The job's pipelines (--dp; 1 for one) and ranks a pipeline, as the
// server takes them (/api/jobs/{id}'s replicas, db/summary.c summary_dp):
// a dp that does not divide the world, or that the program's plan does not
// follow, is one pipeline.
export function replicas() {
  const d = S.info && S.info.replicas, n = world();
  const dp = Number.isInteger(d) && d > 1 && d <= n && n % d === 0 ? d : 1;
  return { dp, pp: Math.max(1, n / dp) };
}

const replicaOf = (r) => Math.floor(r / replicas().pp);

// The ranks the replica filter shows, as trace.json's ranks= takes them
// ("40-47"), or null when it shows every replica.
export function filteredRanks() {
  if (R.replica < 0) return null;
  const pp = replicas().pp;
  return `${R.replica * pp}-${R.replica * pp + pp - 1}`;
}

// Shows replica d's ranks only (-1: every replica's), every group folded
// again as when the grouping changes.
export function showReplica(d) {
  R.replica = d;
  groupBy(R.by);
}

// The group key of rank r (its row of the ranks table: info) under R.by.
function keyOf(r, info) {
  if (R.by === 'replica') return replicaOf(r);
  if (!info) return 0;
  if (R.by === 'node') return info.node;
  const first = parseInt(String(info.stages).split(',')[0], 10);
  return Number.isFinite(first) ? first : 0;
}

// How a job opens: per rank, or grouped and folded.
export function defaultGrouping() {
  const n = world();
  if (n <= GROUPED_ABOVE) return 'rank';
  const nodes = new Set((S.info.ranks || []).map((x) => x.node));
  return nodes.size > 1 ? 'node' : 'stage';
}

// Groups by `by`, every one folded (a job opened, or the grouping changed).
export function groupBy(by) {
  R.by = by;
  layoutRows();
  R.folded = new Set(R.groups.map((g) => g.key));
  layoutRows();
}

export function toggleGroup(key) {
  if (R.folded.has(key)) R.folded.delete(key); else R.folded.add(key);
  layoutRows();
}

// Unfolds the group that holds rank r (the heatmap jumps to a rank), and
// shows every replica when r's is filtered away.
export function revealRank(r) {
  if (R.replica >= 0 && replicaOf(r) !== R.replica) showReplica(-1);
  const g = R.groupOf[r];
  if (g >= 0 && R.folded.has(R.groups[g].key)) toggleGroup(R.groups[g].key);
}

export function layoutRows() {
  const n = world();
  R.slot = new Int32Array(n).fill(-1);
  R.groupOf = new Int32Array(n).fill(-1);
  R.rows = [];
  R.groups = [];
  const shown = (r) => R.replica < 0 || replicaOf(r) === R.replica;
  if (R.by === 'rank') {
    for (let r = 0; r < n; r++) if (shown(r)) { R.slot[r] = R.rows.length; R.rows.push({ rank: r }); }
    return;
  }
  const byKey = new Map(), info = new Map(((S.info && S.info.ranks) || []).map((x) => [x.rank, x]));
  for (let r = 0; r < n; r++) {
    if (!shown(r)) continue;
    const k = keyOf(r, info.get(r));
    if (!byKey.has(k)) byKey.set(k, []);
    byKey.get(k).push(r);
  }
  for (const k of [...byKey.keys()].sort((a, b) => a - b)) {
    const g = { key: k, label: `${R.by} ${k}`, ranks: byKey.get(k), slot: R.rows.length };
    const gi = R.groups.length;
    R.groups.push(g);
    R.rows.push({ group: gi });
    for (const r of g.ranks) {
      R.groupOf[r] = gi;
      if (R.folded.has(k)) continue;
      R.slot[r] = R.rows.length;
      R.rows.push({ rank: r });
    }
  }
}

-- schema.sql: the trace database (docs/design.md §7), version 11 (PRAGMA user_version).
-- A new file gets this whole script; an older file is brought up by the
-- migrations in db/db.c (version 1 -> 2: ranks.cupti_dropped, source in
-- events_by_time; 2 -> 3: step_stats.act_peak_bytes; 3 -> 4: step_idle;
-- 4 -> 5: events.name; 5 -> 6: events.optim_bytes, eval_losses;
-- 6 -> 7: events_by_step on (job_id, step, attempt); 7 -> 8: ring_marks;
-- 8 -> 9: events.wait_cpu_ns; 9 -> 10: event_runs for events_by_time;
-- 10 -> 11: step_totals, step_idle_totals, step_idle_wait_dp).
--
-- One writer (the launcher's collector), any number of readers (WAL).
-- Times: every *_ns column is on the job clock: the master node's
-- CLOCK_MONOTONIC in nanoseconds (other nodes' events are shifted by their
-- measured offset, ranks.clock_offset_ns). jobs.t0_ns is the job's start on
-- that clock, so `start_ns - t0_ns` is time since the job started.
--
-- CONTRACT: db/ writes these tables, web/ and users read them; columns may be
-- added, none renamed or removed without a migration and a version bump.

CREATE TABLE IF NOT EXISTS jobs (
  id             INTEGER PRIMARY KEY,
  name           TEXT NOT NULL,          -- run id
  created_at     TEXT NOT NULL,          -- ISO 8601 UTC wall clock
  status         TEXT NOT NULL,          -- running | succeeded | failed | stopped | lost (docs/schema.md)
  nnodes         INTEGER NOT NULL,
  world_size     INTEGER NOT NULL,
  schedule       TEXT NOT NULL,          -- 1f1b, zb-v, csv:FILE ..., or the program's own (ScheduleGPipe)
  microbatches   INTEGER NOT NULL,
  virtual_stages INTEGER NOT NULL,
  stages         INTEGER NOT NULL,
  steps          INTEGER NOT NULL,       -- steps requested
  model          TEXT NOT NULL,          -- canonical model spec
  device         TEXT NOT NULL,          -- cpu | cuda
  config_json    TEXT NOT NULL,          -- every option of the run, as JSON
  t0_ns          INTEGER NOT NULL,       -- job start on the job clock
  ended_at       TEXT,                   -- ISO 8601 UTC, NULL while running
  exit_code      INTEGER,                -- pprun's exit status, NULL while running
  failed_rank    INTEGER,                -- the rank the failure comes from (a hung rank others waited on), NULL if none
  failure        TEXT                    -- one-line root cause, NULL if none
);

CREATE TABLE IF NOT EXISTS ranks (
  job_id          INTEGER NOT NULL REFERENCES jobs(id),
  rank            INTEGER NOT NULL,
  node            INTEGER NOT NULL,
  host            TEXT NOT NULL,
  pid             INTEGER,
  device          TEXT NOT NULL,         -- cpu | cuda:N
  stages          TEXT NOT NULL,         -- stages this rank holds, e.g. "0,7"
  clock_offset_ns INTEGER NOT NULL DEFAULT 0,
  dropped_events  INTEGER NOT NULL DEFAULT 0,
  cupti_dropped   INTEGER NOT NULL DEFAULT 0, -- CUPTI activity records the rank lost (--cupti on; version 2)
  PRIMARY KEY (job_id, rank)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS events (
  id          INTEGER PRIMARY KEY,
  job_id      INTEGER NOT NULL,
  attempt     INTEGER NOT NULL,
  rank        INTEGER NOT NULL,
  step        INTEGER NOT NULL,
  microbatch  INTEGER,                   -- NULL for OPT
  stage       INTEGER,                   -- NULL for OPT
  phase       TEXT NOT NULL,             -- F B W BW SEND_F RECV_F SEND_B RECV_B OPT SPAN EVAL_F EVAL_SEND_F EVAL_RECV_F
  start_ns    INTEGER NOT NULL,
  end_ns      INTEGER NOT NULL,
  peer        INTEGER,                   -- the other rank of a SEND/RECV (or of a SPAN that names one)
  bytes       INTEGER,
  source      TEXT NOT NULL,             -- cpu (host span) | gpu (CUPTI: the op's first kernel start to last kernel end)
  name        TEXT,                      -- SPAN: its name ("data" or "ALLREDUCE"); NULL for every other phase (version 5)
                                         -- (no comma in this comment: SQLite's DROP COLUMN of the next column would trip on it)
  optim_bytes INTEGER,                   -- OPT: how many of its bytes are optimizer state (with --zero1 the shard) or NULL (version 6)
  wait_cpu_ns INTEGER                    -- host records: ns the thread waited for a core since its previous record, else NULL (version 9)
);
-- No index by rank and time: an index entry per row whose key arrival
-- order scatters (a batch holds every rank's rows) cost as much as the row
-- itself (docs/schema.md, "Ingest"); a rank's time windows are found in
-- event_runs, a row per run of its rows, instead (version 10).
-- A step's rows, and its latest attempt's: the analyses read those alone,
-- and find the latest attempt in the index (max(attempt) is one seek). No
-- rank: a batch's rows of a step then go in at one place, the end of the
-- step, rather than at every rank's (1,024 places at 1,024 ranks) (version 7).
CREATE INDEX IF NOT EXISTS events_by_step ON events(job_id, step, attempt);

-- Where a rank's rows are, by time: one row per run of events.id
-- first_id..last_id that holds rows of this rank alone (a batch's rows of
-- one step, rank and source are such a run), with the least start_ns and
-- the greatest end_ns of its rows. A rank's rows in a window [lo, hi) are
-- in the runs with end_ns >= lo AND start_ns < hi, so with end_ns < hi +
-- the job's longest run (event_run_span): a range of this key from lo to
-- there, then a range of rowids each (docs/schema.md, "Timeline window").
-- Written with the rows, in the same transaction (version 10).
CREATE TABLE IF NOT EXISTS event_runs (
  job_id   INTEGER NOT NULL,
  rank     INTEGER NOT NULL,
  end_ns   INTEGER NOT NULL,             -- greatest end_ns of the run's rows
  first_id INTEGER NOT NULL,             -- events.id of its first row
  last_id  INTEGER NOT NULL,             -- and of its last
  start_ns INTEGER NOT NULL,             -- least start_ns of its rows
  source   TEXT NOT NULL,                -- cpu | gpu: the source of every row of the run
  PRIMARY KEY (job_id, rank, end_ns, first_id)
) WITHOUT ROWID;

-- A job's longest run of event_runs (end_ns - start_ns), raised with every
-- batch that holds a longer one: what bounds a window's range of runs
-- above (version 10).
CREATE TABLE IF NOT EXISTS event_run_span (
  job_id  INTEGER PRIMARY KEY,
  span_ns INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS losses (
  job_id     INTEGER NOT NULL,
  step       INTEGER NOT NULL,
  microbatch INTEGER NOT NULL,
  loss       REAL,                       -- NULL: the loss was not a finite number (NaN, +-Inf)
  rank       INTEGER NOT NULL,           -- the last stage's rank
  at_ns      INTEGER NOT NULL,
  PRIMARY KEY (job_id, step, microbatch)
) WITHOUT ROWID;

-- An evaluation step's losses (--eval-every): one row per microbatch of the
-- evaluation that follows training step `step`, microbatch its index over
-- all replicas (version 6).
CREATE TABLE IF NOT EXISTS eval_losses (
  job_id     INTEGER NOT NULL,
  step       INTEGER NOT NULL,           -- the training step the evaluation follows
  microbatch INTEGER NOT NULL,
  loss       REAL,                       -- NULL: not a finite number
  rank       INTEGER NOT NULL,           -- the last stage's rank
  at_ns      INTEGER NOT NULL,
  PRIMARY KEY (job_id, step, microbatch)
) WITHOUT ROWID;

-- The schedule that was meant: each rank's grid (idle cells omitted), and the
-- simulator's timeline for it (sim_start_ns/sim_end_ns from the job's costs:
-- the timed model's, or measured F/B/W medians once a step is done). A
-- program that runs its own schedule (PyTorch's) declares its plan, which
-- replaces the launcher's: a BW action (phase BW) is its full backward.
CREATE TABLE IF NOT EXISTS plan (
  job_id       INTEGER NOT NULL,
  rank         INTEGER NOT NULL,
  slot         INTEGER NOT NULL,         -- column of the grid
  action       TEXT NOT NULL,            -- "0F3", "1BW0"
  stage        INTEGER NOT NULL,
  phase        TEXT NOT NULL,            -- F B W BW
  microbatch   INTEGER NOT NULL,
  sim_start_ns INTEGER,
  sim_end_ns   INTEGER,
  PRIMARY KEY (job_id, rank, slot)
) WITHOUT ROWID;

-- Every kernel and memcpy CUPTI saw (--cupti on); memcpys are named
-- "[memcpy HtoD]" and so on.
CREATE TABLE IF NOT EXISTS kernels (
  job_id    INTEGER NOT NULL,
  rank      INTEGER NOT NULL,
  event_id  INTEGER,                     -- events.id of the gpu span (source 'gpu') of the op it ran in; NULL: none
  name      TEXT NOT NULL,
  start_ns  INTEGER NOT NULL,
  end_ns    INTEGER NOT NULL,
  stream    INTEGER
);
CREATE INDEX IF NOT EXISTS kernels_by_time ON kernels(job_id, rank, start_ns);
CREATE INDEX IF NOT EXISTS kernels_by_event ON kernels(event_id);

-- Analyses, written by the collector as steps complete (every rank has
-- moved past the step) and again for every step at job end; re-running
-- replaces a step's rows. Only the step's latest attempt counts.
-- Per (job, step, rank): the step's span (first compute op start to last
-- compute op end over all ranks of the step, so ranks share one span;
-- compute = F/B/W/BW/OPT host spans: source 'gpu' rows and a program's own
-- SPANs never count), the busy time (union of the rank's compute spans)
-- and the bubble (span - busy), and the most activation bytes the rank
-- held (max `bytes` of its F/B/W host spans; 0: not recorded).
-- Rules in detail: docs/schema.md.
CREATE TABLE IF NOT EXISTS step_stats (
  job_id       INTEGER NOT NULL,
  step         INTEGER NOT NULL,
  rank         INTEGER NOT NULL,
  start_ns     INTEGER NOT NULL,
  end_ns       INTEGER NOT NULL,
  busy_ns      INTEGER NOT NULL,
  bubble_ns    INTEGER NOT NULL,
  bubble_ratio REAL NOT NULL,
  act_peak_bytes INTEGER NOT NULL DEFAULT 0, -- version 3; appended, as the migration adds it
  PRIMARY KEY (job_id, step, rank)
) WITHOUT ROWID;

-- Per idle gap between compute ops on a rank within a step, its cause,
-- the first rule that matches (sum of a rank's gaps = its bubble_ns):
-- warmup (before the rank's first op), cooldown (after its last op),
-- wait_dp (the next op is the OPT and the rank's ALLREDUCE/REDUCE_SCATTER
-- spans cover part of the gap: waiting for the data-parallel all-reduce),
-- comm (at least half the gap is covered by the rank's sends/receives,
-- not counting the receive the next op waits for: RECV_F before an F,
-- RECV_B before a B or BW), wait_activation (the next op is an F of a stage > 0,
-- waiting for its input), wait_gradient (the next op is a B or BW of a stage
-- other than the last, waiting for its output gradient), other.
CREATE TABLE IF NOT EXISTS gaps (
  job_id      INTEGER NOT NULL,
  step        INTEGER NOT NULL,
  rank        INTEGER NOT NULL,
  start_ns    INTEGER NOT NULL,
  end_ns      INTEGER NOT NULL,
  cause       TEXT NOT NULL,
  next_action TEXT,                      -- "1F4" the op that ended the gap, NULL for cooldown
  PRIMARY KEY (job_id, step, rank, start_ns)
) WITHOUT ROWID;

-- Per rank and step, its idle time by cause: the sum of its gaps of that
-- cause (a cause it was never idle for has no row). Written with the gaps;
-- a job's idle time by cause reads these, a few rows a step, rather than
-- every gap (version 4).
CREATE TABLE IF NOT EXISTS step_idle (
  job_id  INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  rank    INTEGER NOT NULL,
  cause   TEXT NOT NULL,
  idle_ns INTEGER NOT NULL,
  PRIMARY KEY (job_id, step, rank, cause)
) WITHOUT ROWID;

-- A rank's wait for the data-parallel all-reduce, by step: what a
-- replica's wait adds up (version 11). Partial: only those rows, so a job
-- without data parallelism has none to read and one with it reads them
-- alone rather than every cause's.
CREATE INDEX IF NOT EXISTS step_idle_wait_dp ON step_idle(job_id, step, rank, idle_ns) WHERE cause = 'wait_dp';

-- Per (job, step), its ranks' step_stats rows summed up (version 11),
-- written with them (db/db.h, DB_STEP_TOTALS_OF): what a step's line of
-- the dashboard, /steps, /summary and /metrics read, a row a step rather
-- than one per rank (docs/schema.md, "step_totals").
CREATE TABLE IF NOT EXISTS step_totals (
  job_id            INTEGER NOT NULL,
  step              INTEGER NOT NULL,
  ranks             INTEGER NOT NULL, -- step_stats rows: the step is complete at jobs.world_size
  start_ns          INTEGER NOT NULL,
  end_ns            INTEGER NOT NULL,
  bubble_ratio_mean REAL NOT NULL,
  bubble_ratio_min  REAL NOT NULL,
  bubble_ratio_max  REAL NOT NULL,
  act_peak_bytes_max INTEGER NOT NULL,
  PRIMARY KEY (job_id, step)
) WITHOUT ROWID;

-- Per (job, step, cause), its ranks' step_idle rows summed (version 11).
CREATE TABLE IF NOT EXISTS step_idle_totals (
  job_id  INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  cause   TEXT NOT NULL,
  idle_ns INTEGER NOT NULL,
  PRIMARY KEY (job_id, step, cause)
) WITHOUT ROWID;

-- Counters the collector keeps up to date (ingest rate, drops) for /metrics.
CREATE TABLE IF NOT EXISTS job_counters (
  job_id          INTEGER PRIMARY KEY,
  events_ingested INTEGER NOT NULL DEFAULT 0,
  events_dropped  INTEGER NOT NULL DEFAULT 0,
  updated_at_ns   INTEGER NOT NULL DEFAULT 0
);

-- How far the collector stored each trace ring (docs/schema.md,
-- "ring_marks"): pos is the ring's read position after the records stored
-- with it, in the same transaction; `pprun salvage` starts there.
CREATE TABLE IF NOT EXISTS ring_marks (
  job_id INTEGER NOT NULL,
  ring   INTEGER NOT NULL, -- the ring's random id
  rank   INTEGER NOT NULL,
  pos    INTEGER NOT NULL,
  PRIMARY KEY (job_id, ring)
) WITHOUT ROWID;

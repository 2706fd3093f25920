// sql-tab.js: the SQL tab: a read-only query over the database (POST
// /api/sql), its rows as a table, SQLite's error message when refused. Its
// example query is about the job open, until it is edited.
import { api } from './api.js';
import { $, headerRow } from './util.js';
import { probe } from './probe.js';

let sqlExample = null; // the example query as last written, for the job open

// Run: the button, or Ctrl+Enter in the query.
export function setupSql() {
  sqlExample = $('sql-text').value;
  $('sql-run').onclick = runSql;
  $('sql-text').addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) runSql(); });
}

// The example query, about job id (unless it was edited).
export function showSqlExample(id) {
  const sql = $('sql-text');
  if (sql.value === sqlExample) sqlExample = sql.value = sql.defaultValue.replace(/job_id = \d+/, `job_id = ${Number(id)}`);
}

async function runSql() {
  const err = $('sql-error'), tbl = $('sql-result'), info = $('sql-info');
  err.hidden = true; info.textContent = 'running…';
  try {
    const r = await api('/api/sql', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ sql: $('sql-text').value }) });
    tbl.innerHTML = '';
    headerRow(tbl, r.columns);
    const body = tbl.createTBody();
    for (const row of r.rows) {
      const tr = body.insertRow();
      for (const v of row) { const td = tr.insertCell(); td.textContent = v == null ? 'NULL' : String(v); if (typeof v === 'number') td.className = 'num'; }
    }
    info.textContent = `${r.row_count} rows${r.truncated ? ' (cut at the row limit)' : ''} · ${r.elapsed_ms.toFixed(1)} ms`;
    probe.sqlRows = r.rows.length;
  } catch (e) {
    err.textContent = e.message; err.hidden = false; info.textContent = '';
    tbl.innerHTML = ''; // the previous query's rows would read as this one's
    probe.sqlRows = 0;
  }
}

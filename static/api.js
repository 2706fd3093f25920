// api.js: the server's JSON API (docs/api.md) and its live stream, with the
// bearer token when the page was opened with one (#token=T, kept for the
// tab's session).
//
// The live stream (/api/jobs/{id}/live) is Server-Sent Events read through
// fetch, not EventSource, so that the token can be sent as a header; after
// a disconnect it resumes with Last-Event-ID.

const token = (() => {
  const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (m) { sessionStorage.setItem('pprun-token', decodeURIComponent(m[1])); history.replaceState(null, '', location.pathname); }
  return sessionStorage.getItem('pprun-token');
})();

export function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h['Authorization'] = 'Bearer ' + token;
  return h;
}

export async function api(path, opts) {
  const o = Object.assign({}, opts || {});
  o.headers = headers(o.headers);
  const r = await fetch(path, o);
  let body = null;
  try { body = await r.json(); } catch (e) { body = { error: 'not JSON (' + r.status + ')' }; }
  if (!r.ok) { const err = new Error(body && body.error || ('HTTP ' + r.status)); err.status = r.status; throw err; }
  return body;
}

// ---- live stream (SSE over fetch) -------------------------------------------

// Reads the job's stream until the returned controller is aborted; each
// frame goes to its handler in on: hello (once, the cursor is fixed: also
// when the stream cannot be opened), status, events, step and losses.
export function openStream(id, on) {
  const ctl = new AbortController();
  let lastId = null, helloSeen = false;
  const handle = (ev, data, mid) => {
    if (mid) lastId = mid;
    const d = JSON.parse(data);
    if (ev === 'hello') { if (!helloSeen) { helloSeen = true; on.hello(); } }
    else if (ev === 'status') on.status(d);
    else if (ev === 'events') on.events(d.events);
    else if (ev === 'step') on.step(d);
    else if (ev === 'losses') on.losses(d.losses);
  };
  (async () => {
    while (!ctl.signal.aborted) {
      try {
        const h = headers({ Accept: 'text/event-stream' });
        if (lastId) h['Last-Event-ID'] = lastId;
        const r = await fetch(`/api/jobs/${id}/live`, { headers: h, signal: ctl.signal });
        if (!r.ok) throw new Error('live ' + r.status);
        if (lastId && !helloSeen) { helloSeen = true; on.hello(); }
        const rd = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await rd.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let k;
          while ((k = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, k); buf = buf.slice(k + 2);
            let ev = 'message', data = '', mid = null;
            for (const line of frame.split('\n')) {
              if (line.startsWith('event: ')) ev = line.slice(7);
              else if (line.startsWith('data: ')) data += line.slice(6);
              else if (line.startsWith('id: ')) mid = line.slice(4);
            }
            if (data) handle(ev, data, mid);
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        if (!helloSeen) { helloSeen = true; on.hello(); }
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  return ctl;
}

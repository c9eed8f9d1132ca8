// probeBroker checks a broker URL before the options page saves it: it
// opens the WebSocket there (and closes it at once, before hello), and when
// that fails asks the same address over HTTP what is wrong, since a browser
// says nothing of why a WebSocket failed.

/** httpURLOf is the http(s) URL of a ws(s) URL. */
export function httpURLOf(wsUrl) {
  return wsUrl.replace(/^ws(s?):/, 'http$1:');
}

/**
 * diagnoseBroker asks over HTTP why a WebSocket to wsUrl did not open:
 * {ok: false, reason, message}, reason "unreachable" (nothing answered),
 * "wrong_path" (a server answered 404 there) or "refused" (a server
 * answered, but not with a WebSocket).
 */
export async function diagnoseBroker(wsUrl, fetch) {
  const url = httpURLOf(wsUrl);
  let r;
  try {
    r = await fetch(url, { method: 'GET', cache: 'no-store', credentials: 'omit' });
  } catch {
    return { ok: false, reason: 'unreachable', message: `nothing answers at ${new URL(url).host}: is the broker running there, and is the host and port right?` };
  }
  if (r.status === 404) {
    return { ok: false, reason: 'wrong_path', message: `${new URL(url).host} answered, but has nothing at ${new URL(url).pathname} (HTTP 404): is the path right?` };
  }
  return { ok: false, reason: 'refused', message: `${url} answered HTTP ${r.status} but did not accept the WebSocket: is this a Cheetah broker?` };
}

/**
 * probeBroker resolves {ok: true} when the WebSocket opened, else
 * {ok: false, reason, message}: reason "unreachable" (nothing answered),
 * "wrong_path" (a server answered 404 there) or "refused" (a server
 * answered, but not with a WebSocket).
 */
export function probeBroker(wsUrl, { WebSocket, fetch, timeoutMs = 5000, timers = globalThis }) {
  return new Promise((resolve) => {
    let ws;
    let done = false;
    const finish = (v) => {
      if (done) return;
      done = true;
      timers.clearTimeout(timer);
      if (ws) ws.onopen = ws.onclose = ws.onerror = null;
      resolve(v);
    };
    const diagnose = async () => finish(await diagnoseBroker(wsUrl, fetch));
    const timer = timers.setTimeout(() => {
      try {
        ws?.close();
      } catch {
        // closing a socket that never opened
      }
      finish({ ok: false, reason: 'unreachable', message: `no answer from ${wsUrl} within ${timeoutMs / 1000} s` });
    }, timeoutMs);
    try {
      ws = new WebSocket(wsUrl);
    } catch (e) {
      finish({ ok: false, reason: 'refused', message: `cannot open ${wsUrl}: ${e?.message ?? e}` });
      return;
    }
    ws.onopen = () => {
      ws.close(1000, 'checked');
      finish({ ok: true });
    };
    ws.onclose = () => {
      if (!done) diagnose();
    };
    ws.onerror = () => {}; // a close event follows
  });
}

// Executor runs command frames on worker tabs: it acknowledges each command,
// runs the commands of one tab one at a time in arrival order, bounds each
// by its deadline, and answers with exactly one terminal frame (result or
// error with a code), unless the response mode is "none". The browser is
// behind a small adapter (see chrome_browser.js), so the Node tests run the
// executor against a fake one.

import { checkParams, deadlineFor } from './commands.js';
import {
  CODES, CommandError, DEFAULT_MAX_MESSAGE_BYTES, ackFrame, captureFrame, errorFrame,
  frameFits, resultFrame, tabIdForContext, truncateUtf8, utf8Length,
} from './protocol.js';
import { pageClick, pageExtract, pageInfo, pageQuery, pageType } from './page.js';
import { SerialQueues } from './queue.js';

// Room left in a result frame for everything but extracted content.
const FRAME_OVERHEAD = 4096;

/**
 * commandTab returns the worker tab a command is for. A context is one tab,
 * so an explicit target must name that same tab: a command can never reach
 * another tab (another task's, or a person's) through target.tab_id.
 */
export function commandTab(cmd) {
  const own = tabIdForContext(cmd.context_id);
  if (own === null) {
    throw new CommandError(CODES.NO_SUCH_TAB, `context ${String(cmd.context_id).slice(0, 128)} is not a tab of this extension`);
  }
  const t = cmd.target;
  if (t && typeof t === 'object' && t.tab_id !== undefined && t.tab_id !== null && String(t.tab_id) !== String(own)) {
    throw new CommandError(CODES.NO_SUCH_TAB,
      `target tab ${String(t.tab_id).slice(0, 32)} is not the context's tab (${own}); a command may only drive its own context's tab`);
  }
  return own;
}

/** pngSize reads the width and height from a base64 PNG's header. */
export function pngSize(b64) {
  try {
    const head = atob(b64.slice(0, 44));
    if (head.slice(1, 4) !== 'PNG' || head.slice(12, 16) !== 'IHDR') return {};
    const u32 = (o) => ((head.charCodeAt(o) << 24) >>> 0) + (head.charCodeAt(o + 1) << 16) + (head.charCodeAt(o + 2) << 8) + head.charCodeAt(o + 3);
    return { width: u32(16), height: u32(20) };
  } catch {
    return {};
  }
}

/** base64Bytes is the decoded size of standard padded base64. */
export function base64Bytes(b64) {
  const pad = b64.endsWith('==') ? 2 : b64.endsWith('=') ? 1 : 0;
  return (b64.length / 4) * 3 - pad;
}

/**
 * bounded settles with p, or rejects with the signal's reason as soon as the
 * signal aborts: no browser call can hold a command past its deadline, even
 * one that never answers.
 */
export function bounded(p, signal) {
  if (!signal) return p;
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      p.catch(() => {});
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      p.catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    p.then((v) => {
      signal.removeEventListener('abort', onAbort);
      resolve(v);
    }, (e) => {
      signal.removeEventListener('abort', onAbort);
      reject(e);
    });
  });
}

/** toErrorFrame turns anything thrown while running a command into its frame. */
export function toErrorFrame(commandId, e) {
  if (e instanceof CommandError || (e && typeof e.code === 'string' && e.name === 'CommandError')) {
    return errorFrame(commandId, e.code, e.message, e.data);
  }
  return errorFrame(commandId, CODES.COMMAND_FAILED, String(e?.message ?? e));
}

export class Executor {
  constructor({
    browser, send, isWorker, now = () => Date.now(), timers = globalThis,
    maxMessageBytes = () => DEFAULT_MAX_MESSAGE_BYTES, pollMs = 100, log = () => {},
  }) {
    Object.assign(this, { browser, send, isWorker, now, timers, maxMessageBytes, pollMs, log });
    this.queues = new SerialQueues();
    this.inflight = new Map(); // command_id → {ac, tabKey}
  }

  /** pending is how many commands of a tab are queued or running. */
  pending(tabId) {
    return this.queues.pending(tabId);
  }

  /** idle resolves when no command is queued or running. */
  idle() {
    return this.queues.idle();
  }

  /**
   * handleCommand acknowledges cmd at once and queues it behind the tab's
   * earlier commands. The returned promise settles once its terminal frame
   * was sent (tests wait on it; the service worker does not).
   */
  handleCommand(cmd) {
    const id = cmd.command_id;
    this.send(ackFrame(id));
    const deadline = deadlineFor(this.now(), cmd.timeout_ms, undefined);
    const ac = new AbortController();
    let tabId = null;
    let early = null;
    try {
      tabId = commandTab(cmd);
    } catch (e) {
      early = e;
    }
    const key = tabId ?? `context:${cmd.context_id}`;
    this.inflight.set(id, { ac, key });
    return this.queues.run(key, async () => {
      let terminal;
      let after = null;
      try {
        if (early) throw early;
        if (ac.signal.aborted) throw ac.signal.reason;
        if (!this.isWorker(tabId)) {
          throw new CommandError(CODES.NO_SUCH_TAB, `tab ${tabId} is not one of this extension's worker tabs`);
        }
        const params = checkParams(cmd.name, cmd.params);
        const end = Math.min(deadline, deadlineFor(this.now(), cmd.timeout_ms, params.timeout_ms));
        if (this.now() >= end) {
          throw new CommandError(CODES.TIMEOUT, 'the command waited behind earlier commands of its tab until its deadline');
        }
        const budget = end - this.now();
        const timer = this.timers.setTimeout(() => ac.abort(new CommandError(CODES.TIMEOUT,
          `${cmd.name} did not finish within ${budget} ms`)), budget);
        try {
          const out = await this.run(cmd, tabId, params, ac.signal, end);
          terminal = resultFrame(id, out.data);
          after = out.after ?? null;
        } finally {
          this.timers.clearTimeout(timer);
        }
      } catch (e) {
        terminal = toErrorFrame(id, ac.signal.aborted && !(e instanceof CommandError) ? ac.signal.reason : e);
      } finally {
        this.inflight.delete(id);
      }
      if (cmd.response_mode !== 'none') this.send(terminal);
      if (after) {
        try {
          await after();
        } catch (e) {
          this.log('after', cmd.name, e);
        }
      }
    });
  }

  /** handleCancel aborts a queued or running command; it still answers. */
  handleCancel(f) {
    const entry = this.inflight.get(f.command_id);
    if (!entry) return false;
    entry.ac.abort(new CommandError(CODES.CANCELLED, `cancelled${f.reason ? ': ' + f.reason : ''}`));
    return true;
  }

  async run(cmd, tabId, p, signal, deadline) {
    switch (cmd.name) {
      case 'navigate': return { data: await this.navigate(tabId, p, signal) };
      case 'reload': return { data: await this.reload(tabId, p, signal) };
      case 'extract': return { data: await this.extract(tabId, p, signal, deadline) };
      case 'click': return { data: await this.page(tabId, pageClick, [p.selector], signal, deadline) };
      case 'type': return { data: await this.page(tabId, pageType, [p.selector, p.text, p.clear, p.submit], signal, deadline) };
      case 'wait_for': return { data: await this.waitFor(tabId, p, signal, deadline) };
      case 'screenshot': return { data: await this.screenshot(cmd.command_id, tabId, signal) };
      case 'close':
        return { data: { closed: true, tab_id: String(tabId) }, after: () => this.browser.closeTab(tabId) };
    }
    throw new CommandError(CODES.UNSUPPORTED_COMMAND, `no command "${cmd.name}"`);
  }

  async navigate(tabId, p, signal) {
    try {
      await bounded(this.browser.navigate(tabId, p.url, { signal }), signal);
    } catch (e) {
      // A page that never loads must not leave the tab hanging for the next
      // command: stop it before answering.
      if (signal.aborted) await this.browser.stopLoading(tabId).catch(() => {});
      throw e;
    }
    return this.where(tabId, p.url, signal);
  }

  async reload(tabId, p, signal) {
    try {
      await bounded(this.browser.reload(tabId, { bypassCache: p.bypass_cache, signal }), signal);
    } catch (e) {
      if (signal.aborted) await this.browser.stopLoading(tabId).catch(() => {});
      throw e;
    }
    return this.where(tabId, undefined, signal);
  }

  /**
   * where says the URL and title the tab shows after a load. A tab showing
   * Chrome's error page failed to navigate. A page the extension may not
   * script (about:blank) is described from the tab itself.
   */
  async where(tabId, requested, signal) {
    try {
      const r = await bounded(this.browser.runInPage(tabId, pageInfo, []), signal);
      return { url: r.url, title: r.title };
    } catch (e) {
      if (e?.code === CODES.NAVIGATION_FAILED) {
        const t = await this.browser.tabInfo(tabId).catch(() => ({}));
        throw new CommandError(CODES.NAVIGATION_FAILED,
          `${t.url ?? requested ?? 'the page'} did not load (the tab shows the browser's error page)`,
          { url: t.url ?? requested });
      }
      if (e?.code === CODES.NOT_SCRIPTABLE) {
        const t = await this.browser.tabInfo(tabId).catch(() => ({}));
        return { url: t.url ?? requested ?? '', title: t.title ?? '' };
      }
      throw e;
    }
  }

  /**
   * page runs a page function, retrying while the page is between documents
   * (a navigation replaced the frame the script went to), and turns an
   * {ok: false} answer into its CommandError.
   */
  async page(tabId, fn, args, signal, deadline) {
    for (;;) {
      let r;
      try {
        r = await bounded(this.browser.runInPage(tabId, fn, args), signal);
      } catch (e) {
        if (e?.transient && !signal.aborted && this.now() + this.pollMs < deadline) {
          await this.sleep(this.pollMs, signal);
          continue;
        }
        throw e;
      }
      if (signal.aborted) throw signal.reason;
      if (!r || typeof r !== 'object') throw new CommandError(CODES.COMMAND_FAILED, 'the page script returned nothing');
      if (!r.ok) throw new CommandError(r.code || CODES.COMMAND_FAILED, r.message || 'the page script failed');
      const { ok, ...data } = r;
      return data;
    }
  }

  async extract(tabId, p, signal, deadline) {
    const frameRoom = this.maxMessageBytes() - FRAME_OVERHEAD;
    let limit = Math.max(0, Math.min(p.max_bytes, frameRoom));
    // One UTF-16 unit is at least one byte of UTF-8, so limit + 1 units are
    // enough to know whether the content is longer than limit bytes.
    const r = await this.page(tabId, pageExtract, [p.selector ?? null, p.format, limit + 1], signal, deadline);
    for (;;) {
      const cut = truncateUtf8(r.content, limit);
      const truncated = cut.truncated || r.length > r.content.length;
      const data = {
        url: r.url, title: r.title, format: p.format, content: cut.text, bytes: cut.bytes, truncated,
      };
      if (p.selector) data.selector = p.selector;
      // JSON escapes can make the frame bigger than its content; shrink
      // until the result fits the broker's frame limit.
      if (frameFits(resultFrame('x'.repeat(40), data), this.maxMessageBytes()) || limit === 0) return data;
      limit = Math.floor(limit * 0.75);
    }
  }

  async waitFor(tabId, p, signal, deadline) {
    for (;;) {
      let r = null;
      try {
        r = await bounded(this.browser.runInPage(tabId, pageQuery, [p.selector, p.visible]), signal);
      } catch (e) {
        if (e?.code === CODES.NO_SUCH_TAB || signal.aborted) throw signal.aborted ? signal.reason : e;
        // Loading, between documents or on an error page: not there yet.
      }
      if (r && !r.ok && r.code === CODES.INVALID_PARAMS) throw new CommandError(r.code, r.message);
      if (r && r.ok && r.found) return { url: r.url, title: r.title, selector: p.selector };
      if (signal.aborted) throw signal.reason;
      if (this.now() + this.pollMs >= deadline) {
        await this.sleep(Math.max(0, deadline - this.now()), signal);
        throw new CommandError(CODES.TIMEOUT, `no element matched "${p.selector}"${p.visible ? ' visibly' : ''} in time`);
      }
      await this.sleep(this.pollMs, signal);
    }
  }

  async screenshot(commandId, tabId, signal) {
    const b64 = await bounded(this.browser.capture(tabId, { signal }), signal);
    if (signal.aborted) throw signal.reason;
    const frame = captureFrame(commandId, 'image/png', b64);
    if (!frameFits(frame, this.maxMessageBytes())) {
      throw new CommandError(CODES.TOO_LARGE,
        `the screenshot (${utf8Length(b64)} bytes of base64) is larger than the broker's max_message_bytes`);
    }
    this.send(frame);
    return { mime: 'image/png', bytes: base64Bytes(b64), ...pngSize(b64) };
  }

  /** sleep waits ms, or rejects with the signal's reason when it aborts. */
  sleep(ms, signal) {
    return new Promise((resolve, reject) => {
      if (signal.aborted) {
        reject(signal.reason);
        return;
      }
      const onAbort = () => {
        this.timers.clearTimeout(t);
        reject(signal.reason);
      };
      const t = this.timers.setTimeout(() => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }
}

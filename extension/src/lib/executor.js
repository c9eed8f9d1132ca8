// Executor runs command frames on worker tabs: it acknowledges each command,
// runs the commands of one tab one at a time in arrival order, bounds each
// by its deadline, and answers with exactly one terminal frame (result or
// error with a code), unless the response mode is "none". The browser is
// behind a small adapter (see chrome_browser.js), so the Node tests run the
// executor against a fake one.

import { checkOptions, checkParams, deadlineFor, keyEvent } from './commands.js';
import {
  CODES, CommandError, DEFAULT_MAX_MESSAGE_BYTES, ackFrame, captureFrame, errorFrame, eventFrame,
  frameFits, progressFrame, resultFrame, tabIdForContext, truncateUtf8, utf8Length,
} from './protocol.js';
import { pageInfo, pageRun } from './page.js';
import { SerialQueues } from './queue.js';

// How long after a click or type a navigation it caused may take to start.
export const ACTION_NAV_GRACE_MS = 500;

// Room left in a result frame for everything but extracted content.
const FRAME_OVERHEAD = 4096;

/**
 * commandTab returns the worker tab a command is for. A context is one tab,
 * so an explicit target must name that same tab: a command can never reach
 * another tab (another task's, or a person's) through target.tab_id.
 */
export function commandTab(cmd, parentOf = () => null) {
  const own = tabIdForContext(cmd.context_id);
  if (own === null) {
    throw new CommandError(CODES.NO_SUCH_TAB, `context ${String(cmd.context_id).slice(0, 128)} is not a tab of this extension`);
  }
  const t = cmd.target;
  if (t && typeof t === 'object' && t.tab_id !== undefined && t.tab_id !== null && String(t.tab_id) !== String(own)) {
    // A tab the context's page opened (a popup) may be driven during the
    // lease.
    const child = /^[0-9]{1,15}$/.test(String(t.tab_id)) ? Number(t.tab_id) : null;
    if (child !== null && parentOf(child) === own) return child;
    throw new CommandError(CODES.NO_SUCH_TAB,
      `target tab ${String(t.tab_id).slice(0, 32)} is neither the context's tab (${own}) nor a tab it opened; a command may only drive those`);
  }
  return own;
}

/** utf8Base64 is the base64 of a string's UTF-8 bytes. */
export function utf8Base64(s) {
  const bytes = new TextEncoder().encode(s);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
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
    parentOf = () => null, evaluateEnabled = () => false, onCommand = () => {},
  }) {
    Object.assign(this, { browser, send, isWorker, now, timers, maxMessageBytes, pollMs, log, parentOf, evaluateEnabled, onCommand });
    this.queues = new SerialQueues();
    this.inflight = new Map(); // command_id → {ac, tabKey}
    this.running = new Map(); // tabId → {id, options} of the command running there
    this.dialogs = new Map(); // tabId → the dialog policy the tab's last command set
    this.unreported = new Map(); // tabId → popups it opened while no command ran
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
   * emit sends an event of a tab to the command running there, if it asked
   * for that kind (popups are always reported: they name a tab the command
   * may target). A download also comes back as a capture of its bytes.
   */
  emit(tabId, kind, data) {
    const cur = this.running.get(tabId) ?? this.running.get(this.parentOf(tabId));
    if (!cur || cur.done) {
      // A popup that opened between commands is told to the next one.
      if (kind === 'popup') {
        const owner = this.parentOf(tabId) ?? tabId;
        this.unreported.set(owner, [...(this.unreported.get(owner) ?? []), data]);
      }
      return;
    }
    if (kind === 'download') {
      cur.pendingWork.push(this.download(cur, data));
      return;
    }
    if (kind === 'popup' || cur.options.events.has(kind)) this.send(eventFrame(cur.id, kind, data));
  }

  /** download fetches a cancelled download's bytes and sends them as a capture. */
  async download(cur, info) {
    const room = Math.floor((this.maxMessageBytes() - FRAME_OVERHEAD) * 3 / 4);
    let ev = { ...info };
    try {
      const got = await this.browser.fetchBytes(info.url, room);
      if (got.too_large) {
        ev = { ...ev, state: 'cancelled', reason: `larger than the broker's max_message_bytes allows (${room} bytes)` };
      } else {
        if (!cur.done) this.send(captureFrame(cur.id, got.mime, got.data));
        ev = { ...ev, name: ev.name ?? got.name ?? null, state: 'captured', mime: got.mime, bytes: got.bytes };
      }
    } catch (e) {
      ev = { ...ev, state: 'cancelled', reason: String(e?.message ?? e) };
    }
    if (!cur.done) this.send(eventFrame(cur.id, 'download', ev));
    return ev;
  }

  /** dialogPolicy says how to answer a dialog on a tab. */
  dialogPolicy(tabId) {
    const cur = this.running.get(tabId);
    const o = cur?.options?.dialogs ? cur.options : this.dialogs.get(tabId);
    return { accept: o?.dialogs === 'accept', prompt_text: o?.prompt_text };
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
      tabId = commandTab(cmd, this.parentOf);
    } catch (e) {
      early = e;
    }
    const key = tabId ?? `context:${cmd.context_id}`;
    this.inflight.set(id, { ac, key });
    return this.queues.run(key, async () => {
      let terminal;
      let after = null;
      let cur = null;
      try {
        if (early) throw early;
        if (ac.signal.aborted) throw ac.signal.reason;
        if (!this.isWorker(tabId) && this.parentOf(tabId) === null) {
          throw new CommandError(CODES.NO_SUCH_TAB, `tab ${tabId} is not one of this extension's worker tabs`);
        }
        const params = checkParams(cmd.name, cmd.params);
        const options = checkOptions(cmd.options);
        const end = Math.min(deadline, deadlineFor(this.now(), cmd.timeout_ms, params.timeout_ms));
        if (this.now() >= end) {
          throw new CommandError(CODES.TIMEOUT, 'the command waited behind earlier commands of its tab until its deadline');
        }
        cur = { id, options, pendingWork: [], done: false };
        this.running.set(tabId, cur);
        for (const data of this.unreported.get(tabId) ?? []) this.send(eventFrame(id, 'popup', data));
        this.unreported.delete(tabId);
        if (options.dialogs) this.dialogs.set(tabId, options);
        await this.onCommand(tabId, cmd);
        const budget = end - this.now();
        const timer = this.timers.setTimeout(() => ac.abort(new CommandError(CODES.TIMEOUT,
          `${cmd.name} did not finish within ${budget} ms`)), budget);
        try {
          const out = await this.run(cmd, tabId, params, ac.signal, end);
          if (cur.pendingWork.length) await bounded(Promise.all(cur.pendingWork), ac.signal);
          await this.captures(id, tabId, options.capture, ac.signal);
          terminal = resultFrame(id, out.data);
          after = out.after ?? null;
        } finally {
          this.timers.clearTimeout(timer);
        }
      } catch (e) {
        terminal = toErrorFrame(id, ac.signal.aborted && !(e instanceof CommandError) ? ac.signal.reason : e);
      } finally {
        this.inflight.delete(id);
        if (cur) {
          cur.done = true;
          if (this.running.get(tabId) === cur) this.running.delete(tabId);
        }
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

  /**
   * clearState queues the clearing of tabId's state (a lease's clear_state)
   * behind the tab's earlier commands and ahead of any command that comes
   * after it, and resolves with the origins it cleared.
   */
  clearState(tabId, origins) {
    return this.queues.run(tabId, () => this.browser.clearState(tabId, origins));
  }

  /** handleCancel aborts a queued or running command; it still answers. */
  handleCancel(f) {
    const entry = this.inflight.get(f.command_id);
    if (!entry) return false;
    entry.ac.abort(new CommandError(CODES.CANCELLED, `cancelled${f.reason ? ': ' + f.reason : ''}`));
    return true;
  }

  /** captures sends what options.capture asked for, after the command ran. */
  async captures(id, tabId, want, signal) {
    if (want.screenshot) {
      const shot = await bounded(this.browser.capture(tabId, { signal, format: 'png' }), signal);
      this.sendCapture(id, 'image/png', shot.data, 'the screenshot');
    }
    if (want.html || want.text) {
      for (const format of ['html', 'text']) {
        if (!want[format]) continue;
        const r = await this.page(tabId, 'extract', { format, maxChars: Number.MAX_SAFE_INTEGER }, signal, Infinity);
        this.sendCapture(id, format === 'html' ? 'text/html' : 'text/plain', utf8Base64(r.content), `the page's ${format}`);
      }
    }
  }

  sendCapture(id, mime, b64, what) {
    const frame = captureFrame(id, mime, b64);
    if (!frameFits(frame, this.maxMessageBytes())) {
      throw new CommandError(CODES.TOO_LARGE, `${what} (${utf8Length(b64)} bytes of base64) is larger than the broker's max_message_bytes`);
    }
    this.send(frame);
  }

  async run(cmd, tabId, p, signal, deadline) {
    const el = { selector: p.selector, frame: p.frame };
    switch (cmd.name) {
      case 'navigate':
      case 'reload':
      case 'back':
      case 'forward':
        return { data: await this.navigate(cmd, tabId, p, signal, deadline) };
      case 'extract': return { data: await this.extract(tabId, p, signal, deadline) };
      case 'parse': {
        const r = await this.page(tabId, 'parse', { fields: p.fields, frame: p.frame }, signal, deadline);
        return { data: { data: r.data } };
      }
      case 'click':
      case 'type':
        return { data: await this.action(cmd.name, tabId, p, signal, deadline) };
      case 'press': {
        if (p.selector) await this.page(tabId, 'focus', el, signal, deadline);
        await bounded(this.browser.press(tabId, { ...keyEvent(p.key), modifiers: p.modifiers }), signal);
        return { data: {} };
      }
      case 'hover': {
        const r = await this.page(tabId, 'hover', el, signal, deadline);
        await bounded(this.browser.mouseMove(tabId, r.x, r.y), signal);
        return { data: {} };
      }
      case 'scroll': {
        const r = await this.page(tabId, 'scroll', { ...el, x: p.x, y: p.y }, signal, deadline);
        return { data: { x: r.x, y: r.y } };
      }
      case 'select': {
        const r = await this.page(tabId, 'select', { ...el, by: p.by, options: p.options }, signal, deadline);
        return { data: { selected: r.selected } };
      }
      case 'check':
      case 'uncheck': {
        const r = await this.page(tabId, 'check', { ...el, checked: cmd.name === 'check' }, signal, deadline);
        return { data: { checked: r.checked } };
      }
      case 'upload': {
        const r = await this.page(tabId, 'upload', { ...el, files: p.files }, signal, deadline);
        return { data: { files: r.files } };
      }
      case 'wait_for': return { data: await this.waitFor(tabId, p, signal, deadline) };
      case 'evaluate': {
        if (!this.evaluateEnabled()) {
          throw new CommandError(CODES.NOT_ENABLED, 'evaluate runs code in the worker\'s pages: the person must enable it in the extension\'s options');
        }
        const value = await bounded(this.browser.evaluate(tabId, p.expression, p.args), signal);
        return { data: { value: value ?? null } };
      }
      case 'screenshot': return { data: await this.screenshot(cmd.command_id, tabId, p, signal, deadline) };
      case 'pdf': {
        const b64 = await bounded(this.browser.pdf(tabId, { landscape: p.landscape, printBackground: p.print_background }), signal);
        this.sendCapture(cmd.command_id, 'application/pdf', b64, 'the PDF');
        return { data: { bytes: base64Bytes(b64) } };
      }
      case 'cookies':
        return { data: { cookies: await bounded(this.browser.cookies(await this.urls(tabId, p.urls)), signal) } };
      case 'set_cookies': {
        const here = await this.browser.tabInfo(tabId);
        const dflt = /^https?:/.test(here.url ?? '') ? here.url : undefined;
        return { data: { set: await bounded(this.browser.setCookies(p.cookies, dflt), signal) } };
      }
      case 'clear_cookies':
        return { data: { cleared: await bounded(this.browser.clearCookies(await this.urls(tabId, p.urls)), signal) } };
      case 'storage': {
        const r = await this.page(tabId, 'storage', { kind: p.kind }, signal, deadline);
        return { data: { items: r.items } };
      }
      case 'set_storage':
        await this.page(tabId, 'storage', { kind: p.kind, set: p.items }, signal, deadline);
        return { data: {} };
      case 'clear_storage':
        await this.page(tabId, 'storage', { kind: p.kind, clear: p.items ?? true }, signal, deadline);
        return { data: {} };
      case 'close':
        return { data: { closed: true, tab_id: String(tabId) }, after: () => this.browser.closeTab(tabId) };
    }
    throw new CommandError(CODES.UNSUPPORTED_COMMAND, `no command "${cmd.name}"`);
  }

  /** urls is the cookie commands' urls, by default the tab's own. */
  async urls(tabId, given) {
    if (given) return given;
    const t = await this.browser.tabInfo(tabId);
    if (!/^https?:/.test(t.url ?? '')) {
      throw new CommandError(CODES.INVALID_PARAMS, 'the tab shows no web page: name the urls whose cookies are meant');
    }
    return [t.url];
  }

  /**
   * navigate runs navigate, reload, back and forward: progress messages for
   * each phase, and at the deadline what did load (partial) rather than an
   * error, once a document committed.
   */
  async navigate(cmd, tabId, p, signal, deadline) {
    const budget = deadline - this.now();
    const opts = {
      signal, waitUntil: p.wait_until, softDeadline: Date.now() + budget - Math.min(300, Math.floor(budget / 4)),
      onPhase: (phase) => this.send(progressFrame(cmd.command_id, { phase })),
    };
    let nav;
    try {
      const b = this.browser;
      nav = await bounded(
        cmd.name === 'navigate' ? b.navigate(tabId, p.url, opts)
          : cmd.name === 'reload' ? b.reload(tabId, { bypassCache: p.bypass_cache, ...opts })
            : b.history(tabId, cmd.name === 'back' ? -1 : 1, opts),
        signal);
    } catch (e) {
      // A page that never loads must not leave the tab hanging for the next
      // command: stop it before answering.
      if (signal.aborted || e?.code === CODES.TIMEOUT) await this.browser.stopLoading(tabId).catch(() => {});
      throw e;
    }
    nav = nav ?? {};
    if (nav.partial) await this.browser.stopLoading(tabId).catch(() => {});
    const here = await this.where(tabId, p.url, signal);
    if (cmd.name === 'back' || cmd.name === 'forward') return here;
    const out = { ...here, status: nav.status ?? null, redirects: nav.redirects ?? [], partial: Boolean(nav.partial) };
    if (nav.download) out.download = nav.download;
    return out;
  }

  /**
   * action runs click or type, following the navigation it causes: with
   * wait_until it waits for that navigation to reach the state (when one
   * starts within a short grace); without, it says whether one started.
   */
  async action(name, tabId, p, signal, deadline) {
    const args = name === 'click'
      ? { selector: p.selector, frame: p.frame, button: p.button, clickCount: p.click_count }
      : { selector: p.selector, frame: p.frame, text: p.text, clear: p.clear, submit: p.submit };
    const budget = deadline - this.now();
    const nav = await bounded(this.browser.navigation(tabId, () => this.page(tabId, name, args, signal, deadline), {
      signal, waitUntil: p.wait_until ?? null, graceMs: p.wait_until ? ACTION_NAV_GRACE_MS : 0,
      softDeadline: Date.now() + budget - Math.min(300, Math.floor(budget / 4)),
    }), signal);
    if (nav.partial) await this.browser.stopLoading(tabId).catch(() => {});
    let url = nav.value?.url;
    if (nav.started && p.wait_until) url = (await this.where(tabId, undefined, signal)).url;
    return { navigated: Boolean(nav.started), url: url ?? null };
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
   * page runs one pageRun operation, retrying while the page is between
   * documents (a navigation replaced the frame the script went to), and
   * turns an {ok: false} answer into its CommandError.
   */
  async page(tabId, op, args, signal, deadline) {
    for (;;) {
      let r;
      try {
        r = await bounded(this.browser.runInPage(tabId, pageRun, [op, args]), signal);
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
    const args = { selector: p.selector, frame: p.frame, format: p.format, all: p.all, attribute: p.attribute };
    if (p.all || p.attribute) {
      // A list: whole values, as many as fit in max_bytes.
      const r = await this.page(tabId, 'extract', { ...args, maxChars: Number.MAX_SAFE_INTEGER }, signal, deadline);
      const values = [];
      let bytes = 2;
      let truncated = false;
      for (const v of r.values) {
        const n = utf8Length(JSON.stringify(v)) + 1;
        if (bytes + n > limit) {
          truncated = true;
          break;
        }
        bytes += n;
        values.push(v);
      }
      return { values, bytes, truncated };
    }
    // One UTF-16 unit is at least one byte of UTF-8, so limit + 1 units are
    // enough to know whether the content is longer than limit bytes.
    const r = await this.page(tabId, 'extract', { ...args, maxChars: limit + 1 }, signal, deadline);
    for (;;) {
      const cut = truncateUtf8(r.content, limit);
      const truncated = cut.truncated || r.length > r.content.length;
      const data = { url: r.url, title: r.title, [p.format]: cut.text, bytes: cut.bytes, truncated };
      // JSON escapes can make the frame bigger than its content; shrink
      // until the result fits the broker's frame limit.
      if (frameFits(resultFrame('x'.repeat(40), data), this.maxMessageBytes()) || limit === 0) return data;
      limit = Math.floor(limit * 0.75);
    }
  }

  async waitFor(tabId, p, signal, deadline) {
    const args = { selector: p.selector, frame: p.frame, state: p.state };
    for (;;) {
      let r = null;
      try {
        r = await bounded(this.browser.runInPage(tabId, pageRun, ['query', args]), signal);
      } catch (e) {
        if (e?.code === CODES.NO_SUCH_TAB || signal.aborted) throw signal.aborted ? signal.reason : e;
        // Loading, between documents or on an error page: not there yet.
      }
      if (r && !r.ok && r.code === CODES.INVALID_PARAMS) throw new CommandError(r.code, r.message);
      if (r && r.ok && r.met) return {};
      if (signal.aborted) throw signal.reason;
      if (this.now() + this.pollMs >= deadline) {
        await this.sleep(Math.max(0, deadline - this.now()), signal);
        throw new CommandError(CODES.TIMEOUT, `"${p.selector}" was not ${p.state} in time`);
      }
      await this.sleep(this.pollMs, signal);
    }
  }

  async screenshot(commandId, tabId, p, signal, deadline) {
    let clip;
    if (p.selector) {
      const r = await this.page(tabId, 'rect', { selector: p.selector, frame: p.frame }, signal, deadline);
      if (!(r.width > 0 && r.height > 0)) throw new CommandError(CODES.NO_SUCH_ELEMENT, `"${p.selector}" has no size to capture`);
      clip = { x: r.x, y: r.y, width: r.width, height: r.height };
    }
    const shot = await bounded(this.browser.capture(tabId, {
      signal, format: p.format, quality: p.quality, full: p.full_page, clip,
    }), signal);
    if (signal.aborted) throw signal.reason;
    const mime = `image/${p.format}`;
    this.sendCapture(commandId, mime, shot.data, 'the screenshot');
    return { mime, bytes: base64Bytes(shot.data), width: shot.width, height: shot.height };
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

// The Executor's browser adapter over Chrome's extension APIs: tabs,
// scripting, webNavigation and webRequest (observation only), downloads,
// cookies, and debugger where nothing else serves (full-page and element
// screenshots, PDF, key presses, hover, evaluate, dialogs, console). Only
// the service worker loads this file.

import { CODES, CommandError } from './protocol.js';
import { pageInfo, pageRun, pageWaitPaint } from './page.js';
import { Mutex } from './queue.js';

// networkidle: no request of the tab in flight for this long (Playwright's
// meaning).
export const NETWORK_IDLE_MS = 500;
// CLEAR_NAV_MS bounds the wait for about:blank when a tab's state is cleared.
const CLEAR_NAV_MS = 10000;
const DEBUGGER_VERSION = '1.3';
// A download is taken for a worker tab's when that tab requested its URL
// this recently.
const DOWNLOAD_MATCH_MS = 30_000;

/** chromeError turns an extension API failure into a CommandError. */
export function chromeError(e) {
  if (e instanceof CommandError) return e;
  const msg = String(e?.message ?? e);
  if (/showing error page/i.test(msg)) {
    return new CommandError(CODES.NAVIGATION_FAILED, 'the tab shows the browser\'s error page: the page did not load');
  }
  if (/no tab with id|tab was closed|no current window/i.test(msg)) {
    return new CommandError(CODES.NO_SUCH_TAB, 'the tab is gone');
  }
  if (/cannot access|cannot be scripted|missing host permission|extensions gallery|chrome:\/\/|permission/i.test(msg)) {
    return new CommandError(CODES.NOT_SCRIPTABLE, `the extension may not script this page: ${msg}`);
  }
  const err = new CommandError(CODES.COMMAND_FAILED, msg);
  // The frame went away under the script: a navigation is under way.
  if (/removed|destroyed|navigat|no frame with id|back.forward cache|not ready/i.test(msg)) err.transient = true;
  return err;
}

function abortable(signal, executor) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    executor(resolve, reject);
  });
}

/** base64Of encodes bytes (an ArrayBuffer or Uint8Array) as base64. */
export function base64Of(buf) {
  const bytes = buf instanceof Uint8Array ? buf : new Uint8Array(buf);
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

const SAME_SITE_TO_CHROME = { no_restriction: 'no_restriction', lax: 'lax', strict: 'strict', unspecified: 'unspecified' };

/** cookieOut is a chrome.cookies.Cookie as the catalogue names its fields. */
function cookieOut(c) {
  return {
    name: c.name, value: c.value, domain: c.domain, path: c.path,
    expires: c.session ? -1 : Math.round(c.expirationDate ?? -1),
    http_only: c.httpOnly, secure: c.secure, same_site: c.sameSite,
  };
}

function cookieURL(c) {
  const host = c.domain.startsWith('.') ? c.domain.slice(1) : c.domain;
  return `${c.secure ? 'https' : 'http'}://${host}${c.path}`;
}

export class ChromeBrowser {
  /**
   * tracked(tabId) says whether a tab is the extension's (a worker or a tab
   * a worker opened): only those tabs' requests and navigations are looked
   * at. emit(tabId, kind, data) reports an event of a tab; dialogPolicy(tabId)
   * says how to answer a dialog there; download(tabId, info, bytes) hands
   * over a download of a tab that was cancelled.
   */
  constructor({ log = () => {}, tracked = () => false, emit = () => {}, dialogPolicy = () => ({ accept: false }) } = {}) {
    Object.assign(this, { log, tracked, emit, dialogPolicy });
    // captureVisibleTab shows one tab per window and is rate limited, so
    // screenshots take turns across all tabs.
    this.captureLock = new Mutex();
    this.net = new Map(); // tabId → {inflight: Set, listeners: Set}
    this.requested = new Map(); // url → {tabId, at}, recent requests of tracked tabs
    this.attached = new Map(); // tabId → Promise of the attach
    this.listen();
  }

  netOf(tabId) {
    let n = this.net.get(tabId);
    if (!n) {
      n = { inflight: new Set(), listeners: new Set() };
      this.net.set(tabId, n);
    }
    return n;
  }

  notify(tabId, ev) {
    const n = this.net.get(tabId);
    if (n) for (const fn of [...n.listeners]) fn(ev);
  }

  /** listen adds Chrome's listeners once; each filters to tracked tabs. */
  listen() {
    const filter = { urls: ['<all_urls>'] };
    const wr = chrome.webRequest;
    wr.onBeforeRequest.addListener((d) => {
      if (d.tabId < 0 || !this.tracked(d.tabId)) return;
      this.netOf(d.tabId).inflight.add(d.requestId);
      this.requested.delete(d.url); // newest last
      this.requested.set(d.url, { tabId: d.tabId, at: Date.now() });
      if (this.requested.size > 500) this.requested.delete(this.requested.keys().next().value);
      this.notify(d.tabId, { kind: 'request', d });
    }, filter);
    wr.onBeforeRedirect.addListener((d) => {
      if (d.tabId < 0 || !this.tracked(d.tabId)) return;
      this.requested.set(d.redirectUrl, { tabId: d.tabId, at: Date.now() });
      this.notify(d.tabId, { kind: 'redirect', d });
    }, filter);
    wr.onResponseStarted.addListener((d) => {
      if (d.tabId < 0 || !this.tracked(d.tabId)) return;
      this.notify(d.tabId, { kind: 'response', d });
    }, filter);
    const end = (failed) => (d) => {
      if (d.tabId < 0 || !this.tracked(d.tabId)) return;
      this.netOf(d.tabId).inflight.delete(d.requestId);
      this.notify(d.tabId, { kind: 'done', d });
      this.emit(d.tabId, 'network', failed
        ? { url: d.url, method: d.method, type: d.type, error: d.error }
        : { url: d.url, method: d.method, type: d.type, status: d.statusCode, from_cache: d.fromCache });
    };
    wr.onCompleted.addListener(end(false), filter);
    wr.onErrorOccurred.addListener(end(true), filter);

    const nav = chrome.webNavigation;
    const navEvent = (kind) => (d) => {
      if (d.frameId !== 0 || !this.tracked(d.tabId)) return;
      this.notify(d.tabId, { kind, d });
    };
    nav.onBeforeNavigate.addListener(navEvent('before'));
    nav.onCommitted.addListener(navEvent('committed'));
    nav.onDOMContentLoaded.addListener(navEvent('domcontentloaded'));
    nav.onCompleted.addListener(navEvent('load'));
    nav.onErrorOccurred.addListener(navEvent('error'));
    nav.onHistoryStateUpdated.addListener(navEvent('samedoc'));
    nav.onReferenceFragmentUpdated.addListener(navEvent('samedoc'));

    chrome.downloads.onCreated.addListener((item) => this.onDownload(item));
    chrome.debugger.onEvent.addListener((src, method, params) => this.onDebuggerEvent(src.tabId, method, params));
    chrome.debugger.onDetach.addListener((src) => this.attached.delete(src.tabId));
  }

  /** forget drops what the adapter keeps of a tab (closed, or the lease ended). */
  forget(tabId) {
    this.net.delete(tabId);
    if (this.attached.has(tabId)) {
      this.attached.delete(tabId);
      chrome.debugger.detach({ tabId }).catch(() => {});
    }
  }

  // ---- navigation

  /**
   * navigation runs trigger and follows the top-level navigation it causes
   * through webNavigation (phases) and webRequest (status, redirects, the
   * requests still in flight for networkidle). It resolves with
   * {started, status, redirects, partial, download} when waitUntil is
   * reached; at softDeadline it resolves partial when a document committed,
   * else rejects with timeout. graceMs > 0 resolves {started: false} when
   * no navigation began that long after trigger; waitUntil null does not
   * wait at all.
   */
  navigation(tabId, trigger, { waitUntil = 'load', softDeadline, graceMs = 0, signal, onPhase = () => {}, expectURL } = {}) {
    return abortable(signal, (resolve, reject) => {
      const s = {
        started: false, committed: false, dcl: false, load: false, status: null, redirects: [], requestId: null,
        url: null, download: null, triggered: false, value: undefined,
      };
      const n = this.netOf(tabId);
      const timers = [];
      let idleTimer = null;
      let done = false;
      const finish = (fn, v) => {
        if (done) return;
        done = true;
        n.listeners.delete(onEvent);
        for (const t of timers) clearTimeout(t);
        clearTimeout(idleTimer);
        signal?.removeEventListener('abort', onAbort);
        fn(v);
      };
      const out = (partial) => ({
        started: s.started, status: s.status, redirects: s.redirects, partial, download: s.download, value: s.value,
      });
      const check = () => {
        if (!s.triggered) return;
        if (waitUntil === null) {
          finish(resolve, out(false));
          return;
        }
        if (!s.started) return;
        if (waitUntil === 'domcontentloaded' && s.dcl) finish(resolve, out(false));
        else if (waitUntil === 'load' && s.load) finish(resolve, out(false));
        else if (waitUntil === 'networkidle' && s.load && n.inflight.size === 0 && idleTimer === null) {
          idleTimer = setTimeout(() => finish(resolve, out(false)), NETWORK_IDLE_MS);
        }
      };
      const phase = (name) => {
        if (name === 'committed') s.committed = true;
        if (name === 'domcontentloaded') s.committed = s.dcl = true;
        if (name === 'load') s.committed = s.dcl = s.load = true;
        onPhase(name);
      };
      const onEvent = ({ kind, d }) => {
        // A late event of the document before this navigation (a stopped
        // page completing) says nothing of this one.
        if (!s.started && (kind === 'committed' || kind === 'domcontentloaded' || kind === 'load')) return;
        switch (kind) {
          case 'request':
            if (idleTimer !== null) {
              clearTimeout(idleTimer);
              idleTimer = null;
            }
            // A redirect asks again under the same request id.
            if (d.type === 'main_frame' && d.frameId === 0 && d.requestId !== s.requestId) {
              s.started = true;
              s.requestId = d.requestId;
              s.redirects = [];
              s.status = null;
            }
            break;
          case 'redirect':
            if (d.requestId === s.requestId) s.redirects.push(d.url);
            break;
          case 'response':
            if (d.requestId === s.requestId) s.status = d.statusCode;
            break;
          case 'before':
            s.started = true;
            s.committed = s.dcl = s.load = false;
            break;
          case 'committed':
            // The about:blank of an earlier command's stop is not this
            // navigation's document.
            if (expectURL && expectURL !== 'about:blank' && d.url === 'about:blank') return;
            s.started = true;
            s.url = d.url;
            phase('committed');
            // A page restored from the back/forward cache does not load
            // again: read how far it is.
            if ((d.transitionQualifiers ?? []).includes('forward_back')) {
              this.runInPage(tabId, pageInfo, []).then((r) => {
                if (done || !r?.ok) return;
                if (r.ready !== 'loading' && !s.dcl) phase('domcontentloaded');
                if (r.ready === 'complete' && !s.load) phase('load');
                check();
              }, () => {});
            }
            break;
          case 'domcontentloaded':
            if (!s.committed) phase('committed');
            phase('domcontentloaded');
            break;
          case 'load':
            if (!s.dcl) phase('domcontentloaded');
            phase('load');
            break;
          case 'samedoc':
            s.started = true;
            s.committed = s.dcl = s.load = true;
            break;
          case 'download':
            s.download = d;
            finish(resolve, out(false));
            return;
          case 'error':
            if (d.error === 'net::ERR_ABORTED' && s.download) {
              finish(resolve, out(false));
              return;
            }
            if (d.error === 'net::ERR_ABORTED') {
              // A download is being taken apart (see onDownload), or a newer
              // navigation replaced this one: wait for what comes next.
              timers.push(setTimeout(() => {
                if (!s.download && !s.committed) {
                  finish(reject, new CommandError(CODES.NAVIGATION_FAILED, `${d.url} did not load: ${d.error}`, { url: d.url, error: d.error }));
                }
              }, 1000));
              return;
            }
            finish(reject, new CommandError(CODES.NAVIGATION_FAILED, `${d.url} did not load: ${d.error}`, { url: d.url, error: d.error }));
            return;
          default:
        }
        check();
      };
      const onAbort = () => finish(reject, signal.reason);
      n.listeners.add(onEvent);
      signal?.addEventListener('abort', onAbort, { once: true });
      if (softDeadline !== undefined) {
        timers.push(setTimeout(() => {
          if (s.committed) finish(resolve, out(true));
          else finish(reject, new CommandError(CODES.TIMEOUT, `the page did not ${s.started ? 'commit' : 'start loading'} in time`));
        }, Math.max(0, softDeadline - Date.now())));
      }
      Promise.resolve().then(trigger).then((v) => {
        s.value = v;
        s.triggered = true;
        if (graceMs > 0) {
          timers.push(setTimeout(() => {
            if (!s.started) finish(resolve, out(false));
          }, graceMs));
        }
        check();
      }, (e) => finish(reject, chromeError(e)));
    });
  }

  navigate(tabId, url, opts = {}) {
    return this.navigation(tabId, () => chrome.tabs.update(tabId, { url }), { ...opts, expectURL: url });
  }

  reload(tabId, { bypassCache = false, ...opts } = {}) {
    return this.navigation(tabId, () => chrome.tabs.reload(tabId, { bypassCache }), opts);
  }

  /**
   * history goes back (-1) or forward (1) a page. It picks the entry through
   * the debugger: Chrome's own goBack skips the entries of pages that
   * navigated without a person's gesture, which is every page a command
   * clicked away from.
   */
  history(tabId, delta, opts = {}) {
    return this.navigation(tabId, async () => {
      const h = await this.cdp(tabId, 'Page.getNavigationHistory');
      const entry = h.entries[h.currentIndex + delta];
      if (!entry) throw new CommandError(CODES.NAVIGATION_FAILED, `there is no page to go ${delta < 0 ? 'back' : 'forward'} to`);
      await this.cdp(tabId, 'Page.navigateToHistoryEntry', { entryId: entry.id });
    }, opts);
  }

  /**
   * stopLoading makes a tab usable again after a timeout: a page that
   * committed stops its remaining loads (window.stop(), as Esc does) and
   * keeps what it shows; a navigation that never committed cannot be
   * stopped from the old document, so the tab goes to about:blank.
   */
  async stopLoading(tabId) {
    const tab = await chrome.tabs.get(tabId);
    if (tab.status === 'complete' && !tab.pendingUrl) return;
    if (!tab.pendingUrl) {
      try {
        await this.runInPage(tabId, pageRun, ['stop', {}]);
        return;
      } catch {
        // not scriptable: fall through
      }
    }
    await this.navigation(tabId, () => chrome.tabs.update(tabId, { url: 'about:blank' }), {
      waitUntil: 'load', softDeadline: Date.now() + 2000,
    }).catch(() => {});
  }

  async tabInfo(tabId) {
    try {
      const t = await chrome.tabs.get(tabId);
      return { url: t.url, title: t.title };
    } catch (e) {
      throw chromeError(e);
    }
  }

  /** runInPage runs fn(...args) in the tab's top frame and returns its answer. */
  async runInPage(tabId, fn, args) {
    let res;
    try {
      // At once, not at document_idle: a document that never finishes
      // loading would otherwise hold the script (and the command) forever.
      res = await chrome.scripting.executeScript({
        target: { tabId, frameIds: [0] }, func: fn, args, world: 'ISOLATED', injectImmediately: true,
      });
    } catch (e) {
      throw chromeError(e);
    }
    const first = res?.[0];
    if (!first) throw new CommandError(CODES.COMMAND_FAILED, 'the page script did not run', undefined);
    if (first.error) throw chromeError(first.error);
    return first.result;
  }

  /** front shows a tab in its window, without focusing the window. */
  async front(tabId) {
    const tab = await chrome.tabs.get(tabId);
    if (!tab.active) await chrome.tabs.update(tabId, { active: true });
    return tab;
  }

  // ---- the debugger

  /**
   * cdp sends a DevTools protocol command to the tab, attaching the
   * debugger first (once per tab; the lease's end detaches it).
   */
  async cdp(tabId, method, params = {}) {
    await this.attach(tabId);
    try {
      return await chrome.debugger.sendCommand({ tabId }, method, params);
    } catch (e) {
      throw chromeError(e);
    }
  }

  attach(tabId) {
    let p = this.attached.get(tabId);
    if (!p) {
      p = (async () => {
        try {
          await chrome.debugger.attach({ tabId }, DEBUGGER_VERSION);
        } catch (e) {
          if (!/already attached/i.test(String(e?.message))) throw e;
        }
        await chrome.debugger.sendCommand({ tabId }, 'Page.enable');
        await chrome.debugger.sendCommand({ tabId }, 'Runtime.enable');
        // Key presses reach the focused element even while the worker
        // window is not the focused one.
        await chrome.debugger.sendCommand({ tabId }, 'Emulation.setFocusEmulationEnabled', { enabled: true });
      })();
      this.attached.set(tabId, p);
      p.catch(() => this.attached.delete(tabId));
    }
    return p.catch((e) => {
      throw new CommandError(CODES.COMMAND_FAILED, `the extension could not attach the debugger to the tab: ${e?.message ?? e}`);
    });
  }

  /** ensureDialogs attaches the debugger so dialogs are answered by policy. */
  async ensureDialogs(tabId) {
    try {
      await this.attach(tabId);
    } catch (e) {
      this.log('debugger', e);
    }
  }

  onDebuggerEvent(tabId, method, params) {
    if (tabId === undefined) return;
    if (method === 'Page.javascriptDialogOpening') {
      const pol = this.dialogPolicy(tabId, params.type);
      const accept = pol.accept;
      const answer = { accept };
      if (accept && params.type === 'prompt') answer.promptText = pol.prompt_text ?? params.defaultPrompt ?? '';
      chrome.debugger.sendCommand({ tabId }, 'Page.handleJavaScriptDialog', answer).catch((e) => this.log('dialog', e));
      this.emit(tabId, 'dialog', {
        type: params.type, message: params.message, accepted: accept,
        ...(answer.promptText !== undefined ? { prompt_text: answer.promptText } : {}),
      });
    } else if (method === 'Runtime.consoleAPICalled') {
      const text = (params.args ?? []).map((a) => (a.value !== undefined ? (typeof a.value === 'string' ? a.value : JSON.stringify(a.value)) : a.description ?? a.type)).join(' ');
      this.emit(tabId, 'console', { level: params.type, text: text.slice(0, 64 * 1024) });
    } else if (method === 'Runtime.exceptionThrown') {
      const d = params.exceptionDetails ?? {};
      this.emit(tabId, 'console', { level: 'exception', text: String(d.exception?.description ?? d.text ?? '').slice(0, 64 * 1024) });
    }
  }

  /** press sends one key (with modifiers) as real input. */
  async press(tabId, { key, modifiers, code, keyCode, text }) {
    const bits = { Alt: 1, Control: 2, Meta: 4, Shift: 8 };
    let mask = 0;
    const codes = { Alt: ['AltLeft', 18], Control: ['ControlLeft', 17], Meta: ['MetaLeft', 91], Shift: ['ShiftLeft', 16] };
    for (const m of modifiers) {
      mask |= bits[m];
      await this.cdp(tabId, 'Input.dispatchKeyEvent', { type: 'rawKeyDown', modifiers: mask, key: m, code: codes[m][0], windowsVirtualKeyCode: codes[m][1] });
    }
    // Text only without Control, Alt or Meta: a chord is a shortcut, not typing.
    const typed = text !== undefined && (mask & ~bits.Shift) === 0;
    const shifted = typed && (mask & bits.Shift) && text.length === 1 ? text.toUpperCase() : text;
    await this.cdp(tabId, 'Input.dispatchKeyEvent', {
      type: typed ? 'keyDown' : 'rawKeyDown', modifiers: mask, key, code, windowsVirtualKeyCode: keyCode,
      ...(typed ? { text: shifted, unmodifiedText: text } : {}),
      // Chrome's editing shortcuts on Linux need the command named.
      ...(mask === bits.Control && key.toLowerCase() === 'a' ? { commands: ['selectAll'] } : {}),
    });
    await this.cdp(tabId, 'Input.dispatchKeyEvent', { type: 'keyUp', modifiers: mask, key, code, windowsVirtualKeyCode: keyCode });
    for (const m of [...modifiers].reverse()) {
      mask &= ~bits[m];
      await this.cdp(tabId, 'Input.dispatchKeyEvent', { type: 'keyUp', modifiers: mask, key: m, code: codes[m][0], windowsVirtualKeyCode: codes[m][1] });
    }
  }

  /** mouseMove moves the mouse to viewport coordinates (CSS :hover applies). */
  async mouseMove(tabId, x, y) {
    await this.cdp(tabId, 'Input.dispatchMouseEvent', { type: 'mouseMoved', x, y });
  }

  /** evaluate calls a function's source with JSON args in the page's own world. */
  async evaluate(tabId, expression, args) {
    const r = await this.cdp(tabId, 'Runtime.evaluate', {
      expression: `(${expression})(...${JSON.stringify(args)})`,
      awaitPromise: true, returnByValue: true, userGesture: true,
    });
    if (r.exceptionDetails) {
      const d = r.exceptionDetails;
      throw new CommandError(CODES.COMMAND_FAILED, `the expression threw: ${d.exception?.description ?? d.text}`.slice(0, 4096));
    }
    return r.result?.value ?? null;
  }

  // ---- captures

  /**
   * capture takes the visible part of the tab (captureVisibleTab, which
   * needs the tab shown in its window), or with clip/full the page through
   * the debugger. It returns {data (base64), width, height}.
   */
  capture(tabId, { signal, format = 'png', quality, clip, full = false } = {}) {
    return this.captureLock.run(async () => {
      if (signal?.aborted) throw signal.reason;
      let tab;
      try {
        tab = await this.front(tabId);
      } catch (e) {
        throw chromeError(e);
      }
      try {
        await this.runInPage(tabId, pageWaitPaint, []);
      } catch {
        // Not scriptable (about:blank): capture what is there.
      }
      let data;
      if (clip || full) {
        let area = clip;
        if (full) {
          const m = await this.cdp(tabId, 'Page.getLayoutMetrics');
          const size = m.cssContentSize ?? m.contentSize;
          area = { x: 0, y: 0, width: Math.ceil(size.width), height: Math.ceil(size.height) };
        }
        const r = await this.cdp(tabId, 'Page.captureScreenshot', {
          format, ...(quality !== undefined ? { quality } : {}), captureBeyondViewport: true,
          clip: { ...area, scale: 1 },
        });
        data = r.data;
      } else {
        for (let tries = 0; ; tries++) {
          if (signal?.aborted) throw signal.reason;
          try {
            const url = await chrome.tabs.captureVisibleTab(tab.windowId, { format, ...(quality !== undefined ? { quality } : {}) });
            data = url.slice(url.indexOf(',') + 1);
            break;
          } catch (e) {
            // At most two captures a second: wait out the quota.
            if (/MAX_CAPTURE_VISIBLE_TAB_CALLS_PER_SECOND/.test(String(e?.message)) && tries < 20) {
              await new Promise((r) => setTimeout(r, 300));
              continue;
            }
            throw chromeError(e);
          }
        }
      }
      const bmp = await createImageBitmap(await (await fetch(`data:image/${format};base64,${data}`)).blob());
      const out = { data, width: bmp.width, height: bmp.height };
      bmp.close();
      return out;
    });
  }

  async pdf(tabId, { landscape, printBackground }) {
    const r = await this.cdp(tabId, 'Page.printToPDF', { landscape, printBackground, transferMode: 'ReturnAsBase64' });
    return r.data;
  }

  // ---- cookies: the profile's jar, for the URLs the tab shows

  async cookies(urls) {
    const seen = new Map();
    for (const url of urls) {
      for (const c of await chrome.cookies.getAll({ url })) seen.set(`${c.domain}\n${c.path}\n${c.name}`, c);
    }
    return [...seen.values()].map(cookieOut);
  }

  async setCookies(list, defaultURL) {
    let n = 0;
    for (const c of list) {
      const url = c.url ?? (c.domain ? `${c.secure ? 'https' : 'http'}://${c.domain.replace(/^\./, '')}${c.path ?? '/'}` : defaultURL);
      if (!url) throw new CommandError(CODES.INVALID_PARAMS, `cookie ${c.name} needs a url or a domain (the tab shows no web page)`);
      const d = { url, name: c.name, value: c.value };
      if (c.domain) d.domain = c.domain;
      if (c.path) d.path = c.path;
      if (c.expires) d.expirationDate = c.expires;
      if (c.http_only !== undefined) d.httpOnly = c.http_only;
      if (c.secure !== undefined) d.secure = c.secure;
      if (c.same_site) d.sameSite = SAME_SITE_TO_CHROME[c.same_site];
      let r;
      try {
        r = await chrome.cookies.set(d);
      } catch (e) {
        throw new CommandError(CODES.INVALID_PARAMS, `cookie ${c.name}: ${e?.message ?? e}`);
      }
      if (!r) throw new CommandError(CODES.INVALID_PARAMS, `cookie ${c.name} was refused: ${chrome.runtime.lastError?.message ?? 'the browser did not set it'}`);
      n++;
    }
    return n;
  }

  async clearCookies(urls) {
    let n = 0;
    for (const url of urls) {
      for (const c of await chrome.cookies.getAll({ url })) {
        if (await chrome.cookies.remove({ url: cookieURL(c), name: c.name, storeId: c.storeId })) n++;
      }
    }
    return n;
  }

  // ---- a lease's clean slate (clear_state)

  /**
   * clearState clears what a worker tab's lease may leave behind: the
   * session storage of the page in front (every frame), then, with the tab
   * on about:blank so that no page writes again meanwhile, what the
   * profile keeps for each web origin in origins (cookies, which Chrome
   * clears for the whole site, local storage, IndexedDB, Cache Storage,
   * service workers, file systems). It returns the origins it cleared.
   */
  async clearState(tabId, origins) {
    try {
      await chrome.scripting.executeScript({
        target: { tabId, allFrames: true },
        func: () => {
          try {
            sessionStorage.clear();
          } catch {
            // an opaque origin has none
          }
        },
      });
    } catch {
      // no web page in front
    }
    await this.navigate(tabId, 'about:blank', { waitUntil: 'load', softDeadline: Date.now() + CLEAR_NAV_MS }).catch((e) => this.log('clear_state: about:blank', e));
    const web = [...new Set(origins)].filter((o) => /^https?:\/\//.test(o));
    if (web.length > 0) {
      await chrome.browsingData.remove({ origins: web },
        { cookies: true, localStorage: true, indexedDB: true, cacheStorage: true, serviceWorkers: true, fileSystems: true });
    }
    return web;
  }

  // ---- downloads: never into the person's folder

  /**
   * onDownload cancels a download a tracked tab started (matched by its URL
   * or its referrer), removes any file that already landed, and hands the
   * URL to the tab's command, which fetches the bytes itself.
   */
  async onDownload(item) {
    const recent = (url) => {
      const r = url ? this.requested.get(url) : undefined;
      return r && Date.now() - r.at < DOWNLOAD_MATCH_MS ? r.tabId : undefined;
    };
    const tabId = recent(item.finalUrl) ?? recent(item.url) ?? recent(item.referrer);
    if (tabId === undefined || !this.tracked(tabId)) return;
    try {
      await chrome.downloads.cancel(item.id);
    } catch (e) {
      this.log('download cancel', e);
    }
    try {
      const [now] = await chrome.downloads.search({ id: item.id });
      if (now?.state === 'complete' && now.exists) await chrome.downloads.removeFile(item.id);
      await chrome.downloads.erase({ id: item.id });
    } catch (e) {
      this.log('download remove', e);
    }
    const info = { url: item.finalUrl || item.url, name: (item.filename || '').split(/[/\\]/).pop() || null, mime: item.mime || null };
    this.notify(tabId, { kind: 'download', d: info });
    this.emit(tabId, 'download', { ...info, state: 'cancelled' }, { download: true });
  }

  /**
   * fetchBytes reads a download's URL itself (with the profile's cookies),
   * up to max bytes: {mime, bytes, data} or {too_large: true, bytes}.
   */
  async fetchBytes(url, max) {
    const r = await fetch(url, { credentials: 'include' });
    if (!r.ok) throw new Error(`fetching ${url} answered HTTP ${r.status}`);
    const reader = r.body.getReader();
    const parts = [];
    let size = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.length;
      if (size > max) {
        reader.cancel().catch(() => {});
        return { too_large: true, bytes: size };
      }
      parts.push(value);
    }
    const all = new Uint8Array(size);
    let at = 0;
    for (const p of parts) {
      all.set(p, at);
      at += p.length;
    }
    const name = /filename\*?=(?:UTF-8'')?"?([^";]+)"?/i.exec(r.headers.get('content-disposition') || '')?.[1];
    return {
      mime: (r.headers.get('content-type') || 'application/octet-stream').split(';')[0].trim(), bytes: size, data: base64Of(all),
      name: name ? decodeURIComponent(name) : null,
    };
  }

  async closeTab(tabId) {
    await chrome.tabs.remove(tabId);
  }
}

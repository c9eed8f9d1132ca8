// The Executor's browser adapter over Chrome's extension APIs: tabs,
// scripting and captureVisibleTab. Only the service worker loads this file.

import { CODES, CommandError } from './protocol.js';
import { pageWaitPaint } from './page.js';
import { Mutex } from './queue.js';

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

export class ChromeBrowser {
  constructor({ log = () => {} } = {}) {
    this.log = log;
    // captureVisibleTab shows one tab per window and is rate limited, so
    // screenshots take turns across all tabs.
    this.captureLock = new Mutex();
  }

  /**
   * loadAfter runs trigger and resolves when the tab has loaded the new
   * document: a "loading" then a "complete" status with no navigation still
   * pending. It rejects when the tab closes or the signal aborts.
   */
  loadAfter(tabId, trigger, signal) {
    return abortable(signal, (resolve, reject) => {
      let sawLoading = false;
      const onUpdated = (id, info, tab) => {
        if (id !== tabId) return;
        if (info.status === 'loading') sawLoading = true;
        if (tab.status === 'complete' && (sawLoading || info.url !== undefined) && !tab.pendingUrl) finish(resolve, tab);
      };
      const onRemoved = (id) => {
        if (id === tabId) finish(reject, new CommandError(CODES.NO_SUCH_TAB, 'the tab was closed while loading'));
      };
      const onAbort = () => finish(reject, signal.reason);
      let done = false;
      function finish(fn, v) {
        if (done) return;
        done = true;
        chrome.tabs.onUpdated.removeListener(onUpdated);
        chrome.tabs.onRemoved.removeListener(onRemoved);
        signal?.removeEventListener('abort', onAbort);
        fn(v);
      }
      chrome.tabs.onUpdated.addListener(onUpdated);
      chrome.tabs.onRemoved.addListener(onRemoved);
      signal?.addEventListener('abort', onAbort, { once: true });
      trigger().catch((e) => finish(reject, chromeError(e)));
    });
  }

  navigate(tabId, url, { signal } = {}) {
    return this.loadAfter(tabId, () => chrome.tabs.update(tabId, { url }), signal);
  }

  reload(tabId, { bypassCache = false, signal } = {}) {
    return this.loadAfter(tabId, () => chrome.tabs.reload(tabId, { bypassCache }), signal);
  }

  /**
   * stopLoading leaves a tab that would not finish loading on about:blank,
   * so that it is usable again: a navigation still in flight cannot be
   * stopped from a script of the old document.
   */
  async stopLoading(tabId) {
    const tab = await chrome.tabs.get(tabId);
    if (tab.status === 'complete' && !tab.pendingUrl) return;
    await chrome.tabs.update(tabId, { url: 'about:blank' });
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

  /** capture shows the tab in its window and takes a PNG of it (base64). */
  capture(tabId, { signal } = {}) {
    return this.captureLock.run(async () => {
      if (signal?.aborted) throw signal.reason;
      let tab;
      try {
        tab = await chrome.tabs.get(tabId);
        if (!tab.active) tab = await chrome.tabs.update(tabId, { active: true });
      } catch (e) {
        throw chromeError(e);
      }
      try {
        await this.runInPage(tabId, pageWaitPaint, []);
      } catch {
        // Not scriptable (about:blank): capture what is there.
      }
      for (let tries = 0; ; tries++) {
        if (signal?.aborted) throw signal.reason;
        try {
          const url = await chrome.tabs.captureVisibleTab(tab.windowId, { format: 'png' });
          return url.slice(url.indexOf(',') + 1);
        } catch (e) {
          // At most two captures a second: wait out the quota.
          if (/MAX_CAPTURE_VISIBLE_TAB_CALLS_PER_SECOND/.test(String(e?.message)) && tries < 20) {
            await new Promise((r) => setTimeout(r, 300));
            continue;
          }
          throw chromeError(e);
        }
      }
    });
  }

  async closeTab(tabId) {
    await chrome.tabs.remove(tabId);
  }
}

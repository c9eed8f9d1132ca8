import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Executor, base64Bytes, commandTab, utf8Base64 } from '../src/lib/executor.js';
import { CODES, CommandError } from '../src/lib/protocol.js';

// A 1×1 PNG.
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';

function deferred() {
  let resolve;
  const p = new Promise((r) => {
    resolve = r;
  });
  return { p, resolve };
}

/** FakeBrowser answers like ChromeBrowser, from a little model of pages. */
class FakeBrowser {
  constructor() {
    this.log = [];
    this.tabs = new Map([[1, { url: 'about:blank', title: '' }], [2, { url: 'about:blank', title: '' }]]);
    this.elements = { '#intro': 'Hello', '#big': 'Grüße '.repeat(1000) };
    this.gates = new Map(); // url → deferred that navigate waits for
    this.failNext = []; // errors that runInPage throws first
    this.queryMisses = 0; // pageQuery answers "not found" this many times
  }

  abortable(signal, p) {
    return new Promise((resolve, reject) => {
      signal?.addEventListener('abort', () => reject(signal.reason), { once: true });
      p.then(resolve, reject);
    });
  }

  async navigate(tabId, url, { signal }) {
    this.log.push(['navigate', tabId, url]);
    if (url.includes('/never')) return this.abortable(signal, new Promise(() => {}));
    if (this.gates.has(url)) await this.abortable(signal, this.gates.get(url).p);
    this.tabs.get(tabId).url = url;
    this.tabs.get(tabId).title = url.includes('refused') || url === 'about:blank' ? '' : `Title of ${url}`;
    return { started: true, status: 200, redirects: [], partial: false };
  }

  async reload(tabId, { bypassCache }) {
    this.log.push(['reload', tabId, bypassCache]);
    return { started: true, status: 200, redirects: [], partial: false };
  }

  async history(tabId, delta) {
    this.log.push(['history', tabId, delta]);
    return { started: true };
  }

  /** navigation runs the trigger; a click on #link "navigates". */
  async navigation(tabId, trigger, opts) {
    const value = await trigger();
    this.log.push(['navigation', tabId, opts.waitUntil]);
    return { started: this.navigates === true, value };
  }

  async press(tabId, key) {
    this.log.push(['press', tabId, key]);
  }

  async mouseMove(tabId, x, y) {
    this.log.push(['mouse', tabId, x, y]);
  }

  async evaluate(tabId, expression, args) {
    this.log.push(['evaluate', tabId, expression, args]);
    return args.length;
  }

  async pdf(tabId) {
    this.log.push(['pdf', tabId]);
    return 'JVBERi0=';
  }

  async fetchBytes(url) {
    this.log.push(['fetch', url]);
    return { mime: 'text/csv', bytes: 3, data: 'YSxi' };
  }

  async stopLoading(tabId) {
    this.log.push(['stop', tabId]);
  }

  async tabInfo(tabId) {
    return { ...this.tabs.get(tabId) };
  }

  async runInPage(tabId, fn, args) {
    this.log.push([fn.name, tabId, ...args]);
    if (this.failNext.length) throw this.failNext.shift();
    const tab = this.tabs.get(tabId);
    if (tab.url.includes('refused')) throw new CommandError(CODES.NAVIGATION_FAILED, 'error page');
    if (tab.url === 'about:blank') throw new CommandError(CODES.NOT_SCRIPTABLE, 'cannot access about:blank');
    const here = { url: tab.url, title: tab.title };
    if (fn.name === 'pageInfo') return { ok: true, ...here };
    const [op, a] = args;
    const selector = a.selector;
    if (selector === '#hang') return new Promise(() => {}); // a script that never answers
    if (selector === '###') return { ok: false, code: 'invalid_params', message: 'bad selector' };
    const find = () => (selector in this.elements ? this.elements[selector] : null);
    const missing = { ok: false, code: 'no_such_element', message: `no element matches "${selector}"` };
    switch (op) {
      case 'extract': {
        if (a.all) return { ok: true, ...here, values: Object.keys(this.elements) };
        const content = selector ? this.elements[selector] : 'whole page';
        if (content === undefined) return missing;
        return { ok: true, ...here, content: content.slice(0, a.maxChars), length: content.length };
      }
      case 'click':
      case 'type':
      case 'hover':
      case 'focus':
        if (find() === null) return missing;
        return { ok: true, ...here, tag: 'button', x: 10, y: 20 };
      case 'query':
        if (this.queryMisses > 0) {
          this.queryMisses--;
          return { ok: true, met: false };
        }
        return { ok: true, met: find() !== null };
      case 'storage':
        return { ok: true, items: { k: 'v' } };
    }
    throw new Error(`no fake for ${op}`);
  }

  async capture(tabId, opts) {
    this.log.push(['capture', tabId, opts.format]);
    return { data: this.png ?? PNG, width: 1, height: 1 };
  }

  async closeTab(tabId) {
    this.log.push(['close', tabId]);
  }

  async clearState(tabId, origins) {
    if (this.clearGate) await this.clearGate.p;
    this.log.push(['clear_state', tabId, origins]);
    return origins;
  }
}

function setup({ workers = [1, 2], maxMessageBytes = 4 * 1024 * 1024, evaluate = false } = {}) {
  const browser = new FakeBrowser();
  const sent = [];
  const ex = new Executor({
    browser,
    send: (f) => {
      sent.push(f);
      browser.log.push(['send', f.type, f.command_id]);
      return true;
    },
    isWorker: (id) => workers.includes(id),
    maxMessageBytes: () => maxMessageBytes,
    pollMs: 1,
    parentOf: (id) => (id === 7 ? 1 : null),
    evaluateEnabled: () => evaluate,
  });
  let n = 0;
  const cmd = (name, params, more = {}) => ({
    type: 'command', command_id: `c${++n}`, context_id: 'tab-1', task_id: 't', epoch: 1, name, params,
    response_mode: 'rpc', timeout_ms: 20000, ...more,
  });
  const frames = (id) => sent.filter((f) => f.command_id === id);
  const terminal = (id) => frames(id).find((f) => f.type === 'result' || f.type === 'error');
  return { browser, sent, ex, cmd, frames, terminal };
}

test('ack at once, then one result', async () => {
  const { ex, cmd, frames } = setup();
  const c = cmd('navigate', { url: 'https://e.x/a' });
  const done = ex.handleCommand(c);
  assert.deepEqual(frames(c.command_id), [{ type: 'ack', command_id: c.command_id }]);
  await done;
  assert.deepEqual(frames(c.command_id).map((f) => f.type), ['ack', 'result']);
  assert.deepEqual(frames(c.command_id)[1].data, {
    url: 'https://e.x/a', title: 'Title of https://e.x/a', status: 200, redirects: [], partial: false,
  });
});

test('one command per tab at a time, in order; other tabs go on', async () => {
  const { ex, cmd, browser, sent } = setup();
  const gate = { p: null, resolve: null };
  Object.assign(gate, deferred());
  browser.gates.set('https://e.x/slow', gate);
  const slow = ex.handleCommand(cmd('navigate', { url: 'https://e.x/slow' }));
  const quick = ex.handleCommand(cmd('extract', { selector: '#intro' }));
  const other = ex.handleCommand(cmd('click', { selector: '#intro' }, { context_id: 'tab-2' }));
  await other;
  assert.equal(ex.pending(1), 2);
  assert.equal(browser.log.filter((l) => l[1] === 'extract').length, 0, 'extract waited for navigate');
  gate.resolve();
  await Promise.all([slow, quick]);
  const order = sent.filter((f) => f.type !== 'ack' && f.command_id !== 'c3').map((f) => f.command_id);
  assert.deepEqual(order, ['c1', 'c2']);
  assert.equal(ex.pending(1), 0);
});

test('unknown commands and bad params fail with codes', async () => {
  const { ex, cmd, terminal } = setup();
  const cases = [
    [cmd('fly', {}), CODES.UNSUPPORTED_COMMAND],
    [cmd('navigate', { url: 42 }), CODES.INVALID_PARAMS],
    [cmd('navigate', [1]), CODES.INVALID_PARAMS],
    [cmd('extract', { nope: 1 }), CODES.INVALID_PARAMS],
    [cmd('click', { selector: '###' }), CODES.INVALID_PARAMS],
  ];
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  await Promise.all(cases.map(([c]) => ex.handleCommand(c)));
  for (const [c, code] of cases) assert.equal(terminal(c.command_id).code, code, c.name);
});

test('only the context\'s own worker tab can be driven', async () => {
  const { ex, cmd, terminal, browser } = setup({ workers: [1] });
  const notWorker = cmd('extract', {}, { context_id: 'tab-2' });
  const otherTarget = cmd('navigate', { url: 'https://e.x/' }, { target: { tab_id: '2' } });
  const notATab = cmd('extract', {}, { context_id: 'flow-1' });
  const ownTarget = cmd('navigate', { url: 'https://e.x/' }, { target: { tab_id: '1' } });
  await Promise.all([notWorker, otherTarget, notATab, ownTarget].map((c) => ex.handleCommand(c)));
  assert.equal(terminal(notWorker.command_id).code, CODES.NO_SUCH_TAB);
  assert.equal(terminal(otherTarget.command_id).code, CODES.NO_SUCH_TAB);
  assert.equal(terminal(notATab.command_id).code, CODES.NO_SUCH_TAB);
  assert.equal(terminal(ownTarget.command_id).type, 'result');
  assert.equal(browser.log.filter((l) => l[1] === 2).length, 0, 'tab 2 was never touched');
  assert.equal(commandTab({ context_id: 'tab-9', target: {} }), 9);
});

test('a page that never loads times out and the tab is stopped', async () => {
  const { ex, cmd, terminal, browser } = setup();
  const c = cmd('navigate', { url: 'https://e.x/never', timeout_ms: 20 });
  await ex.handleCommand(c);
  assert.equal(terminal(c.command_id).code, CODES.TIMEOUT);
  assert.ok(browser.log.some((l) => l[0] === 'stop' && l[1] === 1));
  // The broker's own timeout bounds it too, with a margin.
  const d = cmd('navigate', { url: 'https://e.x/never' }, { timeout_ms: 40 });
  await ex.handleCommand(d);
  assert.equal(terminal(d.command_id).code, CODES.TIMEOUT);
  // And the tab takes the next command.
  const e = cmd('navigate', { url: 'https://e.x/ok' });
  await ex.handleCommand(e);
  assert.equal(terminal(e.command_id).type, 'result');
});

test('a browser call that never answers still ends at the deadline', async () => {
  const { ex, cmd, terminal } = setup();
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  const c = cmd('click', { selector: '#hang' }, { timeout_ms: 40 });
  const w = cmd('wait_for', { selector: '#hang', timeout_ms: 20 });
  await ex.handleCommand(c);
  await ex.handleCommand(w);
  assert.equal(terminal(c.command_id).code, CODES.TIMEOUT);
  assert.equal(terminal(w.command_id).code, CODES.TIMEOUT);
  const next = cmd('extract', { selector: '#intro' });
  await ex.handleCommand(next);
  assert.equal(terminal(next.command_id).data.text, 'Hello');
});

test('an error page is navigation_failed; an unscriptable page is described from the tab', async () => {
  const { ex, cmd, terminal } = setup();
  const bad = cmd('navigate', { url: 'http://127.0.0.1:1/refused' });
  const blank = cmd('navigate', { url: 'about:blank' });
  await ex.handleCommand(bad);
  await ex.handleCommand(blank);
  assert.equal(terminal(bad.command_id).code, CODES.NAVIGATION_FAILED);
  assert.match(terminal(bad.command_id).message, /127\.0\.0\.1:1/);
  assert.deepEqual(terminal(bad.command_id).data, { url: 'http://127.0.0.1:1/refused' });
  assert.deepEqual(terminal(blank.command_id).data, { url: 'about:blank', title: '', status: 200, redirects: [], partial: false });
});

test('extract cuts to max_bytes and to the broker\'s frame limit', async () => {
  const { ex, cmd, terminal } = setup({ maxMessageBytes: 6000 });
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  const small = cmd('extract', { selector: '#big', max_bytes: 9 });
  const huge = cmd('extract', { selector: '#big' });
  const missing = cmd('extract', { selector: '#nope' });
  await Promise.all([small, huge, missing].map((c) => ex.handleCommand(c)));
  assert.deepEqual(
    { content: terminal(small.command_id).data.text, bytes: terminal(small.command_id).data.bytes, truncated: terminal(small.command_id).data.truncated },
    { content: 'Grüße G', bytes: 9, truncated: true },
  );
  const h = terminal(huge.command_id);
  assert.equal(h.type, 'result');
  assert.equal(h.data.truncated, true);
  assert.ok(JSON.stringify(h).length <= 6000);
  assert.equal(terminal(missing.command_id).code, CODES.NO_SUCH_ELEMENT);
});

test('a page between documents is retried', async () => {
  const { ex, cmd, terminal, browser } = setup();
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  const transient = new CommandError(CODES.COMMAND_FAILED, 'Frame with ID 0 was removed.');
  transient.transient = true;
  browser.failNext.push(transient, transient);
  const c = cmd('click', { selector: '#intro' });
  await ex.handleCommand(c);
  assert.equal(terminal(c.command_id).type, 'result');
  browser.failNext.push(new CommandError(CODES.NOT_SCRIPTABLE, 'no'));
  const d = cmd('click', { selector: '#intro' });
  await ex.handleCommand(d);
  assert.equal(terminal(d.command_id).code, CODES.NOT_SCRIPTABLE);
});

test('wait_for polls until the element is there, or times out', async () => {
  const { ex, cmd, terminal, browser } = setup();
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  browser.queryMisses = 3;
  browser.failNext.push(new CommandError(CODES.COMMAND_FAILED, 'loading'));
  const found = cmd('wait_for', { selector: '#intro' });
  const never = cmd('wait_for', { selector: '#nope', timeout_ms: 15 });
  const bad = cmd('wait_for', { selector: '###' });
  await Promise.all([found, never, bad].map((c) => ex.handleCommand(c)));
  assert.deepEqual(terminal(found.command_id).data, {});
  assert.equal(terminal(never.command_id).code, CODES.TIMEOUT);
  assert.equal(terminal(bad.command_id).code, CODES.INVALID_PARAMS);
});

test('screenshot: a capture frame, then a result that describes it', async () => {
  const { ex, cmd, frames } = setup();
  const c = cmd('screenshot', {});
  await ex.handleCommand(c);
  const f = frames(c.command_id);
  assert.deepEqual(f.map((x) => x.type), ['ack', 'capture', 'result']);
  assert.equal(f[1].mime, 'image/png');
  assert.equal(f[1].data, PNG);
  assert.deepEqual(f[2].data, { mime: 'image/png', bytes: base64Bytes(PNG), width: 1, height: 1 });
  const j = cmd('screenshot', { format: 'jpeg', quality: 50 });
  await ex.handleCommand(j);
  assert.equal(frames(j.command_id)[1].mime, 'image/jpeg');
});

test('a screenshot too large for the broker fails instead of being cut', async () => {
  const { ex, cmd, frames, browser } = setup({ maxMessageBytes: 1000 });
  browser.png = PNG + 'A'.repeat(2000);
  const c = cmd('screenshot', {});
  await ex.handleCommand(c);
  assert.deepEqual(frames(c.command_id).map((x) => x.type), ['ack', 'error']);
  assert.equal(frames(c.command_id)[1].code, CODES.TOO_LARGE);
});

test('response_mode none sends no terminal frame', async () => {
  const { ex, cmd, frames } = setup();
  const c = cmd('navigate', { url: 'https://e.x/' }, { response_mode: 'none' });
  await ex.handleCommand(c);
  assert.deepEqual(frames(c.command_id).map((x) => x.type), ['ack']);
});

test('cancel stops a queued or running command, which still answers', async () => {
  const { ex, cmd, terminal, browser } = setup();
  const running = cmd('navigate', { url: 'https://e.x/never' });
  const queued = cmd('extract', {});
  const p1 = ex.handleCommand(running);
  const p2 = ex.handleCommand(queued);
  assert.equal(ex.handleCancel({ command_id: queued.command_id, reason: 'caller cancelled' }), true);
  assert.equal(ex.handleCancel({ command_id: running.command_id }), true);
  await Promise.all([p1, p2]);
  assert.equal(terminal(running.command_id).code, CODES.CANCELLED);
  assert.equal(terminal(queued.command_id).code, CODES.CANCELLED);
  assert.match(terminal(queued.command_id).message, /caller cancelled/);
  assert.equal(browser.log.filter((l) => l[1] === 'extract').length, 0);
  assert.equal(ex.handleCancel({ command_id: 'nobody' }), false);
});

test('close answers first, then closes the tab', async () => {
  const { ex, cmd, browser } = setup();
  const c = cmd('close', {});
  await ex.handleCommand(c);
  const i = browser.log.findIndex((l) => l[0] === 'send' && l[1] === 'result');
  const j = browser.log.findIndex((l) => l[0] === 'close');
  assert.ok(i >= 0 && j > i, JSON.stringify(browser.log));
});

test('unexpected failures still answer, with command_failed', async () => {
  const { ex, cmd, terminal, browser } = setup();
  browser.capture = async () => {
    throw new TypeError('kaboom');
  };
  const c = cmd('screenshot', {});
  await ex.handleCommand(c);
  assert.equal(terminal(c.command_id).code, CODES.COMMAND_FAILED);
  assert.match(terminal(c.command_id).message, /kaboom/);
});

test('base64 helpers', () => {
  assert.equal(utf8Base64('Grüße'), Buffer.from('Grüße').toString('base64'));
  assert.equal(base64Bytes('YWJj'), 3);
  assert.equal(base64Bytes('YWI='), 2);
  assert.equal(base64Bytes('YQ=='), 1);
});

test('evaluate is not_enabled until the person enables it', async () => {
  const off = setup();
  const c = off.cmd('evaluate', { expression: '() => 1' });
  await off.ex.handleCommand(c);
  assert.equal(off.terminal(c.command_id).code, CODES.NOT_ENABLED);
  assert.equal(off.browser.log.filter((l) => l[0] === 'evaluate').length, 0);
  const on = setup({ evaluate: true });
  const d = on.cmd('evaluate', { expression: '(a, b) => a + b', args: [1, 2] });
  await on.ex.handleCommand(d);
  assert.deepEqual(on.terminal(d.command_id).data, { value: 2 });
});

test('options: malformed ones are invalid_params; capture sends the page after the command', async () => {
  const { ex, cmd, frames, terminal } = setup();
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  const bad = cmd('extract', {}, { options: { capture: { screenshot: 'yes' } } });
  const badEvents = cmd('extract', {}, { options: { events: ['keyboard'] } });
  const foreign = cmd('extract', {}, { options: { parser: 'left to others' } });
  await Promise.all([bad, badEvents, foreign].map((c) => ex.handleCommand(c)));
  assert.equal(terminal(bad.command_id).code, CODES.INVALID_PARAMS);
  assert.equal(terminal(badEvents.command_id).code, CODES.INVALID_PARAMS);
  assert.equal(terminal(foreign.command_id).type, 'result');
  const c = cmd('extract', { selector: '#intro' }, { options: { capture: { screenshot: true, text: true } } });
  await ex.handleCommand(c);
  const f = frames(c.command_id);
  assert.deepEqual(f.map((x) => [x.type, x.mime]), [['ack', undefined], ['capture', 'image/png'], ['capture', 'text/plain'], ['result', undefined]]);
  assert.equal(Buffer.from(f[2].data, 'base64').toString(), 'whole page');
});

test('events reach the running command that asked for them; downloads come back as captures', async () => {
  const { ex, cmd, frames, browser } = setup();
  let release;
  browser.gates.set('https://e.x/slow', { p: new Promise((r) => { release = r; }) });
  const c = cmd('navigate', { url: 'https://e.x/slow' }, { options: { events: ['console'] } });
  const p = ex.handleCommand(c);
  await new Promise((r) => setImmediate(r));
  ex.emit(1, 'console', { text: 'hi' });
  ex.emit(1, 'network', { url: 'https://e.x/a.png' }); // not asked for
  ex.emit(7, 'popup', { tab_id: '8' }); // a child of tab 1: always reported
  ex.emit(1, 'download', { url: 'https://e.x/report.csv' });
  release();
  await p;
  const f = frames(c.command_id).filter((x) => x.type !== 'progress');
  assert.deepEqual(f.map((x) => [x.type, x.name ?? x.mime ?? '']), [
    ['ack', ''], ['event', 'console'], ['event', 'popup'], ['capture', 'text/csv'], ['event', 'download'], ['result', ''],
  ]);
  assert.equal(f[4].data.state, 'captured');
  ex.emit(1, 'console', { text: 'after' }); // nobody is running: dropped
  assert.equal(frames(c.command_id).length, f.length);
});

test('a tab the context\'s page opened may be targeted; other tabs may not', () => {
  const parentOf = (id) => (id === 7 ? 1 : null);
  assert.equal(commandTab({ context_id: 'tab-1', target: { tab_id: '7' } }, parentOf), 7);
  assert.throws(() => commandTab({ context_id: 'tab-1', target: { tab_id: '8' } }, parentOf), { code: CODES.NO_SUCH_TAB });
  assert.throws(() => commandTab({ context_id: 'tab-2', target: { tab_id: '7' } }, parentOf), { code: CODES.NO_SUCH_TAB });
});

test('element commands reach the page with their params', async () => {
  const { ex, cmd, terminal, browser } = setup();
  await ex.handleCommand(cmd('navigate', { url: 'https://e.x/' }));
  const hover = cmd('hover', { selector: '#intro' });
  const press = cmd('press', { keys: 'Control+a', selector: '#intro' });
  const click = cmd('click', { selector: '#intro', wait_until: 'load' });
  const all = cmd('extract', { selector: 'li', all: true, max_bytes: 12 });
  await Promise.all([hover, press, click, all].map((c) => ex.handleCommand(c)));
  assert.deepEqual(terminal(hover.command_id).data, {});
  assert.ok(browser.log.some((l) => l[0] === 'mouse' && l[2] === 10 && l[3] === 20));
  const pr = browser.log.find((l) => l[0] === 'press');
  assert.deepEqual(pr[2], { key: 'a', code: 'KeyA', keyCode: 65, text: 'a', modifiers: ['Control'] });
  assert.deepEqual(terminal(click.command_id).data, { navigated: false, url: 'https://e.x/' });
  assert.ok(browser.log.some((l) => l[0] === 'navigation' && l[2] === 'load'));
  assert.deepEqual(terminal(all.command_id).data, { values: ['#intro'], bytes: 11, truncated: true });
});

test('a download too large for a frame is cancelled with an event saying why', async () => {
  const { ex, cmd, frames, browser } = setup({ maxMessageBytes: 8192 });
  const sizes = [];
  browser.fetchBytes = async (url, max) => {
    sizes.push(max);
    return { too_large: true, bytes: max + 1 };
  };
  let release;
  browser.gates.set('https://e.x/slow', { p: new Promise((r) => { release = r; }) });
  const c = cmd('navigate', { url: 'https://e.x/slow' });
  const p = ex.handleCommand(c);
  await new Promise((r) => setImmediate(r));
  ex.emit(1, 'download', { url: 'https://e.x/big.iso', name: 'big.iso' });
  release();
  await p;
  const f = frames(c.command_id);
  assert.deepEqual(f.map((x) => x.type), ['ack', 'event', 'result']);
  assert.equal(f[1].data.state, 'cancelled');
  assert.match(f[1].data.reason, /max_message_bytes/);
  assert.deepEqual(sizes, [Math.floor((8192 - 4096) * 3 / 4)]);
});

test('a clear_state runs after the tab\'s earlier commands and before its later ones', async () => {
  const { ex, cmd, browser } = setup();
  const gate = deferred();
  browser.gates.set('https://e.x/before', gate);
  const before = ex.handleCommand(cmd('navigate', { url: 'https://e.x/before' }));
  browser.clearGate = deferred();
  const cleared = ex.clearState(1, ['https://e.x']);
  const after = ex.handleCommand(cmd('extract', { selector: '#intro' }));
  const at = (what) => browser.log.findIndex(what);
  const isClear = (l) => l[0] === 'clear_state';
  const isExtract = (l) => l[2] === 'extract';
  gate.resolve();
  await before;
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(at(isClear), -1, 'the clear is held');
  assert.equal(at(isExtract), -1, 'extract waits behind the clear');
  browser.clearGate.resolve();
  assert.deepEqual(await cleared, ['https://e.x']);
  await after;
  assert.ok(at((l) => l[0] === 'navigate') < at(isClear), 'the clear came after the earlier navigate');
  assert.ok(at(isClear) < at(isExtract), 'and before the later extract');
});

// The service worker: keeps the pool of worker tabs, the connection to the
// broker, and the marks on tabs under automation. The logic lives in lib/
// (tested in Node); this file wires it to Chrome's APIs.
//
// A service worker can stop at any time. Everything that must outlive it is
// in chrome.storage: the settings and the client id in storage.local, the
// worker tabs, the tab group and the reconnect backoff in storage.session.
// Reconnects are chrome.alarms, which wake a stopped worker.

import { Backoff } from './lib/backoff.js';
import { ChromeBrowser } from './lib/chrome_browser.js';
import { Connection } from './lib/connection.js';
import { Creations } from './lib/create.js';
import { EFFECTS } from './lib/commands.js';
import { Executor, commandTab } from './lib/executor.js';
import { DEFAULT_HOLD_MINUTES, Holds, PAGE_ACTION_COMMAND, PAGE_ACTION_MENU, holdBadge, pageAction } from './lib/holds.js';
import { Marks } from './lib/marks.js';
import { DEFAULT_POOL_SIZE, buildReport, checkPoolSize, planPool, reportKey } from './lib/pool.js';
import { newClientId, normalizeBrokerURL, stateFrame, tabIdForContext } from './lib/protocol.js';
import { diagnoseBroker } from './lib/probe.js';
import { Mutex } from './lib/queue.js';

const VERSION = chrome.runtime.getManifest().version;
const ALARM_RECONNECT = 'cheetah-reconnect';
const ALARM_WATCHDOG = 'cheetah-watchdog';
const WATCHDOG_MINUTES = 0.5; // the shortest period a packed extension gets
const GROUP_TITLE = 'Cheetah';
const GROUP_COLOR = 'orange';
const ACTION_TITLE = 'Cheetah';
const MARK_TEXT = 'BOT';
const MARK_COLOR = '#c0392b';
const CONFIG_KEYS = ['brokerUrl', 'clientKey', 'poolSize', 'extraTabs', 'clientId', 'name', 'labels', 'allowEvaluate'];

const log = (...a) => console.info('[cheetah]', ...a);
// BOOT and st.snapshots number the status snapshots (see newerStatus in
// lib/view.js): when this run of the worker began, and how many it took.
const BOOT = Date.now();

const st = {
  config: null, // storage.local settings
  workers: new Map(), // tabId → {id, url, title, status}
  children: new Map(), // tabId of a tab a worker page opened → the worker's tabId
  windowId: null,
  groupId: null,
  marks: new Marks(),
  holds: new Holds(), // human control: see "---- human control" below
  visited: new Map(), // tabId of a worker → web origins its lease's pages committed (clear_state)
  lastReport: null,
  reportTimer: null,
  statusTimer: null,
  snapshots: 0, // status snapshots taken (statusSnapshot)
};

const poolLock = new Mutex();
const browser = new ChromeBrowser({
  log,
  tracked: (tabId) => st.workers.has(tabId) || st.children.has(tabId),
  emit: (tabId, kind, data) => executor.emit(tabId, kind, data),
  dialogPolicy: (tabId) => executor.dialogPolicy(tabId),
});

const conn = new Connection({
  WebSocket,
  getConfig: () => connectionConfig(),
  scheduleReconnect: (_delay, at) => chrome.alarms.create(ALARM_RECONNECT, { when: at }),
  cancelReconnect: () => chrome.alarms.clear(ALARM_RECONNECT),
  onWelcome: () => onWelcome(),
  onFrame: (f) => onFrame(f),
  onStatus: () => {
    renderGlobalBadge();
    publishStatus();
  },
  onReconnectState: (r) => chrome.storage.session.set({ reconnect: r }),
  onHalt: (h) => chrome.storage.session.set({ halted: h }),
  backoff: new Backoff({ minMs: 1000, maxMs: 60000 }),
  log,
  diagnose: async (url) => (await diagnoseBroker(url, fetch)).message,
});

const executor = new Executor({
  browser,
  send: (f) => conn.send(f),
  isWorker: (tabId) => st.workers.has(tabId),
  maxMessageBytes: () => conn.maxMessageBytes,
  log,
  parentOf: (tabId) => st.children.get(tabId) ?? null,
  evaluateEnabled: () => st.config?.allowEvaluate === true,
  // A leased tab comes to the front of the worker window on each command
  // (the window itself is never focused), and its dialogs get answered.
  onCommand: async (tabId) => {
    await browser.front(tabId).catch(() => {});
    await browser.ensureDialogs(tabId);
  },
});

// Listeners are added synchronously, at the top level, so that the events
// that wake a stopped worker reach them. Each waits for init first.
const ready = init().catch((e) => {
  console.error('[cheetah] init failed', e);
});
const whenReady = (fn) => (...args) => ready.then(() => fn(...args)).catch((e) => console.error('[cheetah]', e));

chrome.runtime.onInstalled.addListener(whenReady(createPageAction));
chrome.runtime.onStartup.addListener(whenReady(() => {}));
chrome.alarms.onAlarm.addListener(whenReady(onAlarm));
chrome.tabs.onUpdated.addListener(whenReady(onTabUpdated));
chrome.tabs.onRemoved.addListener(whenReady(onTabRemoved));
chrome.tabs.onReplaced.addListener(whenReady(onTabReplaced));
chrome.tabs.onCreated.addListener(whenReady(onTabCreated));
chrome.webNavigation.onCreatedNavigationTarget.addListener(whenReady((d) => adoptChild(d.tabId, d.sourceTabId, d.url)));
chrome.webNavigation.onCommitted.addListener(whenReady(onCommitted));
chrome.storage.onChanged.addListener(whenReady(onStorageChanged));
chrome.tabs.onActivated.addListener(whenReady(renderPageAction));
chrome.windows.onFocusChanged.addListener(whenReady(renderPageAction));
chrome.contextMenus.onClicked.addListener(whenReady((info, tab) => {
  if (info.menuItemId === PAGE_ACTION_MENU && tab) togglePageAction(tab.id);
}));
chrome.commands.onCommand.addListener(whenReady((command, tab) => {
  if (command === PAGE_ACTION_COMMAND && tab) togglePageAction(tab.id);
}));
chrome.runtime.onMessage.addListener((msg, _sender, sendResponse) => {
  ready.then(() => onMessage(msg)).then(sendResponse, (e) => sendResponse({ error: String(e?.message ?? e) }));
  return true; // the answer comes asynchronously
});

async function init() {
  st.config = await loadConfig();
  const sess = await chrome.storage.session.get(['workers', 'windowId', 'groupId', 'reconnect', 'halted']);
  st.windowId = sess.windowId ?? null;
  st.groupId = sess.groupId ?? null;
  for (const id of sess.workers ?? []) {
    try {
      st.workers.set(id, tabInfo(await chrome.tabs.get(id)));
    } catch {
      // closed while no worker was running
    }
  }
  if (!(await chrome.alarms.get(ALARM_WATCHDOG))) {
    await chrome.alarms.create(ALARM_WATCHDOG, { periodInMinutes: WATCHDOG_MINUTES });
  }
  if (sess.reconnect?.attempt) conn.backoff.attempt = sess.reconnect.attempt;
  try {
    await ensurePool();
  } catch (e) {
    // Connect all the same: the watchdog tries the pool again.
    console.warn('[cheetah] could not set up the worker tabs', e);
  }
  if (sess.halted) {
    conn.halt(sess.halted.message, sess.halted.code);
  } else if (sess.reconnect?.nextAttemptAt > Date.now()) {
    conn.waitUntil(sess.reconnect.nextAttemptAt, 'waiting to reconnect');
  } else {
    conn.connect();
  }
  log('started', VERSION, 'client', st.config.clientId, 'workers', [...st.workers.keys()]);
}

/** loadConfig reads the settings, making the client id on first use. */
async function loadConfig() {
  const c = await chrome.storage.local.get(CONFIG_KEYS);
  if (!c.clientId) {
    c.clientId = newClientId((n) => crypto.getRandomValues(new Uint8Array(n)));
    await chrome.storage.local.set({ clientId: c.clientId });
  }
  let poolSize = DEFAULT_POOL_SIZE;
  try {
    if (c.poolSize !== undefined) poolSize = checkPoolSize(c.poolSize);
  } catch {
    // a bad stored value keeps the default
  }
  let extraTabs = 0;
  try {
    if (c.extraTabs !== undefined) extraTabs = checkPoolSize(c.extraTabs);
  } catch {
    // likewise
  }
  return {
    brokerUrl: c.brokerUrl ?? '', clientKey: c.clientKey ?? '', poolSize, extraTabs, clientId: c.clientId,
    name: c.name ?? '', labels: c.labels ?? {}, allowEvaluate: c.allowEvaluate === true,
  };
}

/** connectionConfig is what hello needs; it throws on a bad broker URL. */
function connectionConfig() {
  const c = st.config;
  if (!c.brokerUrl || !c.clientKey) return null;
  return {
    url: normalizeBrokerURL(c.brokerUrl), token: c.clientKey, clientId: c.clientId,
    name: c.name || 'Cheetah browser extension', version: VERSION, labels: c.labels,
    maxContexts: c.poolSize + c.extraTabs, effects: EFFECTS,
  };
}

function tabInfo(t) {
  return { id: t.id, url: t.url ?? t.pendingUrl ?? '', title: t.title ?? '', status: t.status ?? '' };
}

async function saveSession() {
  await chrome.storage.session.set({
    workers: [...st.workers.keys()], windowId: st.windowId, groupId: st.groupId,
  });
}

// ---- the pool

/** ensurePool drops closed tabs and opens or closes tabs to reach the size. */
function ensurePool() {
  return poolLock.run(async () => {
    for (const id of [...st.workers.keys()]) {
      try {
        await chrome.tabs.get(id);
      } catch {
        forgetWorker(id);
      }
    }
    // No worker tabs until there is a broker to offer them to.
    const configured = Boolean(st.config.brokerUrl && st.config.clientKey);
    const plan = planPool([...st.workers.keys()], configured ? st.config.poolSize : 0,
      (id) => st.marks.get(id) !== null || executor.pending(id) > 0 || creations.waits(id),
      (id) => creations.isExtra(id));
    for (const id of plan.close) {
      forgetWorker(id);
      await chrome.tabs.remove(id).catch(() => {});
    }
    for (let i = 0; i < plan.create; i++) {
      try {
        await openWorker();
      } catch (e) {
        console.warn('[cheetah] could not open a worker tab', e);
        break;
      }
    }
    await saveSession();
  }).finally(() => {
    scheduleReport();
    publishStatus();
  });
}

function forgetWorker(id) {
  st.workers.delete(id);
  creations.forget(id);
  if (st.marks.forget(id)) publishStatus();
}

/**
 * openWorker opens one worker tab at url: in the extension's own window, so
 * that a screenshot (which must show the tab) never takes over the person's
 * window, and in the "Cheetah" tab group, so the person sees what the tabs
 * are. onOpened(tabId) runs just before the tab joins the pool.
 */
async function openWorker(url = 'about:blank', onOpened = () => {}) {
  let win = null;
  if (st.windowId !== null) win = await chrome.windows.get(st.windowId).catch(() => null);
  let tab = null;
  if (win) {
    // The window may be closing (a person closed it with its tabs): then
    // the pool moves to a new window.
    tab = await chrome.tabs.create({ windowId: win.id, url, active: false }).catch(() => null);
  }
  if (!tab) {
    const w = await chrome.windows.create({ url, focused: false });
    st.windowId = w.id;
    st.groupId = null;
    tab = w.tabs?.[0] ?? (await chrome.tabs.query({ windowId: w.id }))[0];
  }
  onOpened(tab.id);
  st.workers.set(tab.id, tabInfo(tab));
  await saveSession(); // before anything else can fail: never lose track of a tab
  await groupWorker(tab.id);
  return tab;
}

async function groupWorker(tabId) {
  try {
    const tab = await chrome.tabs.get(tabId);
    let groupId = st.groupId;
    if (groupId !== null) {
      const g = await chrome.tabGroups.get(groupId).catch(() => null);
      if (!g || g.windowId !== tab.windowId) groupId = null;
    }
    groupId = await chrome.tabs.group(groupId !== null
      ? { tabIds: [tabId], groupId }
      : { tabIds: [tabId], createProperties: { windowId: tab.windowId } });
    if (groupId !== st.groupId) {
      st.groupId = groupId;
      await chrome.tabGroups.update(groupId, { title: GROUP_TITLE, color: GROUP_COLOR, collapsed: false });
      await saveSession();
    }
  } catch (e) {
    console.warn('[cheetah] could not group a worker tab', e);
  }
}

// ---- state reports

/** scheduleReport sends the state soon, coalescing bursts of tab events. */
function scheduleReport() {
  if (st.reportTimer !== null) return;
  st.reportTimer = setTimeout(() => {
    st.reportTimer = null;
    sendReport();
  }, 50);
}

function sendReport() {
  if (conn.state !== 'connected') return;
  const contexts = buildReport([...st.workers.values()], undefined, (id) => creations.requestId(id));
  const key = reportKey(contexts);
  if (key === st.lastReport) return;
  if (conn.send(stateFrame(contexts))) st.lastReport = key;
}

// ---- the broker's frames

function onWelcome() {
  // Marks belong to the session: the broker says nothing of leases that
  // ended while the extension was away, so start clean and learn the
  // current ones from assignment and command frames.
  for (const id of st.marks.clear()) renderMark(id);
  holdsEndedWithConnection();
  st.lastReport = null;
  ready.then(() => ensurePool()).then(() => sendReport());
}

function onFrame(f) {
  switch (f.type) {
    case 'command': {
      let tabId = null;
      try {
        tabId = commandTab(f);
      } catch {
        // the executor answers no_such_tab
      }
      if (tabId !== null && st.workers.has(tabId) && st.marks.applyCommand(tabId, f.task_id, f.epoch) !== null) {
        renderMark(tabId);
        publishStatus();
      }
      executor.handleCommand(f).finally(() => publishStatus());
      publishStatus();
      break;
    }
    case 'cancel':
      executor.handleCancel(f);
      break;
    case 'create_context':
      onCreateContext(f);
      break;
    case 'assignment': {
      onCreationAssignment(f);
      // Before anything after this frame runs on the tab (its queue).
      if (f.clear_state) clearTab(tabIdForContext(f.context_id));
      const tabId = st.marks.applyAssignment(f);
      if (tabId !== null) {
        renderMark(tabId);
        publishStatus();
        if (st.marks.get(tabId) !== null) browser.front(tabId).catch(() => {});
        else endLease(tabId);
        // A pool that shrank while this tab was leased can close it now.
        if (st.marks.get(tabId) === null && st.workers.size > st.config.poolSize) ensurePool();
      }
      break;
    }
    case 'hold_state':
      onHoldState(f);
      break;
    case 'error':
      console.warn('[cheetah] broker error', f.code, f.message ?? '');
      break;
    case 'welcome':
    case 'pong':
      break;
    default:
      // A frame of a newer protocol: say so, and carry on.
      conn.send({ type: 'error', code: 'unknown_type', message: `the extension does not know frames of type ${String(f.type).slice(0, 64)}` });
  }
}

// ---- creation on demand (DESIGN §10)

// Tabs opened on request are extra to the pool: up to extraTabs of them,
// each closed once its lease ends (planPool).
const creations = new Creations({
  capacity: () => (st.config.brokerUrl && st.config.clientKey ? st.config.poolSize + st.config.extraTabs : 0),
  count: () => st.workers.size,
  open: (url, onOpened) => openWorker(url, onOpened),
  report: () => sendReport(),
  send: (f) => conn.send(f),
});

/** onCreateContext opens a tab for the broker, one pool change at a time. */
function onCreateContext(f) {
  poolLock.run(() => creations.handle(f))
    .then((tabId) => {
      if (tabId !== null) log('opened tab', tabId, 'for', f.request_id);
    })
    .catch((e) => console.warn('[cheetah] create_context', e))
    .finally(() => publishStatus());
}

/** onCreationAssignment settles the request of a tab opened on request. */
function onCreationAssignment(f) {
  const tabId = tabIdForContext(f.context_id);
  if (tabId !== null && f.state === 'assigned') creations.leased(tabId);
}

// ---- marks: the badge and tooltip of tabs under automation

function renderMark(tabId) {
  if (!st.workers.has(tabId)) return;
  if (renderHoldMark(tabId)) return;
  const m = st.marks.get(tabId);
  if (m) {
    quietly(() => chrome.action.setBadgeText({ tabId, text: MARK_TEXT }));
    quietly(() => chrome.action.setBadgeBackgroundColor({ tabId, color: MARK_COLOR }));
    quietly(() => chrome.action.setTitle({ tabId, title: `${ACTION_TITLE}: this tab is under automation for task ${m.task_id}` }));
  } else {
    // Back to the global badge, which shows the connection state.
    if (!quietly(() => chrome.action.setBadgeText({ tabId, text: null }))) {
      quietly(() => chrome.action.setBadgeText({ tabId, text: '' }));
    }
    quietly(() => chrome.action.setTitle({ tabId, title: ACTION_TITLE }));
  }
}

/** quietly calls an extension API whose failure only costs a cosmetic. */
function quietly(fn) {
  try {
    fn()?.catch?.((e) => console.debug('[cheetah]', e));
    return true;
  } catch (e) {
    console.debug('[cheetah]', e);
    return false;
  }
}

function renderGlobalBadge() {
  const s = conn.state;
  if (s === 'connected') {
    quietly(() => chrome.action.setBadgeText({ text: '' }));
    quietly(() => chrome.action.setTitle({ title: ACTION_TITLE }));
    return;
  }
  const bad = s === 'halted' || s === 'unconfigured';
  quietly(() => chrome.action.setBadgeText({ text: bad ? '!' : 'off' }));
  quietly(() => chrome.action.setBadgeBackgroundColor({ color: bad ? '#c0392b' : '#7f8c8d' }));
  quietly(() => chrome.action.setTitle({ title: `${ACTION_TITLE}: ${s}${conn.status.detail ? ' — ' + conn.status.detail : ''}` }));
}

// ---- tab events

function onTabUpdated(tabId, info, tab) {
  if (!st.workers.has(tabId)) return;
  st.workers.set(tabId, tabInfo(tab));
  // Chrome resets a tab's own badge when it navigates: put the mark back.
  if (st.marks.get(tabId)) renderMark(tabId);
  if (info.url !== undefined || info.title !== undefined || info.status !== undefined) {
    scheduleReport();
    publishStatus();
  }
}

// ---- tabs a worker page opens (popups, target=_blank)

function onTabCreated(tab) {
  if (tab.openerTabId !== undefined) adoptChild(tab.id, tab.openerTabId, tab.pendingUrl ?? tab.url ?? '');
}

/**
 * adoptChild makes a tab a worker's page opened part of that worker's lease:
 * reported to the running command as a popup event, targetable with
 * target.tab_id, closed when the lease ends. It is never a worker itself.
 */
function adoptChild(tabId, openerId, url) {
  const parent = st.children.get(openerId) ?? (st.workers.has(openerId) ? openerId : null);
  if (parent === null || st.children.has(tabId) || st.workers.has(tabId)) return;
  st.children.set(tabId, parent);
  executor.emit(parent, 'popup', { tab_id: String(tabId), url: url || null, opener_tab_id: String(openerId) });
}

/** endLease closes the tabs the worker's pages opened and lets the debugger go. */
function endLease(tabId) {
  for (const [child, parent] of [...st.children]) {
    if (parent !== tabId) continue;
    st.children.delete(child);
    browser.forget(child);
    chrome.tabs.remove(child).catch(() => {});
  }
  browser.forget(tabId);
  executor.dialogs.delete(tabId);
}

function onTabRemoved(tabId) {
  if (st.children.delete(tabId)) browser.forget(tabId);
  if (!st.workers.has(tabId)) return;
  holdTabClosed(tabId);
  endLease(tabId);
  forgetWorker(tabId);
  saveSession();
  scheduleReport();
  ensurePool(); // refill
}

async function onTabReplaced(addedId, removedId) {
  if (!st.workers.has(removedId)) return;
  forgetWorker(removedId);
  try {
    st.workers.set(addedId, tabInfo(await chrome.tabs.get(addedId)));
  } catch {
    // gone already
  }
  await saveSession();
  scheduleReport();
  ensurePool();
}

// ---- settings, alarms, messages

async function onStorageChanged(changes, area) {
  if (area !== 'local' || !CONFIG_KEYS.some((k) => k in changes)) return;
  const before = st.config;
  st.config = await loadConfig();
  // Only what hello says needs a new connection: the pool size and the
  // extra tabs make its capacity.max_contexts.
  const helloOf = (c) => JSON.stringify([c.brokerUrl, c.clientKey, c.clientId, c.name, c.labels, c.poolSize + c.extraTabs]);
  const reconnect = helloOf(before) !== helloOf(st.config);
  await ensurePool();
  if (reconnect) {
    await chrome.storage.session.set({ halted: null, reconnect: null });
    conn.backoff.reset();
    conn.connect();
  }
  publishStatus();
}

async function onAlarm(alarm) {
  if (alarm.name === ALARM_RECONNECT) {
    if (conn.state === 'waiting') conn.connect();
    return;
  }
  if (alarm.name === ALARM_WATCHDOG) {
    // Wakes a stopped worker (whose init then connects), and catches a
    // reconnect alarm that was lost.
    const s = conn.status;
    if (s.state === 'idle' || (s.state === 'waiting' && s.nextAttemptAt <= Date.now())) conn.connect();
    await ensurePool();
  }
}

async function onMessage(msg) {
  switch (msg?.type) {
    case 'status':
      return statusSnapshot();
    case 'hold':
      return takeControl(Number(msg.tab_id), msg.minutes);
    case 'unhold':
      return giveBack(Number(msg.tab_id));
    case 'reconnect':
      await chrome.storage.session.set({ halted: null, reconnect: null });
      conn.backoff.reset();
      conn.connect();
      return statusSnapshot();
    default:
      return { error: 'unknown message' };
  }
}

// ---- status for the popup and the options page

function statusSnapshot() {
  const s = conn.status;
  const c = st.config ?? {};
  return {
    boot: BOOT,
    seq: ++st.snapshots,
    state: s.state,
    detail: s.detail ?? '',
    since: s.since,
    next_attempt_at: s.nextAttemptAt ?? null,
    user_id: s.userId ?? null,
    session_id: s.sessionId ?? null,
    url: s.url ?? (c.brokerUrl || null),
    client_id: c.clientId ?? null,
    pool_size: c.poolSize ?? null,
    configured: Boolean(c.brokerUrl && c.clientKey),
    version: VERSION,
    workers: [...st.workers.values()].sort((a, b) => a.id - b.id).map((t) => {
      const m = st.marks.get(t.id);
      return {
        tab_id: String(t.id), context_id: `tab-${t.id}`, url: t.url, title: t.title, status: t.status,
        task_id: m?.task_id ?? null, epoch: m?.epoch ?? null, busy: executor.pending(t.id),
        held: st.holds.get(t.id),
      };
    }),
  };
}

/** publishStatus writes the status where the popup reads it, coalesced. */
function publishStatus() {
  if (st.statusTimer !== null) return;
  st.statusTimer = setTimeout(() => {
    st.statusTimer = null;
    renderPageAction();
    if (!st.config) return;
    chrome.storage.session.set({ status: statusSnapshot() }).catch(() => {});
  }, 50);
}

// ---- human control (DESIGN §10): Take control / Give back
//
// A person takes over a worker tab from the popup. The extension sends
// hold (ttl_s is the popup's timer) and the broker answers hold_state:
// pending while the automation's admitted mutations run, then active.
// Meanwhile applications' mutations fail held and observations pass. The
// hold ends on Give back, when the timer runs out (the broker's TTL), when
// the person closes the tab (the next state report drops the context, and
// unhold is sent first), or with the connection.

/** takeControl asks the broker for a hold on a worker tab. */
function takeControl(tabId, minutes) {
  if (!st.workers.has(tabId)) return { error: 'not a worker tab' };
  if (!conn.send(st.holds.take(tabId, minutes))) {
    st.holds.forget(tabId);
    return { error: 'not connected to the broker' };
  }
  renderMark(tabId);
  publishStatus();
  return statusSnapshot();
}

/** giveBack ends the person's hold on a worker tab. */
function giveBack(tabId) {
  if (!st.holds.get(tabId)) return statusSnapshot();
  conn.send(st.holds.give(tabId));
  return statusSnapshot();
}

function onHoldState(f) {
  const tabId = st.holds.apply(f);
  if (tabId === null) return;
  log('hold', f.context_id, f.state);
  renderMark(tabId);
  publishStatus();
}

/** holdTabClosed: the person closed a held tab, which ends the hold. */
function holdTabClosed(tabId) {
  if (!st.holds.get(tabId)) return;
  conn.send(st.holds.give(tabId));
  st.holds.forget(tabId);
}

/** holdsEndedWithConnection: a new session holds nothing. */
function holdsEndedWithConnection() {
  for (const id of st.holds.clear()) renderMark(id);
}

/** renderHoldMark badges a held tab; it reports whether the tab is held. */
function renderHoldMark(tabId) {
  const h = st.holds.get(tabId);
  if (!h) return false;
  const b = holdBadge(h);
  quietly(() => chrome.action.setBadgeText({ tabId, text: b.text }));
  quietly(() => chrome.action.setBadgeBackgroundColor({ tabId, color: b.color }));
  quietly(() => chrome.action.setTitle({ tabId, title: b.title }));
  return true;
}

// ---- the page action: Take control / Give back from the tab itself
//
// The page's context menu has one item, and Alt+Shift+H the same effect,
// on the tab in front: what pageAction offers there. Chrome keeps menu
// items across worker restarts, so the item is made once, at install; it
// is redrawn for the active tab whenever the status is published and when
// the person switches tabs or windows.

/** createPageAction makes the context-menu item (hidden until a worker tab is in front). */
function createPageAction() {
  chrome.contextMenus.removeAll(() => {
    chrome.contextMenus.create({ id: PAGE_ACTION_MENU, title: pageAction({ worker: false }).title,
      contexts: ['page', 'frame', 'selection', 'link', 'image', 'editable'], visible: false }, () => void chrome.runtime.lastError);
    renderPageAction();
  });
}

/** pageActionOn is what the page action offers on tabId now. */
function pageActionOn(tabId) {
  return pageAction({ worker: st.workers.has(tabId), held: st.holds.get(tabId), connected: conn.state === 'connected' });
}

/** renderPageAction shows the context-menu item as the tab in front calls for. */
async function renderPageAction() {
  let tab;
  try {
    [tab] = await chrome.tabs.query({ active: true, lastFocusedWindow: true });
  } catch {
    return;
  }
  const a = pageActionOn(tab?.id);
  quietly(() => chrome.contextMenus.update(PAGE_ACTION_MENU, { visible: a.visible, enabled: a.enabled, title: a.title }));
}

/** togglePageAction takes control of tabId, or gives it back. */
function togglePageAction(tabId) {
  const a = pageActionOn(tabId);
  const res = a.action === 'hold' ? takeControl(tabId, DEFAULT_HOLD_MINUTES) : a.action === 'unhold' ? giveBack(tabId) : null;
  if (res?.error) log('page action', tabId, res.error);
  renderPageAction();
}

// ---- a lease's clean slate (clear_state)
//
// A lease acquired with clear_state has its tab cleared on the assignment
// that begins it and on the one that ends it: the page's session storage,
// then (the tab on about:blank) cookies, local storage, IndexedDB, caches
// and service workers of every web origin the tab and the tabs it opened
// committed since the last clear, and of the page in front. The origins
// are kept in memory: a service worker that restarted in between clears
// those it saw since, and the page in front.

/** onCommitted records the web origin of a worker's (or its child's) committed document. */
function onCommitted(d) {
  const owner = st.children.get(d.tabId) ?? (st.workers.has(d.tabId) ? d.tabId : null);
  const origin = webOrigin(d.url);
  if (owner === null || origin === null) return;
  if (!st.visited.has(owner)) st.visited.set(owner, new Set());
  st.visited.get(owner).add(origin);
}

/** webOrigin is url's origin when it is an http(s) URL, else null. */
function webOrigin(url) {
  try {
    const u = new URL(url);
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.origin : null;
  } catch {
    return null;
  }
}

/** clearTab queues the clearing of a worker tab's state. */
function clearTab(tabId) {
  if (tabId === null || !st.workers.has(tabId)) return;
  const origins = [...(st.visited.get(tabId) ?? [])];
  const front = webOrigin(st.workers.get(tabId)?.url ?? '');
  if (front) origins.push(front);
  st.visited.delete(tabId);
  executor.clearState(tabId, origins).then(
    (cleared) => log('clear_state', tabId, cleared),
    (e) => console.warn('[cheetah] clear_state', tabId, e),
  );
}

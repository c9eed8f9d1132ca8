// Connection keeps one WebSocket to the broker: hello, welcome, pings every
// 20 s, and reconnection with jittered exponential backoff after anything
// but a permanent close. It takes its WebSocket constructor, timers and
// reconnect scheduler from the caller, so the Node tests drive it with
// fakes, and the service worker schedules reconnects with chrome.alarms,
// which outlive the worker itself.
//
// Every connect() starts a new generation. Handlers of an older generation's
// socket do nothing but close that socket, so a stale socket (one that was
// opening while the worker reconnected, or that a restarted worker no longer
// knows) never replaces a newer one.

import { Backoff } from './backoff.js';
import {
  CLOSE, DEFAULT_MAX_MESSAGE_BYTES, closeReason, encodeFrame, helloFrame,
  isPermanentClose, parseFrame, pingFrame,
} from './protocol.js';

export const PING_MS = 20000;
export const HANDSHAKE_MS = 15000;

// The error frame the broker sends before a 44xx close says why; a browser
// does not always get to see the close code itself.
const CLOSE_FOR_ERROR = {
  unauthorized: CLOSE.UNAUTHORIZED,
  forbidden: CLOSE.FORBIDDEN,
  replaced: CLOSE.REPLACED,
};

// Client-side close codes (a browser may only use 1000 and 3000–4999).
const CLIENT_CLOSE_NO_WELCOME = 4000;
const CLIENT_CLOSE_SILENT = 4001;

export class Connection {
  constructor({
    WebSocket,
    getConfig,
    scheduleReconnect = () => {},
    cancelReconnect = () => {},
    onWelcome = () => {},
    onFrame = () => {},
    onStatus = () => {},
    onReconnectState = () => {},
    onHalt = () => {},
    timers = globalThis,
    now = () => Date.now(),
    backoff = new Backoff(),
    pingMs = PING_MS,
    handshakeMs = HANDSHAKE_MS,
    log = () => {},
    // diagnose(wsUrl) says why a socket never opened, when it can tell
    // (see probe.js); null when it cannot.
    diagnose = null,
  }) {
    Object.assign(this, {
      WebSocket, getConfig, scheduleReconnect, cancelReconnect, onWelcome, onFrame,
      onStatus, onReconnectState, onHalt, timers, now, backoff, pingMs, handshakeMs, log, diagnose,
    });
    this.gen = 0;
    this.ws = null;
    this.welcomed = false;
    this.maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES;
    this.heartbeatMs = PING_MS;
    this.lastSeen = 0;
    this.pingTimer = null;
    this.handshakeTimer = null;
    this.brokerError = null;
    this.status = { state: 'idle', detail: '', since: now() };
  }

  get state() {
    return this.status.state;
  }

  setStatus(state, fields = {}) {
    this.status = { state, detail: '', since: this.now(), ...fields };
    this.onStatus(this.status);
  }

  /**
   * connect opens a new connection, closing the current one. It is safe to
   * call at any time and from any event: an older call still reading the
   * configuration finds its generation superseded and gives up.
   */
  async connect() {
    const gen = ++this.gen;
    this.dropSocket();
    this.cancelReconnect();
    let cfg;
    try {
      cfg = await this.getConfig();
    } catch (e) {
      if (gen !== this.gen) return;
      this.setStatus('unconfigured', { detail: String(e?.message ?? e) });
      return;
    }
    if (gen !== this.gen) return;
    if (!cfg || !cfg.url || !cfg.token) {
      this.setStatus('unconfigured', { detail: '' });
      return;
    }
    let ws;
    try {
      ws = new this.WebSocket(cfg.url);
    } catch (e) {
      this.log('websocket', e);
      this.retry(gen, `cannot open ${cfg.url}: ${e?.message ?? e}`);
      return;
    }
    this.ws = ws;
    this.url = cfg.url;
    this.opened = false;
    this.welcomed = false;
    this.brokerError = null;
    this.setStatus('connecting', { url: cfg.url });
    this.handshakeTimer = this.timers.setTimeout(() => {
      if (gen === this.gen && !this.welcomed) {
        this.brokerError = this.brokerError ?? { code: 'timeout', message: 'no welcome from the broker' };
        this.abandon(gen, ws, CLIENT_CLOSE_NO_WELCOME, 'no welcome');
      }
    }, this.handshakeMs);

    ws.onopen = () => {
      if (gen !== this.gen) return this.closeSocket(ws, 1000, 'stale');
      this.opened = true;
      this.sendRaw(ws, helloFrame(cfg));
    };
    ws.onmessage = (ev) => {
      if (gen !== this.gen) return this.closeSocket(ws, 1000, 'stale');
      this.handleMessage(gen, ev.data);
    };
    ws.onclose = (ev) => {
      if (gen !== this.gen) return;
      this.handleClose(gen, ev.code, ev.reason);
    };
    ws.onerror = () => {}; // a close event follows
  }

  /** send writes a frame on the welcomed connection; false when it cannot. */
  send(frame) {
    if (!this.ws || !this.welcomed || this.ws.readyState !== 1) return false;
    return this.sendRaw(this.ws, frame);
  }

  sendRaw(ws, frame) {
    const s = encodeFrame(frame, this.maxMessageBytes);
    if (s === null) {
      this.log('dropped a frame larger than max_message_bytes', frame.type);
      return false;
    }
    try {
      ws.send(s);
      return true;
    } catch (e) {
      this.log('send', e);
      return false;
    }
  }

  handleMessage(gen, data) {
    if (typeof data !== 'string') return; // the protocol is JSON text
    const { frame, error } = parseFrame(data);
    if (error) {
      this.log('bad frame from the broker:', error);
      return;
    }
    this.lastSeen = this.now();
    if (!this.welcomed) {
      if (frame.type === 'welcome') {
        this.welcomed = true;
        this.timers.clearTimeout(this.handshakeTimer);
        this.handshakeTimer = null;
        this.backoff.reset();
        this.onReconnectState(null);
        if (Number.isInteger(frame.max_message_bytes) && frame.max_message_bytes > 0) {
          this.maxMessageBytes = frame.max_message_bytes;
        }
        if (Number.isInteger(frame.heartbeat_s) && frame.heartbeat_s > 0) {
          this.heartbeatMs = frame.heartbeat_s * 1000;
        }
        this.pingTimer = this.timers.setInterval(() => this.tick(gen), this.pingMs);
        this.setStatus('connected', {
          url: this.status.url, userId: frame.user_id, sessionId: frame.session_id,
        });
        this.onWelcome(frame);
      } else if (frame.type === 'error') {
        this.brokerError = { code: frame.code, message: frame.message };
      }
      return;
    }
    if (frame.type === 'pong') return;
    if (frame.type === 'error' && !frame.command_id) {
      this.brokerError = { code: frame.code, message: frame.message };
    }
    this.onFrame(frame);
  }

  /** tick sends the ping, and gives up on a broker silent for too long. */
  tick(gen) {
    if (gen !== this.gen || !this.ws) return;
    const silentFor = this.now() - this.lastSeen;
    if (silentFor > 3 * Math.max(this.heartbeatMs, this.pingMs)) {
      this.brokerError = { code: 'timeout', message: 'the broker answered no ping' };
      this.abandon(gen, this.ws, CLIENT_CLOSE_SILENT, 'broker silent');
      return;
    }
    this.send(pingFrame());
  }

  handleClose(gen, code, reason) {
    if (gen !== this.gen) return;
    this.stopTimers();
    this.ws = null;
    const wasWelcomed = this.welcomed;
    this.welcomed = false;
    const err = this.brokerError;
    const effective = CLOSE_FOR_ERROR[err?.code] ?? code;
    let detail = [closeReason(effective), err?.message].filter(Boolean).join(': ');
    // A connection that never opened was not lost: it never was. A browser
    // does not say why; say what to check.
    const never = !this.opened && !err && code === 1006;
    if (never) detail = neverOpened(this.url);
    if (isPermanentClose(effective)) {
      this.gen++; // nothing of this connection may act any more
      this.setStatus('halted', { detail, closeCode: effective });
      this.onHalt({ code: effective, message: detail });
      return;
    }
    this.log('connection closed', code, reason, wasWelcomed ? '(was connected)' : '');
    this.retry(gen, detail);
    if (never && this.diagnose) {
      const url = this.url;
      const status = this.status;
      Promise.resolve(this.diagnose(url)).then((why) => {
        // Only while still waiting after this very attempt.
        if (!why || gen !== this.gen || this.status !== status) return;
        this.status = { ...status, detail: `could not connect to ${url}: ${why}` };
        this.onStatus(this.status);
      }, () => {});
    }
  }

  /** retry schedules the next attempt after the backoff delay. */
  retry(gen, detail) {
    if (gen !== this.gen) return;
    const delay = this.backoff.next();
    const at = this.now() + delay;
    this.onReconnectState({ attempt: this.backoff.attempt, nextAttemptAt: at });
    this.waitUntil(at, detail);
  }

  /**
   * waitUntil shows the connection waiting, and asks the scheduler to call
   * connect at that time. A restarted service worker uses it to honour the
   * delay its predecessor chose.
   */
  waitUntil(at, detail = '') {
    this.setStatus('waiting', { detail, nextAttemptAt: at });
    this.scheduleReconnect(Math.max(0, at - this.now()), at);
  }

  /** halt stops without reconnecting, as after a permanent close. */
  halt(detail, closeCode) {
    this.gen++;
    this.dropSocket();
    this.cancelReconnect();
    this.setStatus('halted', { detail, closeCode });
  }

  /** stop closes the connection and stays idle (no configuration). */
  stop(state = 'idle', detail = '') {
    this.gen++;
    this.dropSocket();
    this.cancelReconnect();
    this.setStatus(state, { detail });
  }

  dropSocket() {
    this.stopTimers();
    const ws = this.ws;
    this.ws = null;
    this.welcomed = false;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      this.closeSocket(ws, 1000, 'reconnecting');
    }
  }

  /**
   * abandon gives up on a socket that the broker does not close by itself:
   * its handlers are detached first, so its close event cannot count twice.
   */
  abandon(gen, ws, code, reason) {
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    this.closeSocket(ws, code, reason);
    this.handleClose(gen, 1006, reason);
  }

  closeSocket(ws, code, reason) {
    try {
      if (ws.readyState === 0 || ws.readyState === 1) ws.close(code, reason);
    } catch (e) {
      this.log('close', e);
    }
  }

  stopTimers() {
    if (this.pingTimer !== null) this.timers.clearInterval(this.pingTimer);
    if (this.handshakeTimer !== null) this.timers.clearTimeout(this.handshakeTimer);
    this.pingTimer = null;
    this.handshakeTimer = null;
  }
}

/**
 * neverOpened says what a WebSocket that never opened means: nothing
 * answered at that address, or something did that is not the broker's
 * WebSocket (a wrong path), or, for wss://, a certificate the browser does
 * not trust.
 */
export function neverOpened(url) {
  const base = `could not connect to ${url}: no broker answered there`;
  if (url?.startsWith('wss:')) {
    return `${base} (is the broker serving TLS there, with a certificate this browser trusts? is the path right?)`;
  }
  return `${base} (is it running, and are the host, port and path right?)`;
}

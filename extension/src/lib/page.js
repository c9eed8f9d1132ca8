// Functions that chrome.scripting.executeScript runs inside a worker tab's
// top frame, in the extension's isolated world. Chrome serializes each one on
// its own, so every function here is self-contained: no imports, no helpers
// from outside its body, and a plain-JSON answer of the form
// {ok: true, ...} or {ok: false, code, message}.

/** pageInfo reads where the tab is. */
export function pageInfo() {
  return { ok: true, url: location.href, title: document.title, ready: document.readyState };
}

/**
 * pageRun runs one element or reading operation. a.frame, when given, is the
 * CSS selector of a same-origin iframe whose document the operation works in.
 */
export function pageRun(op, a) {
  const fail = (code, message) => ({ ok: false, code, message });
  const here = () => ({ url: location.href, title: document.title });
  class Fail extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
    }
  }
  const query = (root, sel, all) => {
    try {
      return all ? [...root.querySelectorAll(sel)] : root.querySelector(sel);
    } catch (e) {
      throw new Fail('invalid_params', `"${sel}" is not a valid CSS selector: ${e.message}`);
    }
  };
  // The document the operation works in, and the offset of its frame in
  // the top viewport (for coordinates).
  const scope = () => {
    if (!a.frame) return { doc: document, win: window, dx: 0, dy: 0 };
    const f = query(document, a.frame, false);
    if (!f) throw new Fail('no_such_frame', `no element matches the frame selector "${a.frame}"`);
    if (f.tagName !== 'IFRAME' && f.tagName !== 'FRAME') throw new Fail('no_such_frame', `"${a.frame}" is a <${f.tagName.toLowerCase()}>, not an iframe`);
    let doc = null;
    try {
      doc = f.contentDocument;
    } catch {
      doc = null;
    }
    if (!doc) throw new Fail('no_such_frame', `the frame "${a.frame}" is not same-origin (or not loaded): its document is out of reach`);
    const r = f.getBoundingClientRect();
    return { doc, win: f.contentWindow, dx: r.left + f.clientLeft, dy: r.top + f.clientTop };
  };
  const one = (s) => {
    const el = query(s.doc, a.selector, false);
    if (!el) throw new Fail('no_such_element', `no element matches "${a.selector}"${a.frame ? ` in frame "${a.frame}"` : ''}`);
    return el;
  };
  const center = (s, el) => {
    el.scrollIntoView({ block: 'center', inline: 'center' });
    const r = el.getBoundingClientRect();
    return { x: s.dx + r.left + r.width / 2, y: s.dy + r.top + r.height / 2, cx: r.left + r.width / 2, cy: r.top + r.height / 2 };
  };
  const fire = (el, type, init) => el.dispatchEvent(new Event(type, { bubbles: true, composed: true, ...init }));
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    const st = el.ownerDocument.defaultView.getComputedStyle(el);
    return r.width > 0 && r.height > 0 && st.visibility !== 'hidden' && st.display !== 'none';
  };
  const textOf = (el) => (el.innerText ?? el.textContent ?? '');
  const valueOf = (el, attribute) => {
    if (!attribute) return textOf(el).trim();
    // A live property where the element has one (value, checked, href as
    // resolved), else the attribute.
    const v = el[attribute];
    if (v !== undefined && v !== null && ['string', 'number', 'boolean'].includes(typeof v)) return v;
    return el.getAttribute(attribute);
  };
  try {
    switch (op) {
      case 'extract': {
        const s = scope();
        const cut = (v) => (typeof v === 'string' && v.length > a.maxChars ? v.slice(0, a.maxChars) : v);
        if (a.all || a.attribute) {
          const els = a.all ? query(s.doc, a.selector, true) : [one(s)];
          if (!a.all && els.length === 0) throw new Fail('no_such_element', `no element matches "${a.selector}"`);
          const values = els.map((el) => (a.attribute ? valueOf(el, a.attribute) : a.format === 'html' ? el.outerHTML : textOf(el)));
          return { ok: true, ...here(), values };
        }
        let content;
        const el = a.selector ? one(s) : null;
        if (a.format === 'html') {
          if (el) {
            content = el.outerHTML;
          } else {
            const d = s.doc;
            const dt = d.doctype ? new XMLSerializer().serializeToString(d.doctype) + '\n' : '';
            content = dt + (d.documentElement ? d.documentElement.outerHTML : '');
          }
        } else {
          const root = el ?? s.doc.body ?? s.doc.documentElement;
          content = root ? textOf(root) : '';
        }
        return { ok: true, ...here(), content: cut(content), length: content.length };
      }
      case 'parse': {
        const s = scope();
        const run = (root, fields) => {
          const out = {};
          for (const [name, f] of Object.entries(fields)) {
            const els = f.selector ? query(root, f.selector, true) : [root];
            const read = (el) => (f.fields ? run(el, f.fields) : valueOf(el, f.attribute));
            out[name] = f.all ? els.map(read) : (els.length ? read(els[0]) : null);
          }
          return out;
        };
        return { ok: true, ...here(), data: run(s.doc, a.fields) };
      }
      case 'query': {
        const s = scope();
        const el = query(s.doc, a.selector, false);
        const state = a.state;
        const met = state === 'attached' ? !!el
          : state === 'detached' ? !el
            : state === 'visible' ? !!el && visible(el)
              : !el || !visible(el);
        return { ok: true, met, ...here() };
      }
      case 'point': {
        const s = scope();
        const el = one(s);
        const c = center(s, el);
        return { ok: true, x: c.x, y: c.y };
      }
      case 'click': {
        const s = scope();
        const el = one(s);
        const c = center(s, el);
        const button = { left: 0, middle: 1, right: 2 }[a.button];
        const buttons = { left: 1, middle: 4, right: 2 }[a.button];
        const base = {
          bubbles: true, cancelable: true, composed: true, view: s.win, clientX: c.cx, clientY: c.cy, button,
        };
        const pointer = { ...base, pointerId: 1, pointerType: 'mouse', isPrimary: true };
        const disabled = el.disabled === true;
        for (let i = 1; i <= a.clickCount; i++) {
          el.dispatchEvent(new PointerEvent('pointerdown', { ...pointer, buttons }));
          el.dispatchEvent(new MouseEvent('mousedown', { ...base, buttons, detail: i }));
          if (i === 1 && typeof el.focus === 'function') el.focus({ preventScroll: true });
          el.dispatchEvent(new PointerEvent('pointerup', pointer));
          el.dispatchEvent(new MouseEvent('mouseup', { ...base, detail: i }));
          if (a.button === 'left') {
            if (i === 1 && typeof el.click === 'function') el.click();
            else el.dispatchEvent(new MouseEvent('click', { ...base, detail: i }));
          } else if (a.button === 'middle') {
            el.dispatchEvent(new MouseEvent('auxclick', { ...base, detail: i }));
          } else {
            el.dispatchEvent(new MouseEvent('contextmenu', { ...base, detail: i }));
          }
        }
        if (a.clickCount === 2 && a.button === 'left') el.dispatchEvent(new MouseEvent('dblclick', { ...base, detail: 2 }));
        return { ok: true, ...here(), tag: el.tagName.toLowerCase(), disabled };
      }
      case 'hover': {
        const s = scope();
        const el = one(s);
        const c = center(s, el);
        const init = { bubbles: true, cancelable: true, composed: true, view: s.win, clientX: c.cx, clientY: c.cy };
        el.dispatchEvent(new PointerEvent('pointerover', { ...init, pointerType: 'mouse' }));
        el.dispatchEvent(new MouseEvent('mouseover', init));
        el.dispatchEvent(new MouseEvent('mouseenter', { ...init, bubbles: false }));
        el.dispatchEvent(new MouseEvent('mousemove', init));
        return { ok: true, x: c.x, y: c.y };
      }
      case 'focus': {
        const s = scope();
        const el = one(s);
        el.scrollIntoView({ block: 'center', inline: 'center' });
        if (typeof el.focus === 'function') el.focus();
        return { ok: true };
      }
      case 'type': {
        const s = scope();
        const el = one(s);
        const tag = el.tagName;
        const text = a.text;
        const noText = ['checkbox', 'radio', 'file', 'submit', 'button', 'image', 'reset', 'hidden', 'range', 'color'];
        const input = () => el.dispatchEvent(new InputEvent('input', { bubbles: true, composed: true, inputType: 'insertText', data: text }));
        if (tag === 'INPUT' || tag === 'TEXTAREA') {
          if (tag === 'INPUT' && noText.includes(el.type)) return fail('invalid_params', `"${a.selector}" is an input of type ${el.type}, which takes no text`);
          if (el.disabled || el.readOnly) return fail('invalid_params', `"${a.selector}" is disabled or read-only`);
          el.focus({ preventScroll: false });
          const proto = tag === 'INPUT' ? s.win.HTMLInputElement.prototype : s.win.HTMLTextAreaElement.prototype;
          Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, a.clear ? text : el.value + text);
          input();
          fire(el, 'change');
        } else if (tag === 'SELECT') {
          const opt = [...el.options].find((o) => o.value === text) ?? [...el.options].find((o) => o.label === text || o.text === text);
          if (!opt) return fail('invalid_params', `"${a.selector}" has no option "${text}"`);
          el.focus();
          el.value = opt.value;
          input();
          fire(el, 'change');
        } else if (el.isContentEditable) {
          el.focus();
          const sel = s.win.getSelection();
          const range = s.doc.createRange();
          range.selectNodeContents(el);
          if (!a.clear) range.collapse(false);
          sel.removeAllRanges();
          sel.addRange(range);
          if (!s.doc.execCommand('insertText', false, text)) {
            if (a.clear) el.textContent = text;
            else el.textContent += text;
            input();
          }
        } else {
          return fail('invalid_params', `"${a.selector}" is a <${tag.toLowerCase()}>, which takes no text`);
        }
        let submitted = false;
        if (a.submit) {
          const form = el.form ?? el.closest('form');
          if (!form) return fail('invalid_params', `"${a.selector}" is in no form to submit`);
          if (typeof form.requestSubmit === 'function') form.requestSubmit();
          else form.submit();
          submitted = true;
        }
        return { ok: true, ...here(), tag: tag.toLowerCase(), submitted };
      }
      case 'scroll': {
        const s = scope();
        if (a.selector) {
          one(s).scrollIntoView({ block: 'center', inline: 'nearest' });
        } else {
          s.win.scrollBy(a.x, a.y);
        }
        return { ok: true, x: s.win.scrollX, y: s.win.scrollY };
      }
      case 'select': {
        const s = scope();
        const el = one(s);
        if (el.tagName !== 'SELECT') return fail('invalid_params', `"${a.selector}" is a <${el.tagName.toLowerCase()}>, not a <select>`);
        if (el.disabled) return fail('invalid_params', `"${a.selector}" is disabled`);
        const opts = [...el.options];
        const chosen = [];
        for (const want of a.options) {
          const o = opts.find((x) => (a.by === 'values' ? x.value === want : x.label === want || x.text.trim() === want));
          if (!o) return fail('invalid_params', `"${a.selector}" has no option with ${a.by === 'values' ? 'value' : 'label'} "${want}"`);
          chosen.push(o);
        }
        if (!el.multiple && chosen.length > 1) return fail('invalid_params', `"${a.selector}" takes one option, not ${chosen.length}`);
        for (const o of opts) o.selected = chosen.includes(o);
        fire(el, 'input');
        fire(el, 'change');
        return { ok: true, selected: [...el.selectedOptions].map((o) => o.value) };
      }
      case 'check': {
        const s = scope();
        const el = one(s);
        const box = el.tagName === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio');
        const role = el.getAttribute('role');
        if (!box && role !== 'checkbox' && role !== 'radio' && role !== 'switch') {
          return fail('invalid_params', `"${a.selector}" is not a checkbox or radio button`);
        }
        const now = () => (box ? el.checked : el.getAttribute('aria-checked') === 'true');
        if (box && el.type === 'radio' && !a.checked) return fail('invalid_params', `"${a.selector}" is a radio button, which cannot be unchecked`);
        if (box && el.disabled) return fail('invalid_params', `"${a.selector}" is disabled`);
        if (now() !== a.checked) {
          el.scrollIntoView({ block: 'center' });
          el.click();
        }
        if (now() !== a.checked) return fail('command_failed', `clicking "${a.selector}" did not ${a.checked ? 'check' : 'uncheck'} it`);
        return { ok: true, checked: now() };
      }
      case 'upload': {
        const s = scope();
        const el = one(s);
        if (el.tagName !== 'INPUT' || el.type !== 'file') return fail('invalid_params', `"${a.selector}" is not an <input type=file>`);
        if (el.disabled) return fail('invalid_params', `"${a.selector}" is disabled`);
        if (a.files.length > 1 && !el.multiple) return fail('invalid_params', `"${a.selector}" takes one file, not ${a.files.length}`);
        const dt = new DataTransfer();
        for (const f of a.files) {
          const bin = atob(f.data);
          const bytes = new Uint8Array(bin.length);
          for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
          dt.items.add(new File([bytes], f.name, { type: f.mime }));
        }
        el.files = dt.files;
        fire(el, 'input');
        fire(el, 'change');
        return { ok: true, files: el.files.length };
      }
      case 'rect': {
        const s = scope();
        const el = one(s);
        el.scrollIntoView({ block: 'start', inline: 'nearest' });
        const r = el.getBoundingClientRect();
        return {
          ok: true, x: s.dx + r.left + window.scrollX, y: s.dy + r.top + window.scrollY, width: r.width, height: r.height,
        };
      }
      case 'storage': {
        const st = a.kind === 'session' ? sessionStorage : localStorage;
        if (a.set) for (const [k, v] of Object.entries(a.set)) st.setItem(k, v);
        if (a.clear === true) st.clear();
        else if (Array.isArray(a.clear)) for (const k of a.clear) st.removeItem(k);
        const items = {};
        for (let i = 0; i < st.length; i++) {
          const k = st.key(i);
          items[k] = st.getItem(k);
        }
        return { ok: true, items };
      }
      case 'stop':
        window.stop();
        return { ok: true };
    }
    return fail('command_failed', `unknown page operation ${op}`);
  } catch (e) {
    if (e instanceof Fail) return fail(e.code, e.message);
    if (e && e.name === 'SecurityError') return fail('not_scriptable', String(e.message));
    return fail('command_failed', String(e && e.message || e));
  }
}

/** pageWaitPaint resolves after the next two frames, or after 500 ms. */
export function pageWaitPaint() {
  return new Promise((resolve) => {
    const done = () => resolve({ ok: true });
    setTimeout(done, 500);
    requestAnimationFrame(() => requestAnimationFrame(done));
  });
}

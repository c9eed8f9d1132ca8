// Functions that chrome.scripting.executeScript runs inside a worker tab's
// top frame, in the extension's isolated world. Chrome serializes each one on
// its own, so every function here is self-contained: no imports, no helpers
// from outside its body, and a plain-JSON answer of the form
// {ok: true, ...} or {ok: false, code, message}.

/** pageInfo reads where the tab is. */
export function pageInfo() {
  return { ok: true, url: location.href, title: document.title, ready: document.readyState };
}

/** pageExtract reads the page's (or one element's) text or HTML. */
export function pageExtract(selector, format, maxChars) {
  try {
    let el = null;
    if (selector) {
      try {
        el = document.querySelector(selector);
      } catch (e) {
        return { ok: false, code: 'invalid_params', message: `"${selector}" is not a valid CSS selector: ${e.message}` };
      }
      if (!el) return { ok: false, code: 'no_such_element', message: `no element matches "${selector}"` };
    }
    let content;
    if (format === 'html') {
      if (el) {
        content = el.outerHTML;
      } else {
        const dt = document.doctype ? new XMLSerializer().serializeToString(document.doctype) + '\n' : '';
        content = dt + (document.documentElement ? document.documentElement.outerHTML : '');
      }
    } else {
      const root = el ?? document.body ?? document.documentElement;
      content = root ? (root.innerText ?? root.textContent ?? '') : '';
    }
    const length = content.length;
    if (length > maxChars) content = content.slice(0, maxChars);
    return { ok: true, url: location.href, title: document.title, content, length };
  } catch (e) {
    return { ok: false, code: 'command_failed', message: String(e && e.message || e) };
  }
}

/** pageClick clicks the first element that matches selector. */
export function pageClick(selector) {
  try {
    let el;
    try {
      el = document.querySelector(selector);
    } catch (e) {
      return { ok: false, code: 'invalid_params', message: `"${selector}" is not a valid CSS selector: ${e.message}` };
    }
    if (!el) return { ok: false, code: 'no_such_element', message: `no element matches "${selector}"` };
    if (typeof el.scrollIntoView === 'function') el.scrollIntoView({ block: 'center', inline: 'center' });
    const r = el.getBoundingClientRect();
    const base = {
      bubbles: true, cancelable: true, composed: true, view: window,
      clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, button: 0,
    };
    const pointer = { ...base, pointerId: 1, pointerType: 'mouse', isPrimary: true };
    el.dispatchEvent(new PointerEvent('pointerdown', { ...pointer, buttons: 1 }));
    el.dispatchEvent(new MouseEvent('mousedown', { ...base, buttons: 1 }));
    if (typeof el.focus === 'function') el.focus({ preventScroll: true });
    el.dispatchEvent(new PointerEvent('pointerup', pointer));
    el.dispatchEvent(new MouseEvent('mouseup', base));
    const disabled = el.disabled === true;
    if (typeof el.click === 'function') el.click();
    else el.dispatchEvent(new MouseEvent('click', base));
    return { ok: true, url: location.href, title: document.title, tag: el.tagName.toLowerCase(), disabled };
  } catch (e) {
    return { ok: false, code: 'command_failed', message: String(e && e.message || e) };
  }
}

/**
 * pageType puts text into a field: an input, a textarea, a select (by option
 * value or label) or a contenteditable element. It sets the value the way a
 * framework notices (the native setter, then input and change events); it
 * does not synthesize key presses.
 */
export function pageType(selector, text, clear, submit) {
  try {
    let el;
    try {
      el = document.querySelector(selector);
    } catch (e) {
      return { ok: false, code: 'invalid_params', message: `"${selector}" is not a valid CSS selector: ${e.message}` };
    }
    if (!el) return { ok: false, code: 'no_such_element', message: `no element matches "${selector}"` };
    const tag = el.tagName;
    const fire = (type) => el.dispatchEvent(type === 'input'
      ? new InputEvent('input', { bubbles: true, composed: true, inputType: 'insertText', data: text })
      : new Event(type, { bubbles: true }));
    const noText = ['checkbox', 'radio', 'file', 'submit', 'button', 'image', 'reset', 'hidden', 'range', 'color'];
    if (tag === 'INPUT' || tag === 'TEXTAREA') {
      if (tag === 'INPUT' && noText.includes(el.type)) {
        return { ok: false, code: 'invalid_params', message: `"${selector}" is an input of type ${el.type}, which takes no text` };
      }
      if (el.disabled || el.readOnly) {
        return { ok: false, code: 'invalid_params', message: `"${selector}" is disabled or read-only` };
      }
      el.focus({ preventScroll: false });
      const proto = tag === 'INPUT' ? HTMLInputElement.prototype : HTMLTextAreaElement.prototype;
      const setter = Object.getOwnPropertyDescriptor(proto, 'value').set;
      setter.call(el, clear ? text : el.value + text);
      fire('input');
      fire('change');
    } else if (tag === 'SELECT') {
      const opt = [...el.options].find((o) => o.value === text) ?? [...el.options].find((o) => o.label === text || o.text === text);
      if (!opt) return { ok: false, code: 'invalid_params', message: `"${selector}" has no option "${text}"` };
      el.focus();
      el.value = opt.value;
      fire('input');
      fire('change');
    } else if (el.isContentEditable) {
      el.focus();
      const sel = window.getSelection();
      const range = document.createRange();
      range.selectNodeContents(el);
      if (!clear) range.collapse(false);
      sel.removeAllRanges();
      sel.addRange(range);
      if (!document.execCommand('insertText', false, text)) {
        if (clear) el.textContent = text;
        else el.textContent += text;
        fire('input');
      }
    } else {
      return { ok: false, code: 'invalid_params', message: `"${selector}" is a <${tag.toLowerCase()}>, which takes no text` };
    }
    let submitted = false;
    if (submit) {
      const form = el.form ?? el.closest('form');
      if (!form) return { ok: false, code: 'invalid_params', message: `"${selector}" is in no form to submit` };
      if (typeof form.requestSubmit === 'function') form.requestSubmit();
      else form.submit();
      submitted = true;
    }
    return { ok: true, url: location.href, title: document.title, tag: tag.toLowerCase(), submitted };
  } catch (e) {
    return { ok: false, code: 'command_failed', message: String(e && e.message || e) };
  }
}

/** pageQuery says whether selector matches (and, if asked, is visible). */
export function pageQuery(selector, visible) {
  try {
    let el;
    try {
      el = document.querySelector(selector);
    } catch (e) {
      return { ok: false, code: 'invalid_params', message: `"${selector}" is not a valid CSS selector: ${e.message}` };
    }
    if (!el) return { ok: true, found: false };
    if (visible) {
      const r = el.getBoundingClientRect();
      const s = getComputedStyle(el);
      if (!(r.width > 0 && r.height > 0) || s.visibility === 'hidden' || s.display === 'none') {
        return { ok: true, found: false };
      }
    }
    return { ok: true, found: true, url: location.href, title: document.title };
  } catch (e) {
    return { ok: false, code: 'command_failed', message: String(e && e.message || e) };
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

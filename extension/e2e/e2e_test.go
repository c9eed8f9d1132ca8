package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// TestExtension drives the extension in a real headless Chromium against a
// real broker, as an application would: one browser for the whole story,
// since starting one is the slow part.
func TestExtension(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser; skipped with -short")
	}
	e := newEnv(t)
	steps := []struct {
		name string
		run  func(*testing.T, *env, *story)
	}{
		{"connects and reports its pool", stepConnect},
		{"never assigns a person's tab", stepPersonTab},
		{"acquire and navigate", stepNavigate},
		{"extract", stepExtract},
		{"type and click on a form", stepForm},
		{"commands of a tab run in order", stepOrder},
		{"screenshot is a PNG in history", stepScreenshot},
		{"popup shows the lease", stepPopup},
		{"take control and give back from the popup", stepTakeControl},
		{"bad input gets error codes", stepBadInput},
		{"navigation: status, redirects, partial loads, history", stepNavigation},
		{"interaction: upload, select, check, press, hover, scroll, dialogs", stepInteraction},
		{"reading: all, attributes, parser, iframe, evaluate", stepReading},
		{"captures: full page, element, jpeg, pdf, options.capture", stepCaptures},
		{"state: cookies and storage", stepState},
		{"events, downloads and popups", stepEventsDownloadsPopups},
		{"service worker restart keeps the lease", stepWorkerRestart},
		{"release clears the mark", stepRelease},
		{"clear_state gives each lease a clean slate", stepClearState},
		{"a dropped connection comes back by itself", stepBrokerDrop},
		{"an admin disconnect stops it until Reconnect", stepAdminDisconnect},
		{"close ends the context and the pool refills", stepClose},
		{"creation on demand opens a worker tab at the URL", stepCreate},
	}
	s := &story{}
	for _, st := range steps {
		if !t.Run(st.name, func(t *testing.T) {
			e.t = t // steps run one after another
			st.run(t, e, s)
		}) {
			return // each step builds on the ones before
		}
	}
}

// story is what the steps hand on to each other.
type story struct {
	popup     context.Context // the popup, open in a tab
	h         *cheetah.Handle
	tabID     string // the leased context's tab
	personTab string
}

const taskID = "e2e-task"

func stepConnect(t *testing.T, e *env, _ *story) {
	// The options page checks the broker URL before it saves it.
	if msg := e.save(e.brokerURL+"/nope", "chk_nobody_0000", 2); !strings.HasPrefix(msg, "Not saved:") || !strings.Contains(msg, "nothing at /nope/ws/v1/client (HTTP 404)") {
		t.Fatalf("a wrong path: the options page says %q", msg)
	}
	if stored := eval[any](e, `chrome.storage.local.get('brokerUrl').then((c) => c.brokerUrl ?? null)`); stored != nil {
		t.Fatalf("the wrong URL was saved: %v", stored)
	}
	dead := "http://127.0.0.1:1"
	if msg := e.save(dead, "chk_nobody_0000", 2); !strings.Contains(msg, "nothing answers at 127.0.0.1:1") {
		t.Fatalf("an unreachable broker: the options page says %q", msg)
	}
	// Saving it again keeps it, and the state says it never connected.
	if msg := e.save(dead, "chk_nobody_0000", 2); !strings.HasPrefix(msg, "Saved, though nothing answers") {
		t.Fatalf("the second save of an unreachable broker: %q", msg)
	}
	eventually(t, 10*time.Second, "the options page to say it could not connect", func() bool {
		_, detail := e.optionsState()
		return strings.HasPrefix(detail, "could not connect to ws://127.0.0.1:1/ws/v1/client: nothing answers at 127.0.0.1:1")
	})
	// A wrong path kept anyway: the state says so too, not "lost".
	e.save(e.brokerURL+"/nope", "chk_nobody_0000", 2)
	if msg := e.save(e.brokerURL+"/nope", "chk_nobody_0000", 2); !strings.HasPrefix(msg, "Saved, though") {
		t.Fatalf("the second save of a wrong path: %q", msg)
	}
	eventually(t, 10*time.Second, "the state to name the wrong path", func() bool {
		_, detail := e.optionsState()
		return strings.Contains(detail, "could not connect to ws://"+strings.TrimPrefix(e.brokerURL, "http://")+"/nope/ws/v1/client: "+strings.TrimPrefix(e.brokerURL, "http://")+" answered, but has nothing at /nope/ws/v1/client (HTTP 404)")
	})
	// A wrong key: the broker closes with 4401 and the extension stops
	// trying, and says why.
	e.configure("chk_nobody_0000", 2)
	eventually(t, 10*time.Second, "the options page to show the refused key", func() bool {
		state, detail := e.optionsState()
		return state == "Stopped" && strings.Contains(detail, "refused the client key")
	})
	if _, _, connected := e.client(); connected {
		t.Fatal("connected with a wrong key")
	}
	e.configure(e.clientKey, 2)
	snaps := e.available(2, "the extension to report a pool of two worker tabs")
	clientID, _, connected := e.client()
	if !connected || !strings.HasPrefix(clientID, "ext-") {
		t.Fatalf("client %q connected=%v, want a connected ext-… client", clientID, connected)
	}
	for _, s := range snaps {
		if s.Owner != cheetah.OwnerWorker || s.ClientID != clientID || !strings.HasPrefix(s.ContextID, "tab-") ||
			s.TabID != strings.TrimPrefix(s.ContextID, "tab-") {
			t.Errorf("snapshot %+v, want a worker tab-N context of %s with tab_id N", s, clientID)
		}
	}
	// The worker tabs are in their own group.
	group := eval[string](e, fmt.Sprintf(`(async () => {
		const tab = await chrome.tabs.get(%s);
		return tab.groupId >= 0 ? (await chrome.tabGroups.get(tab.groupId)).title : 'ungrouped';
	})()`, snaps[0].TabID))
	if group != "Cheetah" {
		t.Errorf("worker tab group %q, want Cheetah", group)
	}
	eventually(t, 10*time.Second, "the options page to show Connected", func() bool {
		state, _ := e.optionsState()
		return state == "Connected"
	})
	if raw, err := chromedp.Run(e.ext, chromedp.CaptureScreenshot()); err == nil {
		saveArtifact(t, "options.png", raw)
	}
}

func stepPersonTab(t *testing.T, e *env, s *story) {
	e.newTab(e.pages.URL + "/person")
	s.personTab = fmt.Sprint(eval[int](e, `(async () => {
		const tabs = await chrome.tabs.query({});
		return tabs.find((t) => (t.url || '').endsWith('/person')).id;
	})()`))
	// Move a worker tab, and wait until the broker shows it: state reports
	// are applied in order, so a report that listed the person's tab (which
	// loaded first) would have been applied by then.
	h0, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	ok[where](e, h0, "navigate", map[string]any{"url": e.pages.URL + "/article?sync"})
	if _, err := e.mgr.Release(e.ctx, h0); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the moved worker tab in the broker's view", func() bool {
		snaps, err := e.mgr.ListAvailable(e.ctx, userID, cheetah.Browser)
		if err != nil {
			return false
		}
		for _, sn := range snaps {
			if strings.HasSuffix(sn.URL, "/article?sync") {
				return true
			}
		}
		return false
	})
	snaps := e.available(2, "the pool to stay at two worker tabs")
	for _, sn := range snaps {
		if sn.TabID == s.personTab || strings.Contains(sn.URL, "/person") || sn.Owner != cheetah.OwnerWorker {
			t.Fatalf("the person's tab is in the pool: %+v", sn)
		}
	}
	var hs []*cheetah.Handle
	for range 2 {
		h, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "greedy"})
		if err != nil {
			t.Fatal(err)
		}
		if h.ContextID() == "tab-"+s.personTab {
			t.Fatalf("acquired the person's tab")
		}
		hs = append(hs, h)
	}
	_, err = e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "greedy"})
	var nc *cheetah.NoContextError
	if !errors.As(err, &nc) || nc.Reason != cheetah.ReasonNoIdleWorker {
		t.Fatalf("third acquire: %v, want no_context_available (no_idle_worker)", err)
	}
	if n, err := e.mgr.ReleaseAll(e.ctx, hs); err != nil || n != 2 {
		t.Fatalf("release all: %d, %v", n, err)
	}
	e.available(2, "both worker tabs to be idle again")
}

// send runs a command through h and returns its resolution and record.
func (e *env) send(h *cheetah.Handle, name string, params any, opts ...cheetah.SendOption) (cheetah.Resolution, cheetah.CommandRecord) {
	e.t.Helper()
	opts = append([]cheetah.SendOption{cheetah.WithTimeout(20 * time.Second)}, opts...)
	res, err := h.SendAndWait(e.ctx, cheetah.Command{Name: name, Params: params}, opts...)
	if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	rec, err := e.mgr.History().Read(e.ctx, userID, res.CommandID)
	if err != nil {
		e.t.Fatalf("read %s: %v", name, err)
	}
	return res, rec
}

// ok runs a command that must complete and decodes its result into T.
func ok[T any](e *env, h *cheetah.Handle, name string, params any, opts ...cheetah.SendOption) T {
	e.t.Helper()
	res, rec := e.send(h, name, params, opts...)
	if res.Status != cheetah.StatusCompleted {
		e.t.Fatalf("%s %v: %s %+v, want completed", name, params, res.Status, res.Error)
	}
	var out T
	data, err := resultData(rec)
	if err == nil {
		err = json.Unmarshal(data, &out)
	}
	if err != nil {
		e.t.Fatalf("%s result: %v", name, err)
	}
	return out
}

// fails runs a command that must fail with code.
func (e *env) fails(h *cheetah.Handle, code, name string, params any, opts ...cheetah.SendOption) cheetah.Resolution {
	e.t.Helper()
	res, rec := e.send(h, name, params, opts...)
	if res.Status != cheetah.StatusFailed || errorCode(res) != code {
		e.t.Fatalf("%s %v: %s %+v, want failed with %s", name, params, res.Status, res.Error, code)
	}
	if n := countKind(rec, cheetah.KindAck); n != 1 {
		e.t.Errorf("%s: %d acks, want 1", name, n)
	}
	return res
}

func resultData(rec cheetah.CommandRecord) (json.RawMessage, error) {
	for _, m := range rec.Messages {
		if m.Kind == cheetah.KindResult {
			return m.Data, nil
		}
	}
	return nil, errNoResult
}

func countKind(rec cheetah.CommandRecord, k cheetah.MessageKind) int {
	n := 0
	for _, m := range rec.Messages {
		if m.Kind == k {
			n++
		}
	}
	return n
}

type where struct {
	URL   string `json:"url"`
	Title string `json:"title"`
}

type extracted struct {
	URL       string   `json:"url"`
	Title     string   `json:"title"`
	Text      string   `json:"text"`
	HTML      string   `json:"html"`
	Values    []string `json:"values"`
	Bytes     int      `json:"bytes"`
	Truncated bool     `json:"truncated"`
}

func stepNavigate(t *testing.T, e *env, s *story) {
	h, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: taskID, ClientType: cheetah.Browser})
	if err != nil {
		t.Fatal(err)
	}
	s.h = h
	s.tabID = strings.TrimPrefix(h.ContextID(), "tab-")
	got := ok[where](e, h, "navigate", map[string]any{"url": e.pages.URL + "/form"})
	if got.URL != e.pages.URL+"/form" || got.Title != "Form" {
		t.Fatalf("navigate result %+v", got)
	}
	// The assignment frame marked the tab, and the mark survived the
	// navigation (Chrome resets a tab's badge when it navigates).
	eventually(t, 10*time.Second, "the leased tab's badge", func() bool {
		b, err := e.badge(s.tabID)
		return err == nil && b == "BOT"
	})
	title := eval[string](e, fmt.Sprintf(`chrome.action.getTitle({tabId: %s})`, s.tabID))
	if !strings.Contains(title, taskID) {
		t.Errorf("action title %q does not name the task", title)
	}
}

func stepExtract(t *testing.T, e *env, s *story) {
	got := ok[extracted](e, s.h, "extract", map[string]any{"selector": "#intro"})
	if got.Text != "Hello from the form page" || got.Truncated || got.Title != "Form" {
		t.Fatalf("extract text: %+v", got)
	}
	page := ok[extracted](e, s.h, "extract", map[string]any{"format": "html"})
	if !strings.HasPrefix(page.HTML, "<!DOCTYPE html>") || !strings.Contains(page.HTML, `<h1 id="intro">`) {
		t.Fatalf("extract html: %.200s", page.HTML)
	}
	ok[where](e, s.h, "navigate", map[string]any{"url": e.pages.URL + "/article"})
	cut := ok[extracted](e, s.h, "extract", map[string]any{"selector": "#text", "max_bytes": 10})
	if cut.Text != "Grüße au" || cut.Bytes != 10 || !cut.Truncated || !utf8.ValidString(cut.Text) {
		t.Fatalf("extract max_bytes 10: %+v", cut)
	}
	// Cutting inside a multi-byte character keeps the whole characters only.
	cut = ok[extracted](e, s.h, "extract", map[string]any{"selector": "#text", "max_bytes": 3})
	if cut.Text != "Gr" || cut.Bytes != 2 || !cut.Truncated {
		t.Fatalf("extract max_bytes 3: %+v", cut)
	}
}

func stepForm(t *testing.T, e *env, s *story) {
	ok[where](e, s.h, "navigate", map[string]any{"url": e.pages.URL + "/form"})
	ok[map[string]any](e, s.h, "type", map[string]any{"selector": "#name", "text": "Ada Lovelace"})
	ok[map[string]any](e, s.h, "click", map[string]any{"selector": "#go"})
	select {
	case name := <-e.submitted:
		if name != "Ada Lovelace" {
			t.Fatalf("the form sent %q", name)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the form was not submitted")
	}
	ok[map[string]any](e, s.h, "wait_for", map[string]any{"selector": "#done", "timeout_ms": 10000})
	got := ok[extracted](e, s.h, "extract", map[string]any{"selector": "#done"})
	if got.Text != "Submitted: Ada Lovelace" || !strings.Contains(got.URL, "/submitted?name=Ada+Lovelace") {
		t.Fatalf("after submit: %+v", got)
	}
	// type with submit: true submits the field's form.
	ok[where](e, s.h, "navigate", map[string]any{"url": e.pages.URL + "/form"})
	ok[map[string]any](e, s.h, "type", map[string]any{"selector": "#name", "text": "Grace", "submit": true})
	ok[map[string]any](e, s.h, "wait_for", map[string]any{"selector": "#done", "state": "visible"})
	// wait_for saw the answer page, so the server has had the request.
	select {
	case name := <-e.submitted:
		if name != "Grace" {
			t.Fatalf("type with submit sent %q", name)
		}
	default:
		t.Fatal("type with submit did not submit the form")
	}
}

// stepOrder sends three commands without waiting: if the tab ran them out
// of order, the greeting would not name who was typed.
func stepOrder(t *testing.T, e *env, s *story) {
	ok[where](e, s.h, "navigate", map[string]any{"url": e.pages.URL + "/form"})
	for _, c := range []cheetah.Command{
		{Name: "type", Params: map[string]any{"selector": "#js-name", "text": "Hopper"}},
		{Name: "click", Params: map[string]any{"selector": "#greet"}},
	} {
		if _, err := s.h.Send(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	got := ok[extracted](e, s.h, "extract", map[string]any{"selector": "#greeting"})
	if got.Text != "Hello, Hopper" {
		t.Fatalf("greeting %q, want the commands run in order", got.Text)
	}
}

func stepScreenshot(t *testing.T, e *env, s *story) {
	type shot struct {
		Mime          string `json:"mime"`
		Bytes         int    `json:"bytes"`
		Width, Height int
	}
	res, rec := e.send(s.h, "screenshot", nil)
	if res.Status != cheetah.StatusCompleted {
		t.Fatalf("screenshot: %s %+v", res.Status, res.Error)
	}
	var capture *cheetah.Message
	for i, m := range rec.Messages {
		if m.Kind == cheetah.KindCapture {
			capture = &rec.Messages[i]
		}
	}
	if capture == nil || capture.Mime != "image/png" {
		t.Fatalf("no image/png capture in %+v", rec.Messages)
	}
	if capture.Seq > rec.Messages[len(rec.Messages)-1].Seq || rec.Messages[len(rec.Messages)-1].Kind != cheetah.KindResult {
		t.Errorf("the capture does not come before the result: %+v", rec.Messages)
	}
	raw := captureOf(t, rec, "image/png")
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the capture is not a PNG: %v", err)
	}
	data, _ := resultData(rec)
	var r shot
	json.Unmarshal(data, &r)
	bnd := img.Bounds()
	if r.Mime != "image/png" || r.Bytes != len(raw) || r.Width != bnd.Dx() || r.Height != bnd.Dy() || bnd.Dx() < 100 {
		t.Fatalf("result %+v for a %dx%d PNG of %d bytes", r, bnd.Dx(), bnd.Dy(), len(raw))
	}
	if colors := distinctColors(img); colors < 3 {
		t.Errorf("the screenshot has %d colours: blank", colors)
	}
	saveArtifact(t, "worker-screenshot.png", raw)
}

func stepPopup(t *testing.T, e *env, s *story) {
	popup := e.newTab(e.extURL("popup.html"))
	s.popup = popup
	eventually(t, 10*time.Second, "the popup to show the task on the leased tab", func() bool {
		got, err := chromedp.Run(popup, chromedp.Evaluate[string](fmt.Sprintf(
			`(document.querySelector('#workers tr[data-tab-id="%s"] .task') || {}).textContent || ''`, s.tabID)))
		state, err2 := chromedp.Run(popup, chromedp.Evaluate[string](`document.getElementById('state').textContent`))
		return err == nil && err2 == nil && got == taskID && state == "Connected"
	})
	raw, err := chromedp.Run(popup, chromedp.Screenshot(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("popup screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 150 {
		t.Errorf("the popup rendered at %dx%d", b.Dx(), b.Dy())
	}
	// Rendered text and the status pill make many colours; a blank or
	// unstyled page makes one or two.
	if colors := distinctColors(img); colors < 16 {
		t.Errorf("the popup screenshot has %d colours: it did not render", colors)
	}
	if !hasColor(img, func(r, g, b uint32) bool { return g > r+0x2000 && g > b+0x2000 }) {
		t.Error("the popup shows no green Connected pill")
	}
	saveArtifact(t, "popup.png", raw)
}

func stepBadInput(t *testing.T, e *env, s *story) {
	h := s.h
	e.fails(h, "unsupported_command", "fly", map[string]any{"to": "moon"})
	e.fails(h, "invalid_params", "navigate", map[string]any{"url": 42})
	e.fails(h, "invalid_params", "navigate", map[string]any{"url": "javascript:alert(1)"})
	e.fails(h, "invalid_params", "navigate", json.RawMessage(`[1,2]`))
	e.fails(h, "invalid_params", "extract", map[string]any{"selektor": "#intro"})
	e.fails(h, "invalid_params", "extract", map[string]any{"format": "pdf"})
	e.fails(h, "invalid_params", "type", map[string]any{"selector": "#name"})
	ok[where](e, h, "navigate", map[string]any{"url": e.pages.URL + "/form"})
	e.fails(h, "no_such_element", "click", map[string]any{"selector": "#nope"})
	e.fails(h, "no_such_element", "extract", map[string]any{"selector": "#nope"})
	e.fails(h, "invalid_params", "click", map[string]any{"selector": "###"})
	e.fails(h, "invalid_params", "type", map[string]any{"selector": "#greet", "text": "x"})
	e.fails(h, "timeout", "wait_for", map[string]any{"selector": "#nope", "timeout_ms": 300})
	// A command may not reach another tab, the person's least of all.
	e.fails(h, "no_such_tab", "navigate", map[string]any{"url": e.pages.URL + "/form"}, cheetah.WithTarget(s.personTab))
	person := eval[string](e, fmt.Sprintf(`chrome.tabs.get(%s).then((t) => t.url)`, s.personTab))
	if !strings.HasSuffix(person, "/person") {
		t.Errorf("the person's tab moved to %s", person)
	}
	// A refused connection shows Chrome's error page.
	res := e.fails(h, "navigation_failed", "navigate", map[string]any{"url": "http://127.0.0.1:1/"})
	if !strings.Contains(res.Error.Message, "127.0.0.1:1") {
		t.Errorf("navigation_failed message %q", res.Error.Message)
	}
	// A page that never loads times out, and the tab is usable right after.
	start := time.Now()
	e.fails(h, "timeout", "navigate", map[string]any{"url": e.pages.URL + "/never", "timeout_ms": 1500})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the never-loading page took %s to fail", d)
	}
	e.fails(h, "timeout", "navigate", map[string]any{"url": e.pages.URL + "/never"}, cheetah.WithTimeout(2*time.Second))
	got := ok[where](e, h, "navigate", map[string]any{"url": e.pages.URL + "/article"})
	if got.Title != "Article" {
		t.Fatalf("after the timeouts: %+v", got)
	}
	// Options the extension does not act on are left alone; malformed
	// ones it acts on are invalid_params.
	ok[extracted](e, h, "extract", map[string]any{"selector": "#text"}, cheetah.WithOptions(map[string]any{"anything": true}))
	e.fails(h, "invalid_params", "extract", map[string]any{"selector": "#text"}, cheetah.WithOptions(map[string]any{"events": []string{"keys"}}))
}

func stepWorkerRestart(t *testing.T, e *env, s *story) {
	_, before, _ := e.client()
	sw := e.eventuallyTarget("the service worker", 10*time.Second, isServiceWorker)
	if _, err := chromedp.CallBrowser(e.browser, target.CloseTarget, target.CloseTargetParams{TargetID: sw.TargetID}); err != nil {
		t.Fatalf("stop the service worker: %v", err)
	}
	start := time.Now()
	eventually(t, 15*time.Second, "the broker to lose the client", func() bool {
		_, sess, connected := e.client()
		return !connected || sess != before
	})
	// Nothing but the extension's watchdog alarm wakes the worker now.
	eventually(t, 90*time.Second, "the extension to reconnect", func() bool {
		_, sess, connected := e.client()
		return connected && sess != before
	})
	t.Logf("reconnected %s after the service worker stopped", time.Since(start).Round(100*time.Millisecond))
	// The same lease (same epoch) works once the new session reported the tab.
	var got extracted
	eventually(t, 15*time.Second, "the lease to work again", func() bool {
		res, err := s.h.SendAndWait(e.ctx, cheetah.Command{Name: "extract", Params: map[string]any{"selector": "#text"}})
		var lost *cheetah.LeaseLostError
		if errors.As(err, &lost) && lost.Reason == cheetah.LostNotLive {
			return false
		}
		if err != nil || res.Status != cheetah.StatusCompleted {
			t.Fatalf("extract after the restart: %v %+v", err, res)
		}
		rec, err := e.mgr.History().Read(e.ctx, userID, res.CommandID)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := resultData(rec)
		json.Unmarshal(data, &got)
		return true
	})
	if !strings.HasPrefix(got.Text, "Grüße aus Köln") {
		t.Fatalf("extract after the restart: %+v", got)
	}
	// The command re-marked the tab for its task.
	eventually(t, 10*time.Second, "the mark to come back", func() bool {
		b, err := e.badge(s.tabID)
		return err == nil && b == "BOT"
	})
}

func stepRelease(t *testing.T, e *env, s *story) {
	released, err := e.mgr.Release(e.ctx, s.h)
	if err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	eventually(t, 10*time.Second, "the mark to clear", func() bool {
		b, err := e.badge(s.tabID)
		return err == nil && b == ""
	})
	snaps := e.available(2, "the released tab to be idle")
	found := false
	for _, sn := range snaps {
		if sn.TabID == s.tabID {
			found = true
			// The state reports followed the tab's navigations.
			if sn.URL != e.pages.URL+"/article" || sn.Title != "Article" {
				t.Errorf("released tab reported as %s %q", sn.URL, sn.Title)
			}
		}
	}
	if !found {
		t.Errorf("tab %s is not idle after release: %+v", s.tabID, snaps)
	}
}

// stepBrokerDrop closes the connection from the broker's side as a restart
// would (1001): the extension retries on its backoff alarm.
func stepBrokerDrop(t *testing.T, e *env, _ *story) {
	clientID, before, _ := e.client()
	if !e.b.Registry.DisconnectClient(userID, clientID, protocol.CloseGoingAway, "the broker restarts") {
		t.Fatal("the client was not connected")
	}
	start := time.Now()
	eventually(t, 30*time.Second, "the extension to reconnect", func() bool {
		_, sess, connected := e.client()
		return connected && sess != before
	})
	t.Logf("reconnected %s after the drop", time.Since(start).Round(100*time.Millisecond))
	e.available(2, "the pool to be reported again")
}

// stepAdminDisconnect: after 4403 a retry cannot succeed, so the extension
// stops and says so, until the person presses Reconnect.
func stepAdminDisconnect(t *testing.T, e *env, s *story) {
	clientID, before, _ := e.client()
	if !e.b.Registry.DisconnectClient(userID, clientID, protocol.CloseForbidden, "disconnected by an admin") {
		t.Fatal("the client was not connected")
	}
	eventually(t, 10*time.Second, "the popup to show Stopped", func() bool {
		state, err := chromedp.Run(s.popup, chromedp.Evaluate[string](`document.getElementById('state').textContent`))
		return err == nil && state == "Stopped"
	})
	detail, _ := chromedp.Run(s.popup, chromedp.Evaluate[string](`document.getElementById('detail').textContent`))
	if !strings.Contains(detail, "admin") {
		t.Errorf("the popup says %q", detail)
	}
	if _, _, connected := e.client(); connected {
		t.Fatal("the extension reconnected after 4403")
	}
	if err := chromedp.Do(s.popup, chromedp.Click(chromedp.ID("reconnect"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "Reconnect to reconnect", func() bool {
		_, sess, connected := e.client()
		return connected && sess != before
	})
	e.available(2, "the pool to be reported again")
}

func stepClose(t *testing.T, e *env, _ *story) {
	h, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "closer"})
	if err != nil {
		t.Fatal(err)
	}
	closed := h.ContextID()
	ok[map[string]any](e, h, "close", nil)
	eventually(t, 20*time.Second, "a new worker tab to replace the closed one", func() bool {
		snaps, err := e.mgr.ListAvailable(e.ctx, userID, cheetah.Browser)
		if err != nil || len(snaps) != 2 {
			return false
		}
		for _, sn := range snaps {
			if sn.ContextID == closed {
				return false
			}
		}
		return true
	})
	_, err = h.SendAndWait(e.ctx, cheetah.Command{Name: "extract"})
	var lost *cheetah.LeaseLostError
	if !errors.As(err, &lost) || lost.Reason != cheetah.LostContextGone {
		t.Fatalf("send on the closed tab's lease: %v, want lease_lost context_gone", err)
	}
}

func distinctColors(img image.Image) int {
	seen := map[[3]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
		}
	}
	return len(seen)
}

func hasColor(img image.Image, match func(r, g, b uint32) bool) bool {
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if match(r, g, bl) {
				return true
			}
		}
	}
	return false
}

// saveArtifact keeps a screenshot for people to look at: in
// $CHEETAH_E2E_ARTIFACTS when set, else in the test's temporary folder.
func saveArtifact(t *testing.T, name string, b []byte) {
	dir := os.Getenv("CHEETAH_E2E_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	t.Logf("saved %s", p)
}

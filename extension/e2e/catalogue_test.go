package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// okRec runs a command that must complete and returns its result and record.
func okRec[T any](e *env, h *cheetah.Handle, name string, params any, opts ...cheetah.SendOption) (T, cheetah.CommandRecord) {
	e.t.Helper()
	res, rec := e.send(h, name, params, opts...)
	var out T
	if res.Status != cheetah.StatusCompleted {
		e.t.Fatalf("%s %v: %s %+v, want completed", name, params, res.Status, res.Error)
	}
	data, err := resultData(rec)
	if err == nil {
		err = json.Unmarshal(data, &out)
	}
	if err != nil {
		e.t.Fatalf("%s result: %v", name, err)
	}
	return out, rec
}

// messages are the record's messages of one kind (and name, for events).
func messages(rec cheetah.CommandRecord, k cheetah.MessageKind, name string) []cheetah.Message {
	var out []cheetah.Message
	for _, m := range rec.Messages {
		if m.Kind == k && (name == "" || m.Name == name) {
			out = append(out, m)
		}
	}
	return out
}

// captureOf is the decoded bytes of the record's one capture of mime.
func captureOf(t *testing.T, rec cheetah.CommandRecord, mime string) []byte {
	t.Helper()
	for _, m := range messages(rec, cheetah.KindCapture, "") {
		if m.Mime != mime {
			continue
		}
		var b64 string
		if err := json.Unmarshal(m.Data, &b64); err != nil {
			t.Fatalf("capture data: %v", err)
		}
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	t.Fatalf("no %s capture in %+v", mime, rec.Messages)
	return nil
}

func eventData(t *testing.T, m cheetah.Message) map[string]any {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(m.Data, &d); err != nil {
		t.Fatalf("event data: %v", err)
	}
	return d
}

type loaded struct {
	URL       string   `json:"url"`
	Title     string   `json:"title"`
	Status    *int     `json:"status"`
	Redirects []string `json:"redirects"`
	Partial   bool     `json:"partial"`
}

type acted struct {
	Navigated bool   `json:"navigated"`
	URL       string `json:"url"`
}

func stepNavigation(t *testing.T, e *env, s *story) {
	h, base := s.h, e.pages.URL
	got, rec := okRec[loaded](e, h, "navigate", map[string]any{"url": base + "/hop1"})
	if got.URL != base+"/article" || got.Title != "Article" || got.Status == nil || *got.Status != 200 || got.Partial ||
		!slices.Equal(got.Redirects, []string{base + "/hop1", base + "/hop2"}) {
		t.Fatalf("navigate through two redirects: %+v", got)
	}
	var phases []string
	for _, m := range messages(rec, cheetah.KindProgress, "") {
		phases = append(phases, eventData(t, m)["phase"].(string))
	}
	if !slices.Equal(phases, []string{"committed", "domcontentloaded", "load"}) {
		t.Errorf("progress phases %v", phases)
	}
	got = ok[loaded](e, h, "navigate", map[string]any{"url": base + "/missing"})
	if got.Status == nil || *got.Status != 404 || got.Title != "Not here" {
		t.Fatalf("navigate to a 404: %+v", got)
	}
	// An image that never loads: load never comes, the page is there.
	start := time.Now()
	got = ok[loaded](e, h, "navigate", map[string]any{"url": base + "/slowimg", "timeout_ms": 2000})
	if !got.Partial || got.Title != "Slow image" || *got.Status != 200 {
		t.Fatalf("navigate to a page with a hung image: %+v", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the partial load took %s", d)
	}
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#here"}); x.Text != "the text is here" {
		t.Fatalf("after a partial load the tab shows %+v", x)
	}
	got = ok[loaded](e, h, "navigate", map[string]any{"url": base + "/slowimg", "wait_until": "domcontentloaded"})
	if got.Partial || got.Title != "Slow image" {
		t.Fatalf("domcontentloaded of the hung page: %+v", got)
	}
	ok[loaded](e, h, "navigate", map[string]any{"url": base + "/kitchen", "wait_until": "networkidle", "timeout_ms": 10000})
	// A click that navigates, and the history both ways.
	a := ok[acted](e, h, "click", map[string]any{"selector": "#next", "wait_until": "load"})
	if !a.Navigated || a.URL != base+"/article" {
		t.Fatalf("click with wait_until: %+v", a)
	}
	if w := ok[where](e, h, "back", nil); w.URL != base+"/kitchen" || w.Title != "Kitchen" {
		t.Fatalf("back: %+v", w)
	}
	if w := ok[where](e, h, "forward", map[string]any{"wait_until": "domcontentloaded"}); w.URL != base+"/article" {
		t.Fatalf("forward: %+v", w)
	}
	if r := ok[loaded](e, h, "reload", map[string]any{"bypass_cache": true}); r.URL != base+"/article" || r.Status == nil || *r.Status != 200 {
		t.Fatalf("reload: %+v", r)
	}
	// type … submit with wait_until: an extract at once reads the new page.
	ok[loaded](e, h, "navigate", map[string]any{"url": base + "/form"})
	a = ok[acted](e, h, "type", map[string]any{"selector": "#name", "text": "Zed", "submit": true, "wait_until": "load"})
	if !a.Navigated || !strings.Contains(a.URL, "/submitted?name=Zed") {
		t.Fatalf("type with submit and wait_until: %+v", a)
	}
	<-e.submitted
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#done"}); x.Text != "Submitted: Zed" {
		t.Fatalf("right after the submit: %+v", x)
	}
	// A click that does not navigate says so.
	ok[loaded](e, h, "navigate", map[string]any{"url": base + "/form"})
	if a := ok[acted](e, h, "click", map[string]any{"selector": "#greet", "wait_until": "load"}); a.Navigated {
		t.Fatalf("a button that only greets navigated: %+v", a)
	}
	// The leased tab is the one its window shows.
	if !eval[bool](e, fmt.Sprintf(`chrome.tabs.get(%s).then((t) => t.active)`, s.tabID)) {
		t.Error("the commanded worker tab is not in front of its window")
	}
}

func stepInteraction(t *testing.T, e *env, s *story) {
	h := s.h
	ok[loaded](e, h, "navigate", map[string]any{"url": e.pages.URL + "/kitchen"})
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	up := ok[map[string]int](e, h, "upload", map[string]any{"selector": "#file", "files": []map[string]any{
		{"name": "a.txt", "mime": "text/plain", "data": b64("hello")}, {"name": "b.bin", "data": b64("xyz")},
	}})
	if up["files"] != 2 {
		t.Fatalf("upload: %v", up)
	}
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#files"}); x.Text != "a.txt:5,b.bin:3" {
		t.Fatalf("the page saw files %q", x.Text)
	}
	sel := ok[map[string][]string](e, h, "select", map[string]any{"selector": "#sel", "values": []string{"a", "c"}})
	if !slices.Equal(sel["selected"], []string{"a", "c"}) {
		t.Fatalf("select by values: %v", sel)
	}
	sel = ok[map[string][]string](e, h, "select", map[string]any{"selector": "#sel", "labels": []string{"Banana"}})
	if !slices.Equal(sel["selected"], []string{"b"}) {
		t.Fatalf("select by label: %v", sel)
	}
	e.fails(h, "invalid_params", "select", map[string]any{"selector": "#sel", "values": []string{"kiwi"}})
	if c := ok[map[string]bool](e, h, "check", map[string]any{"selector": "#agree"}); !c["checked"] {
		t.Fatalf("check: %v", c)
	}
	if c := ok[map[string]bool](e, h, "uncheck", map[string]any{"selector": "#agree"}); c["checked"] {
		t.Fatalf("uncheck: %v", c)
	}
	ok[map[string]any](e, h, "press", map[string]any{"keys": "Control+a", "selector": "#keys"})
	ok[map[string]any](e, h, "press", map[string]any{"keys": "Backspace"})
	ok[map[string]any](e, h, "press", map[string]any{"keys": "Shift+x"})
	type vals struct {
		Values []any `json:"values"`
	}
	if v := ok[vals](e, h, "extract", map[string]any{"selector": "#keys", "attribute": "value"}); len(v.Values) != 1 || v.Values[0] != "X" {
		t.Fatalf("after Control+A, Backspace, Shift+x the field holds %v", v.Values)
	}
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#keylog"}); !strings.Contains(x.Text, "a^") || !strings.Contains(x.Text, "Backspace") {
		t.Fatalf("key log %q", x.Text)
	}
	ok[map[string]any](e, h, "hover", map[string]any{"selector": "#hov"})
	if v := ok[vals](e, h, "extract", map[string]any{"selector": "#hov", "attribute": "data-hovered"}); len(v.Values) != 1 || v.Values[0] != "yes" {
		t.Fatalf("hover: %v", v.Values)
	}
	ok[acted](e, h, "click", map[string]any{"selector": "#clicks", "click_count": 2})
	ok[acted](e, h, "click", map[string]any{"selector": "#clicks", "button": "right"})
	for _, attr := range []string{"data-dbl", "data-menu"} {
		if v := ok[vals](e, h, "extract", map[string]any{"selector": "#clicks", "attribute": attr}); len(v.Values) != 1 || v.Values[0] != "yes" {
			t.Fatalf("%s after a double and a right click: %v", attr, v.Values)
		}
	}
	sc := ok[map[string]float64](e, h, "scroll", map[string]any{"y": 500})
	if sc["y"] < 499 || sc["x"] != 0 {
		t.Fatalf("scroll by 500: %v", sc)
	}
	// Dialogs: answered by the policy, reported as events.
	_, rec := okRec[acted](e, h, "click", map[string]any{"selector": "#confirm"},
		cheetah.WithOptions(map[string]any{"dialogs": "accept", "events": []string{"dialog"}}))
	ev := messages(rec, cheetah.KindEvent, "dialog")
	if len(ev) != 1 {
		t.Fatalf("dialog events %+v", rec.Messages)
	}
	if d := eventData(t, ev[0]); d["type"] != "confirm" || d["message"] != "Sure?" || d["accepted"] != true {
		t.Fatalf("dialog event %v", d)
	}
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#answer"}); x.Text != "true" {
		t.Fatalf("accepted confirm answered %q", x.Text)
	}
	ok[acted](e, h, "click", map[string]any{"selector": "#prompt"}, cheetah.WithOptions(map[string]any{"dialogs": "accept", "prompt_text": "Ada"}))
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#answer"}); x.Text != "Ada" {
		t.Fatalf("prompt answered %q", x.Text)
	}
	ok[acted](e, h, "click", map[string]any{"selector": "#confirm"}, cheetah.WithOptions(map[string]any{"dialogs": "dismiss"}))
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#answer"}); x.Text != "false" {
		t.Fatalf("dismissed confirm answered %q", x.Text)
	}
}

func stepReading(t *testing.T, e *env, s *story) {
	h, base := s.h, e.pages.URL
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#list .n", "all": true}); !slices.Equal(x.Values, []string{"one", "two", "three"}) {
		t.Fatalf("extract all: %+v", x)
	}
	if x := ok[extracted](e, h, "extract", map[string]any{"selector": "#list a", "all": true, "attribute": "href"}); !slices.Equal(x.Values, []string{base + "/a/1", base + "/a/2", base + "/a/3"}) {
		t.Fatalf("extract all hrefs: %+v", x)
	}
	type item struct{ Name, Link string }
	type parsedPage struct {
		Data struct {
			Heading string `json:"heading"`
			Items   []item `json:"items"`
		} `json:"data"`
	}
	parsed := ok[parsedPage](e, h, "parse", map[string]any{"fields": map[string]any{
		"heading": map[string]any{"selector": "#hov"},
		"items": map[string]any{"selector": "#list li", "all": true, "fields": map[string]any{
			"name": map[string]any{"selector": ".n"}, "link": map[string]any{"selector": "a", "attribute": "href"},
		}},
	}})
	want := []item{{"one", base + "/a/1"}, {"two", base + "/a/2"}, {"three", base + "/a/3"}}
	if parsed.Data.Heading != "hover me" || !slices.Equal(parsed.Data.Items, want) {
		t.Fatalf("parse: %+v", parsed.Data)
	}
	if x := ok[extracted](e, h, "extract", map[string]any{"frame": "#f", "selector": "#text"}); !strings.HasPrefix(x.Text, "Grüße aus Köln") {
		t.Fatalf("extract in the iframe: %+v", x)
	}
	e.fails(h, "no_such_frame", "extract", map[string]any{"frame": "#nope", "selector": "#text"})
	ok[map[string]any](e, h, "wait_for", map[string]any{"selector": "#nope", "state": "detached"})
	ok[map[string]any](e, h, "wait_for", map[string]any{"selector": "#text", "state": "visible", "frame": "#f"})
	e.fails(h, "timeout", "wait_for", map[string]any{"selector": "#hov", "state": "hidden", "timeout_ms": 300})

	e.fails(h, "no_such_element", "click", map[string]any{"frame": "#f", "selector": "#nope"})
	// evaluate is off until the person turns it on.
	e.fails(h, "not_enabled", "evaluate", map[string]any{"expression": "() => 1"})
	eval[any](e, `chrome.storage.local.set({allowEvaluate: true})`)
	defer eval[any](e, `chrome.storage.local.set({allowEvaluate: false})`)
	var v struct {
		Value float64 `json:"value"`
	}
	eventually(t, 5*time.Second, "evaluate to be enabled", func() bool {
		res, rec := e.send(h, "evaluate", map[string]any{"expression": "(a, b) => a * b + document.title.length", "args": []int{6, 7}})
		if res.Status != cheetah.StatusCompleted {
			return false
		}
		data, _ := resultData(rec)
		return json.Unmarshal(data, &v) == nil
	})
	if v.Value != float64(6*7+len("Kitchen")) {
		t.Fatalf("evaluate: %v", v.Value)
	}
}

func stepCaptures(t *testing.T, e *env, s *story) {
	h := s.h
	type shot struct {
		Mime          string
		Bytes         int
		Width, Height int
	}
	view, rec := okRec[shot](e, h, "screenshot", nil)
	viewPNG, err := png.Decode(bytes.NewReader(captureOf(t, rec, "image/png")))
	if err != nil {
		t.Fatal(err)
	}
	full, rec := okRec[shot](e, h, "screenshot", map[string]any{"full_page": true})
	fullPNG, err := png.Decode(bytes.NewReader(captureOf(t, rec, "image/png")))
	if err != nil {
		t.Fatal(err)
	}
	if fullPNG.Bounds().Dy() != full.Height || full.Height < 3000 || full.Height <= viewPNG.Bounds().Dy() || view.Height != viewPNG.Bounds().Dy() {
		t.Fatalf("full page %+v (%v) against the viewport %+v", full, fullPNG.Bounds(), view)
	}
	el, rec := okRec[shot](e, h, "screenshot", map[string]any{"selector": "#list"})
	elPNG, err := png.Decode(bytes.NewReader(captureOf(t, rec, "image/png")))
	if err != nil {
		t.Fatal(err)
	}
	if el.Height <= 0 || el.Height > 200 || elPNG.Bounds().Dy() != el.Height {
		t.Fatalf("element screenshot %+v", el)
	}
	j, rec := okRec[shot](e, h, "screenshot", map[string]any{"format": "jpeg", "quality": 40})
	if raw := captureOf(t, rec, "image/jpeg"); j.Mime != "image/jpeg" || len(raw) != j.Bytes || !bytes.HasPrefix(raw, []byte{0xff, 0xd8}) {
		t.Fatalf("jpeg screenshot %+v", j)
	}
	pdf, rec := okRec[map[string]int](e, h, "pdf", map[string]any{"print_background": true})
	if raw := captureOf(t, rec, "application/pdf"); !bytes.HasPrefix(raw, []byte("%PDF")) || len(raw) != pdf["bytes"] {
		t.Fatalf("pdf of %d bytes, result %v", len(raw), pdf)
	}
	_, rec = okRec[extracted](e, h, "extract", map[string]any{"selector": "#hov"},
		cheetah.WithOptions(map[string]any{"capture": map[string]any{"screenshot": true, "html": true, "text": true}}))
	if _, err := png.Decode(bytes.NewReader(captureOf(t, rec, "image/png"))); err != nil {
		t.Fatal(err)
	}
	if html := captureOf(t, rec, "text/html"); !bytes.Contains(html, []byte("<title>Kitchen</title>")) {
		t.Fatalf("html capture %.200s", html)
	}
	if text := captureOf(t, rec, "text/plain"); !bytes.Contains(text, []byte("hover me")) {
		t.Fatalf("text capture %.200s", text)
	}
}

func stepState(t *testing.T, e *env, s *story) {
	h := s.h
	if n := ok[map[string]int](e, h, "set_cookies", map[string]any{"cookies": []map[string]any{{"name": "flavour", "value": "oat"}}}); n["set"] != 1 {
		t.Fatalf("set_cookies: %v", n)
	}
	type jar struct {
		Cookies []struct{ Name, Value string } `json:"cookies"`
	}
	has := func() bool {
		for _, c := range ok[jar](e, h, "cookies", nil).Cookies {
			if c.Name == "flavour" && c.Value == "oat" {
				return true
			}
		}
		return false
	}
	if !has() {
		t.Fatal("the cookie set is not listed")
	}
	if n := ok[map[string]int](e, h, "clear_cookies", nil); n["cleared"] < 1 || has() {
		t.Fatalf("clear_cookies: %v", n)
	}
	type items struct {
		Items map[string]string `json:"items"`
	}
	for _, kind := range []string{"local", "session"} {
		ok[map[string]any](e, h, "set_storage", map[string]any{"kind": kind, "items": map[string]string{"k": kind}})
		if got := ok[items](e, h, "storage", map[string]any{"kind": kind}); got.Items["k"] != kind {
			t.Fatalf("%s storage: %v", kind, got)
		}
		ok[map[string]any](e, h, "clear_storage", map[string]any{"kind": kind})
		if got := ok[items](e, h, "storage", map[string]any{"kind": kind}); len(got.Items) != 0 {
			t.Fatalf("%s storage after clear: %v", kind, got)
		}
	}
}

func stepEventsDownloadsPopups(t *testing.T, e *env, s *story) {
	h, base := s.h, e.pages.URL
	_, rec := okRec[loaded](e, h, "navigate", map[string]any{"url": base + "/kitchen"},
		cheetah.WithOptions(map[string]any{"events": []string{"console", "network"}}))
	var logged, fetched bool
	for _, m := range messages(rec, cheetah.KindEvent, "console") {
		logged = logged || eventData(t, m)["text"] == "kitchen ready"
	}
	for _, m := range messages(rec, cheetah.KindEvent, "network") {
		d := eventData(t, m)
		fetched = fetched || (d["url"] == base+"/kitchen" && d["status"] == 200.0)
	}
	if !logged || !fetched {
		t.Fatalf("console %v, network %v in %+v", logged, fetched, rec.Messages)
	}
	// A download comes back as a capture and never lands in a folder.
	_, rec = okRec[acted](e, h, "click", map[string]any{"selector": "#dl", "wait_until": "load"},
		cheetah.WithOptions(map[string]any{"events": []string{"download"}}))
	if got := captureOf(t, rec, "text/csv"); string(got) != downloadBody {
		t.Fatalf("download capture %q", got)
	}
	ev := messages(rec, cheetah.KindEvent, "download")
	if len(ev) != 1 || eventData(t, ev[0])["state"] != "captured" || eventData(t, ev[0])["name"] != "report.csv" {
		t.Fatalf("download events %+v", ev)
	}
	// navigate to a download: the tab keeps its page, the bytes come back.
	type navDownload struct {
		loaded
		Download map[string]any `json:"download"`
	}
	nav, rec := okRec[navDownload](e, h, "navigate", map[string]any{"url": base + "/download"})
	if nav.Download == nil || nav.URL != base+"/kitchen" {
		t.Fatalf("navigate to a download: %+v", nav)
	}
	if got := captureOf(t, rec, "text/csv"); string(got) != downloadBody {
		t.Fatalf("download capture of navigate %q", got)
	}
	e.noDownloadsLanded()
	// One too large for a frame is cancelled, and says why.
	_, rec = okRec[navDownload](e, h, "navigate", map[string]any{"url": base + "/bigdownload"},
		cheetah.WithOptions(map[string]any{"events": []string{"download"}}))
	ev = messages(rec, cheetah.KindEvent, "download")
	if len(ev) != 1 || eventData(t, ev[0])["state"] != "cancelled" || !strings.Contains(fmt.Sprint(eventData(t, ev[0])["reason"]), "max_message_bytes") ||
		len(messages(rec, cheetah.KindCapture, "")) != 0 {
		t.Fatalf("a download too large: %+v", rec.Messages)
	}
	e.noDownloadsLanded()
	ok[loaded](e, h, "navigate", map[string]any{"url": base + "/article"}) // where the later steps expect the tab
	// A target=_blank tab belongs to the lease: reported, driven, closed
	// when the lease ends.
	h2, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "popups", ClientType: cheetah.Browser})
	if err != nil {
		t.Fatal(err)
	}
	// Acquiring brings the tab to the front of the worker window.
	eventually(t, 10*time.Second, "the acquired tab to come to the front", func() bool {
		return eval[bool](e, fmt.Sprintf(`chrome.tabs.get(%s).then((t) => t.active)`, strings.TrimPrefix(h2.ContextID(), "tab-")))
	})
	ok[loaded](e, h2, "navigate", map[string]any{"url": base + "/kitchen"})
	_, rec = okRec[acted](e, h2, "click", map[string]any{"selector": "#pop", "wait_until": "load"})
	var child string
	eventually(t, 10*time.Second, "a popup event", func() bool {
		for _, m := range messages(rec, cheetah.KindEvent, "popup") {
			child, _ = eventData(t, m)["tab_id"].(string)
		}
		if child == "" {
			_, rec = okRec[map[string]any](e, h2, "wait_for", map[string]any{"selector": "body"})
		}
		return child != ""
	})
	eventually(t, 10*time.Second, "the popup to load", func() bool {
		res, rec := e.send(h2, "extract", map[string]any{"selector": "#text"}, cheetah.WithTarget(child))
		if res.Status != cheetah.StatusCompleted {
			return false
		}
		var x extracted
		data, _ := resultData(rec)
		json.Unmarshal(data, &x)
		return strings.HasPrefix(x.Text, "Grüße")
	})
	if _, err := e.mgr.Release(e.ctx, h2); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the popup to close with the lease", func() bool {
		return eval[bool](e, fmt.Sprintf(`chrome.tabs.get(%s).then(() => false, () => true)`, child))
	})
}

// noDownloadsLanded checks that the browser saved no file: nothing under
// its $HOME (where Downloads is) and nothing in its download list.
func (e *env) noDownloadsLanded() {
	e.t.Helper()
	var files []string
	filepath.WalkDir(e.home, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(p, "Download") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) > 0 {
		e.t.Fatalf("downloads landed: %v", files)
	}
	if n := eval[int](e, `chrome.downloads.search({}).then((l) => l.length)`); n != 0 {
		e.t.Fatalf("%d downloads are listed", n)
	}
}

// stepClearState: a lease acquired with clear_state begins on a clean tab
// and leaves one (cookies, local and session storage of the site it
// visited); a lease without it finds what the one before left. Affinity
// keeps the leases on one tab.
func stepClearState(t *testing.T, e *env, _ *story) {
	page := e.pages.URL + "/form"
	type jar struct {
		Cookies []struct{ Name, Value string } `json:"cookies"`
	}
	type items struct {
		Items map[string]string `json:"items"`
	}
	tab := ""
	lease := func(clear bool) *cheetah.Handle {
		t.Helper()
		h, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "slate", ClientType: cheetah.Browser,
			AffinityKey: "slate", ClearState: clear})
		if err != nil {
			t.Fatal(err)
		}
		if tab == "" {
			tab = h.ContextID()
		} else if h.ContextID() != tab {
			t.Fatalf("affinity: %s, then %s", tab, h.ContextID())
		}
		return h
	}
	release := func(h *cheetah.Handle) {
		t.Helper()
		if ok, err := e.mgr.Release(e.ctx, h); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
	}
	leave := func(h *cheetah.Handle) {
		t.Helper()
		ok[where](e, h, "navigate", map[string]any{"url": page})
		ok[map[string]int](e, h, "set_cookies", map[string]any{"cookies": []map[string]any{{"name": "crumb", "value": "1"}}})
		for _, kind := range []string{"local", "session"} {
			ok[map[string]any](e, h, "set_storage", map[string]any{"kind": kind, "items": map[string]string{"slate": kind}})
		}
	}
	found := func(h *cheetah.Handle) string {
		t.Helper()
		ok[where](e, h, "navigate", map[string]any{"url": page})
		var got []string
		for _, c := range ok[jar](e, h, "cookies", nil).Cookies {
			if c.Name == "crumb" {
				got = append(got, "cookie")
			}
		}
		for _, kind := range []string{"local", "session"} {
			if v := ok[items](e, h, "storage", map[string]any{"kind": kind}).Items["slate"]; v != "" {
				got = append(got, v)
			}
		}
		return strings.Join(got, " ")
	}

	h := lease(false)
	leave(h)
	release(h)
	h = lease(false)
	if got := found(h); got != "cookie local session" {
		t.Fatalf("without clear_state the next lease finds %q", got)
	}
	release(h)

	h = lease(true)
	if got := found(h); got != "" {
		t.Fatalf("a lease with clear_state begins with %q", got)
	}
	leave(h)
	release(h)
	h = lease(false)
	if got := found(h); got != "" {
		t.Fatalf("a lease with clear_state left %q", got)
	}
	ok[map[string]int](e, h, "clear_cookies", nil)
	release(h)
	e.available(2, "both tabs idle again")
}

package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	cheetah "github.com/cheetahbroker/cheetah"
)

// setExtraTabs saves the options page with n extra tabs on request, the
// rest as configure left it, and waits for the new connection (the hello's
// max_contexts changed).
func (e *env) setExtraTabs(n int) {
	t := e.t
	t.Helper()
	_, before, _ := e.client()
	err := chromedp.Do(e.ext,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('message').textContent = ''`),
		chromedp.SetValue(chromedp.ID("extra-tabs"), fmt.Sprint(n)),
		chromedp.Click(chromedp.ID("save")),
	)
	if err != nil {
		t.Fatalf("set the extra tabs: %v", err)
	}
	eventually(t, 20*time.Second, "the extension to reconnect with its new capacity", func() bool {
		_, sess, connected := e.client()
		return connected && sess != before
	})
}

// clientContexts is how many contexts the broker holds for the extension.
func (e *env) clientContexts() int {
	for _, c := range e.b.Registry.Clients(userID) {
		return c.Contexts
	}
	return -1
}

// tabURL is the URL a tab is loading or shows ("(none)" when it has
// neither yet), or "" when the tab is gone.
func (e *env) tabURL(tabID string) string {
	return eval[string](e, fmt.Sprintf(`chrome.tabs.get(%s).then((t) => t.pendingUrl || t.url || '(none)', () => '')`, tabID))
}

func creating(url string, timeout time.Duration) cheetah.AcquireRequest {
	return cheetah.AcquireRequest{UserID: userID, TaskID: "create", Create: &cheetah.CreateSpec{URL: url, Timeout: timeout}}
}

func noContextReason(err error) cheetah.NoContextReason {
	var nc *cheetah.NoContextError
	if errors.As(err, &nc) {
		return nc.Reason
	}
	return ""
}

// stepCreate: with one extra tab allowed, an acquire with create that finds
// the pool busy gets a new worker tab at its URL; a second finds no room;
// a URL a worker tab may not open is refused by the extension; the tab
// closes when its lease ends.
func stepCreate(t *testing.T, e *env, _ *story) {
	e.setExtraTabs(1)
	pool := e.available(2, "the pool to be reported after the reconnect")
	var busy []*cheetah.Handle
	for range pool {
		h, err := e.mgr.Acquire(e.ctx, cheetah.AcquireRequest{UserID: userID, TaskID: "busy"})
		if err != nil {
			t.Fatal(err)
		}
		busy = append(busy, h)
	}
	defer func() {
		if _, err := e.mgr.ReleaseAll(e.ctx, busy); err != nil {
			t.Error(err)
		}
	}()

	h, err := e.mgr.Acquire(e.ctx, creating(e.pages.URL+"/article", 20*time.Second))
	if err != nil {
		t.Fatalf("acquire with create: %v", err)
	}
	lease := h.Lease()
	tabID := strings.TrimPrefix(lease.ContextID, "tab-")
	if !lease.Created || lease.ContextID == pool[0].ContextID || lease.ContextID == pool[1].ContextID {
		t.Fatalf("lease %+v, want created: true on a new tab", lease)
	}
	// A worker tab in the pool's group (it joins the group just after it is
	// reported, which is not held up for it).
	eventually(t, 10*time.Second, "the created tab to join the pool's Cheetah group", func() bool {
		return eval[string](e, fmt.Sprintf(`(async () => {
			const [tab, pooled] = await Promise.all([chrome.tabs.get(%s), chrome.tabs.get(%s)]);
			return tab.groupId >= 0 && tab.groupId === pooled.groupId ? (await chrome.tabGroups.get(tab.groupId)).title : 'elsewhere';
		})()`, tabID, pool[0].TabID)) == "Cheetah"
	})
	// The lease comes as the tab opens, before its page has loaded: an
	// application waits for what it reads.
	ok[map[string]any](e, h, "wait_for", map[string]any{"selector": "#text", "timeout_ms": 10000})
	got := ok[extracted](e, h, "extract", map[string]any{"selector": "#text"})
	if got.Text != "Grüße aus Köln — 🐆 fast cats" || got.URL != e.pages.URL+"/article" {
		t.Fatalf("extract on the created tab: %+v", got)
	}

	// Two pool tabs and one extra: the broker knows there is no room.
	_, err = e.mgr.Acquire(e.ctx, creating(e.pages.URL+"/article", 5*time.Second))
	if r := noContextReason(err); r != cheetah.ReasonCapacityExhausted {
		t.Fatalf("a creation beyond the capacity: %v, want no_context_available (capacity_exhausted)", err)
	}

	// Its lease over, the extra tab closes; the pool stays.
	if _, err := e.mgr.Release(e.ctx, h); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the extra tab to close after its release", func() bool {
		return e.tabURL(tabID) == "" && e.clientContexts() == 2
	})
	for _, p := range pool {
		if e.tabURL(p.TabID) == "" {
			t.Fatalf("pool tab %s closed", p.TabID)
		}
	}

	// The extension refuses what a worker tab may not open.
	_, err = e.mgr.Acquire(e.ctx, creating("file:///etc/passwd", 10*time.Second))
	if r := noContextReason(err); r != cheetah.ReasonCreationFailed {
		t.Fatalf("a creation at file:///etc/passwd: %v, want no_context_available (creation_failed)", err)
	}

	// The tab is reported at once, not when its page has loaded: /never
	// never answers.
	h, err = e.mgr.Acquire(e.ctx, creating(e.pages.URL+"/never", 10*time.Second))
	if err != nil {
		t.Fatalf("acquire with create at a page that never loads: %v", err)
	}
	if !h.Lease().Created {
		t.Fatalf("lease %+v, want created: true", h.Lease())
	}
	if u := e.tabURL(strings.TrimPrefix(h.ContextID(), "tab-")); u != e.pages.URL+"/never" {
		t.Errorf("the created tab is at %q", u)
	}
	if _, err := e.mgr.Release(e.ctx, h); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the second extra tab to close", func() bool { return e.clientContexts() == 2 })
}

package console_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/server"
)

// axeSource is axe-core (testdata/axe, MPL-2.0), injected into the page.
func axeSource(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/axe/axe.min.js")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// axe runs axe-core on the page as it is and fails the test on serious or
// critical violations.
func axe(t *testing.T, p *page, src, where string) {
	t.Helper()
	if !eval[bool](p, `typeof window.axe === 'object'`) {
		eval[bool](p, src+"\n;true")
	}
	found := eval[[]string](p, `axe.run(document, {resultTypes: ['violations']}).then(r => r.violations
		.filter(v => v.impact === 'serious' || v.impact === 'critical')
		.map(v => v.impact + ' ' + v.id + ': ' + v.help + ' at ' + v.nodes.map(n => n.target.join(' ')).join('; ')))`)
	for _, v := range found {
		t.Errorf("%s: %s", where, v)
	}
}

// TestConsoleAccessibility checks every view with axe-core at 1280×800 and
// on a narrow window, and that the keyboard alone signs in, moves between
// views and reaches the actions.
func TestConsoleAccessibility(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser; skipped with -short")
	}
	br := startBroker(t, server.Options{})
	startAgent(t, br)
	setQuotas(t, br, e2eQuotas)
	var acq struct{ Lease cheetah.Lease }
	if st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/acquire", nil,
		map[string]any{"user_id": e2eUser, "task_id": e2eTask, "client_type": "console"}, &acq); st != http.StatusCreated {
		t.Fatalf("acquire: %d %s", st, raw)
	}
	var res struct{ Resolution cheetah.Resolution }
	if st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/commands/wait", map[string]string{"X-Lease": acq.Lease.LeaseToken},
		map[string]any{"name": "shoot"}, &res); st != http.StatusOK {
		t.Fatalf("send: %d %s", st, raw)
	}
	src := axeSource(t)

	for _, size := range []struct {
		name string
		w, h int
	}{{"wide", 1280, 800}, {"narrow", 390, 844}} {
		t.Run(size.name, func(t *testing.T) {
			p := openBrowser(t, br.url, size.w, size.h)
			p.run("open", chromedp.Navigate(br.url+"/ui/"), chromedp.WaitVisible(chromedp.ID("signin-key")))
			axe(t, p, src, "sign-in")
			p.screenshot(size.name + "-sign-in")

			// The key field has the focus: type the key and press Enter.
			if id := eval[string](p, `document.activeElement.id`); id != "signin-key" {
				t.Fatalf("the sign-in form does not have the focus (%q has)", id)
			}
			p.run("sign in with the keyboard",
				chromedp.KeyEvent(adminKey+kb.Enter),
				chromedp.WaitVisible(`//main//td/code[text()="`+e2eAgent+`"]`),
			)
			axe(t, p, src, "overview")
			p.screenshot(size.name + "-overview")

			// Tab to the Leases link and follow it.
			tabTo(t, p, `document.activeElement.getAttribute('href') === '#leases'`)
			p.run("open leases", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(`//main//h1[text()="Leases"]`))
			// Tab to Revoke; Enter asks, Escape cancels, and the lease stays.
			tabTo(t, p, `(document.activeElement.getAttribute('aria-label') || '').startsWith('Revoke the lease')`)
			p.run("ask to revoke", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.ID("confirm-ok")))
			if id := eval[string](p, `document.activeElement.id`); id != "confirm-cancel" {
				t.Fatalf("the confirmation opens with the focus on %q, not on Cancel", id)
			}
			axe(t, p, src, "revoke confirmation")
			p.run("cancel", chromedp.KeyEvent(kb.Escape))
			if eval[bool](p, `document.getElementById('confirm').open`) {
				t.Fatal("Escape did not close the confirmation")
			}
			if n := len(br.b.Registry.Leases(e2eUser, e2eTask)); n != 1 {
				t.Fatalf("a cancelled revoke left %d leases", n)
			}
			axe(t, p, src, "leases")
			p.screenshot(size.name + "-leases")

			p.show("command?user="+e2eUser+"&id="+res.Resolution.CommandID, "Command")
			p.run("wait for the command", chromedp.WaitVisible(chromedp.CSS(".thumb img")))
			axe(t, p, src, "command")
			p.screenshot(size.name + "-command")

			p.show("keys", "Keys")
			p.run("keys listed", chromedp.WaitVisible(`//main//caption[text()="API keys"]`))
			axe(t, p, src, "keys")
			p.screenshot(size.name + "-keys")

			// From the top of the page, Tab reaches the Quotas link.
			eval[bool](p, `document.getElementById('skip').focus(); true`)
			tabTo(t, p, `document.activeElement.getAttribute('href') === '#quotas'`)
			p.run("open quotas", chromedp.KeyEvent(kb.Enter),
				chromedp.WaitVisible(`//main//caption[text()="Occupancy of consoles"]`))
			axe(t, p, src, "quotas")
			p.screenshot(size.name + "-quotas")
			if over := eval[float64](p, `document.documentElement.scrollWidth - window.innerWidth`); over > 0 {
				t.Errorf("the Quotas page is %v pixels wider than a %d-pixel window", over, size.w)
			}

			// Nothing is wider than the window.
			if over := eval[float64](p, `document.documentElement.scrollWidth - window.innerWidth`); over > 0 {
				t.Errorf("the page is %v pixels wider than a %d-pixel window", over, size.w)
			}
			p.noProblems()
		})
	}
}

// tabTo presses Tab until the expression holds for the focused element.
func tabTo(t *testing.T, p *page, cond string) {
	t.Helper()
	for range 60 {
		if eval[bool](p, cond) {
			return
		}
		p.run("tab", chromedp.KeyEvent(kb.Tab))
	}
	t.Fatalf("Tab never reached an element where %s", strings.TrimSpace(cond))
}

package console_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/quota"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

const (
	e2eUser  = "usr_console"
	e2eAgent = "agent-build-7"
	e2eTask  = "t-console"
)

// shotPNG is the capture the agent's "shoot" command sends.
var shotW, shotH = 64, 40

// startAgent runs a console agent of e2eUser whose "shoot" command reports
// progress, an event and a PNG capture before its result.
func startAgent(t *testing.T, br *broker) *agent.Agent {
	t.Helper()
	png := testPNG(t, shotW, shotH)
	a := agent.New(agent.Config{URL: br.url, Token: br.clientKey(t, e2eUser), ClientID: e2eAgent,
		Name: "Build host 7", Version: "0.9.1", Labels: map[string]string{"region": "eu", "pool": "nightly"}, Flows: 2})
	a.Handle("shoot", func(ctx context.Context, cmd *protocol.Command, out agent.Output) (any, error) {
		if err := out.Progress(map[string]any{"phase": "rendering"}); err != nil {
			return nil, err
		}
		if err := out.Event("console", map[string]string{"text": "ready"}); err != nil {
			return nil, err
		}
		if err := out.Capture("image/png", png); err != nil {
			return nil, err
		}
		return map[string]int{"width": shotW, "height": shotH}, nil
	})
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-a.Connected():
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not connect")
	}
	// Connected says its report was sent; the broker applies it soon after.
	eventually(t, 20*time.Second, "the agent's flows to be available", func() bool {
		var avail struct{ Contexts []cheetah.ContextSnapshot }
		st, _ := br.api(t, adminKey, http.MethodGet, "/api/v1/users/"+e2eUser+"/contexts/available", nil, nil, &avail)
		return st == http.StatusOK && len(avail.Contexts) == 2
	})
	return a
}

// countdownSeconds reads the lease's remaining time off the page.
func countdownSeconds(t *testing.T, p *page) int {
	t.Helper()
	s := eval[string](p, `(document.querySelector('[data-expires]') || {}).textContent || ''`)
	var m, sec int
	if _, err := fmt.Sscanf(s, "%dm %ds", &m, &sec); err == nil {
		return m*60 + sec
	}
	if _, err := fmt.Sscanf(s, "%ds", &sec); err == nil {
		return sec
	}
	return -1
}

// e2eQuotas caps the console contexts the tests acquire.
const e2eQuotas = `
quotas:
  - name: consoles
    match: {client_type: console}
    levels: {global: 10, user: 2}
`

// setQuotas puts a quota document in force, as a good reload of the quota
// file does.
func setQuotas(t *testing.T, br *broker, doc string) {
	t.Helper()
	qs, err := quota.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	br.b.Registry.SetQuotas(qs)
}

// quotaUse reads the used and cap cells of a quota's occupancy row off the
// Quotas page: level global, tenant or user, and the scope's user id ("" for
// none). ok is false while there is no such row.
func quotaUse(t *testing.T, p *page, name, level, user string) (used, limit string, ok bool) {
	t.Helper()
	got := eval[[]string](p, `(() => {
		const t = [...document.querySelectorAll('main table')].find(t => t.caption.textContent === 'Occupancy of ' + `+jsString(name)+`);
		if (!t) return [];
		const want = `+jsString(user)+` || '—';
		const r = [...t.tBodies[0].rows].find(r => r.cells[0].textContent === `+jsString(level)+` && r.cells[2].textContent === want);
		return r ? [r.cells[3].textContent, r.cells[4].textContent] : [];
	})()`)
	if len(got) != 2 {
		return "", "", false
	}
	return got[0], got[1], true
}

// TestConsoleEndToEnd drives the console in Debian's chromium against a real
// broker with a real agent, as an operator would, and writes a screenshot
// of each page.
func TestConsoleEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser; skipped with -short")
	}
	br := startBroker(t, server.Options{WebhookAllowPrivate: true})
	p := openBrowser(t, br.url, 1280, 800)
	// The application's key, which signs the webhook of the command below,
	// and the application's receiver.
	app, err := br.b.Keys.Create(t.Context(), auth.App, "", "e2e app")
	if err != nil {
		t.Fatal(err)
	}
	hooks := make(chan string, 4)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hooks <- r.Header.Get("webhook-id")
	}))
	t.Cleanup(receiver.Close)

	// Sign in. The key is in no storage, and not in the page once signed in.
	p.run("open the console", chromedp.Navigate(br.url+"/ui/"), chromedp.WaitVisible(chromedp.ID("signin-key")),
		chromedp.WaitNotVisible(chromedp.ID("nav")), chromedp.WaitNotVisible(chromedp.ID("sign-out")))
	// A wrong key is refused, and said so.
	p.run("a wrong key",
		chromedp.SendKeys(chromedp.ID("signin-key"), "chk_nobody_0000"),
		chromedp.Click(chromedp.CSS(`#signin-form button[type=submit]`)),
		chromedp.WaitVisible(`//p[@id="signin-error" and text()="the key is not valid"]`),
	)
	if v := eval[string](p, `document.getElementById('signin-key').value`); v != "" {
		t.Fatalf("the key field still holds %q after sign-in", v)
	}
	p.screenshot("01-sign-in")
	p.signIn(adminKey)
	if html := eval[string](p, `document.documentElement.outerHTML + JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie`); strings.Contains(html, adminKey) {
		t.Fatal("the admin key is in the page after sign-in")
	}
	if c := eval[string](p, `document.cookie`); c != "" {
		t.Fatalf("the page can read a cookie (%q): the session cookie must be HttpOnly", c)
	}

	// A client appears live, pushed by the event stream: the page is not
	// reloaded, and nothing polls.
	p.run("an empty overview", chromedp.WaitVisible(`//main//p[text()="No client has connected yet."]`))
	reloads := eval[float64](p, `performance.getEntriesByType('navigation').length`)
	a := startAgent(t, br)
	p.run("see the agent appear",
		chromedp.WaitVisible(`//main//td/code[text()="`+e2eAgent+`"]`),
		chromedp.WaitVisible(`//main//li[contains(@class,"idle")]/span[text()="2"]`),
	)
	if n := eval[float64](p, `performance.getEntriesByType('navigation').length`); n != reloads {
		t.Fatalf("the page was reloaded (%v navigations, was %v)", n, reloads)
	}
	row := eval[string](p, `[...document.querySelectorAll('main tr')].find(r => r.textContent.includes('`+e2eAgent+`')).textContent`)
	for _, want := range []string{"Build host 7", "console", "0.9.1", "region=eu", "pool=nightly", "just now"} {
		if !strings.Contains(row, want) {
			t.Errorf("the client's row %q lacks %q", row, want)
		}
	}
	p.screenshot("02-overview")

	// Acquire through the API; the lease shows on the page, with a countdown
	// that counts down, and no token anywhere. A quota governs it.
	setQuotas(t, br, e2eQuotas)
	var acq struct{ Lease cheetah.Lease }
	st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/acquire", nil,
		map[string]any{"user_id": e2eUser, "task_id": e2eTask, "client_type": "console", "ttl_s": 300}, &acq)
	if st != http.StatusCreated {
		t.Fatalf("acquire: %d %s", st, raw)
	}
	lease := acq.Lease
	// One command, for the history steps below, with a webhook.
	var res struct{ Resolution cheetah.Resolution }
	st, raw = br.api(t, app.Secret, http.MethodPost, "/api/v1/commands/wait",
		map[string]string{"X-Lease": lease.LeaseToken, "X-Callback-Url": receiver.URL + "/hook"},
		map[string]any{"name": "shoot", "params": map[string]any{"full_page": true}}, &res)
	if st != http.StatusOK || res.Resolution.Status != cheetah.StatusCompleted {
		t.Fatalf("send shoot: %d %s", st, raw)
	}
	if id := <-hooks; id != res.Resolution.CommandID {
		t.Fatalf("the webhook came for %q", id)
	}
	fctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := br.b.Webhooks.Flush(fctx); err != nil { // the delivery is recorded
		t.Fatal(err)
	}
	// The Quotas page shows the lease's slot, as the API counts it.
	p.show("quotas", "Quotas")
	var qv registry.QuotasView
	if st, raw := br.api(t, adminKey, http.MethodGet, "/api/v1/admin/quotas", nil, nil, &qv); st != http.StatusOK || len(qv.Quotas) != 1 {
		t.Fatalf("quotas: %d %s", st, raw)
	}
	var want registry.ScopeUse
	for _, u := range qv.Quotas[0].Occupancy.Users {
		if u.UserID == e2eUser {
			want = u
		}
	}
	if want.Used != 1 || want.Cap != 2 {
		t.Fatalf("the API counts %+v for %s", want, e2eUser)
	}
	eventually(t, 10*time.Second, "the user's slot on the Quotas page", func() bool {
		_, _, ok := quotaUse(t, p, "consoles", "user", e2eUser)
		return ok
	})
	if used, cp, _ := quotaUse(t, p, "consoles", "user", e2eUser); used != strconv.Itoa(want.Used) || cp != strconv.Itoa(want.Cap) {
		t.Fatalf("the Quotas page shows %s of %s for %s, the API %d of %d", used, cp, e2eUser, want.Used, want.Cap)
	}
	if used, cp, _ := quotaUse(t, p, "consoles", "global", ""); used != "1" || cp != "10" {
		t.Fatalf("the Quotas page shows %s of %s globally, want 1 of 10", used, cp)
	}
	quotaPage := eval[string](p, `document.querySelector('main').textContent`)
	for _, w := range []string{"client type console", "global 10, user 2", e2eTask, lease.ContextID} {
		if !strings.Contains(quotaPage, w) {
			t.Errorf("the Quotas page lacks %q", w)
		}
	}
	if strings.Contains(eval[string](p, `document.documentElement.outerHTML`), lease.LeaseToken) {
		t.Fatal("the lease token is in the Quotas page")
	}
	p.screenshot("03-quotas")

	p.show("leases", "Leases")
	p.run("see the lease", chromedp.WaitVisible(`//main//td/span[@class="task" and text()="`+e2eTask+`"]`))
	leaseRow := eval[string](p, `[...document.querySelectorAll('main tbody tr')].find(r => r.textContent.includes('`+e2eTask+`')).textContent`)
	if !strings.Contains(leaseRow, lease.ContextID) || !strings.Contains(leaseRow, strconv.FormatInt(lease.Epoch, 10)) {
		t.Fatalf("the lease row %q lacks its context %s or epoch %d", leaseRow, lease.ContextID, lease.Epoch)
	}
	if strings.Contains(eval[string](p, `document.documentElement.outerHTML`), lease.LeaseToken) {
		t.Fatal("the lease token is in the page")
	}
	first := countdownSeconds(t, p)
	if first <= 0 || first > 300 {
		t.Fatalf("the countdown shows %d s of a 300 s lease", first)
	}
	eventually(t, 5*time.Second, "the countdown to tick", func() bool {
		n := countdownSeconds(t, p)
		return n > 0 && n < first
	})
	if !strings.Contains(leaseRow, "on use") {
		t.Fatalf("the lease row %q does not say it renews on use", leaseRow)
	}
	// A person takes the context over: the lease says so, live, and again
	// when the hold ends.
	leaseRowNow := func() string {
		return eval[string](p, `[...document.querySelectorAll('main tbody tr')].find(r => r.textContent.includes('`+e2eTask+`')).textContent`)
	}
	if st, err := a.Hold(t.Context(), lease.ContextID, time.Minute); err != nil || st != protocol.HoldActive {
		t.Fatalf("hold: %v %v", st, err)
	}
	eventually(t, 10*time.Second, "the lease to show its hold", func() bool { return strings.Contains(leaseRowNow(), "held (active) since") })
	p.screenshot("03-leases-held")
	if _, err := a.Unhold(t.Context(), lease.ContextID); err != nil {
		t.Fatalf("unhold: %v", err)
	}
	eventually(t, 10*time.Second, "the hold to go from the lease", func() bool { return !strings.Contains(leaseRowNow(), "held (") })
	p.screenshot("03-leases")

	// Revoke it from the page, through the confirmation; the holder's next
	// send fails lease_lost (revoked).
	p.run("revoke",
		chromedp.Click(chromedp.CSS(`button[aria-label="Revoke the lease of task `+e2eTask+` on `+lease.ContextID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")),
	)
	p.screenshot("04-revoke-confirm")
	p.run("confirm",
		chromedp.Click(chromedp.ID("confirm-ok")),
		chromedp.WaitVisible(`//main//p[text()="No active leases."]`),
	)
	st, raw = br.api(t, adminKey, http.MethodPost, "/api/v1/commands", map[string]string{"X-Lease": lease.LeaseToken},
		map[string]any{"name": "shoot"}, nil)
	if e := errorOf(t, raw); st != http.StatusLocked || e.Code != cheetah.CodeLeaseLost || e.Reason != string(cheetah.LostRevoked) {
		t.Fatalf("a send after the revoke: %d %s, want 423 lease_lost revoked", st, raw)
	}

	// The Quotas page follows the leases live: the revoke gave the slot back,
	// and an acquire takes one, with no reload.
	p.show("quotas", "Quotas")
	eventually(t, 10*time.Second, "the revoked lease's slot to be free", func() bool {
		used, _, _ := quotaUse(t, p, "consoles", "global", "")
		return used == "0"
	})
	if st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/acquire", nil,
		map[string]any{"user_id": e2eUser, "task_id": "t-quota", "client_type": "console"}, nil); st != http.StatusCreated {
		t.Fatalf("acquire: %d %s", st, raw)
	}
	eventually(t, 10*time.Second, "the new lease's slot to show", func() bool {
		used, _, _ := quotaUse(t, p, "consoles", "user", e2eUser)
		return used == "1"
	})
	if n := eval[float64](p, `performance.getEntriesByType('navigation').length`); n != reloads {
		t.Fatalf("the page was reloaded (%v navigations, was %v)", n, reloads)
	}

	// History: search by user and command id, and open the timeline.
	p.show("history", "History")
	p.run("search history",
		chromedp.SetValue(chromedp.ID("h-user"), e2eUser),
		chromedp.SetValue(chromedp.ID("h-command"), res.Resolution.CommandID),
		chromedp.Click(chromedp.CSS(`form.search button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`.thumb img`)),
	)
	if w := eval[float64](p, `document.querySelector('.thumb img').naturalWidth`); int(w) != shotW {
		t.Fatalf("the thumbnail is %v pixels wide, the capture %d", w, shotW)
	}
	stages := eval[[]string](p, `[...document.querySelectorAll('.timeline li')].map(li => li.textContent)`)
	wantStages := []string{"Admitted", "Dispatched", "Acknowledged", "Terminal: completed"}
	if len(stages) != len(wantStages) {
		t.Fatalf("timeline %q", stages)
	}
	for i, w := range wantStages {
		if !strings.HasPrefix(stages[i], w) || strings.Contains(stages[i], "—") {
			t.Errorf("timeline stage %d is %q, want %s with its time", i, stages[i], w)
		}
	}
	if got := eval[string](p, `document.querySelector('.trace').textContent`); got != res.Resolution.TraceID {
		t.Errorf("the trace id shows as %q, want %q", got, res.Resolution.TraceID)
	}
	webhook := eval[string](p, `[...document.querySelectorAll('.fields dt')].find(dt => dt.textContent === 'Webhook').nextElementSibling.textContent`)
	if !strings.HasPrefix(webhook, "delivered after 1 attempt") || !strings.Contains(webhook, receiver.URL+"/hook") {
		t.Errorf("the webhook shows as %q", webhook)
	}
	kinds := eval[string](p, `[...document.querySelectorAll('article tbody tr td:nth-child(2)')].map(td => td.textContent).join(',')`)
	if kinds != "ack,progress,event,capture,result" {
		t.Errorf("the messages' kinds are %q", kinds)
	}
	p.screenshot("05-command")
	p.run("open the capture",
		chromedp.Click(chromedp.CSS(`.thumb`)),
		chromedp.WaitVisible(chromedp.ID("viewer-img")),
	)
	if w := eval[float64](p, `document.getElementById('viewer-img').naturalWidth`); int(w) != shotW {
		t.Fatalf("the full-size capture is %v pixels wide, want %d", w, shotW)
	}
	p.screenshot("06-capture")
	p.run("close the capture", chromedp.Click(chromedp.ID("viewer-close")))
	if open := eval[bool](p, `document.getElementById('viewer').open`); open {
		t.Fatal("the capture viewer did not close")
	}

	// The list by task links to the same command.
	p.run("search by task",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('h-command').value = ''`),
		chromedp.SetValue(chromedp.ID("h-task"), e2eTask),
		chromedp.Click(chromedp.CSS(`form.search button[type=submit]`)),
		chromedp.WaitVisible(`//main//a[text()="`+res.Resolution.CommandID+`"]`),
	)

	// Keys: create one (shown once, with a copy button), then revoke it.
	p.show("keys", "Keys")
	p.run("create a key",
		chromedp.SetValue(chromedp.ID("k-kind"), "app"),
		chromedp.SetValue(chromedp.ID("k-name"), "made in the console"),
		chromedp.Click(chromedp.CSS(`form.search button[type=submit]`)),
		chromedp.WaitVisible(chromedp.ID("created-key")),
	)
	secret := eval[string](p, `document.getElementById('created-key').value`)
	if !strings.HasPrefix(secret, "chk_") {
		t.Fatalf("the created key shows as %q", secret)
	}
	keyID := strings.SplitN(strings.TrimPrefix(secret, "chk_"), "_", 2)[0]
	if st, raw := br.api(t, secret, http.MethodGet, "/api/v1/users/"+e2eUser+"/contexts/available", nil, nil, nil); st != http.StatusOK {
		t.Fatalf("the key made in the console does not work: %d %s", st, raw)
	}
	if n := eval[float64](p, `[...document.querySelectorAll('.created button')].filter(b => b.textContent === 'Copy key').length`); n != 1 {
		t.Fatal("no copy button for the key")
	}
	p.run("see the key listed", chromedp.WaitVisible(`//main//td/code[text()="`+keyID+`"]`))
	p.screenshot("07-keys")
	p.run("dismiss the key", chromedp.Click(`//div[contains(@class,"created")]//button[text()="Done"]`))
	if n := eval[float64](p, `document.querySelectorAll('#created-key').length`); n != 0 {
		t.Fatal("the key is still shown after Done")
	}
	p.run("revoke the key",
		chromedp.Click(chromedp.CSS(`button[aria-label="Revoke key `+keyID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")),
		chromedp.Click(chromedp.ID("confirm-ok")),
		chromedp.WaitVisible(`//main//tr[td/code[text()="`+keyID+`"]]/td[starts-with(text(),"revoked")]`),
	)
	if st, _ := br.api(t, secret, http.MethodGet, "/api/v1/users/"+e2eUser+"/contexts/available", nil, nil, nil); st != http.StatusUnauthorized {
		t.Fatalf("the revoked key still answers %d", st)
	}

	// Disconnect the agent from the overview, through the confirmation: its
	// connection is closed, and the page shows it away.
	gone := make(chan registry.Event, 1)
	cancelSub := br.b.Registry.Subscribe(func(ev registry.Event) {
		if ev.Kind == registry.ClientDisconnected && ev.ClientID == e2eAgent {
			select {
			case gone <- ev:
			default:
			}
		}
	})
	defer cancelSub()
	p.show("overview", "Overview")
	p.run("disconnect",
		chromedp.Click(chromedp.CSS(`button[aria-label="Disconnect client `+e2eAgent+` of `+e2eUser+`"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")),
		chromedp.Click(chromedp.ID("confirm-ok")),
	)
	select {
	case <-gone:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent was not disconnected")
	}
	p.run("see the agent away", chromedp.WaitVisible(`//main//td/span[text()="away (reconnect grace)"]`))

	// Sign out: the sign-in form is back, and the session is gone.
	p.run("sign out",
		chromedp.Click(chromedp.ID("sign-out")),
		chromedp.WaitVisible(chromedp.ID("signin-key")),
		chromedp.WaitNotVisible(chromedp.ID("nav")),
		chromedp.WaitNotVisible(chromedp.ID("view")),
	)
	if st := eval[float64](p, `fetch('/api/v1/admin/pools').then(r => r.status)`); st != http.StatusUnauthorized {
		t.Fatalf("after sign-out the API answers the page %v", st)
	}
	p.screenshot("08-signed-out")
	p.noProblems()
	t.Logf("screenshots in %s", p.shot)
	if d := os.Getenv("CHEETAH_CONSOLE_SCREENSHOTS"); d != "" {
		t.Logf("kept in CHEETAH_CONSOLE_SCREENSHOTS=%s", d)
	}
}

// xssTitle and xssLabel are what a hostile client reports.
const (
	xssTitle = `<img src=x onerror=alert(1)>`
	xssLabel = `</script><script>alert(2)</script>`
	xssName  = `<b onmouseover=alert(3)>bold</b>`
)

// TestConsoleRendersClientTextAsText has a client report markup in a tab
// title, a label, a name and its command's messages: the page shows it as
// text, and nothing runs (no dialog, no script error, no CSP violation).
func TestConsoleRendersClientTextAsText(t *testing.T) {
	br, p := signedInConsole(t)
	p.probe() // what runs in the page would be seen

	c := dialRaw(t, br, br.clientKey(t, "usr_xss"), protocol.Hello{ClientID: "ext-xss", ClientType: protocol.ClientBrowser,
		Name: xssName, Version: `"><svg onload=alert(4)>`, Labels: map[string]string{"note": xssLabel}})
	c.send(t, &protocol.State{Contexts: []protocol.ContextReport{{
		ContextID: "tab-1", TabID: "1", Owner: protocol.OwnerWorker, Title: xssTitle,
		URL: `javascript:alert(5)`, Labels: map[string]string{"x": xssLabel},
	}}})
	p.run("see the hostile client",
		chromedp.WaitVisible(`//main//td/code[text()="ext-xss"]`),
		chromedp.WaitVisible(`//main//td/span[@class="title"]`),
	)
	if got := eval[string](p, `document.querySelector('td .title').textContent`); got != xssTitle {
		t.Fatalf("the title shows as %q, want the text %q", got, xssTitle)
	}
	text := eval[string](p, `document.querySelector('main').textContent`)
	for _, want := range []string{xssTitle, "note=" + xssLabel, "x=" + xssLabel, xssName} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q as text", want)
		}
	}
	// No element came out of what the client reported.
	if n := eval[float64](p, `document.querySelectorAll('img[src="x"], main b, main svg, main script, a[href^="javascript"]').length`); n != 0 {
		t.Fatalf("%v elements were made from the client's text", n)
	}
	p.screenshot("xss-overview")

	// History holds what the client sends: the same.
	var acq struct{ Lease cheetah.Lease }
	if st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/acquire", nil,
		map[string]any{"user_id": "usr_xss", "task_id": "t-xss"}, &acq); st != http.StatusCreated {
		t.Fatalf("acquire: %d %s", st, raw)
	}
	var sent cheetah.Sent
	if st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/commands", map[string]string{"X-Lease": acq.Lease.LeaseToken},
		map[string]any{"name": "extract"}, &sent); st != http.StatusAccepted {
		t.Fatalf("send: %d %s", st, raw)
	}
	cmd := c.readCommand(t)
	svg := `<svg xmlns="http://www.w3.org/2000/svg" onload="alert(6)"><script>alert(7)</script></svg>`
	c.send(t, &protocol.Ack{CommandID: cmd.CommandID})
	c.send(t, &protocol.Event{CommandID: cmd.CommandID, Name: xssTitle, Data: []byte(`{"html":"<img src=x onerror=alert(8)>"}`)})
	c.send(t, &protocol.Capture{CommandID: cmd.CommandID, MIME: "image/svg+xml", Data: base64.StdEncoding.EncodeToString([]byte(svg))})
	ended := commandEnded(t, br, sent.CommandID)
	c.send(t, &protocol.Error{CommandID: cmd.CommandID, Code: "no_such_element", Message: xssLabel})
	select {
	case ev := <-ended:
		if ev.Status != cheetah.StatusFailed {
			t.Fatalf("the command ended %s", ev.Status)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the command did not end")
	}

	p.show("command?user=usr_xss&id="+sent.CommandID, "Command")
	p.run("see the command", chromedp.WaitVisible(`//main//h3[text()="Messages"]`))
	text = eval[string](p, `document.querySelector('main').textContent`)
	for _, want := range []string{xssTitle, xssLabel, "<img src=x onerror=alert(8)>", "image/svg+xml"} {
		if !strings.Contains(text, want) {
			t.Errorf("the command page does not show %q as text", want)
		}
	}
	if n := eval[float64](p, `document.querySelectorAll('img[src="x"], main svg, main script, .thumb').length`); n != 0 {
		t.Fatalf("%v elements were made from the command's messages (an SVG capture is not shown as an image)", n)
	}
	p.screenshot("xss-command")

	// A quota's match labels come from the quota file, and the reason a
	// reload failed from its parser: text as well. (Quota and tenant names
	// are ids: no markup gets through.)
	setQuotas(t, br, `
quotas:
  - name: hostile
    match: {labels: {note: "`+xssLabel+`"}}
    levels: {user: 1}
`)
	br.b.Registry.QuotasBroken(errors.New("line 3: " + xssTitle))
	p.show("quotas", "Quotas")
	p.run("see the broken quota file", chromedp.WaitVisible(chromedp.CSS(`main .banner`)))
	if got := eval[string](p, `document.querySelector('main .banner').textContent`); !strings.Contains(got, "quota_unavailable") || !strings.Contains(got, "line 3: "+xssTitle) {
		t.Errorf("the banner says %q", got)
	}
	if got := eval[string](p, `document.querySelector('main .match').textContent`); !strings.Contains(got, "note="+xssLabel) {
		t.Errorf("the quota's match shows as %q", got)
	}
	if n := eval[float64](p, `document.querySelectorAll('img[src="x"], main svg, main script').length`); n != 0 {
		t.Fatalf("%v elements were made from the quota file", n)
	}
	p.screenshot("xss-quotas")
	p.noProblems()
}

// TestConsoleOverviewReplicaAndStates feeds the overview view snapshots as
// the event stream sends them: from replicas, each client names its
// replica in a Replica column, which is not there when no client names one;
// the contexts are counted by whatever states the pools report, known ones
// by their labels and in their order. It then opens the Quotas page of a
// broker without a quota file.
func TestConsoleOverviewReplicaAndStates(t *testing.T) {
	br, p := signedInConsole(t)
	var got struct {
		Heads, Row, Plain, Counts []string
	}
	raw := eval[string](p, `import('/ui/overview.js').then((m) => {
		const now = new Date().toISOString();
		const client = (id, replica) => ({ user_id: 'usr_r', client_id: id, client_type: 'browser', name: id, version: '1',
			labels: {}, connected: true, connected_at: now, contexts: 1, ...(replica ? { replica } : {}) });
		const snap = (clients, contexts) => ({ overview: { now, leases: [],
			users: [{ user_id: 'usr_r', contexts, leases: 0, waiters: 0, clients, idle: [] }] } });
		const table = (el) => el.querySelector('table');
		const texts = (els) => [...els].map((e) => e.textContent);
		const cluster = m.render({}, snap([client('ext-a', 'replica-<b>1</b>'), client('ext-b')],
			{ idle: 1, leased: 2, not_live: 0, human: 3, held: 4, frozen_solid: 5 }));
		const single = m.render({}, snap([client('ext-c')], { idle: 1, leased: 0, not_live: 0, human: 0 }));
		return JSON.stringify({
			heads: texts(table(cluster).querySelectorAll('th')),
			row: texts(table(cluster).tBodies[0].rows[0].cells),
			plain: texts(table(single).querySelectorAll('th')),
			counts: texts(cluster.querySelectorAll('.counts li')),
		});
	})`)
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatal(err)
	}
	wantHeads := []string{"Name", "Client id", "Type", "Version", "Labels", "Connected since", "Replica", "Contexts", ""}
	if strings.Join(got.Heads, "|") != strings.Join(wantHeads, "|") {
		t.Errorf("the clients' columns from replicas are %q", got.Heads)
	}
	if len(got.Row) != len(wantHeads) || got.Row[6] != "replica-<b>1</b>" {
		t.Errorf("the client's row is %q, want its replica in the Replica column", got.Row)
	}
	if strings.Contains(strings.Join(got.Plain, "|"), "Replica") {
		t.Errorf("the clients' columns without replicas are %q", got.Plain)
	}
	wantCounts := []string{"1 Idle", "2 Leased", "4 Held", "0 Not live", "3 Human", "5 Frozen solid", "0 Leases", "0 Waiting acquires"}
	if strings.Join(got.Counts, "|") != strings.Join(wantCounts, "|") {
		t.Errorf("the counts are %q, want %q", got.Counts, wantCounts)
	}

	// A broker without a quota file has no quotas, and the page says so.
	if st, raw := br.api(t, adminKey, http.MethodGet, "/api/v1/admin/quotas", nil, nil, nil); st != http.StatusOK || string(raw) != `{"quotas":[]}` {
		t.Fatalf("quotas without a quota file: %d %s", st, raw)
	}
	p.show("quotas", "Quotas")
	p.run("see no quotas", chromedp.WaitVisible(`//main//p[starts-with(text(),"No quotas are in force")]`))
	// Refresh reads them again: a reload shows without a lease event.
	setQuotas(t, br, e2eQuotas)
	p.run("refresh", chromedp.Click(`//main//button[text()="Refresh"]`),
		chromedp.WaitVisible(`//main//caption[text()="Occupancy of consoles"]`))
	p.noProblems()
}

// commandEnded returns a channel that receives the registry's event of the
// command's end once its status is durable in history.
func commandEnded(t *testing.T, br *broker, id string) <-chan registry.Event {
	t.Helper()
	ch := make(chan registry.Event, 1)
	cancel := br.b.Registry.Subscribe(func(ev registry.Event) {
		if ev.Kind == registry.CommandEnded && ev.CommandID == id && ev.Durable {
			ch <- ev
		}
	})
	t.Cleanup(cancel)
	return ch
}

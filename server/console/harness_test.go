package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/internal/browsertest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// adminKey is the broker's bootstrap admin key in these tests.
const adminKey = "console-test-admin-key-0123456789abcdef"

// broker is a real broker on SQLite in a temporary directory, served over
// HTTP on a loopback port.
type broker struct {
	b   *server.Broker
	url string
}

func startBroker(t *testing.T, o server.Options) *broker {
	t.Helper()
	o.DataDir = t.TempDir()
	o.AdminKey = adminKey
	o.LoopbackOnly = true
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	b, url := browsertest.Broker(t, o)
	return &broker{b: b, url: url}
}

// clientKey makes a client key for user.
func (br *broker) clientKey(t *testing.T, user string) string {
	t.Helper()
	k, err := br.b.Keys.Create(t.Context(), auth.Client, user, "test client")
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret
}

// api calls the broker's HTTP API with a bearer key and decodes the answer
// into out (when not nil); it returns the status and the raw body.
func (br *broker) api(t *testing.T, key, method, path string, hdr map[string]string, body, out any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, br.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
	return resp.StatusCode, raw
}

// errorOf decodes an error envelope.
func errorOf(t *testing.T, raw []byte) cheetah.EnvelopeError {
	t.Helper()
	var env cheetah.Envelope
	if err := json.Unmarshal(raw, &env); err != nil || env.Error == nil {
		t.Fatalf("not an error envelope: %s", raw)
	}
	return *env.Error
}

// cookieClient is an HTTP client with a cookie jar, as a browser is.
func cookieClient(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar}
}

// rawClient is a client speaking the wire protocol itself: it reports
// whatever contexts a test wants, titles and labels included.
type rawClient struct {
	conn *websocket.Conn
	ctx  context.Context
}

func dialRaw(t *testing.T, br *broker, key string, hello protocol.Hello) *rawClient {
	t.Helper()
	ctx := t.Context()
	conn, _, err := websocket.Dial(ctx, strings.Replace(br.url, "http", "ws", 1)+"/ws/v1/client", nil)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(8 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	c := &rawClient{conn: conn, ctx: ctx}
	hello.Protocol, hello.Token = protocol.ProtocolVersion, key
	c.send(t, &hello)
	if _, ok := c.read(t).(*protocol.Welcome); !ok {
		t.Fatal("no welcome")
	}
	return c
}

func (c *rawClient) send(t *testing.T, f protocol.Frame) {
	t.Helper()
	b, err := protocol.Encode(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.conn.Write(c.ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

func (c *rawClient) read(t *testing.T) protocol.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 20*time.Second)
	defer cancel()
	for {
		_, b, err := c.conn.Read(ctx)
		if err != nil {
			t.Fatalf("read a frame: %v", err)
		}
		f, err := protocol.Decode(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if _, ok := f.(*protocol.Ping); ok {
			c.send(t, &protocol.Pong{})
			continue
		}
		return f
	}
}

// readCommand reads frames until a command comes.
func (c *rawClient) readCommand(t *testing.T) *protocol.Command {
	t.Helper()
	for {
		if cmd, ok := c.read(t).(*protocol.Command); ok {
			return cmd
		}
	}
}

// testPNG is a small PNG of w×h.
func testPNG(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{R: uint8(x * 255 / w), G: 120, B: uint8(y * 255 / h), A: 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// page is one browser tab on the console, with what it reported: script
// errors, console errors, CSP violations and JavaScript dialogs.
type page struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string // the screenshot directory

	mu       sync.Mutex
	problems []string
}

// screenshotDir is $CHEETAH_CONSOLE_SCREENSHOTS, or a temporary directory.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("CHEETAH_CONSOLE_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// openBrowser starts headless chromium at width×height and opens a tab.
func openBrowser(t *testing.T, base string, width, height int) *page {
	t.Helper()
	opts := append(browsertest.Flags(browsertest.ChromiumPath(t), t.TempDir()),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-features", "Translate"),
		chromedp.WindowSize(width, height),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	p := &page{t: t, ctx: ctx, base: base, shot: screenshotDir(t)}
	// The first run starts the browser, with the domains chromedp enables
	// (runtime, log, page) on.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			p.problem("exception: " + msg)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var parts []string
				for _, a := range ev.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				p.problem("console." + string(ev.Type) + ": " + strings.Join(parts, " "))
			}
		case *log.EventEntryAdded:
			// Network errors are the page's own answers (a 401 before
			// sign-in); a script error or a CSP violation is a problem.
			if ev.Entry.Level == log.EntryLevelError && ev.Entry.Source != log.EntrySourceNetwork {
				p.problem("log " + string(ev.Entry.Source) + ": " + ev.Entry.Text)
			}
		case *cdppage.EventJavascriptDialogOpening:
			p.problem("a JavaScript dialog opened: " + string(ev.Type) + " " + ev.Message)
			// Listen's function may not call the browser; another goroutine may.
			go chromedp.Call(ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{Accept: false})
		}
	})
	if err != nil {
		t.Fatalf("listen to chromium: %v", err)
	}
	return p
}

func (p *page) problem(s string) {
	p.mu.Lock()
	p.problems = append(p.problems, s)
	p.mu.Unlock()
}

// probe proves the page's listeners work: a dialog, a console error, an
// uncaught exception and an inline script the CSP refuses are each
// reported. It then forgets them.
func (p *page) probe() {
	p.t.Helper()
	eval[bool](p, `setTimeout(() => { console.error('probe'); alert('probe'); }, 0);
		setTimeout(() => { throw new Error('probe'); }, 0);
		const s = document.createElement('script'); s.textContent = 'window.probed = 1'; document.body.appendChild(s);
		true`)
	eventually(p.t, 10*time.Second, "the probes to be reported", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		var dialog, console, exception, csp bool
		for _, s := range p.problems {
			dialog = dialog || strings.HasPrefix(s, "a JavaScript dialog opened: alert probe")
			console = console || strings.HasPrefix(s, "console.error")
			exception = exception || strings.HasPrefix(s, "exception:")
			csp = csp || strings.Contains(s, "Content Security Policy")
		}
		return dialog && console && exception && csp
	})
	if eval[bool](p, `window.probed === 1`) {
		p.t.Fatal("an inline script ran: the Content-Security-Policy does not hold")
	}
	p.mu.Lock()
	p.problems = nil
	p.mu.Unlock()
}

// noProblems fails the test if the page reported any.
func (p *page) noProblems() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.problems {
		p.t.Errorf("the page reported: %s", s)
	}
}

// run runs browser actions, failing the test on error.
func (p *page) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise) in the page.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot writes the viewport to <dir>/<name>.png and checks that it is
// a PNG with something on it.
func (p *page) screenshot(name string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if len(buf) == 0 {
		p.t.Fatalf("screenshot %s is empty", name)
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if b := img.Bounds(); b.Dx() == 0 || b.Dy() == 0 {
		p.t.Fatalf("screenshot %s has no pixels", name)
	}
	path := filepath.Join(p.shot, name+".png")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		p.t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() == 0 {
		p.t.Fatalf("screenshot %s was not written: %v", path, err)
	}
	return path
}

// signIn opens the console and signs in with key.
func (p *page) signIn(key string) {
	p.t.Helper()
	p.run("sign in",
		chromedp.Navigate(p.base+"/ui/"),
		chromedp.WaitVisible(chromedp.ID("signin-key")),
		chromedp.SendKeys(chromedp.ID("signin-key"), key),
		chromedp.Click(chromedp.CSS(`#signin-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.ID("nav")),
		chromedp.WaitVisible(`//span[@id="live" and text()="live"]`),
	)
}

// signedInConsole starts a broker and a browser at 1280×800 signed in to
// its console with the admin key. Skipped with -short.
func signedInConsole(t *testing.T) (*broker, *page) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a browser; skipped with -short")
	}
	br := startBroker(t, server.Options{})
	p := openBrowser(t, br.url, 1280, 800)
	p.signIn(adminKey)
	return br, p
}

// show navigates the console to a view and waits for its heading.
func (p *page) show(hash, heading string) {
	p.t.Helper()
	p.run("show "+hash,
		chromedp.Evaluate[chromedp.Void](`location.hash = `+jsString(hash)),
		chromedp.WaitVisible(`//main//h1[text()=`+xpathString(heading)+`]`),
	)
}

// eventually polls cond until it holds: the page's progress sends the test
// no signal, so what it shows is looked at until it shows it.
var eventually = browsertest.Eventually

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// xpathString quotes s for XPath 1.0 (which has no escapes).
func xpathString(s string) string {
	if !strings.Contains(s, `"`) {
		return `"` + s + `"`
	}
	if !strings.Contains(s, "'") {
		return "'" + s + "'"
	}
	parts := strings.Split(s, `"`)
	return `concat("` + strings.Join(parts, `", '"', "`) + `")`
}

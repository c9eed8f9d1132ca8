package e2e

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/extension/internal/pack"
	"github.com/cheetahbroker/cheetah/internal/browsertest"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

const userID = "usr_e2e"

// chromiumPath is Debian's chromium, or $CHEETAH_CHROMIUM.
var chromiumPath = browsertest.ChromiumPath

// logWriter sends lines to t.Log until the test ends; the browser and the
// broker go on writing a little after that.
type logWriter struct {
	mu     sync.Mutex
	t      *testing.T
	prefix string
	done   bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
			// Chromium complains about the machine (no D-Bus in a container);
			// only its other lines are worth reading.
			if line != "" && !strings.Contains(line, "dbus") && !strings.Contains(line, "unexpected operator") {
				w.t.Log(w.prefix + line)
			}
		}
	}
	return len(p), nil
}

func (w *logWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// env is one broker, one pages server and one chromium with the extension.
type env struct {
	t         *testing.T      // the running step
	root      *testing.T      // the whole test: owns the browser, the broker and every tab
	ctx       context.Context // the test's context; bounded by the test deadline
	b         *server.Broker
	mgr       *cheetah.Manager
	brokerURL string
	clientKey string
	pages     *httptest.Server
	submitted chan string
	browser   context.Context // the chromedp browser (its first tab is a person's)
	extID     string
	ext       context.Context // an extension page (the options page), for chrome.* calls
	home      string          // the browser's $HOME: a download that lands goes to its Downloads
}

func newEnv(t *testing.T) *env {
	t.Helper()
	chromium := chromiumPath(t)
	e := &env{t: t, root: t, ctx: t.Context(), submitted: make(chan string, 8)}
	e.startBroker()
	e.startPages()
	e.startBrowser(chromium, e.unpackExtension())
	return e
}

func (e *env) startBroker() {
	t := e.t
	lw := &logWriter{t: t, prefix: "broker: "}
	t.Cleanup(lw.stop)
	b, url := browsertest.Broker(t, server.Options{
		DataDir: t.TempDir(),
		// Long enough that the service-worker restart below always fits,
		// however slowly the watchdog alarm wakes it.
		ReconnectGrace: 2 * time.Minute,
		LoopbackOnly:   true,
		Log:            slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	key, err := b.Keys.Create(e.ctx, auth.Client, userID, "e2e browser")
	if err != nil {
		t.Fatal(err)
	}
	e.b, e.mgr = b, b.Manager()
	e.brokerURL = url
	e.clientKey = key.Secret
}

const formPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>Form</title>
<style>body{font:16px sans-serif;margin:24px;background:#fffbe6}h1{color:#d35400}</style></head>
<body>
<h1 id="intro">Hello from the form page</h1>
<form action="/submitted" method="get">
  <label>Name <input id="name" name="name"></label>
  <button id="go" type="submit">Send</button>
</form>
<p><input id="js-name"> <button id="greet" type="button">Greet</button></p>
<p id="greeting"></p>
<ul id="items"><li>one</li><li>two</li></ul>
<script>
document.getElementById('greet').addEventListener('click', function () {
  document.getElementById('greeting').textContent = 'Hello, ' + document.getElementById('js-name').value;
});
</script>
</body></html>`

// article has multi-byte text, so that truncation is checked on UTF-8
// boundaries.
const articlePage = `<!doctype html>
<html><head><meta charset="utf-8"><title>Article</title></head>
<body><article id="text">Grüße aus Köln — 🐆 fast cats</article></body></html>`

// downloadBody is what /download serves as an attachment.
const downloadBody = "name,count\nada,1\ngrace,2\n"

// kitchenPage has one of everything the catalogue drives: a file input, a
// multiple select, a checkbox, a key log, a hover target, dialogs, a list
// for the parser, a target=_blank link, a download link, a same-origin
// iframe, and a page taller than the viewport.
const kitchenPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>Kitchen</title>
<style>body{margin:8px;font:16px sans-serif}.tall{height:3000px;background:linear-gradient(#fff,#09c)}</style></head>
<body>
<input id="file" type="file" multiple><p id="files"></p>
<select id="sel" multiple><option value="a">Apple</option><option value="b">Banana</option><option value="c">Cherry</option></select>
<input id="agree" type="checkbox">
<input id="keys" value="hello"><p id="keylog"></p>
<div id="hov">hover me</div>
<button id="confirm" onclick="document.getElementById('answer').textContent = String(confirm('Sure?'))">confirm</button>
<button id="prompt" onclick="document.getElementById('answer').textContent = String(prompt('Name?'))">prompt</button>
<p id="answer"></p>
<button id="clicks" ondblclick="this.dataset.dbl = 'yes'" oncontextmenu="this.dataset.menu = 'yes'; return false">clicks</button>
<ul id="list"><li><span class="n">one</span> <a href="/a/1">1</a></li><li><span class="n">two</span> <a href="/a/2">2</a></li><li><span class="n">three</span> <a href="/a/3">3</a></li></ul>
<a id="pop" href="/article" target="_blank">popup</a>
<a id="dl" href="/download">download</a>
<a id="next" href="/article">next</a>
<iframe id="f" src="/article" width="400" height="100"></iframe>
<div class="tall"></div>
<script>
document.getElementById('file').addEventListener('change', function (e) {
  document.getElementById('files').textContent = [].map.call(e.target.files, function (f) { return f.name + ':' + f.size; }).join(',');
});
document.getElementById('keys').addEventListener('keydown', function (e) {
  document.getElementById('keylog').textContent += e.key + (e.ctrlKey ? '^' : '') + ' ';
});
document.getElementById('hov').addEventListener('mouseover', function () { document.getElementById('hov').dataset.hovered = 'yes'; });
console.log('kitchen ready');
</script>
</body></html>`

func (e *env) startPages() {
	t := e.t
	stop := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/form", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, formPage)
	})
	mux.HandleFunc("/article", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, articlePage)
	})
	mux.HandleFunc("/submitted", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		select {
		case e.submitted <- name:
		default:
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><html><head><meta charset="utf-8"><title>Submitted</title></head>
<body><p id="done">Submitted: %s</p></body></html>`, html.EscapeString(name))
	})
	mux.HandleFunc("/person", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><html><head><title>A person's own tab</title></head><body><p id="mine">mine</p></body></html>`)
	})
	mux.HandleFunc("/kitchen", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, kitchenPage)
	})
	// /slowimg is a page whose one image never loads: its load event never
	// comes.
	mux.HandleFunc("/slowimg", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><html><head><title>Slow image</title></head><body><p id="here">the text is here</p><img src="/never"></body></html>`)
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `<!doctype html><html><head><title>Not here</title></head><body>404</body></html>`)
	})
	mux.HandleFunc("/hop1", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/hop2", http.StatusFound) })
	mux.HandleFunc("/hop2", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/article", http.StatusMovedPermanently)
	})
	mux.HandleFunc("/download", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		w.Header().Set("Content-Disposition", `attachment; filename="report.csv"`)
		io.WriteString(w, downloadBody)
	})
	// /bigdownload is an attachment larger than a frame of the broker.
	mux.HandleFunc("/bigdownload", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="big.bin"`)
		w.Write(make([]byte, 5<<20))
	})
	// /never answers nothing until the browser gives up or the test ends.
	mux.HandleFunc("/never", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	e.pages = httptest.NewServer(mux)
	t.Cleanup(e.pages.Close)
	t.Cleanup(func() { close(stop) }) // runs first: /never returns, Close does not wait for it
}

// unpackExtension builds the zip that `make extension` ships and unpacks it,
// so the browser runs exactly what a person would install.
func (e *env) unpackExtension() string {
	t := e.t
	dir := t.TempDir()
	zip := filepath.Join(dir, "cheetah-extension.zip")
	if _, err := pack.WriteFile(filepath.Join("..", "src"), zip); err != nil {
		t.Fatal(err)
	}
	ext := filepath.Join(dir, "extension")
	if err := os.Mkdir(ext, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := pack.Unzip(zip, ext); err != nil {
		t.Fatal(err)
	}
	return ext
}

func (e *env) startBrowser(chromium, ext string) {
	t := e.t
	profile := t.TempDir() // removed after the browser is gone (cleanups run last-in first-out)
	e.home = t.TempDir()
	lw := &logWriter{t: t, prefix: "chromium: "}
	t.Cleanup(lw.stop)
	// chromedp's default options disable extensions, so the flags are our own.
	opts := append(browsertest.Flags(chromium, profile),
		chromedp.Flag("disable-extensions-except", ext),
		chromedp.Flag("load-extension", ext),
		chromedp.Flag("disable-features", "DisableLoadExtensionCommandLineSwitch,Translate"),
		chromedp.Flag("window-size", "1280,800"),
		chromedp.CombinedOutput(lw),
		chromedp.Env("HOME="+e.home, "XDG_DOWNLOAD_DIR="+filepath.Join(e.home, "Downloads")),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelBrowser() })
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	e.browser = browser

	// The extension's service worker names its id.
	sw := e.eventuallyTarget("the extension's service worker", 30*time.Second, isServiceWorker)
	e.extID = strings.Split(strings.TrimPrefix(sw.URL, "chrome-extension://"), "/")[0]
	t.Logf("extension %s loaded", e.extID)
}

func isServiceWorker(ti *target.Info) bool {
	return ti.Type == "service_worker" && strings.HasPrefix(ti.URL, "chrome-extension://") &&
		strings.HasSuffix(ti.URL, "/background.js")
}

// eventuallyTarget waits for a browser target that match accepts.
func (e *env) eventuallyTarget(what string, timeout time.Duration, match func(*target.Info) bool) *target.Info {
	e.t.Helper()
	var found *target.Info
	eventually(e.t, timeout, what, func() bool {
		ts, err := chromedp.Targets(e.browser)
		if err != nil {
			return false
		}
		for _, ti := range ts {
			if match(ti) {
				found = ti
				return true
			}
		}
		return false
	})
	return found
}

// newTab opens a tab (a person's, as far as the extension knows) at url.
func (e *env) newTab(url string) context.Context {
	e.t.Helper()
	ctx, cancel := chromedp.NewContext(e.browser)
	e.root.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		e.t.Fatalf("open %s: %v", url, err)
	}
	return ctx
}

func (e *env) extURL(page string) string { return "chrome-extension://" + e.extID + "/" + page }

// configure fills the options page as a person would and saves it.
func (e *env) configure(key string, poolSize int) {
	e.t.Helper()
	if msg := e.save(e.brokerURL, key, poolSize); msg != "Saved." {
		e.t.Fatalf("the options page says %q, want Saved.", msg)
	}
}

// save fills the options page, saves, and returns what the page says once
// it has checked the broker.
func (e *env) save(brokerURL, key string, poolSize int) string {
	t := e.t
	t.Helper()
	if e.ext == nil {
		e.ext = e.newTab(e.extURL("options.html"))
	}
	err := chromedp.Do(e.ext,
		chromedp.WaitVisible(chromedp.ID("broker-url")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('message').textContent = ''`),
		chromedp.SetValue(chromedp.ID("broker-url"), brokerURL),
		chromedp.SetValue(chromedp.ID("client-key"), key),
		chromedp.SetValue(chromedp.ID("pool-size"), fmt.Sprint(poolSize)),
		chromedp.Click(chromedp.ID("save")),
	)
	if err != nil {
		t.Fatalf("fill the options page: %v", err)
	}
	var msg string
	eventually(t, 10*time.Second, "the options page to say what it did", func() bool {
		msg, err = chromedp.Run(e.ext, chromedp.Evaluate[string](`document.getElementById('message').textContent`))
		return err == nil && msg != "" && !strings.HasPrefix(msg, "Checking")
	})
	return msg
}

// optionsState is the connection state the options page shows.
func (e *env) optionsState() (state, detail string) {
	state, _ = chromedp.Run(e.ext, chromedp.Evaluate[string](`document.getElementById('state').textContent`))
	detail, _ = chromedp.Run(e.ext, chromedp.Evaluate[string](`document.getElementById('detail').textContent`))
	return state, detail
}

// eval runs an expression in the extension page (awaiting a promise) and
// decodes its value into T.
func eval[T any](e *env, expr string) T {
	e.t.Helper()
	v, err := chromedp.Run(e.ext, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		e.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// badge is the extension's badge text on a tab.
func (e *env) badge(tabID string) (string, error) {
	return chromedp.Run(e.ext, chromedp.Evaluate[string](
		fmt.Sprintf(`chrome.action.getBadgeText({tabId: %s})`, tabID), chromedp.EvalAwaitPromise))
}

// available waits until the broker lists n idle browser contexts.
func (e *env) available(n int, what string) []cheetah.ContextSnapshot {
	e.t.Helper()
	var got []cheetah.ContextSnapshot
	eventually(e.t, 30*time.Second, what, func() bool {
		var err error
		got, err = e.mgr.ListAvailable(e.ctx, userID, cheetah.Browser)
		return err == nil && len(got) == n
	})
	return got
}

// client is the extension's client as the broker sees it.
func (e *env) client() (clientID, sessionID string, connected bool) {
	for _, c := range e.b.Registry.Clients(userID) {
		return c.ClientID, c.SessionID, c.Connected
	}
	return "", "", false
}

// eventually polls cond until it holds or timeout passes (the browser's
// progress sends no signal to the test).
var eventually = browsertest.Eventually

// errorCode is a command's error code from its resolution, or "".
func errorCode(res cheetah.Resolution) string {
	if res.Error == nil {
		return ""
	}
	return res.Error.Code
}

var errNoResult = errors.New("no result message")

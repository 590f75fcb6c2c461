package service

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/keysched/keysched"
	"github.com/keysched/keysched/examples/webhook/sim"
	"github.com/stretchr/testify/require"
)

// The browser test's variables: KEYSCHED_CHROMIUM names the browser binary
// (default: /usr/bin/chromium, Debian's chromium package, else chromium or
// chromium-browser on PATH); without one the test fails unless
// KEYSCHED_SKIP_BROWSER=1.
const (
	envChromium    = "KEYSCHED_CHROMIUM"
	envSkipBrowser = "KEYSCHED_SKIP_BROWSER"
)

// chromiumPath finds the browser, or returns "" and what it tried: the value
// of KEYSCHED_CHROMIUM when it is set (and only that), else
// /usr/bin/chromium and chromium and chromium-browser on PATH.
func chromiumPath() (path, tried string) {
	if p := os.Getenv(envChromium); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Sprintf("%s=%s is set, and: %v", envChromium, p, err)
		}
		return p, ""
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium", ""
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, ""
		}
	}
	return "", fmt.Sprintf("%s is not set; tried /usr/bin/chromium, then chromium and chromium-browser on PATH (%s)",
		envChromium, os.Getenv("PATH"))
}

// requireChromium returns the browser's path; it skips t when
// KEYSCHED_SKIP_BROWSER=1 and fails it, saying what it tried and how to
// install one or opt out, when there is none. what names what goes untested.
func requireChromium(t *testing.T, what string) string {
	t.Helper()
	if os.Getenv(envSkipBrowser) == "1" {
		t.Skipf("%s=1: %s NOT tested in a browser", envSkipBrowser, what)
	}
	browser, tried := chromiumPath()
	if browser == "" {
		t.Fatalf("\n*** NO CHROMIUM BINARY: %s.\n*** %s cannot be tested in a browser.\n"+
			"*** Install it (Debian, as root): apt-get update && apt-get install -y chromium\n"+
			"*** Or point %s at a Chromium binary, or skip the browser tests: %s=1\n", tried, what, envChromium, envSkipBrowser)
	}
	return browser
}

// newBrowser starts a headless Chromium for t (requireChromium: without one
// it fails t, or skips it with KEYSCHED_SKIP_BROWSER=1; what names what goes
// untested); stop ends it. The browser starts at the context's first Run.
func newBrowser(t *testing.T, what string) (ctx context.Context, stop func()) {
	t.Helper()
	browser := requireChromium(t, what)
	alloc, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(browser),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	return ctx, func() { cancel(); cancelAlloc() }
}

// cssText is the text of the element sel selects in the browser of ctx.
func cssText(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, sel)
	return v
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The operator page in a real headless Chromium: it lists the parked
// partner, and its Resume button resumes it (the partner's events are then
// delivered in order, and the action is logged).
func TestOperatorPageInBrowser(t *testing.T) {
	ctx, stop := newBrowser(t, "the operator page")
	defer stop()
	logs := &syncBuffer{}
	h := newHarness(t, map[string]sim.Behavior{"stuck": {Down: true}, "fine": {}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	for i := range 3 {
		h.post("stuck", i)
		h.post("fine", i)
	}
	require.Eventually(t, func() bool { return len(h.parked()) == 1 && h.delivered("fine") }, waitLong, 5*time.Millisecond)

	text := func(sel string) string { t.Helper(); return cssText(t, ctx, sel) }
	// The first Run starts the browser: no timeout on its context.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(h.admin.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("#parked")),
	))
	parkedTable := text("#parked")
	require.Contains(t, parkedTable, "stuck")
	require.NotContains(t, parkedTable, "fine")
	require.Equal(t, "parked", text(`#partners tr[data-partner="stuck"] td.state`))
	require.Equal(t, "active", text(`#partners tr[data-partner="fine"] td.state`))

	// The endpoint is back; the operator presses Resume (a POST form; the
	// server redirects back to the page).
	h.eps["stuck"].Set(sim.Behavior{})
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("#resume-stuck")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	))
	require.Contains(t, text("#flash"), "resumed stuck")
	require.Eventually(t, func() bool { return h.delivered("stuck") }, waitLong, 5*time.Millisecond)
	h.checkOrder("stuck")
	require.Contains(t, logs.String(), `msg="operator resumed partner" partner=stuck`)

	// Reloaded, the page lists no parked partner.
	require.Eventually(t, func() bool { return len(h.parked()) == 0 }, waitLong, 5*time.Millisecond)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(h.admin.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("#partners")),
	))
	noParked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#parked") === null`))
	require.NoError(t, err)
	require.True(t, noParked)
	require.Equal(t, "active", text(`#partners tr[data-partner="stuck"] td.state`))
}

package cockpittest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// FindChromium returns Debian's Chromium; the error names the package.
func FindChromium() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("chromium is not installed (apt-get install chromium)")
}

// NeedChromium returns the browser, or fails (CI=true) or skips the test.
func NeedChromium(t testing.TB) string {
	t.Helper()
	p, err := FindChromium()
	testenv.Need(t, err == nil, "%v", err)
	return p
}

// Browser is one headless Chromium with a fresh profile.
type Browser struct {
	ctx     context.Context
	cancel  context.CancelFunc
	out     *lockedWriter // Chromium's stdout and stderr
	console *lockedWriter // the page's console
}

// NewBrowser starts Chromium headless for the test, with a fresh profile and
// nothing that reaches the network on its own; it is closed when the test
// ends. width×height is the window, which screenshots show.
func NewBrowser(t testing.TB, chromium string, width, height int) *Browser {
	t.Helper()
	b, err := StartBrowser(chromium, t.TempDir(), width, height)
	if err != nil {
		t.Fatalf("cannot start chromium: %v", err)
	}
	t.Cleanup(func() {
		b.Close()
		if logs := b.Logs(); t.Failed() && logs != "" {
			t.Logf("chromium and the page's console said:\n%s", tail([]byte(logs), 6000))
		}
	})
	return b
}

// StartBrowser starts Chromium outside a test's lifetime; call Close.
func StartBrowser(chromium, profileDir string, width, height int) (*Browser, error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(filepath.Join(profileDir, "chromium-profile")),
		chromedp.WindowSize(width, height),
		// Root in a container: Chromium's own sandbox cannot start.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("lang", "en-US"),
	)
	b := &Browser{out: &lockedWriter{}, console: &lockedWriter{}}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(opts, chromedp.CombinedOutput(b.out))...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	b.ctx, b.cancel = ctx, func() { cancelCtx(); cancelAlloc() }
	// Start the browser now, with a deadline, so a broken install fails
	// here. The first action owns the browser: it must run on ctx itself,
	// not on a context with a timeout that would end the browser with it.
	timer := time.AfterFunc(60*time.Second, b.cancel)
	defer timer.Stop()
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		b.Close()
		return nil, fmt.Errorf("cannot start %s: %w\n%s", chromium, err, b.out.String())
	}
	// The page's console and uncaught exceptions, for a failing test's log.
	if err := chromedp.Listen(ctx, b.record); err != nil {
		b.Close()
		return nil, fmt.Errorf("cannot listen to the page's console: %w", err)
	}
	return b, nil
}

func (b *Browser) record(ev any) {
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		var parts []string
		for _, a := range ev.Args {
			if a.Description != "" {
				parts = append(parts, a.Description)
			} else {
				parts = append(parts, string(a.Value))
			}
		}
		fmt.Fprintf(b.console, "console.%s: %s\n", ev.Type, strings.Join(parts, " "))
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		fmt.Fprintf(b.console, "exception at %s:%d: %s\n", d.URL, d.LineNumber+1, msg)
	}
}

// Logs are Chromium's own output and the page's console.
func (b *Browser) Logs() string {
	return b.out.String() + b.console.String()
}

// Close ends the browser.
func (b *Browser) Close() { b.cancel() }

// Do runs actions with a deadline.
func (b *Browser) Do(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// Eval evaluates a JavaScript expression in the page and stores its value.
func Eval[T any](b *Browser, timeout time.Duration, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// WaitFor waits until the JavaScript expression is truthy in the page,
// re-evaluating it whenever the DOM changes (not on a timer).
func (b *Browser) WaitFor(timeout time.Duration, expr string) error {
	return b.waitFor(timeout, expr, chromedp.WithPollingMutation())
}

// WaitForInFrames is WaitFor for an expression that reads the documents of
// frames (Cockpit's shell around a page): the top document's mutations do
// not show theirs, so it re-evaluates every 100 ms.
func (b *Browser) WaitForInFrames(timeout time.Duration, expr string) error {
	return b.waitFor(timeout, expr, chromedp.WithPollingInterval(100*time.Millisecond))
}

func (b *Browser) waitFor(timeout time.Duration, expr string, how chromedp.PollOption) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, how))
		if err == nil {
			return nil
		}
		// A navigation replaced the document the poll ran in: poll the new one.
		if ctx.Err() == nil && (strings.Contains(err.Error(), "context") || strings.Contains(err.Error(), "Inspected target navigated")) {
			continue
		}
		return fmt.Errorf("page never showed %s: %w", expr, err)
	}
}

// Screenshot saves the whole page as a PNG.
func (b *Browser) Screenshot(path string) error {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		return fmt.Errorf("cannot take a screenshot: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", filepath.Dir(path), err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		return fmt.Errorf("cannot save the screenshot: %w", err)
	}
	return nil
}

// ShellFrameReady is a JavaScript expression for Cockpit's shell: true once
// the frame of package pkg has finished its first refresh (it sets
// data-ready on its body).
func ShellFrameReady(pkg string) string {
	return `(() => { const f = document.querySelector('iframe[name$="/` + pkg + `"]');
		return !!(f && f.contentDocument && f.contentDocument.body && f.contentDocument.body.dataset.ready === "true"); })()`
}

// Go sends the tab to url without waiting for its load event: Cockpit's
// shell keeps frames loading, so callers wait for what they need to see.
func (b *Browser) Go(timeout time.Duration, url string) error {
	return b.Do(timeout, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		res, err := cdp.Call(ctx, t, page.Navigate, page.NavigateParams{URL: url})
		if err != nil {
			return fmt.Errorf("cannot open %s: %w", url, err)
		}
		if res.ErrorText != "" {
			return fmt.Errorf("cannot open %s: %s", url, res.ErrorText)
		}
		return nil
	}))
}

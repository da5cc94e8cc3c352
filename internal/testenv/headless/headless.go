// Package headless starts a headless Chromium for the tests that check a
// page in a real browser (the status page, the batch list). It is its own
// package so that chromedp is linked only by those tests.
package headless

import (
	"context"

	"github.com/chromedp/chromedp"
)

// Browser starts the Chromium at path (testenv.LookPath finds it) under
// ctx, headless and without its sandbox (tests run as root in containers,
// where the sandbox cannot start), with extra allocator options, and
// returns the browser's context for chromedp.Run/Do and the func that
// closes it. logf, when not nil, receives chromedp's log.
func Browser(ctx context.Context, path string, logf func(string, ...any), extra ...chromedp.ExecAllocatorOption) (context.Context, context.CancelFunc) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Flag("headless", "new"))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(opts, extra...)...)
	var copts []chromedp.ContextOption
	if logf != nil {
		copts = append(copts, chromedp.WithLogf(logf))
	}
	bctx, cancelBrowser := chromedp.NewContext(actx, copts...)
	return bctx, func() {
		cancelBrowser()
		cancelAlloc()
	}
}

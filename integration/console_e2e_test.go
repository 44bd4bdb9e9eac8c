package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestConsoleInBrowser drives the web console in headless Chromium against
// a fleet of two replicas sharing a bucket at 20/s with a backlog:
//   - the delivered rate the page shows is within 10% of the rate the sink
//     counts over the last 5 s;
//   - a rate set in the page (1/s) reaches every replica within 2 s: from
//     2 s to 4 s after the click the sink receives at most 5 messages,
//     where the old rate gives 40. (The messages that were already waiting
//     on reservations when the rate changed come due at up to 1/s per
//     replica for a few seconds: 4 in that window, measured, with 2
//     replicas; docs/console.md);
//   - an action without the token is refused with 401 (from the page's
//     button and from a script) and changes nothing;
//   - the page shows the queue's backlog, which the replicas' heartbeats
//     carry;
//   - the page shows the key a (shadow) per-recipient layer refused most,
//     which the heartbeats carry too.
//
// It saves a screenshot, console.png, in its temporary directory, and
// also as THROTTLE_CONSOLE_SCREENSHOT when set (docs/console.png).
// Chromium must be installed (Debian: apt-get install chromium); with
// CI=true a missing Chromium fails the test.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		testenv.Missing(t, "chromium", "install it (Debian: apt-get install -y chromium)", exec.ErrNotFound)
	}
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	start := time.Now()

	const (
		rate    = 20.0
		newRate = 1.0
		window  = 10 * time.Second
		bound   = 0.10
		token   = "console-e2e-token-0123456789"
	)
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	sink := cliNewSink(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "throttle.yaml")
	cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit:
  bucket: %s
  rate: %v
  burst: 1
  extra:
    - {name: per-recipient, key: '{{.JSON.to}}', rate: 1/h, on_exceed: dead_letter, shadow: true}
source:
  rabbitmq: {url: %q, queue: %s, prefetch: 5, declare: true}
sink:
  http: {url: %q, timeout: 5s}
delivery: {drain_timeout: 2s}
metrics: {listen: "off"}
console: {token: %q}
`, redisAddr, name, rate, amqpURL, name, sink.srv.URL+"/send", token)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	for range 2 {
		cliStart(t, bin, "run", "--config", cfgPath)
	}
	cons := cliStart(t, bin, "console", "--config", cfgPath, "--listen", "127.0.0.1:0")
	cliWait(t, 20*time.Second, "two consumers on the queue", func() bool { return cliQueueState(conn, name).Consumers == 2 })
	// A backlog for the whole test: 20/s for about 15 s, then 1/s.
	// Two recipients in three messages are one number: the shadow layer
	// would refuse all of its messages but the first, and most of the
	// other's.
	const topKey = "+33612345678"
	for i := range 500 {
		to := topKey
		if i%3 == 2 {
			to = "+447700900123"
		}
		err := ch.Publish("", name, false, false, amqp.Publishing{ContentType: "application/json", Body: []byte(fmt.Sprintf(`{"id":%d,"to":%q}`, i, to))})
		if err != nil {
			t.Fatal(err)
		}
	}
	var url string
	addrRe := regexp.MustCompile(`msg="serving the console" addr=(\S+)`)
	cliWait(t, 20*time.Second, "the console's address in its log", func() bool {
		m := addrRe.FindStringSubmatch(cons.stderr.String())
		if m != nil {
			url = "http://" + m[1] + "/"
		}
		return m != nil
	})

	opts := append([]chromedp.ExecAllocatorOption{}, chromedp.DefaultExecAllocatorOptions[:]...)
	opts = append(opts,
		chromedp.ExecPath(browser),
		chromedp.Headless, // Chromium as root needs these flags
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	// The first call starts the browser, which lives as long as its
	// context: no timeout on that one.
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("opening the console at %s in %s: %v", url, browser, err)
	}
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	card := fmt.Sprintf(`section.bucket[data-bucket=%q]`, name)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(css(card+" .delivered"))); err != nil {
		t.Fatalf("the console at %s shows no bucket %s: %v", url, name, err)
	}
	// text waits for sel and reads it in one evaluation: the page
	// renders its tables anew each second, and reading a node found by an
	// earlier call (as TextContent does) failed once with "No node with
	// given id found".
	text := func(sel string) string {
		s, err := chromedp.Run(ctx, chromedp.Poll[[]string](
			fmt.Sprintf(`(e => e ? [e.textContent] : null)(document.querySelector(%q))`, sel),
			chromedp.WithPollingInterval(50*time.Millisecond)))
		if err != nil || len(s) != 1 {
			t.Fatalf("reading %s: %q, %v", sel, s, err)
		}
		return s[0]
	}
	// sinkRate is what the sink counted over the window w that ended lag
	// ago. The page's rate is over the heartbeats (3 s apart) of the last
	// 10 s, the last one 0 to 3 s old, read once a second: lag 1.5 s
	// centres the sink's window on it, so that a stall under load shows
	// in both alike.
	const lag = 1500 * time.Millisecond
	sinkRate := func(w time.Duration) float64 {
		n, to := 0, time.Now().Add(-lag)
		from := to.Add(-w)
		for _, at := range sink.times() {
			if at.After(from) && !at.After(to) {
				n++
			}
		}
		return float64(n) / w.Seconds()
	}
	// The page shows a rate from each replica's second heartbeat (3 s
	// apart); the sink's window needs window of deliveries.
	// The page's rate is over the heartbeats of the last 10 s (3 s
	// apart): once the first delivery is 13 s old, the heartbeats from
	// before it, when the queue was still empty, have left that window,
	// and the sink's window (10 s ending 1.5 s ago) holds deliveries only.
	cliWait(t, 30*time.Second, "the page to show the delivered rate of two replicas", func() bool {
		rows, _ := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, card+" table.replicas tr")))
		ts := sink.times()
		return rows == 3 && text(card+" .delivered") != "?" && len(ts) > 0 && time.Since(ts[0]) > 13*time.Second
	})
	t.Logf("the page showed the delivered rate of both replicas %v after the test started", time.Since(start).Round(time.Millisecond))
	for i := range 3 {
		shown := text(card + " .delivered")
		want := sinkRate(window)
		got, err := strconv.ParseFloat(strings.TrimSuffix(shown, "/s"), 64)
		if err != nil {
			t.Fatalf("the page shows the delivered rate %q, not a rate", shown)
		}
		t.Logf("reading %d: the page shows %.1f/s, the sink counted %.2f/s over %v ending %v ago (%.1f%% apart)", i+1, got, want, window, lag, 100*math.Abs(got-want)/want)
		if math.Abs(got-want) > bound*want {
			t.Errorf("the page shows %v/s delivered, the sink counted %.2f/s over %v ending %v ago: not within %.0f%%", got, want, window, lag, 100*bound)
		}
		if i < 2 {
			time.Sleep(time.Second) // the next frame
		}
	}

	// The backlog, read by the replicas every 5 s, comes with their
	// heartbeats.
	if bl := text(card + " .backlog"); !regexp.MustCompile(`^[1-9]\d* \(\d+ ready, 0 set aside\)$`).MatchString(bl) {
		t.Errorf("the page shows the backlog %q; want the ready messages of the queue", bl)
	} else {
		t.Logf("the page shows the backlog %s; the queue holds %d ready now", bl, cliQueueState(conn, name).Messages)
	}

	// The key the shadow layer would have refused most, from the
	// heartbeats, first in its row of the layers table.
	layerRow := card + ` table.layers tr:nth-child(2)`
	cliWait(t, 10*time.Second, "the page to show the key refused most", func() bool {
		return strings.Contains(text(layerRow), "per-recipient") && strings.Contains(text(layerRow+" td:last-child"), topKey+" (")
	})
	t.Logf("the layers table shows: %s", text(layerRow))

	// Set the rate in the page, with the token typed in.
	rateSel, result := card+" .rate-input", card+" .result"
	setAt := time.Now()
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(css("#token"), token),
		chromedp.SetValue(css(rateSel), "1/s"),
		chromedp.Func(func(context.Context, *chromedp.Target) error { setAt = time.Now(); return nil }),
		chromedp.Click(css(card+" button.set-rate")),
	); err != nil {
		t.Fatal(err)
	}
	cliWait(t, 10*time.Second, "the page to confirm the new rate", func() bool { return strings.Contains(text(result), "now runs at 1/s") })
	// Every replica has the new rate within 2 s: from setAt+2s to
	// setAt+4s the sink gets at most 5 messages (measured: 4, the
	// reservations waiting at the change coming due at up to 1/s on each
	// replica), where the old rate gives 40.
	cliWait(t, 10*time.Second, "4 s after the change", func() bool { return time.Since(setAt) > 4*time.Second })
	var after, lastOld int
	var lastOldAt time.Time
	var offsets []string
	for _, at := range sink.times() {
		if d := at.Sub(setAt); d >= 0 {
			offsets = append(offsets, d.Round(time.Millisecond).String())
		}
		switch d := at.Sub(setAt); {
		case d >= 2*time.Second && d < 4*time.Second:
			after++
		case d >= 0 && d < 2*time.Second && (lastOldAt.IsZero() || at.Sub(lastOldAt) < 300*time.Millisecond):
			lastOld++
			lastOldAt = at
		}
	}
	propagated := time.Duration(0)
	if !lastOldAt.IsZero() {
		propagated = lastOldAt.Sub(setAt)
	}
	t.Logf("deliveries after the click, since the click: %s", strings.Join(offsets, " "))
	t.Logf("rate set in the page at 1/s: the last delivery at the old cadence came %v after the click; %d deliveries from 2 s to 4 s after it", propagated.Round(time.Millisecond), after)
	if after > 5 {
		t.Errorf("the sink received %d messages from 2 s to 4 s after the rate was set to 1/s in the page (20/s before); want at most 5", after)
	}

	// Without the token: the page's button and a script get 401, and the
	// override stays 1/s.
	if err := chromedp.Do(ctx,
		chromedp.Evaluate[chromedp.Void](`document.querySelector("#token").value = ""`),
		chromedp.SetValue(css(rateSel), "50/s"),
		chromedp.Click(css(card+" button.set-rate")),
	); err != nil {
		t.Fatal(err)
	}
	cliWait(t, 10*time.Second, "the page to show the refusal", func() bool { return strings.HasPrefix(text(result), "401:") })
	script := fmt.Sprintf(`fetch("api/buckets/%s/rate", {method: "POST", body: JSON.stringify({rate: "50/s"})}).then(r => r.status)`, name)
	code, err := chromedp.Run(ctx, chromedp.Evaluate[int](script, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if code != 401 {
		t.Errorf("a rate change without the token answered %d, want 401", code)
	}
	if st := cliRun(t, bin, "bucket", "status", name, "--redis", redisAddr, "--json"); !regexp.MustCompile(`"override": \{\s*"rate": 1,`).MatchString(st) {
		t.Errorf("after the refused actions the override is not 1/s any more:\n%s", st)
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "console.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	// THROTTLE_CONSOLE_SCREENSHOT=docs/console.png (relative to the
	// repository) refreshes the README's picture.
	if dst := os.Getenv("THROTTLE_CONSOLE_SCREENSHOT"); dst != "" {
		if err := os.WriteFile(filepath.Join("..", dst), png, 0o644); err != nil {
			t.Error(err)
		}
	}
	t.Logf("screenshot: %s (%d bytes); the test took %v", shot, len(png), time.Since(start).Round(time.Millisecond))
}

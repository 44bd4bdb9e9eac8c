// Command mocksink stands in for an SMS or push provider's HTTP API. It
// accepts every request, logs what it received, and once a second logs how
// many requests arrived during that second, so the rate that all throttle
// replicas deliver together can be read from one place.
//
// It is the HTTP sink of the docker-compose stack, and works as well next to
// a throttle binary run by hand:
//
//	go run ./examples/mocksink -listen 127.0.0.1:8080
//
// With -limit N it answers 429 with "Retry-After: 1" to the requests beyond N
// in one second, as a provider does when it is sent too much; throttle then
// pauses the shared bucket for every replica (push-back). With -check URL it
// only probes URL and exits 0 when it answers 2xx, which is the container
// health check, since the distroless image has no curl.
//
// GET /healthz answers 200. Every other request counts as a delivery.
//
// With -mode twilio, vonage, vonage_sms, fcm or apns it speaks that
// provider's API instead (package providers): its auth check, its answers
// and, with -limit, its rate-limit answer. The fcm mode writes a
// service-account key (-write-key) whose token_uri points at itself; the
// apns mode serves HTTP/2 over TLS with a certificate it generates
// (-write-cert) and writes the signing key (-write-key):
//
//	go run ./examples/mocksink -mode twilio -user AC123 -password secret -limit 5
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// maxLoggedBody bounds the part of a request body that is logged.
const maxLoggedBody = 256

func main() {
	listen := flag.String("listen", ":8080", "host:port to listen on")
	limit := flag.Int("limit", 0, "answer 429 to the requests beyond this many per second; 0 accepts all")
	quiet := flag.Bool("quiet", false, "log only the per-second rate, not each request")
	check := flag.String("check", "", "probe this URL, exit 0 if it answers 2xx, and do nothing else")
	flag.Parse()

	if *check != "" {
		if err := probe(*check, 2*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "mocksink:", err)
			os.Exit(1)
		}
		return
	}
	if *limit < 0 {
		fmt.Fprintf(os.Stderr, "mocksink: -limit %d must not be negative\n", *limit)
		os.Exit(2)
	}

	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *modeFlag != "" {
		if err := runProvider(ctx, *listen, *limit, log); err != nil {
			log.Error("mocksink stopped", "error", err)
			os.Exit(1)
		}
		return
	}
	if err := serve(ctx, *listen, newSink(log, *limit, !*quiet, time.Now), log); err != nil {
		log.Error("mocksink stopped", "error", err)
		os.Exit(1)
	}
}

// serve runs the sink on addr until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, addr string, s *sink, log *slog.Logger) error {
	srv := &http.Server{Addr: addr, Handler: s, ReadHeaderTimeout: 5 * time.Second}
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	go s.reportRate(ctx, ticker.C)
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("mocksink listening", "addr", addr, "limit_per_second", s.limit)
	select {
	case err := <-errc:
		return fmt.Errorf("listening on %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// probe sends GET url and fails unless the answer is 2xx.
func probe(url string, timeout time.Duration) error {
	client, err := probeClient(timeout)
	if err != nil {
		return err
	}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// sink is the HTTP handler that counts and logs deliveries. It is safe for
// concurrent use.
type sink struct {
	log     *slog.Logger
	limit   int  // accepted requests per wall-clock second; 0 means no limit
	logEach bool // log every accepted request
	now     func() time.Time

	mu       sync.Mutex
	second   int64 // the Unix second that accepted counts
	accepted int   // requests accepted during second
	received int64 // requests accepted since the last rate report
	rejected int64 // requests answered 429 since the last rate report
	total    int64 // requests accepted since the start
}

func newSink(log *slog.Logger, limit int, logEach bool, now func() time.Time) *sink {
	return &sink{log: log, limit: limit, logEach: logEach, now: now}
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !s.admit() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
		return
	}
	if s.logEach {
		snippet := body
		if len(snippet) > maxLoggedBody {
			snippet = snippet[:maxLoggedBody]
		}
		s.log.Info("received", "method", r.Method, "path", r.URL.Path, "bytes", len(body), "body", string(snippet))
	}
	w.WriteHeader(http.StatusAccepted)
}

// admit counts a request and reports whether it is within the limit.
func (s *sink) admit() bool {
	sec := s.now().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	if sec != s.second {
		s.second, s.accepted = sec, 0
	}
	if s.limit > 0 && s.accepted >= s.limit {
		s.rejected++
		return false
	}
	s.accepted++
	s.received++
	s.total++
	return true
}

// reportRate logs, at every tick, the requests accepted and rejected since
// the previous tick, until ctx ends. Idle seconds after an idle second are
// not logged.
func (s *sink) reportRate(ctx context.Context, tick <-chan time.Time) {
	idle := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		s.mu.Lock()
		received, rejected, total := s.received, s.rejected, s.total
		s.received, s.rejected = 0, 0
		s.mu.Unlock()
		if received == 0 && rejected == 0 && idle {
			continue
		}
		idle = received == 0 && rejected == 0
		s.log.Info("rate", "received_per_second", received, "rejected_per_second", rejected, "total", total)
	}
}

var _ http.Handler = (*sink)(nil)

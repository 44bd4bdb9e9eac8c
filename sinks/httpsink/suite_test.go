package httpsink_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
	"github.com/throttlehq/throttle/sinks/internal/sinktest"
)

// TestSinkContract runs the suite every sink passes. The HTTP sink sends
// the body only: key and headers stay behind.
func TestSinkContract(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) (sinks.Sink, func() []sinktest.Received) {
			var (
				mu  sync.Mutex
				got []sinktest.Received
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = append(got, sinktest.Received{Body: body})
				mu.Unlock()
			}))
			t.Cleanup(srv.Close)
			return newSink(t, httpsink.Config{URL: srv.URL}), func() []sinktest.Received {
				mu.Lock()
				defer mu.Unlock()
				return append([]sinktest.Received(nil), got...)
			}
		},
		Fail: func(t *testing.T, kind sinktest.Kind) (sinks.Sink, consumer.Message) {
			code := http.StatusBadRequest
			if kind == sinktest.Retryable {
				code = http.StatusServiceUnavailable
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(code)
			}))
			t.Cleanup(srv.Close)
			return newSink(t, httpsink.Config{URL: srv.URL}), jsonMsg(`{"a":1}`)
		},
		Block: func(t *testing.T) sinks.Sink {
			srv := httptest.NewServer(http.HandlerFunc(hang))
			t.Cleanup(srv.Close)
			return newSink(t, httpsink.Config{URL: srv.URL})
		},
	})
}

package httpsink_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// BenchmarkSend is one request per message to a local server that reads
// the body and answers 200 with no body, as the end-to-end benchmark's
// sink does: "sink" through a Sink with the default configuration,
// "bare" with the plain POST of integration/bench's bare loops (a
// keep-alive client, a timeout, one header). Their difference is the
// sink's own cost per message. "readme" is the sink of README.md's
// configuration.
func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	body := []byte(`{"to":"+15550000001","text":"message 1"}`)
	msg := consumer.Message{Body: body}
	run := func(b *testing.B, send func(context.Context) bool) {
		b.ReportAllocs()
		b.SetParallelism(8) // 16 senders on 2 cores, as the Kafka scenario has
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if !send(ctx) {
					b.Error("not delivered")
					return
				}
			}
		})
	}
	b.Run("sink", func(b *testing.B) {
		s, err := httpsink.New(httpsink.Config{URL: srv.URL + "/throttle"})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run(b, func(ctx context.Context) bool { return s.Send(ctx, msg) == nil })
	})
	b.Run("readme", func(b *testing.B) {
		// README.md's "Run the binary" sink: a header, a form body from
		// a template.
		s, err := httpsink.New(httpsink.Config{
			URL:          srv.URL + "/throttle",
			Headers:      map[string]string{"Authorization": "Bearer token"},
			ContentType:  "application/x-www-form-urlencoded",
			BodyTemplate: `{{form "To" .JSON.to "Body" .JSON.text}}`,
		})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run(b, func(ctx context.Context) bool { return s.Send(ctx, msg) == nil })
	})
	b.Run("bare", func(b *testing.B) {
		c := &http.Client{Transport: &http.Transport{
			MaxIdleConns:        64,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}, Timeout: 5 * time.Second}
		defer c.CloseIdleConnections()
		url := srv.URL + "/bare"
		run(b, func(ctx context.Context) bool {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				return false
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				return false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode >= 200 && resp.StatusCode < 300
		})
	})
}

package redisconn

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

func TestSlogPrinter(t *testing.T) {
	cases := []struct {
		name  string
		level slog.Level
		want  string
	}{
		{"debug enabled", slog.LevelDebug, `level=DEBUG msg="redis: dial tcp 127.0.0.1:1: refused" component=go-redis`},
		{"debug disabled", slog.LevelInfo, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}})
			slogPrinter{slog.New(h)}.Printf(context.Background(), "redis: dial tcp %s: %s", "127.0.0.1:1", "refused")
			if got := strings.TrimSpace(buf.String()); got != tc.want {
				t.Errorf("logged %q, want %q", got, tc.want)
			}
		})
	}
	slogPrinter{}.Printf(context.Background(), "nil logger: %d", 1) // must not panic
}

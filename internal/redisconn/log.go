package redisconn

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// SetLogger sends go-redis's own log lines (failed dials, discarded
// connections, Sentinel master switches) to l at debug level, instead of
// the standard library's log on stderr. They repeat what the limiter
// reports once per transition, so they are only worth seeing when
// debugging. A nil l silences them.
//
// go-redis has one logger per process: SetLogger affects every client, and
// the last call wins. It is safe to call concurrently with running clients.
func SetLogger(l *slog.Logger) {
	redis.SetLogger(slogPrinter{l})
}

// slogPrinter adapts a *slog.Logger to go-redis's logging interface.
type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Printf(ctx context.Context, format string, v ...any) {
	if p.l == nil || !p.l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	p.l.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

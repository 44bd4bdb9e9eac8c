package limiter_test

import (
	"io"
	"log/slog"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a Bucket
// starts the most of them (probe, heartbeat, watch, lease expiry), and Close
// must stop them all.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Package connstate tracks a consumer backend's broker session, so that
// every backend says the same thing about its connection: what Connected
// returns, which consumer.MessageObserver connection events it reports and
// when, and which log lines it writes, with the same messages and keys.
//
// A backend calls, from its Run loop:
//
//   - Attempted with the result of every attempt to connect (nil when a
//     session began);
//   - Retry after a failed attempt that it retries;
//   - Up when a session began (again a no-op while it is up);
//   - Lost when a live session ended other than by Run returning;
//   - Stopped when Run returns.
//
// The log lines, at the level given, with the keys of the logger the
// backend passes plus:
//
//	info  "connected"                      the backend's details
//	warn  "connect failed; retrying"       attempt, retry_in, err (error level when refused)
//	warn  "connection lost; reconnecting"  retry_in, err
//	info  "reconnected"                    attempts, cause
package connstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// State is a backend's broker session: whether it is up, why not, and the
// failures since the last one began. It is safe for concurrent use;
// Connected is called from any goroutine, the other methods from Run's.
type State struct {
	broker string
	obs    *consumer.MessageObserver
	log    *slog.Logger

	mu       sync.Mutex
	up       bool
	why      error // why not up
	everUp   bool  // a session began once
	failures int   // failed attempts and lost sessions since the last session began
	lastErr  error // why the last session or attempt ended
}

// New returns the State of a backend named broker ("kafka", "rabbitmq",
// the name the observer's connection events carry), which reports to obs
// (may be nil) and logs to log. It is not connected: Run has not
// connected yet.
func New(broker string, obs *consumer.MessageObserver, log *slog.Logger) *State {
	return &State{broker: broker, obs: obs, log: log, why: errors.New("Run has not connected yet")}
}

// Connected returns nil while a session is up, and otherwise an error
// wrapping consumer.ErrNotConnected with the reason: Run has not connected
// yet, the last connection error, or Run returned.
func (s *State) Connected() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.up {
		return nil
	}
	return fmt.Errorf("%s: %w: %w", s.broker, consumer.ErrNotConnected, s.why)
}

// EverUp reports whether a session began once, since when a failure is
// retried rather than fatal.
func (s *State) EverUp() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.everUp
}

// Failures returns the failed attempts and lost sessions since the last
// session began: the count a backoff grows with.
func (s *State) Failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures
}

// Attempted records the result of an attempt to connect, err nil when a
// session began (call Up next). An attempt that follows a failure is
// reported to MessageObserver.ReconnectAttempt; a failed one makes
// Connected return err.
func (s *State) Attempted(err error) {
	s.mu.Lock()
	after := s.failures > 0
	if err != nil {
		s.up, s.why, s.lastErr = false, err, err
	}
	s.mu.Unlock()
	if after && s.obs != nil && s.obs.ReconnectAttempt != nil {
		s.obs.ReconnectAttempt(s.broker, err)
	}
}

// Retry records that the failed attempt err is retried in retryIn (0:
// the backend's client retries by itself) and logs "connect failed;
// retrying", at error level when refused (the broker refused the
// credentials or permissions: consumer.ErrAccessRefused), which needs an
// operator.
func (s *State) Retry(ctx context.Context, err error, retryIn time.Duration, refused bool) {
	s.mu.Lock()
	s.failures++
	n := s.failures
	s.mu.Unlock()
	level := slog.LevelWarn
	if refused {
		level = slog.LevelError
	}
	s.log.LogAttrs(ctx, level, "connect failed; retrying", slog.Int("attempt", n),
		slog.String("retry_in", retryIn.String()), slog.String("err", err.Error()))
}

// Up records that a session began and logs "connected" with attrs the
// first time, else, after a lost session, "reconnected" with the attempts
// it took and the cause, and reports MessageObserver.Reconnected. While a
// session is up it does nothing.
func (s *State) Up(attrs ...slog.Attr) {
	s.mu.Lock()
	if s.up {
		s.mu.Unlock()
		return
	}
	again, attempts, cause := s.everUp, s.failures, s.lastErr
	s.up, s.why, s.everUp, s.failures = true, nil, true, 0
	s.mu.Unlock()
	if !again {
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "connected", attrs...)
		return
	}
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "reconnected",
		slog.Int("attempts", attempts), slog.String("cause", errString(cause)))
	if s.obs != nil && s.obs.Reconnected != nil {
		s.obs.Reconnected(s.broker, cause)
	}
}

// Lost records that the live session ended because of err, to be
// reconnected in retryIn (0: by the backend's client), reports
// MessageObserver.Disconnected and logs "connection lost; reconnecting".
func (s *State) Lost(err error, retryIn time.Duration) {
	s.mu.Lock()
	s.up, s.why, s.lastErr = false, err, err
	s.failures++
	s.mu.Unlock()
	if s.obs != nil && s.obs.Disconnected != nil {
		s.obs.Disconnected(s.broker, err)
	}
	s.log.LogAttrs(context.Background(), slog.LevelWarn, "connection lost; reconnecting",
		slog.String("retry_in", retryIn.String()), slog.String("err", err.Error()))
}

// Stopped records that Run returned: Connected says so from then on.
func (s *State) Stopped() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.up, s.why = false, errors.New("Run returned")
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/console"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestConsoleInputErrorsAreTheCLIs: a bucket name, rate or pause out of
// range sent to the console gets the message 'bucket set', 'bucket
// status' and 'bucket pause' print for it, from the same parsing code,
// the flag's name without its dashes; the backend refuses it before any
// Redis call (it has no client here).
func TestConsoleInputErrorsAreTheCLIs(t *testing.T) {
	b := newConsoleBackend(nil, &config.Config{Limit: config.Limit{Bucket: "sms"}}, "test.yaml", []string{"sms"})
	for _, c := range []struct {
		action console.Action
		cli    []string
	}{
		{console.Action{Bucket: "sms", Op: "set", Rate: "0/s"}, []string{"bucket", "set", "sms", "--redis", "127.0.0.1:1", "--rate", "0/s"}},
		{console.Action{Bucket: "sms", Op: "set", Rate: "2e9"}, []string{"bucket", "set", "sms", "--redis", "127.0.0.1:1", "--rate", "2e9"}},
		{console.Action{Bucket: "sms", Op: "set", Rate: "5/fortnight"}, []string{"bucket", "set", "sms", "--redis", "127.0.0.1:1", "--rate", "5/fortnight"}},
		{console.Action{Bucket: "sms", Op: "pause", For: "0s"}, []string{"bucket", "pause", "sms", "--redis", "127.0.0.1:1", "--for", "0s"}},
		{console.Action{Bucket: "sms", Op: "pause", For: "48h"}, []string{"bucket", "pause", "sms", "--redis", "127.0.0.1:1", "--for", "48h"}},
		{console.Action{Bucket: "sms", Op: "pause", For: "soon"}, []string{"bucket", "pause", "sms", "--redis", "127.0.0.1:1", "--for", "soon"}},
		{console.Action{Bucket: "a b", Op: "fill"}, []string{"bucket", "fill", "a b", "--redis", "127.0.0.1:1"}},
		{console.Action{Bucket: "{x}", Op: "resume"}, []string{"bucket", "resume", "{x}", "--redis", "127.0.0.1:1"}},
	} {
		_, err := b.Do(context.Background(), c.action)
		var ie *console.InputError
		if !errors.As(err, &ie) || ie.NotFound {
			t.Errorf("%+v: %v; want an InputError", c.action, err)
			continue
		}
		code, _, stderr := runCLI(t, c.cli...)
		cliMsg := strings.TrimPrefix(strings.SplitN(stderr, ".\n", 2)[0], "throttle: ")
		if code != ExitUsage || strings.ReplaceAll(cliMsg, "--", "") != ie.Msg {
			t.Errorf("%+v: the console says %q, throttle %s says %q (exit %d)", c.action, ie.Msg, strings.Join(c.cli[:2], " "), cliMsg, code)
		}
	}
	_, err := b.Do(context.Background(), console.Action{Bucket: "other", Op: "fill"})
	if ie := (*console.InputError)(nil); !errors.As(err, &ie) || !ie.NotFound {
		t.Errorf("a bucket the console does not show: %v; want a NotFound InputError", err)
	}
}

// TestBucketPauseResume: 'bucket pause' stops the bucket and status says
// an operator did; 'bucket resume' ends it; without known limits pause
// fails and says why.
func TestBucketPauseResume(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	name := testenv.Name(t, "pause")
	path := writeConfig(t, fmt.Sprintf(`redis: {addr: %q}
limit: {bucket: %s, rate: 10, burst: 5}
source:
  rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: unused}
sink: {stdout: {}}
`, redisAddr, name))
	t.Cleanup(func() { runCLI(t, "bucket", "reset", name, "--config", path) })
	if code, out, stderr := runCLI(t, "bucket", "pause", "--config", path, "--for", "1m"); code != ExitOK || !strings.Contains(out, "Paused bucket "+name+" for 1m0s") {
		t.Fatalf("bucket pause: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ := runCLI(t, "bucket", "status", "--config", path, "--json")
	var st struct {
		PausedSeconds float64 `json:"paused_seconds"`
		PausedBy      string  `json:"paused_by"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != ExitOK || err != nil || st.PausedSeconds < 59 || st.PausedBy != "operator" {
		t.Fatalf("status after pause: exit %d, %+v, %v\n%s", code, st, err, out)
	}
	if _, out, _ := runCLI(t, "bucket", "status", "--config", path); !strings.Contains(out, "an operator paused it") {
		t.Errorf("status does not say an operator paused it:\n%s", out)
	}
	if code, out, _ := runCLI(t, "bucket", "resume", "--config", path); code != ExitOK || !strings.Contains(out, "Resumed bucket") {
		t.Fatalf("bucket resume: exit %d\n%s", code, out)
	}
	if _, out, _ := runCLI(t, "bucket", "status", "--config", path); !strings.Contains(out, "paused      no") {
		t.Errorf("status after resume:\n%s", out)
	}
	if code, out, _ := runCLI(t, "bucket", "resume", "--config", path); code != ExitOK || !strings.Contains(out, "was not paused") {
		t.Errorf("a second resume: exit %d\n%s", code, out)
	}
	if code, _, stderr := runCLI(t, "bucket", "pause", name, "--redis", redisAddr, "--for", "1s"); code != ExitFailure || !strings.Contains(stderr, "rate and burst are unknown") {
		t.Errorf("pause without known limits: exit %d\n%s", code, stderr)
	}
}

package stdout_test

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/internal/sinktest"
	"github.com/throttlehq/throttle/sinks/stdout"
)

// TestSinkContract runs the suite every sink passes. stdout keeps key,
// body and headers; it has no permanent failure, and a write cannot be
// interrupted, so those cases are skipped.
func TestSinkContract(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		KeepsKey:     true,
		KeepsHeaders: true,
		New: func(t *testing.T) (sinks.Sink, func() []sinktest.Received) {
			var buf testenv.Buffer
			return stdout.New(&buf), func() []sinktest.Received {
				var got []sinktest.Received
				sc := bufio.NewScanner(strings.NewReader(buf.String()))
				for sc.Scan() {
					l := sc.Text()
					var line struct {
						Key     string            `json:"key"`
						Body    json.RawMessage   `json:"body"`
						Headers map[string]string `json:"headers"`
					}
					if err := json.Unmarshal([]byte(l), &line); err != nil {
						t.Fatalf("line %q: %v", l, err)
					}
					body := []byte(line.Body)
					var s string
					if json.Unmarshal(line.Body, &s) == nil {
						body = []byte(s) // a body that is not JSON is written as a string
					}
					got = append(got, sinktest.Received{Key: []byte(line.Key), Body: body, Headers: line.Headers})
				}
				return got
			}
		},
		Fail: func(t *testing.T, kind sinktest.Kind) (sinks.Sink, consumer.Message) {
			if kind == sinktest.Permanent {
				return nil, consumer.Message{}
			}
			return stdout.New(failingWriter{}), consumer.Message{Body: []byte("x")}
		},
	})
}

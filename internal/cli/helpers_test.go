package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// runCLI runs the command line and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut testenv.Buffer
	code = Run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// writeConfig writes a config file into a temporary directory.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "throttle.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeLayersConfig writes a config file of a unique bucket (named after
// prefix) on the test Redis, 100/s with a burst of 100, whose limit.extra
// holds the layers of extra (YAML list items, indented four spaces), and
// returns its path and the bucket's name.
func writeLayersConfig(t *testing.T, prefix, extra string) (path, name string) {
	t.Helper()
	name = testenv.Name(t, prefix)
	path = writeConfig(t, fmt.Sprintf(`redis:
  addr: %s
limit:
  bucket: %s
  rate: 100
  burst: 100
  extra:
%s
source:
  rabbitmq:
    url: amqp://guest:guest@127.0.0.1:5672/
    queue: unused
sink:
  stdout: {}
`, testenv.RedisAddr(t), name, strings.TrimRight(extra, "\n")))
	return path, name
}

// openLayers loads the config file at path and returns a Redis client for
// it, closed when the test ends, and the extra layers of its limit.
func openLayers(t *testing.T, path string) (redis.UniversalClient, *redislimiter.Layered) {
	t.Helper()
	cfg, err := loadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	client, err := redisconn.New(cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ls, err := layersOf(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client, ls
}

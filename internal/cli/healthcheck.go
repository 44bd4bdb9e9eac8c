package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/throttlehq/throttle/config"
)

const healthcheckHelp = `Usage: throttle healthcheck [--url URL] [--timeout D]

Asks a running replica's health endpoint and exits 0 when it answers 2xx,
1 otherwise. It is meant for container health checks in images that have no
curl: HEALTHCHECK CMD ["/throttle", "healthcheck"].

Flags:
  --url URL       the endpoint (default http://127.0.0.1:9464/healthz; use
                  /readyz to also require a running consumer)
  --timeout D     how long to wait for the answer (default 2s)
`

func cmdHealthcheck(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("healthcheck")
	target := fs.String("url", "http://127.0.0.1:9464/healthz", "")
	timeout := fs.Duration("timeout", 2*time.Second, "")
	pos, err := parseArgs(fs, args, healthcheckHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("healthcheck", "unexpected argument %q", pos[0])
	case *timeout <= 0:
		return usagef("healthcheck", "--timeout must be > 0, got %v", *timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	shown := config.RedactURL(*target)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
	if err != nil {
		return usagef("healthcheck", "--url %s is not a valid URL", shown)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck %s: no answer: %w", shown, unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("healthcheck %s: %s: %s", shown, resp.Status, trimBody(body))
	}
	fmt.Fprintf(stdout, "%s: %s\n", shown, trimBody(body))
	return nil
}

// unwrapURLError drops the *target.Error wrapper, whose text repeats the URL
// unredacted.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func trimBody(b []byte) string { return strings.TrimSpace(string(b)) }

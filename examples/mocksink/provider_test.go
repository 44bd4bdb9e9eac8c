package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// startProvider runs runProvider with the given mode flags on a free port
// and returns its address, read from the log line.
func startProvider(t *testing.T, set func()) string {
	t.Helper()
	set()
	logs := &testenv.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runProvider(ctx, "127.0.0.1:0", 0, slog.New(slog.NewTextHandler(logs, nil))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runProvider: %v", err)
		}
	})
	re := regexp.MustCompile(`addr=(\S+)`)
	var m []string
	if !testenv.Within(5*time.Second, func() bool {
		m = re.FindStringSubmatch(logs.String())
		return m != nil
	}) {
		t.Fatalf("no listening line in:\n%s", logs.String())
	}
	return m[1]
}

// TestProviderModeAPNs: the apns mode serves HTTP/2 over TLS with the
// certificate it writes, and its health check trusts that certificate.
func TestProviderModeAPNs(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "apns.p8")
	addr := startProvider(t, func() {
		*modeFlag, *writeKeyFlag, *writeCAFlag, *tlsHostsFlag = "apns", key, cert, "127.0.0.1"
	})
	t.Cleanup(func() { *modeFlag, *writeKeyFlag, *writeCAFlag, *checkCAFlag = "", "", "", "" })
	pemCert, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(key); err != nil {
		t.Fatalf("signing key not written: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCert) {
		t.Fatal("the written certificate does not parse")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := client.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Errorf("GET /healthz: %d over HTTP/%d, want 200 over HTTP/2", resp.StatusCode, resp.ProtoMajor)
	}
	*checkCAFlag = cert
	if err := probe("https://"+addr+"/healthz", 2*time.Second); err != nil {
		t.Errorf("-check with -check-ca: %v", err)
	}
}

// TestProviderModeFCM: the fcm mode writes a service-account key whose
// token_uri is the mock itself.
func TestProviderModeFCM(t *testing.T) {
	key := filepath.Join(t.TempDir(), "sa.json")
	addr := startProvider(t, func() { *modeFlag, *writeKeyFlag, *publicFlag = "fcm", key, "" })
	t.Cleanup(func() { *modeFlag, *writeKeyFlag = "", "" })
	b, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	var sa struct {
		Type     string `json:"type"`
		TokenURI string `json:"token_uri"`
	}
	if err := json.Unmarshal(b, &sa); err != nil {
		t.Fatal(err)
	}
	if sa.Type != "service_account" || sa.TokenURI != "http://"+addr+"/token" {
		t.Errorf("key: type %q token_uri %q, want service_account and http://%s/token", sa.Type, sa.TokenURI, addr)
	}
}

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/throttlehq/throttle/examples/mocksink/providers"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// Flags of the provider modes (-mode twilio | vonage | vonage_sms | fcm |
// apns). Without -mode, mocksink is the generic sink.
var (
	modeFlag     = flag.String("mode", "", "speak a provider's API: "+strings.Join(providers.Modes, ", ")+"; empty is the generic sink")
	userFlag     = flag.String("user", "", "twilio account SID or vonage API key the mock expects")
	passFlag     = flag.String("password", "", "twilio auth token or vonage API secret the mock expects")
	keyIDFlag    = flag.String("key-id", "MOCKKEY123", "apns: the key id the mock expects")
	teamIDFlag   = flag.String("team-id", "MOCKTEAM12", "apns: the team id the mock expects")
	projectFlag  = flag.String("project", "mock-project", "fcm: the project id")
	writeKeyFlag = flag.String("write-key", "", "fcm: write the service-account JSON here; apns: write the .p8 signing key here")
	writeCAFlag  = flag.String("write-cert", "", "apns: write the generated TLS certificate (PEM) here, for the client's SSL_CERT_FILE")
	tlsHostsFlag = flag.String("tls-hosts", "localhost,127.0.0.1", "apns: comma-separated names and IPs of the generated TLS certificate")
	publicFlag   = flag.String("public-url", "", "fcm: the mock's URL as clients reach it, for token_uri; default http://127.0.0.1:<port>")
	checkCAFlag  = flag.String("check-ca", "", "with -check: trust this PEM certificate (the apns mode's -write-cert)")
)

// probeClient is the -check client; with -check-ca it trusts that
// certificate.
func probeClient(timeout time.Duration) (*http.Client, error) {
	client := &http.Client{Timeout: timeout}
	if *checkCAFlag == "" {
		return client, nil
	}
	pem, err := os.ReadFile(*checkCAFlag)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", *checkCAFlag)
	}
	client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return client, nil
}

// runProvider serves the provider mode until ctx ends.
func runProvider(ctx context.Context, addr string, limit int, log *slog.Logger) error {
	p, err := providers.New(providers.Config{
		Mode: *modeFlag, Limit: limit, Username: *userFlag, Password: *passFlag,
		KeyID: *keyIDFlag, TeamID: *teamIDFlag, ProjectID: *projectFlag,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	switch *modeFlag {
	case httpsink.PresetFCM:
		public := *publicFlag
		if public == "" {
			_, port, _ := net.SplitHostPort(ln.Addr().String())
			public = "http://127.0.0.1:" + port
		}
		if err := writeFile(*writeKeyFlag, p.ServiceAccountJSON(strings.TrimRight(public, "/")+"/token")); err != nil {
			return err
		}
	case httpsink.PresetAPNs:
		if err := writeFile(*writeKeyFlag, p.SigningKeyPEM()); err != nil {
			return err
		}
		cert, certPEM, err := selfSigned(strings.Split(*tlsHostsFlag, ","))
		if err != nil {
			return err
		}
		if err := writeFile(*writeCAFlag, certPEM); err != nil {
			return err
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("mock provider listening", "mode", *modeFlag, "addr", ln.Addr().String(), "limit_per_second", limit)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}

func writeFile(path string, data []byte) error {
	if path == "" {
		return nil
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// selfSigned makes a P-256 certificate for hosts, valid for a day, that is
// its own CA, so a client can trust it through SSL_CERT_FILE.
func selfSigned(hosts []string) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "mocksink apns"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if len(tmpl.IPAddresses)+len(tmpl.DNSNames) == 0 {
		return tls.Certificate{}, nil, errors.New("-tls-hosts names no host")
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, certPEM, nil
}

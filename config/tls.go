package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLS configures a TLS client (YAML keys "redis.tls", "source.kafka.tls"
// and "source.rabbitmq.tls"). It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type TLS struct {
	// Enabled turns TLS on; the other fields must stay empty unless it is
	// true.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of CA certificates used instead of the system
	// pool to verify the server.
	CAFile string `yaml:"ca_file"`
	// CertFile is the PEM client certificate; it requires KeyFile.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM client private key; it requires CertFile.
	KeyFile string `yaml:"key_file"`
	// ServerName overrides the host name used to verify the server.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables server certificate verification. Use it
	// only for tests.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// ClientConfig builds a *tls.Config requiring TLS 1.2 or later, loading the
// CA and client certificate files. It returns nil and no error when TLS is
// not enabled. Errors name the file that could not be used.
func (t TLS) ClientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // Explicitly requested by the configuration.
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: read ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: ca_file %s: no PEM certificate found", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		if t.CertFile == "" || t.KeyFile == "" {
			return nil, errors.New("tls: cert_file and key_file must be set together")
		}
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load client certificate from cert_file %s and key_file %s: %w", t.CertFile, t.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

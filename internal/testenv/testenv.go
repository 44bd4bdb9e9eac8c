// Package testenv finds the services that integration tests need and
// decides what a test does when one is missing.
//
// The one switch is the CI environment variable: when CI is "true" or "1",
// a test that cannot reach a service fails; otherwise it is skipped with a
// message that names the missing service and the variable that points to it.
// Every integration test in this repository goes through this package.
package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// InCI reports whether the CI switch is on: CI=true or CI=1.
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1"
}

// Missing skips t, or fails it under CI, because a service is unreachable.
func Missing(t testing.TB, service, hint string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not reachable (%v); %s", service, err, hint)
	if InCI() {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skipf("skipping: %s", msg)
}

func getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// RedisAddr returns the address of the test Redis, from REDIS_ADDR or
// 127.0.0.1:6379, after checking that it accepts connections.
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr := getenv("REDIS_ADDR", "127.0.0.1:6379")
	if err := dial(addr); err != nil {
		Missing(t, "Redis at "+addr, "start redis-server or set REDIS_ADDR", err)
	}
	return addr
}

// AMQPURL returns the URL of the test RabbitMQ, from AMQP_URL or
// amqp://guest:guest@127.0.0.1:5672/, after checking that it accepts
// connections.
func AMQPURL(t testing.TB) string {
	t.Helper()
	raw := getenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("AMQP_URL: %v", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5672")
	}
	if err := dial(host); err != nil {
		Missing(t, "RabbitMQ at "+host, "start rabbitmq-server or set AMQP_URL", err)
	}
	return raw
}

// PostgresDSN returns a DSN for the test PostgreSQL, from DATABASE_URL or
// the standard PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE variables
// (defaults 127.0.0.1, 5432, postgres, none, test), after checking that it
// accepts connections.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
		return dsn
	}
	host := getenv("PGHOST", "127.0.0.1")
	port := getenv("PGPORT", "5432")
	u := &url.URL{Scheme: "postgres", Host: net.JoinHostPort(host, port), Path: "/" + getenv("PGDATABASE", "test")}
	if pw, ok := os.LookupEnv("PGPASSWORD"); ok {
		u.User = url.UserPassword(getenv("PGUSER", "postgres"), pw)
	} else {
		u.User = url.User(getenv("PGUSER", "postgres"))
	}
	q := url.Values{"sslmode": {getenv("PGSSLMODE", "disable")}}
	u.RawQuery = q.Encode()
	if err := dial(net.JoinHostPort(host, port)); err != nil {
		Missing(t, "PostgreSQL at "+net.JoinHostPort(host, port), "start PostgreSQL or set PGHOST/PGPORT or DATABASE_URL", err)
	}
	return u.String()
}

// KafkaBrokers returns the brokers named by KAFKA_BROKERS (comma-separated),
// or nil when it is unset, in which case tests use the in-process kfake
// broker.
func KafkaBrokers() []string {
	v := os.Getenv("KAFKA_BROKERS")
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// Context returns a context that ends when the test ends or after d.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

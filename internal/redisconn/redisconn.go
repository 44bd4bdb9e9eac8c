// Package redisconn builds the Redis client that holds the global token
// bucket from a config.Redis: a single node, a Sentinel-managed master, or a
// Redis Cluster, with ACL credentials and TLS.
//
// The client is tuned for a rate limiter that must notice a dead Redis
// quickly rather than for a cache that should ride out blips: every dial,
// read, write and wait for a pooled connection is bounded by one
// config.Redis.Timeout, a failed command is not retried, and a failed dial
// is not retried either. A store call therefore fails within about one
// timeout, and the limiter's store-failure policy (limiter.Options
// OnStoreError) takes over; the limiter's background probe, not the client,
// finds out when Redis is back.
package redisconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/throttlehq/throttle/config"
)

// DefaultTimeout is used when config.Redis.Timeout is zero. It matches the
// default of the configuration file.
const DefaultTimeout = 250 * time.Millisecond

// New returns a client for cfg, chosen by cfg.Mode():
//
//   - config.RedisSingle: a *redis.Client for cfg.Addr;
//   - config.RedisSentinel: a *redis.Client from redis.NewFailoverClient that
//     asks the Sentinels in cfg.Addrs for the master cfg.MasterName,
//     authenticating to them with SentinelUsername and SentinelPassword, and
//     follows failovers;
//   - config.RedisCluster: a *redis.ClusterClient seeded with cfg.Addrs.
//
// Username and Password authenticate to Redis itself (ACL, or the legacy
// requirepass with an empty Username). TLS is on when cfg.TLS.Enabled.
//
// New makes no network call: a Redis that is down at start-up makes the
// first store call fail, not New. It returns an error for a configuration
// it cannot use; the error names the field at fault and never contains a
// password. The returned client is safe for concurrent use; close it when
// done.
func New(cfg config.Redis) (redis.UniversalClient, error) {
	timeout := time.Duration(cfg.Timeout)
	switch {
	case timeout < 0:
		return nil, fmt.Errorf("redis.timeout: must be > 0, got %v", timeout)
	case timeout == 0:
		timeout = DefaultTimeout
	}
	tlsConf, err := cfg.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redis.tls: %w", err)
	}
	switch cfg.Mode() {
	case config.RedisSentinel:
		o, err := failoverOptions(cfg, timeout, tlsConf)
		if err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(o), nil
	case config.RedisCluster:
		o, err := clusterOptions(cfg, timeout, tlsConf)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(o), nil
	default:
		o, err := singleOptions(cfg, timeout, tlsConf)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(o), nil
	}
}

// go-redis reads 0 as "use the default" (3 command retries, 5 dial
// attempts), so "none" is spelled with these.
const (
	noRetries = -1
	dialOnce  = 1
)

// defaultAddr is used in single mode when cfg.Addr is empty, as in the
// configuration file.
const defaultAddr = "127.0.0.1:6379"

func singleOptions(cfg config.Redis, timeout time.Duration, tlsConf *tls.Config) (*redis.Options, error) {
	if len(cfg.Addrs) > 0 {
		return nil, errors.New("redis: set either addr or addrs, not both")
	}
	addr := cfg.Addr
	if addr == "" {
		addr = defaultAddr
	}
	if err := checkAddr("redis.addr", addr); err != nil {
		return nil, err
	}
	if cfg.DB < 0 {
		return nil, fmt.Errorf("redis.db: must be >= 0, got %d", cfg.DB)
	}
	return universal(cfg, []string{addr}, timeout, tlsConf).Simple(), nil
}

func failoverOptions(cfg config.Redis, timeout time.Duration, tlsConf *tls.Config) (*redis.FailoverOptions, error) {
	if cfg.Addr != "" {
		return nil, errors.New("redis: set either addr or addrs, not both")
	}
	if err := checkAddrs(cfg.Addrs); err != nil {
		return nil, err
	}
	if cfg.DB < 0 {
		return nil, fmt.Errorf("redis.db: must be >= 0, got %d", cfg.DB)
	}
	return universal(cfg, cfg.Addrs, timeout, tlsConf).Failover(), nil
}

func clusterOptions(cfg config.Redis, timeout time.Duration, tlsConf *tls.Config) (*redis.ClusterOptions, error) {
	if cfg.Addr != "" {
		return nil, errors.New("redis: set either addr or addrs, not both")
	}
	if err := checkAddrs(cfg.Addrs); err != nil {
		return nil, err
	}
	if cfg.DB != 0 {
		return nil, fmt.Errorf("redis.db: must be 0 with a cluster, got %d", cfg.DB)
	}
	return universal(cfg, cfg.Addrs, timeout, tlsConf).Cluster(), nil
}

// universal holds the settings every topology shares: one timeout for
// dials, reads, writes and pool waits, no command retries and one dial
// attempt, so that a dead Redis is noticed within about one timeout. The
// client speaks RESP2 without maintenance notifications: the store reads
// nothing RESP3 adds (its scripts answer in RESP2 types either way), and
// RESP3 makes go-redis check for push notifications before every command,
// a cost paid on every message (3.6% of a Kafka consumer's CPU samples
// with dedupe).
func universal(cfg config.Redis, addrs []string, timeout time.Duration, tlsConf *tls.Config) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                    append([]string(nil), addrs...),
		MasterName:               cfg.MasterName,
		SentinelUsername:         cfg.SentinelUsername,
		SentinelPassword:         cfg.SentinelPassword,
		Username:                 cfg.Username,
		Password:                 cfg.Password,
		DB:                       cfg.DB,
		TLSConfig:                tlsConf,
		MaxRetries:               noRetries,
		DialerRetries:            dialOnce,
		DialTimeout:              timeout,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		PoolTimeout:              timeout,
		ContextTimeoutEnabled:    true,
		Protocol:                 2,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

func checkAddrs(addrs []string) error {
	if len(addrs) == 0 {
		return errors.New("redis.addrs: required")
	}
	for i, a := range addrs {
		if err := checkAddr(fmt.Sprintf("redis.addrs[%d]", i), a); err != nil {
			return err
		}
	}
	return nil
}

// checkAddr rejects an address that is not host:port. A URL or user:pass@
// given by mistake carries a password, so such a value is never echoed.
func checkAddr(field, addr string) error {
	if addr == "" {
		return errors.New(field + ": must not be empty")
	}
	if strings.Contains(addr, "://") || strings.Contains(addr, "@") {
		return errors.New(field + ": must be host:port, not a URL or user@host (set redis.username and redis.password instead)")
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%s: must be host:port, got %q", field, addr)
	}
	return nil
}

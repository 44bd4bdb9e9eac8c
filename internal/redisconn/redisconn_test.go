package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/testenv"
)

const secret = "hunter2-do-not-log"

// common is what every mode must set, whatever the option struct.
type common struct {
	username, password string
	tls                *tls.Config
	maxRetries         int
	dialerRetries      int
	dial, read, write  time.Duration
	pool               time.Duration
	ctxTimeout         bool
}

func checkCommon(t *testing.T, got common, wantUser, wantPass string, timeout time.Duration, wantTLS bool) {
	t.Helper()
	if got.username != wantUser || got.password != wantPass {
		t.Errorf("credentials = %q/%q, want %q/%q", got.username, got.password, wantUser, wantPass)
	}
	if (got.tls != nil) != wantTLS {
		t.Errorf("TLSConfig set = %v, want %v", got.tls != nil, wantTLS)
	}
	if got.tls != nil && got.tls.MinVersion < tls.VersionTLS12 {
		t.Errorf("TLS MinVersion = %x, want >= TLS 1.2", got.tls.MinVersion)
	}
	if got.maxRetries != -1 {
		t.Errorf("MaxRetries = %d, want -1 (no retries; 0 means 3 in go-redis)", got.maxRetries)
	}
	if got.dialerRetries != 1 {
		t.Errorf("DialerRetries = %d, want 1 (0 means 5 in go-redis)", got.dialerRetries)
	}
	for name, d := range map[string]time.Duration{"DialTimeout": got.dial, "ReadTimeout": got.read, "WriteTimeout": got.write, "PoolTimeout": got.pool} {
		if d != timeout {
			t.Errorf("%s = %v, want %v", name, d, timeout)
		}
	}
	if !got.ctxTimeout {
		t.Error("ContextTimeoutEnabled = false, want true")
	}
}

func TestOptionsMapping(t *testing.T) {
	tlsOn := config.TLS{Enabled: true, ServerName: "redis.internal"}
	cases := []struct {
		name        string
		cfg         config.Redis
		wantMode    config.RedisMode
		wantAddrs   []string
		wantTimeout time.Duration
	}{
		{"single default addr", config.Redis{}, config.RedisSingle, []string{"127.0.0.1:6379"}, DefaultTimeout},
		{"single with acl and tls", config.Redis{Addr: "10.0.0.1:6380", Username: "app", Password: secret, DB: 3, Timeout: config.Duration(time.Second), TLS: tlsOn},
			config.RedisSingle, []string{"10.0.0.1:6380"}, time.Second},
		{"sentinel", config.Redis{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster", SentinelUsername: "sent", SentinelPassword: "sentpw",
			Username: "app", Password: secret, DB: 1, Timeout: config.Duration(100 * time.Millisecond)},
			config.RedisSentinel, []string{"s1:26379", "s2:26379"}, 100 * time.Millisecond},
		{"cluster with tls", config.Redis{Addrs: []string{"c1:7000", "c2:7001", "c3:7002"}, Password: secret, TLS: tlsOn},
			config.RedisCluster, []string{"c1:7000", "c2:7001", "c3:7002"}, DefaultTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if m := tc.cfg.Mode(); m != tc.wantMode {
				t.Fatalf("Mode() = %s, want %s", m, tc.wantMode)
			}
			tlsConf, err := tc.cfg.TLS.ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			timeout := time.Duration(tc.cfg.Timeout)
			if timeout == 0 {
				timeout = DefaultTimeout
			}
			switch tc.wantMode {
			case config.RedisSingle:
				o, err := singleOptions(tc.cfg, timeout, tlsConf)
				if err != nil {
					t.Fatal(err)
				}
				if o.Addr != tc.wantAddrs[0] || o.DB != tc.cfg.DB {
					t.Errorf("Addr, DB = %q, %d, want %q, %d", o.Addr, o.DB, tc.wantAddrs[0], tc.cfg.DB)
				}
				checkCommon(t, common{o.Username, o.Password, o.TLSConfig, o.MaxRetries, o.DialerRetries,
					o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.ContextTimeoutEnabled},
					tc.cfg.Username, tc.cfg.Password, tc.wantTimeout, tc.cfg.TLS.Enabled)
			case config.RedisSentinel:
				o, err := failoverOptions(tc.cfg, timeout, tlsConf)
				if err != nil {
					t.Fatal(err)
				}
				if o.MasterName != tc.cfg.MasterName || strings.Join(o.SentinelAddrs, ",") != strings.Join(tc.wantAddrs, ",") || o.DB != tc.cfg.DB {
					t.Errorf("MasterName, SentinelAddrs, DB = %q, %v, %d", o.MasterName, o.SentinelAddrs, o.DB)
				}
				if o.SentinelUsername != tc.cfg.SentinelUsername || o.SentinelPassword != tc.cfg.SentinelPassword {
					t.Errorf("sentinel credentials = %q/%q, want %q/%q", o.SentinelUsername, o.SentinelPassword, tc.cfg.SentinelUsername, tc.cfg.SentinelPassword)
				}
				checkCommon(t, common{o.Username, o.Password, o.TLSConfig, o.MaxRetries, o.DialerRetries,
					o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.ContextTimeoutEnabled},
					tc.cfg.Username, tc.cfg.Password, tc.wantTimeout, tc.cfg.TLS.Enabled)
			case config.RedisCluster:
				o, err := clusterOptions(tc.cfg, timeout, tlsConf)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(o.Addrs, ",") != strings.Join(tc.wantAddrs, ",") {
					t.Errorf("Addrs = %v, want %v", o.Addrs, tc.wantAddrs)
				}
				checkCommon(t, common{o.Username, o.Password, o.TLSConfig, o.MaxRetries, o.DialerRetries,
					o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.ContextTimeoutEnabled},
					tc.cfg.Username, tc.cfg.Password, tc.wantTimeout, tc.cfg.TLS.Enabled)
			}
		})
	}
}

func TestNewReturnsTheClientForTheMode(t *testing.T) {
	cases := []struct {
		cfg  config.Redis
		want string
	}{
		{config.Redis{Addr: "127.0.0.1:1"}, "*redis.Client"},
		{config.Redis{Addrs: []string{"127.0.0.1:1"}, MasterName: "m"}, "*redis.Client"},
		{config.Redis{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "*redis.ClusterClient"},
	}
	for _, tc := range cases {
		c, err := New(tc.cfg)
		if err != nil {
			t.Fatalf("New(%v): %v", tc.cfg.Mode(), err)
		}
		var got string
		switch c.(type) {
		case *redis.Client:
			got = "*redis.Client"
		case *redis.ClusterClient:
			got = "*redis.ClusterClient"
		}
		if got != tc.want {
			t.Errorf("New(%s) = %T, want %s", tc.cfg.Mode(), c, tc.want)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name  string
		cfg   config.Redis
		field string
	}{
		{"negative timeout", config.Redis{Addr: "h:1", Timeout: -1}, "redis.timeout"},
		{"addr and addrs", config.Redis{Addr: "h:1", Addrs: []string{"h:2"}}, "redis"},
		{"addr without port", config.Redis{Addr: "localhost"}, "redis.addr"},
		{"url as addr", config.Redis{Addr: "redis://:" + secret + "@h:6379"}, "redis.addr"},
		{"userinfo as addr", config.Redis{Addr: "app:" + secret + "@h:6379"}, "redis.addr"},
		{"empty cluster addr", config.Redis{Addrs: []string{"h:1", ""}}, "redis.addrs[1]"},
		{"url in sentinel addrs", config.Redis{MasterName: "m", Addrs: []string{"redis://u:" + secret + "@h:1"}}, "redis.addrs[0]"},
		{"sentinel without addrs", config.Redis{MasterName: "m", Password: secret}, "redis.addrs"},
		{"cluster db", config.Redis{Addrs: []string{"h:1"}, DB: 2}, "redis.db"},
		{"negative db", config.Redis{Addr: "h:1", DB: -1}, "redis.db"},
		{"missing ca file", config.Redis{Addr: "h:1", TLS: config.TLS{Enabled: true, CAFile: filepath.Join(dir, "none.pem")}}, "redis.tls"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.cfg)
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			if !strings.HasPrefix(err.Error(), tc.field+":") {
				t.Errorf("error %q does not start with %q", err, tc.field+":")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q contains the password", err)
			}
		})
	}
}

// TestHungRedisFailsWithinOneTimeout checks the settings that matter for the
// limiter's fallback: a Redis that accepts connections but never answers
// fails the call after one timeout, on one connection, without a retry.
func TestHungRedisFailsWithinOneTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	conns := make(chan net.Conn, 16)
	defer func() {
		ln.Close()
		for len(conns) > 0 {
			(<-conns).Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			select {
			case conns <- c:
			default:
				c.Close()
			}
		}
	}()
	c, err := New(config.Redis{Addr: ln.Addr().String(), Password: secret, Timeout: config.Duration(100 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Ping(context.Background()).Err()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Ping against a silent server = %v, want a timeout", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error %q contains the password", err)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("the client opened %d connections for one call, want 1 (no retries)", n)
	}
}

func TestSingleNodeRoundTrip(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ctx := testenv.Context(t, 10*time.Second)
	c, err := New(config.Redis{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := fmt.Sprintf("redisconn-test:%s:%d", t.Name(), time.Now().UnixNano())
	if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	defer c.Del(context.Background(), key)
	if v, err := c.Get(ctx, key).Result(); err != nil || v != "v" {
		t.Fatalf("Get = %q, %v; want v", v, err)
	}
}

// TestClientSpeaksRESP2: the connections New opens speak RESP2, so that
// go-redis does not look for push notifications before every command.
func TestClientSpeaksRESP2(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ctx := testenv.Context(t, 10*time.Second)
	c, err := New(config.Redis{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.ClientInfo(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if info.Resp != 2 {
		t.Errorf("CLIENT INFO resp = %d, want 2", info.Resp)
	}
}

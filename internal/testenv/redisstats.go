package testenv

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CallCounter is a go-redis hook that counts a client's round trips: each
// command sent alone, and each pipeline. Add it with Client.AddHook; read
// N. It is safe for concurrent use.
type CallCounter struct{ N atomic.Int64 }

// DialHook implements redis.Hook.
func (h *CallCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *CallCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *CallCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.N.Add(1)
		return next(ctx, cmds)
	}
}

// RedisCPU returns the CPU the server behind c used so far, in seconds
// (user and system), and the commands it ran (INFO commandstats, those
// scripts ran included). Each call runs one INFO itself.
func RedisCPU(tb testing.TB, c redis.UniversalClient) (float64, int64) {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var cpu float64
	var cmds int64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		} else if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		} else if strings.HasPrefix(line, "cmdstat_") {
			_, rest, _ := strings.Cut(line, "calls=")
			v, _, _ := strings.Cut(rest, ",")
			k, _ := strconv.ParseInt(v, 10, 64)
			cmds += k
		}
	}
	return cpu, cmds
}

package redislimiter

import (
	"math"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// takeFastLua is the start of takeScript: the plain take, decided without
// the prelude. A take that holds the cost at once, on a bucket with no
// override or adaptive rate, no warm-up configured, no class fields in its
// state (no reservation of a class to jump) and no pause, is granted here
// exactly as the full take below would grant it, and the script returns
// before the prelude runs; anything else goes on to the full take, which
// uses TAKE_NOW as its time. The full take's Redis time is mostly the
// prelude's closures (every call of a script creates each of its
// functions), hash fields read into Lua and numbers Redis formats with
// %.17g; eight replicas' calls queue behind each other on Redis's one
// thread, so it shows in every caller's latency.
// TestTakeFastPathSameAsFull runs both on random states.
//
// Its reply is "tokens remaining_milli now_us": granted, no wait, at the
// configured rate and burst, of the asking class, no push (fastTakeResult).
const takeFastLua = `
local TAKE_NOW = tonumber(ARGV[6])
if not (TAKE_NOW and TAKE_NOW > 0) then
  local t = redis.call('TIME')
  TAKE_NOW = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
do
  local now, rate, burst, cost = TAKE_NOW, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local warm = tonumber(ARGV[7])
  if not (warm and warm > 0) and cost <= burst and #redis.call('HGETALL', KEYS[2]) == 0 then
    local h = redis.call('HGETALL', KEYS[1])
    local tokens, ts, plain = nil, nil, true
    for i = 1, #h, 2 do
      local f = h[i]
      if f == 'tokens' then tokens = tonumber(h[i + 1])
      elseif f == 'ts' then ts = tonumber(h[i + 1])
      elseif f ~= 'by' and f ~= 'wts' and f ~= 'wu' then plain = false end
    end
    if plain then
      if not tokens or not ts then
        tokens, ts = burst, now
      else
        if now > ts then
          tokens = tokens + (now - ts) * rate / 1e6
          ts = now
        end
        if tokens > burst then tokens = burst end
      end
      local left, got, extra = tokens - cost, cost, tonumber(ARGV[4])
      if ts <= now and left >= 0 then
        if extra > 0 and left >= 1 then
          local k = math.min(extra, math.floor(left))
          left = left - k
          got = got + k
        end
        -- The strings Redis would store for these numbers (%.17g), made
        -- with %d when whole, which is cheaper.
        local sl
        if left == math.floor(left) then sl = string.format('%d', left) else sl = string.format('%.17g', left) end
        redis.call('HSET', KEYS[1], 'tokens', sl, 'ts', string.format('%d', ts))
        redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(((ts - now) + (burst - left) * 1e6 / rate) / 1000) + 1000))
        local m = math.floor(left * 1000 + 0.5)
        if m > 1e15 then m = 1e15 end
        return string.format('%d %d %d', got, m, now)
      end
    end
  end
end
`

// fastTakeResult returns the answer of the fast path's reply (takeFastLua)
// to req, and false when str is not one.
func (s *Store) fastTakeResult(req limiter.TakeRequest, str string) (limiter.TakeResult, bool) {
	var v [3]int64
	if !parseInts(str, v[:]) {
		return limiter.TakeResult{}, false
	}
	return limiter.TakeResult{
		Granted:   true,
		Tokens:    int(v[0]),
		Remaining: float64(v[1]) / 1000,
		// As the full take's milli(rate): the same operations on the
		// same float64.
		Rate:  math.Min(math.Floor(s.cfg.Rate*1000+0.5), 1e15) / 1000,
		Burst: s.cfg.Burst,
		At:    time.UnixMicro(v[2]),
		Class: req.Priority,
	}, true
}

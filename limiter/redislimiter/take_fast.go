package redislimiter

import (
	"math"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// takeFastLua is the start of takeScript (lua/take_fast.lua, which
// includes take_full_again.lua): it decides the plain takes without the
// prelude, exactly as the full take would, and replies with
// "granted tokens wait_us remaining_milli now_us pushed_milli"
// (fastTakeResult) or, for a take full again within a microsecond, with
// now_us alone (fullAgainResult). TestTakeFastPathSameAsFull runs both
// paths on random states.
var takeFastLua = luaSource("take_fast.lua")

// takeFullAgainLua is the part of takeFastLua that replies with the
// instant alone (lua/take_full_again.lua).
var takeFullAgainLua = luaSource("take_full_again.lua")

// fullAgainResult returns the answer to req that the take script gives as
// the bare instant nowUS (takeFastLua): req granted at once from a full
// bucket at the configured rate and burst, with its Extra up to the burst,
// and nothing stored. It is the answer the fast path's string would carry
// (TestTakeFullAgainReply).
func (s *Store) fullAgainResult(req backend.TakeRequest, nowUS int64) (backend.TakeResult, bool) {
	if !s.shortTake(req) || req.Cost > s.cfg.Burst {
		return backend.TakeResult{}, false
	}
	got := req.Cost
	if left := s.cfg.Burst - req.Cost; req.Extra > 0 && left >= 1 {
		got += min(req.Extra, left)
	}
	return backend.TakeResult{
		Granted:   true,
		Tokens:    got,
		Remaining: float64(s.cfg.Burst - got),
		Rate:      s.milliRate(),
		Burst:     s.cfg.Burst,
		At:        time.UnixMicro(nowUS),
		Class:     req.Priority,
	}, true
}

// milliRate is the configured rate as the scripts reply it: in thousandths,
// the same operations on the same float64 as their milli(rate).
func (s *Store) milliRate() float64 {
	return math.Min(math.Floor(s.cfg.Rate*1000+0.5), 1e15) / 1000
}

// fastTakeResult returns the answer of the fast path's reply (takeFastLua)
// to req, and false when str is not one.
func (s *Store) fastTakeResult(req backend.TakeRequest, str string) (backend.TakeResult, bool) {
	var v [6]int64
	if !parseInts(str, v[:]) || v[0] < 0 || v[0] > 1 {
		return backend.TakeResult{}, false
	}
	return backend.TakeResult{
		Granted:   v[0] == 1,
		Tokens:    int(v[1]),
		Wait:      time.Duration(v[2]) * time.Microsecond,
		Remaining: float64(v[3]) / 1000,
		Rate:      s.milliRate(),
		Burst:     s.cfg.Burst,
		At:        time.UnixMicro(v[4]),
		Class:     req.Priority,
		Pushed:    float64(v[5]) / 1000,
	}, true
}

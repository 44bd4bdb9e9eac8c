package campaign

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// The kinds of fault the nemesis injects.
const (
	RedisKill   = "redis-kill"   // SIGKILL the private redis-server, start it again (empty) after Hold
	RedisPause  = "redis-pause"  // SIGSTOP it for Hold, then SIGCONT
	RedisCut    = "redis-cut"    // close every replica's connection to Redis (faultproxy)
	AMQPCut     = "amqp-cut"     // close every replica's connection to RabbitMQ (faultproxy)
	ReplicaKill = "replica-kill" // SIGKILL a replica, start it again after Hold
	ReplicaTerm = "replica-term" // SIGTERM a replica, wait for it to drain, start it again after Hold
	RateSet     = "rate-set"     // bucket set --rate Rate for Hold, then bucket set --clear
	AddReplica  = "add-replica"  // start one more replica (up to MaxReplicas)
)

// Step is one fault of a schedule.
type Step struct {
	At   time.Duration // from the nemesis's start; later if the step before overran
	Kind string
	Hold time.Duration // how long the fault lasts before it is healed
	Rate float64       // RateSet: the override
	Pick int           // which running replica, modulo their number
}

func (s Step) String() string {
	switch s.Kind {
	case RedisKill, RedisPause, ReplicaKill, ReplicaTerm:
		return fmt.Sprintf("+%.1fs %s for %v (pick %d)", s.At.Seconds(), s.Kind, s.Hold, s.Pick)
	case RateSet:
		return fmt.Sprintf("+%.1fs %s %v/s for %v", s.At.Seconds(), s.Kind, s.Rate, s.Hold)
	default:
		return fmt.Sprintf("+%.1fs %s", s.At.Seconds(), s.Kind)
	}
}

// faultWeights gives each kind its share of the schedule.
var faultWeights = []struct {
	kind   string
	weight int
}{
	{RedisKill, 2}, {RedisPause, 2}, {RedisCut, 2}, {AMQPCut, 2},
	{ReplicaKill, 2}, {ReplicaTerm, 1}, {RateSet, 3}, {AddReplica, 1},
}

// ms returns a random duration in [lo, hi) ms, rounded to 100 ms.
func ms(rng *rand.Rand, lo, hi int) time.Duration {
	return time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond / (100 * time.Millisecond) * (100 * time.Millisecond)
}

// Plan returns the fault schedule of seed over d: from 3 s in, one fault
// at a time, each held for a random time and followed by a pause of 1–3 s,
// the last healed by d. The same seed and d give the same schedule.
func Plan(seed int64, d time.Duration) []Step {
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	total := 0
	for _, w := range faultWeights {
		total += w.weight
	}
	var steps []Step
	at := 3 * time.Second
	for {
		n := rng.IntN(total)
		kind := ""
		for _, w := range faultWeights {
			if n < w.weight {
				kind = w.kind
				break
			}
			n -= w.weight
		}
		s := Step{At: at, Kind: kind, Pick: rng.IntN(1000)}
		switch kind {
		case RedisKill:
			s.Hold = ms(rng, 1000, 4000)
		case RedisPause:
			s.Hold = ms(rng, 500, 3000)
		case ReplicaKill, ReplicaTerm:
			s.Hold = ms(rng, 200, 2000)
		case RateSet:
			s.Hold = ms(rng, 2000, 5000)
			if rng.IntN(3) == 0 {
				s.Rate = float64(25 + rng.IntN(16)) // raised
			} else {
				s.Rate = float64(5 + rng.IntN(11)) // cut
			}
		}
		if at+s.Hold > d {
			return steps
		}
		steps = append(steps, s)
		at += s.Hold + ms(rng, 1000, 3000)
	}
}

// Pub is a message the publisher sends At from the start.
type Pub struct {
	At  time.Duration
	Msg Message
}

// Workload returns the messages of seed over d, in time order: phases of
// 2 s, each normal (18/s), a surge (40/s), quiet (6/s), a hot sender
// (20/s, 70% of it from sender s0) or a hot recipient (20/s, one in 6
// to r0, up to one message per 4 s of d in all, half what its layer
// lets out); recipients r0–r199, senders s0–s4, one message in 16 from
// the quota-capped account, one in 10 of class high and 3 in 10 low. The
// average is about the shared rate.
func Workload(seed int64, d time.Duration) []Pub {
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	const tick = 50 * time.Millisecond
	var out []Pub
	id, hotMsgs := 0, 0
	var rate float64
	hot, hotTo := false, false
	for at := time.Duration(0); at < d; at += tick {
		if at%(2*time.Second) == 0 {
			hot, hotTo = false, false
			switch p := rng.IntN(20); {
			case p < 10:
				rate = 18
			case p < 13:
				rate = 40
			case p < 16:
				rate = 6
			case p < 18:
				rate, hot = 20, true
			default:
				rate, hotTo = 20, true
			}
		}
		n := int(rate*tick.Seconds() + rng.Float64())
		for range n {
			m := Message{ID: id, To: fmt.Sprintf("r%d", rng.IntN(200)), From: fmt.Sprintf("s%d", rng.IntN(5)), Acct: fmt.Sprintf("a%d", id), Class: "normal"}
			if hot && rng.IntN(10) < 7 {
				m.From = "s0"
			}
			if hotTo && rng.IntN(6) == 0 && hotMsgs < int(d/(4*time.Second)) {
				m.To = "r0"
				hotMsgs++
			}
			if rng.IntN(16) == 0 {
				m.Acct = CappedAccount
			}
			switch c := rng.IntN(10); {
			case c == 0:
				m.Class = "high"
			case c < 4:
				m.Class = "low"
			}
			out = append(out, Pub{At: at, Msg: m})
			id++
		}
	}
	return out
}

// CappedAccount is the account whose quota binds in the campaign.
const CappedAccount = "capped"

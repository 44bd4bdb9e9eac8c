package rabbitmq

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// brokerAcks plays the broker's side of a channel's acks: the tags
// delivered and not yet settled, and an unknown tag closing the channel,
// as RabbitMQ does (PRECONDITION_FAILED), also for an Ack with multiple
// set whose own tag was settled already.
type brokerAcks struct {
	outstanding map[uint64]bool
	calls       []string
	err         error // the first precondition failure: the channel is closed from then on
}

func newBrokerAcks(n int) *brokerAcks {
	b := &brokerAcks{outstanding: map[uint64]bool{}}
	for tag := range uint64(n) {
		b.outstanding[tag+1] = true
	}
	return b
}

func (b *brokerAcks) Ack(tag uint64, multiple bool) error {
	b.calls = append(b.calls, fmt.Sprintf("ack %d multiple=%v", tag, multiple))
	if b.err != nil {
		return b.err
	}
	if !b.outstanding[tag] {
		b.err = fmt.Errorf("PRECONDITION_FAILED - unknown delivery tag %d", tag)
		return b.err
	}
	if multiple {
		for t := range b.outstanding {
			if t <= tag {
				delete(b.outstanding, t)
			}
		}
		return nil
	}
	delete(b.outstanding, tag)
	return nil
}

// nack settles tag on its own, as a Nack does.
func (b *brokerAcks) nack(tag uint64) {
	b.calls = append(b.calls, fmt.Sprintf("nack %d", tag))
	delete(b.outstanding, tag)
}

// TestAckBatcherSteps drives an ackBatcher by hand, one flush at a time,
// and checks each flush's acks: the settled run from the lowest tag as
// one multiple ack, a tag above a delivery still handled on its own only
// after it waited a round, and a nacked tag passed over.
func TestAckBatcherSteps(t *testing.T) {
	type step struct {
		add     []uint64 // acks queued before the flush
		nack    []uint64 // settled on their own before the flush
		final   bool
		want    []string // the calls of the flush
		wantOff bool
	}
	steps := []step{
		{add: []uint64{1, 2, 3}, want: []string{"ack 3 multiple=true"}},
		// 4 is still handled: 5 and 6 wait a round, then go alone.
		{add: []uint64{6, 5}, want: nil},
		{want: []string{"ack 5 multiple=false", "ack 6 multiple=false"}},
		// 4 settles: the multiple ack stops at 4, not at 6, which the
		// broker no longer knows.
		{add: []uint64{4}, want: []string{"ack 4 multiple=true"}},
		// 7 is nacked; 8 and 9 pass it.
		{nack: []uint64{7}, add: []uint64{9, 8}, want: []string{"ack 9 multiple=true"}},
		// 10 handled; 11 waits one round, and the final flush sends it.
		{add: []uint64{11}, want: nil},
		{add: []uint64{12}, final: true, want: []string{"ack 11 multiple=false", "ack 12 multiple=false"}},
	}
	broker := newBrokerAcks(12)
	b := newAckBatcher(broker, DefaultAckDelay, testenv.Logger(t, 0))
	for i, s := range steps {
		for _, tag := range s.nack {
			broker.nack(tag)
			b.settled(tag)
		}
		for _, tag := range s.add {
			if !b.add(tag) {
				t.Fatalf("step %d: add(%d) refused", i, tag)
			}
		}
		broker.calls = nil
		b.flush(s.final)
		got := broker.calls
		slices.Sort(got)
		if !slices.Equal(got, s.want) {
			t.Errorf("step %d: flush sent %q, want %q", i, got, s.want)
		}
	}
	if broker.err != nil {
		t.Fatal(broker.err)
	}
	if !broker.outstanding[10] || len(broker.outstanding) != 1 {
		t.Errorf("outstanding after the steps %v, want only 10 (never settled)", broker.outstanding)
	}
}

// TestAckBatcherNeverAcksUnsettled settles deliveries in random orders,
// some by a nack, with flushes at random points, and checks against the
// broker's rules that no ack names an unknown tag, that no unsettled
// delivery is acked (a multiple ack passing it), and that the final flush
// leaves only the unsettled ones outstanding.
func TestAckBatcherNeverAcksUnsettled(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		n := 1 + rng.IntN(300)
		broker := newBrokerAcks(n)
		b := newAckBatcher(broker, DefaultAckDelay, testenv.Logger(t, 0))
		order := rng.Perm(n)
		unsettled := map[uint64]bool{}
		for _, i := range order {
			tag := uint64(i + 1)
			switch r := rng.IntN(20); {
			case r == 0:
				unsettled[tag] = true // its handler still runs at the end
			case r == 1:
				broker.nack(tag)
				b.settled(tag)
			default:
				b.add(tag)
			}
			if rng.IntN(8) == 0 {
				b.flush(false)
			}
			for tag := range unsettled {
				if !broker.outstanding[tag] {
					t.Fatalf("seed %d: tag %d acked before it was settled; calls %q", seed, tag, broker.calls)
				}
			}
		}
		b.flush(true)
		if broker.err != nil {
			t.Fatalf("seed %d: %v; calls %q", seed, broker.err, broker.calls)
		}
		if len(broker.outstanding) != len(unsettled) {
			t.Fatalf("seed %d: %d outstanding after the final flush, want the %d unsettled", seed, len(broker.outstanding), len(unsettled))
		}
	}
}

// TestAckBatcherOffPastTheGoneBound checks that a batcher that would
// remember more than maxAckGone tags settled on their own stops batching:
// add then refuses, so the caller acks at once.
func TestAckBatcherOffPastTheGoneBound(t *testing.T) {
	broker := newBrokerAcks(0)
	b := newAckBatcher(broker, DefaultAckDelay, testenv.Logger(t, 0))
	for tag := uint64(2); tag <= maxAckGone+2; tag++ {
		b.settled(tag) // tag 1 is never settled
	}
	if b.add(maxAckGone + 3) {
		t.Fatal("add accepted past the bound, want refused (acked on its own)")
	}
	if newAckBatcher(broker, -1, nil) != nil {
		t.Error("a negative delay made a batcher, want none (each ack at once)")
	}
}

// TestAckBatcherStarvedAcksAtOnce: an ack that would keep the broker from
// sending a free handler its next delivery goes out at once, within add,
// however long the delay: when the deliveries read and not settled fill
// the prefetch window and no delivery waits for a handler. Otherwise it
// waits for a flush.
func TestAckBatcherStarvedAcksAtOnce(t *testing.T) {
	broker := newBrokerAcks(5)
	b := newAckBatcher(broker, time.Hour, testenv.Logger(t, 0))
	b.window = 2
	free := true
	b.handlersFree = func() bool { return free }
	steps := []struct {
		read   uint64 // the highest tag read before the add
		window uint64
		free   bool
		add    uint64
		flush  bool // then a flush, as run's timer makes
		want   []string
	}{
		// 1 and 2 read, the window of 2 full: 1's ack goes at once.
		{read: 2, window: 2, free: true, add: 1, want: []string{"ack 1 multiple=true"}},
		// 3 read: 2 and 3 fill the window; 3 goes alone, 2 unsettled.
		{read: 3, window: 2, free: true, add: 3, want: []string{"ack 3 multiple=false"}},
		// 4 read, the window full, but a delivery waits for a handler:
		// 2's ack waits.
		{read: 4, window: 2, free: false, add: 2, want: nil},
		// A window of 10, not full: 4's ack waits too, and the flush
		// sends 2 to 4 as one.
		{read: 4, window: 10, free: true, add: 4, flush: true, want: []string{"ack 4 multiple=true"}},
		// No window known: an ack always waits.
		{read: 5, window: 0, free: true, add: 5, want: nil},
	}
	for i, s := range steps {
		b.readTag(s.read)
		b.window, free = s.window, s.free
		broker.calls = nil
		if !b.add(s.add) {
			t.Fatalf("step %d: add(%d) refused", i, s.add)
		}
		if s.flush {
			b.flush(false)
		}
		if !slices.Equal(broker.calls, s.want) {
			t.Errorf("step %d: sent %q, want %q", i, broker.calls, s.want)
		}
	}
	if broker.err != nil {
		t.Fatal(broker.err)
	}
}

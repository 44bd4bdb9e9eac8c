package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// clockedLayers drives the layer scripts at explicit instants.
type clockedLayers struct{ l *Layered }

func (c clockedLayers) TakeLayersAt(now time.Time, req limiter.LayerRequest) (limiter.LayerResult, error) {
	return c.l.takeLayers(context.Background(), now, req)
}

func (c clockedLayers) RefundLayersAt(now time.Time, req limiter.LayerRequest, res limiter.LayerResult) error {
	return c.l.refundLayers(context.Background(), now, req, res)
}

func (c clockedLayers) LayerStatusAt(now time.Time, layer, key string) (limiter.LayerState, error) {
	return c.l.layerStatus(context.Background(), now, layer, key)
}

func (c clockedLayers) StatusAt(now time.Time) (limiter.State, error) {
	return c.l.status(context.Background(), now.UnixMicro())
}

// newLayered returns a layered store on a unique bucket of c, whose keys
// are deleted when the test ends.
func newLayered(t testing.TB, c redis.UniversalClient, rate float64, burst int, layers []limiter.Layer) *Layered {
	t.Helper()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.WithLayers(layers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteLayerKeys(t, c, l) })
	return l
}

// deleteLayerKeys deletes every key of l's layers.
func deleteLayerKeys(t testing.TB, c redis.UniversalClient, l *Layered) {
	ctx := context.Background()
	for i := range l.layers {
		c.Del(ctx, l.unkeyed[i])
		iter := c.Scan(ctx, 0, globEscaper.Replace(l.keyPrefix[i])+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	}
}

func TestRedisLayerSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.LayeredClockedStore {
		return clockedLayers{newLayered(t, c, rate, burst, layers)}
	})
}

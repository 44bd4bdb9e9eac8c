package config_test

import (
	"context"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// A program that loads the binary's YAML and builds the consumer the
// binary builds, here for a Kafka source and an HTTP sink. It needs Redis
// and Kafka, so the example only compiles.
func ExampleConfig_Libraries() {
	cfg, err := config.Load("throttle.yaml")
	if err != nil {
		log.Fatal(err)
	}
	lib, err := cfg.Libraries()
	if err != nil {
		log.Fatal(err)
	}
	store, err := redislimiter.New(redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr}), lib.Bucket)
	if err != nil {
		log.Fatal(err)
	}
	var ls limiter.Store = store
	if len(lib.Layers) > 0 {
		if ls, err = store.WithLayers(lib.Layers); err != nil {
			log.Fatal(err)
		}
	}
	bucket, err := limiter.New(ls, lib.Limiter)
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()
	lim, err := consumer.NewLimiter(bucket, lib.Limit)
	if err != nil {
		log.Fatal(err)
	}
	hc := *lib.HTTP
	hc.MaxRetryAfter = bucket.MaxPause()
	sink, err := httpsink.New(hc)
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close()
	kc := *lib.Kafka
	kc.Limiter = lim
	if lib.PushBack {
		kc.Pauser = bucket
	}
	kc.Assigned = func(n int) { bucket.SetIdle(n == 0) }
	c, err := kafka.New(kc, sinks.Handler(sink))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

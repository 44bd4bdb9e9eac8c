package redisconn_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// A Sentinel-managed Redis holding the shared bucket. The client follows
// failovers; while no master answers, the Bucket limits locally.
func ExampleNew() {
	client, err := redisconn.New(config.Redis{
		MasterName: "mymaster",
		Addrs:      []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		Password:   "from-env",
		Timeout:    config.Duration(250 * time.Millisecond),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	store, err := redislimiter.New(client, redislimiter.Config{Bucket: "sms", Rate: 100, Burst: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	bucket, err := limiter.New(store, limiter.Options{OnStoreError: limiter.ModeLocal})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer bucket.Close()
	_ = bucket.Wait(context.Background(), 1)
}

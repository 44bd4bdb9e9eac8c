package redislimiter_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// Every replica runs this with the same bucket name and shares 100 SMS per
// second, whatever the number of replicas.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	store, err := redislimiter.New(client, redislimiter.Config{Bucket: "sms-outbound", Rate: 100, Burst: 200})
	if err != nil {
		log.Fatal(err)
	}
	bucket, err := limiter.New(store, limiter.Options{}) // falls back to a local share if Redis fails
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	ctx := context.Background()
	for _, parts := range []int{1, 3, 2} { // an SMS costs one token per part
		if err := bucket.Wait(ctx, parts); err != nil {
			log.Fatal(err)
		}
		// send the SMS here
	}
}

// An operator raises the rate for every replica for one hour, before a
// promotion, and pre-fills the bucket. The Admin needs no configured
// limits: the override gives them.
func ExampleAdmin_SetOverride() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	admin, err := redislimiter.NewAdmin(client, redislimiter.AdminConfig{Bucket: "sms-outbound"})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := admin.SetOverride(ctx, 300, 600, time.Hour); err != nil {
		log.Fatal(err)
	}
	if err := admin.Fill(ctx); err != nil {
		log.Fatal(err)
	}
	st, err := admin.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%v tokens of %d at %v/s", st.Tokens, st.Burst, st.Rate)
}

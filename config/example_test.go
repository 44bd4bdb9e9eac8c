package config_test

import (
	"fmt"
	"log"

	"github.com/throttlehq/throttle/config"
)

// readme is an example configuration (every key: docs/configuration.md).
const readme = `
redis:
  addr: 127.0.0.1:6379
  password: "${REDIS_PASSWORD:-}"
  timeout: 250ms
limit:
  bucket: sms-outbound
  rate: 6000/min
  on_store_error: local
source:
  kafka:
    brokers: ["127.0.0.1:9092"]
    topic: sms
    group: sms-sender
sink:
  http:
    url: "http://127.0.0.1:8080/send"
    headers:
      Authorization: "Bearer ${API_TOKEN}"
delivery:
  max_attempts: 5
  backoff: 200ms
metrics:
  listen: 127.0.0.1:9464
log:
  level: info
`

func ExampleParse() {
	env := map[string]string{"REDIS_PASSWORD": "s3cret", "API_TOKEN": "t0ken"}
	lookup := func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
	cfg, err := config.Parse([]byte(readme), lookup)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("bucket:", cfg.Limit.Bucket, "rate:", cfg.Limit.Rate, "burst:", cfg.Limit.Burst)
	fmt.Println("redis:", cfg.Redis.Mode(), cfg.Redis.Addr, cfg.Redis.Timeout)
	// Keys left out stay zero: the library the value goes to applies its
	// own default (here the HTTP sink's POST and 5s).
	fmt.Printf("sink: %q %s %v\n", cfg.Sink.HTTP.Method, cfg.Sink.HTTP.URL, cfg.Sink.HTTP.Timeout)
	fmt.Println("logged header:", cfg.Redacted().Sink.HTTP.Headers["Authorization"])
	// Output:
	// bucket: sms-outbound rate: 100 burst: 100
	// redis: single 127.0.0.1:6379 250ms
	// sink: "" http://127.0.0.1:8080/send 0s
	// logged header: xxxxx
}

func ExampleParse_errors() {
	_, err := config.Parse([]byte("limit: {bucket: b, rate: -5}\nsink: {http: {url: 'http://h/'}, stdout: {}}\n"), nil)
	fmt.Println(err)
	// Output:
	// limit.rate: must be a number > 0 and <= 1e+09, got -5 (line 1)
	// source: exactly one of kafka, rabbitmq must be set, got 0
	// sink: exactly one of http, postgres, stdout must be set, got 2 (http, stdout) (line 2)
}

func ExampleRedactURL() {
	fmt.Println(config.RedactURL("amqp://guest:guest@127.0.0.1:5672/"))
	fmt.Println(config.RedactURL("host=db user=app password='x y' sslmode=require"))
	// Output:
	// amqp://guest:xxxxx@127.0.0.1:5672/
	// host=db user=app password=xxxxx sslmode=require
}

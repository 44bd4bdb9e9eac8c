package integration

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/throttlehq/throttle/internal/testenv"
)

// The end-to-end suite runs one set of scenarios (suiteScenarios) against
// each broker, on one of two environments, so that the two cannot drift:
//
//   - docker: with a Docker daemon, testcontainers-go starts Redis, Kafka
//     (apache/kafka, KRaft) and RabbitMQ containers once for the suite. This
//     machine has no Docker daemon; the path compiles here and runs wherever
//     Docker does (a developer's laptop, a CI runner with Docker).
//   - local: without one, the scenarios use the services that
//     internal/testenv finds (REDIS_ADDR, AMQP_URL) and, for Kafka, the
//     brokers in KAFKA_BROKERS or an in-process kfake cluster.
//
// A service missing from the local environment skips its scenarios with a
// message that names it and says that no Docker daemon was found either;
// under CI=true that is a failure (testenv.Missing). THROTTLE_TEST_DOCKER=off
// makes the suite use the local services even where Docker runs.

// suiteEnv says where the suite's services are. Each accessor skips or
// fails t, through testenv, when its service is unreachable.
type suiteEnv struct {
	// name is "docker" or "local", for logs.
	name string
	// redisAddr returns the host:port of Redis.
	redisAddr func(t testing.TB) string
	// amqpURL returns the AMQP URL of RabbitMQ.
	amqpURL func(t testing.TB) string
	// kafkaBrokers returns seed brokers: the suite's container, the
	// brokers of KAFKA_BROKERS, or a kfake cluster that ends with t.
	kafkaBrokers func(t testing.TB) []string
	// kafkaSessionTimeout is the consumer group session timeout the
	// brokers accept; a stock broker's minimum is 6s.
	kafkaSessionTimeout time.Duration
}

// TestSuite is the one entry point of the end-to-end suite: it picks the
// environment and runs every scenario against Kafka and RabbitMQ.
func TestSuite(t *testing.T) {
	env := suiteSelectEnv(t)
	t.Logf("end-to-end suite on the %s environment", env.name)
	brokers := []struct {
		name string
		open func(t *testing.T, env suiteEnv) suiteBroker
	}{
		{"kafka", suiteOpenKafka},
		{"rabbitmq", suiteOpenRabbitMQ},
	}
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			broker := b.open(t, env)
			for _, s := range suiteScenarios {
				t.Run(s.name, func(t *testing.T) { s.run(t, env, broker) })
			}
		})
	}
}

// suiteSelectEnv returns the docker environment when a Docker daemon
// answers, and the local one otherwise.
func suiteSelectEnv(t *testing.T) suiteEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reason := suiteDockerUnavailable(ctx)
	if reason == "" {
		return suiteDockerEnv(t)
	}
	t.Logf("not using Docker: %s; using the local services", reason)
	return suiteLocalEnv("no Docker daemon for testcontainers (" + reason + ")")
}

// suiteLocalEnv returns the environment of the local services. noDocker
// says why Docker is not used, for the skip messages.
func suiteLocalEnv(noDocker string) suiteEnv {
	return suiteEnv{
		name:      "local",
		redisAddr: func(t testing.TB) string { t.Helper(); return testenv.RedisAddr(suiteWhy{t, noDocker}) },
		amqpURL:   func(t testing.TB) string { t.Helper(); return testenv.AMQPURL(suiteWhy{t, noDocker}) },
		kafkaBrokers: func(t testing.TB) []string {
			t.Helper()
			if brokers := testenv.KafkaBrokers(); len(brokers) > 0 {
				return brokers
			}
			c, err := kfake.NewCluster(
				kfake.NumBrokers(1),
				kfake.AllowAutoTopicCreation(),
				kfake.GroupMinSessionTimeout(100*time.Millisecond),
			)
			if err != nil {
				t.Fatalf("starting kfake: %v", err)
			}
			t.Cleanup(c.Close)
			return c.ListenAddrs()
		},
		kafkaSessionTimeout: suiteLocalSessionTimeout(),
	}
}

func suiteLocalSessionTimeout() time.Duration {
	if len(testenv.KafkaBrokers()) > 0 {
		return 6 * time.Second
	}
	return time.Second
}

// suiteWhy adds to the skip or failure message of a missing service that
// Docker was not available either, so that the message names everything
// that is missing.
type suiteWhy struct {
	testing.TB
	noDocker string
}

func (w suiteWhy) Skipf(format string, args ...any) {
	w.TB.Helper()
	w.TB.Skipf(format+"; and %s", append(args, w.noDocker)...)
}

func (w suiteWhy) Fatalf(format string, args ...any) {
	w.TB.Helper()
	w.TB.Fatalf(format+"; and %s", append(args, w.noDocker)...)
}

// suiteName returns a topic, queue, group or bucket name made of the test's
// name and a random suffix, unique across parallel test runs.
func suiteName(t testing.TB, prefix string) string {
	t.Helper()
	return testenv.Name(t, "suite-"+prefix)
}

// suiteLogger returns a logger that writes warnings and errors to t's log.
func suiteLogger(t testing.TB) *slog.Logger { return testenv.Logger(t, slog.LevelWarn) }

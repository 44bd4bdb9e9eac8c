package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// The images of the docker environment: the same as in docker-compose.yml.
const (
	suiteRedisImage    = "redis:7"
	suiteKafkaImage    = "apache/kafka:3.9.1"
	suiteRabbitMQImage = "rabbitmq:3-management"
)

// suiteDockerUnavailable returns "" when a Docker daemon answers, and
// otherwise why the suite does not use Docker.
//
// It first dials the daemon's socket itself, with ctx's deadline, and asks
// testcontainers only when one answers: testcontainers' own discovery has no
// deadline of its own and would log and retry. Nothing here starts a
// container, so testcontainers' reaper (Ryuk) never runs without Docker.
func suiteDockerUnavailable(ctx context.Context) string {
	switch v := strings.ToLower(os.Getenv("THROTTLE_TEST_DOCKER")); v {
	case "off", "0", "false", "no":
		return "THROTTLE_TEST_DOCKER=" + v
	}
	var failed []string
	answered := false
	for _, ep := range suiteDockerEndpoints() {
		if err := suiteDialDocker(ctx, ep); err != nil {
			failed = append(failed, err.Error())
			continue
		}
		answered = true
		break
	}
	if !answered && !suiteDockerContextSet() {
		return "no Docker daemon at " + strings.Join(failed, ", ") + "; set DOCKER_HOST to use another"
	}

	errc := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				errc <- fmt.Errorf("testcontainers: %v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			errc <- err
			return
		}
		errc <- p.Health(ctx) // Health closes p
	}()
	select {
	case err := <-errc:
		if err != nil {
			return "the Docker daemon does not answer: " + err.Error()
		}
		return ""
	case <-ctx.Done():
		return "the Docker daemon does not answer: " + ctx.Err().Error()
	}
}

// suiteDockerEndpoints returns the Docker endpoints to try, in the order
// testcontainers does: DOCKER_HOST, the testcontainers properties file, and
// the usual socket paths (system, rootless, Docker Desktop).
func suiteDockerEndpoints() []string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return []string{h}
	}
	home, _ := os.UserHomeDir()
	if h := suiteTestcontainersHost(filepath.Join(home, ".testcontainers.properties")); h != "" {
		return []string{h}
	}
	eps := []string{"unix:///var/run/docker.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		eps = append(eps, "unix://"+filepath.Join(d, "docker.sock"))
	}
	eps = append(eps, fmt.Sprintf("unix:///run/user/%d/docker.sock", os.Getuid()))
	if home != "" {
		eps = append(eps,
			"unix://"+filepath.Join(home, ".docker", "run", "docker.sock"),
			"unix://"+filepath.Join(home, ".docker", "desktop", "docker.sock"))
	}
	return eps
}

// suiteTestcontainersHost returns tc.host or docker.host from the
// testcontainers properties file at path, or "".
func suiteTestcontainersHost(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			props[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if h := props["tc.host"]; h != "" {
		return h
	}
	return props["docker.host"]
}

// suiteDockerContextSet reports whether a Docker CLI context other than the
// default may point at a daemon that the socket paths do not cover.
func suiteDockerContextSet() bool {
	if c := os.Getenv("DOCKER_CONTEXT"); c != "" && c != "default" {
		return true
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return false
	}
	data, err := os.ReadFile(filepath.Join(home, ".docker", "config.json"))
	if err != nil {
		return false
	}
	var cfg struct {
		CurrentContext string `json:"currentContext"`
	}
	return json.Unmarshal(data, &cfg) == nil && cfg.CurrentContext != "" && cfg.CurrentContext != "default"
}

// suiteDialDocker checks that something listens at a Docker endpoint:
// unix://PATH or tcp://HOST:PORT. Other schemes (npipe, ssh) are left to
// testcontainers.
func suiteDialDocker(ctx context.Context, endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("%s (%w)", endpoint, err)
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		network, addr = "unix", u.Path
		if _, err := os.Stat(addr); err != nil {
			return fmt.Errorf("%s (%w)", endpoint, errors.Unwrap(err))
		}
	case "tcp", "http", "https":
		network, addr = "tcp", u.Host
	default:
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("%s (%w)", endpoint, err)
	}
	return c.Close()
}

// suiteDockerEnv starts Redis, Kafka and RabbitMQ containers, in parallel,
// for the whole suite; they are removed when t ends. A container that does
// not start fails t: the daemon answered, so Docker was meant to be used.
func suiteDockerEnv(t *testing.T) suiteEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var (
		wg                         sync.WaitGroup
		redisAddr, amqpURL, broker string
		errs                       = make([]error, 3)
	)
	wg.Add(3)
	go func() { defer wg.Done(); redisAddr, errs[0] = suiteStartRedis(ctx, t) }()
	go func() { defer wg.Done(); amqpURL, errs[1] = suiteStartRabbitMQ(ctx, t) }()
	go func() { defer wg.Done(); broker, errs[2] = suiteStartKafka(ctx, t) }()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("a Docker daemon answers but the suite's containers did not start (THROTTLE_TEST_DOCKER=off uses the local services instead): %v", err)
	}
	return suiteEnv{
		name:                "docker",
		redisAddr:           func(testing.TB) string { return redisAddr },
		amqpURL:             func(testing.TB) string { return amqpURL },
		kafkaBrokers:        func(testing.TB) []string { return []string{broker} },
		kafkaSessionTimeout: time.Second, // the container lowers the broker's minimum
	}
}

func suiteStartRedis(ctx context.Context, t *testing.T) (string, error) {
	ctr, err := testcontainers.Run(ctx, suiteRedisImage,
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections"), wait.ForListeningPort("6379/tcp")),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		return "", fmt.Errorf("redis container: %w", err)
	}
	addr, err := ctr.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		return "", fmt.Errorf("redis container: %w", err)
	}
	return addr, nil
}

func suiteStartRabbitMQ(ctx context.Context, t *testing.T) (string, error) {
	// The guest user may connect only from the loopback interface, and the
	// test connects through a published port: use another user.
	ctr, err := testcontainers.Run(ctx, suiteRabbitMQImage,
		testcontainers.WithExposedPorts("5672/tcp"),
		testcontainers.WithEnv(map[string]string{"RABBITMQ_DEFAULT_USER": "throttle", "RABBITMQ_DEFAULT_PASS": "throttle"}),
		testcontainers.WithWaitStrategyAndDeadline(3*time.Minute,
			wait.ForLog("Server startup complete"), wait.ForListeningPort("5672/tcp")),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		return "", fmt.Errorf("rabbitmq container: %w", err)
	}
	addr, err := ctr.PortEndpoint(ctx, "5672/tcp", "")
	if err != nil {
		return "", fmt.Errorf("rabbitmq container: %w", err)
	}
	return "amqp://throttle:throttle@" + addr + "/", nil
}

// suiteKafkaListenersFile is where the Kafka container's command waits for
// the advertised listeners, which include the host port Docker maps, known
// only once the container runs.
const suiteKafkaListenersFile = "/tmp/advertised-listeners"

// suiteStartKafka starts a single KRaft node. Clients on the host reach it on
// the mapped port of its PLAINTEXT listener (9092); BROKER (9093) is its own
// inter-broker listener and CONTROLLER (9094) the KRaft quorum's.
func suiteStartKafka(ctx context.Context, t *testing.T) (string, error) {
	ctr, err := testcontainers.Run(ctx, suiteKafkaImage,
		testcontainers.WithExposedPorts("9092/tcp"),
		testcontainers.WithEnv(map[string]string{
			"CLUSTER_ID":                                     "5L6g3nShT-eMCtK--X86sw",
			"KAFKA_NODE_ID":                                  "1",
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_LISTENERS":                                "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,CONTROLLER://0.0.0.0:9094",
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
			"KAFKA_INTER_BROKER_LISTENER_NAME":               "BROKER",
			"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9094",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
			"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":             "1",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
			// Lets the replicas use a 1s session timeout, as on kfake.
			"KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "500",
		}),
		testcontainers.WithEntrypoint("sh"),
		testcontainers.WithCmd("-c", "while [ ! -s "+suiteKafkaListenersFile+" ]; do sleep 0.1; done; "+
			"export KAFKA_ADVERTISED_LISTENERS=\"$(cat "+suiteKafkaListenersFile+")\"; exec /etc/kafka/docker/run"),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{func(ctx context.Context, c testcontainers.Container) error {
				if err := wait.ForMappedPort("9092/tcp").WaitUntilReady(ctx, c); err != nil {
					return fmt.Errorf("waiting for the mapped port: %w", err)
				}
				endpoint, err := c.PortEndpoint(ctx, "9092/tcp", "")
				if err != nil {
					return err
				}
				listeners := "PLAINTEXT://" + endpoint + ",BROKER://localhost:9093"
				if err := c.CopyToContainer(ctx, []byte(listeners), suiteKafkaListenersFile, 0o644); err != nil {
					return fmt.Errorf("writing the advertised listeners: %w", err)
				}
				return wait.ForLog("Kafka Server started").WithStartupTimeout(3*time.Minute).WaitUntilReady(ctx, c)
			}},
		}),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		return "", fmt.Errorf("kafka container: %w", err)
	}
	endpoint, err := ctr.PortEndpoint(ctx, "9092/tcp", "")
	if err != nil {
		return "", fmt.Errorf("kafka container: %w", err)
	}
	return endpoint, nil
}

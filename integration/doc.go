// Package integration holds the end-to-end and fault tests of throttle.
// It has no API: its tests live in _test.go files, run with
//
//	go test ./integration/
//
// The seeded fault campaign's one implementation, shared by TestCampaign
// and the benchmark program's -campaign mode, is the package
// integration/campaign (docs/campaign.md).
//
// The end-to-end tests (suite_*_test.go, cli_*_test.go) run the consumers,
// sinks and the throttle binary against real brokers: the services that
// internal/testenv finds (Redis, RabbitMQ, PostgreSQL, and Kafka from
// KAFKA_BROKERS or an in-process kfake cluster), or containers where a
// Docker daemon runs.
//
// The fault tests (fault_*_test.go) never stop or reconfigure the shared
// services. Each starts its own servers on free loopback ports, in
// temporary directories, and kills, partitions or slows them: redis-server
// processes (single node, a Sentinel set of one master, one replica and
// three Sentinels, a three-master Cluster), kfake brokers, HTTP sinks,
// throttle processes, and TCP proxies from internal/faultproxy in front of
// Redis, Kafka and the shared RabbitMQ, so that a cut only ever breaks the
// test's own connections. Every fault test checks that every message was
// delivered or dead-lettered and none lost; the limiter-only ones check
// that every Wait was granted and that the counts add up. They log the
// rates and counts they measured (go test -v -run Fault ./integration/).
//
// A test skips when a program it needs (redis-server, redis-cli, go) or a
// service is missing, and fails instead when CI=true; see internal/testenv.
// Servers a test starts die with it: its cleanup kills them, and on Linux
// so does the kernel if the test binary itself is killed.
package integration

package rabbitmq

// The position headers: where a delivery came from. The consumer adds them
// to a message it dead-letters, beside consumer.HeaderError and
// consumer.HeaderAttempts.
const (
	HeaderOriginalQueue      = "x-throttle-original-queue"
	HeaderOriginalExchange   = "x-throttle-original-exchange"
	HeaderOriginalRoutingKey = "x-throttle-original-routing-key"
)

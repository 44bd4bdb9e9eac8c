package kafka

// The position headers: where a message was first consumed from. The
// consumer adds them to a message it dead-letters (beside
// consumer.HeaderError and consumer.HeaderAttempts) and to a copy it sets
// aside in the delay topic, which keeps them when it is set aside again and
// when it is dead-lettered from there.
const (
	HeaderOriginalTopic     = "x-throttle-original-topic"
	HeaderOriginalPartition = "x-throttle-original-partition"
	HeaderOriginalOffset    = "x-throttle-original-offset"
)

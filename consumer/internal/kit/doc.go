// Package kit is what the consumer backends (consumer/kafka,
// consumer/rabbitmq) share beyond package consumer's public surface, so
// that they behave alike and a library user reads only what they use:
//
//   - Processor, the per-message path: the middleware the Options ask for,
//     the retry policy (Process, RetryDelay, ErrHandlerPanic), the
//     MessageObserver and a rate-bounded log of sink failures, ending in
//     an Outcome (dead-letter headers, set-aside headers);
//   - WithDefaults, the Options with every default filled in;
//   - Lifecycle, the Run and Close contract (Run runs once, Close stops
//     it, consumer.ErrStopped);
//   - Backoff and Sleep, the one backoff of reconnects, dead-letter writes
//     and fetch errors;
//   - KeyQueue, which serializes the messages of one ordering key;
//   - the Observe functions, BacklogTotal.
//
// The paid-slot header and the set-aside error live one level down, in
// consumer/internal/setaside, which package consumer imports too.
package kit

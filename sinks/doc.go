// Package sinks defines where throttled messages go: the Sink interface and
// the way a sink tells the consumer whether a failure is worth retrying.
//
// The implementations live in subpackages, so that an importer pulls in only
// the clients it uses:
//
//   - sinks/httpsink posts each message to an HTTP endpoint: an SMS gateway,
//     a push service or a webhook.
//   - sinks/postgres inserts each message into a PostgreSQL table,
//     idempotently.
//   - sinks/stdout writes each message as one line of JSON.
//
// The guide in the repository shows each sink in use (docs/library.md,
// Sinks), and docs/providers.md the HTTP sink's presets and response rules.
//
// # Error classification
//
// A sink's Send returns nil when the message was delivered. Every error is
// classified with the consumer package's one classification, which the
// retry and dead-letter path relies on:
//
//   - An error wrapped with consumer.Permanent (tested with
//     consumer.IsPermanent, that is errors.Is(err, consumer.ErrPermanent))
//     means retrying cannot help: an HTTP 400, a payload the database
//     rejects. The consumer dead-letters the message at once.
//   - Every other error is retryable: the consumer retries it with backoff
//     and dead-letters the message only when the attempts are used up.
//   - A retryable error wrapped with consumer.RetryAfter (read with
//     consumer.RetryAfterOf) also says how long the destination asked to be
//     left alone, as an HTTP 429 with Retry-After does. The retry policy
//     waits at least that long, and the consumer.PushBack middleware pauses
//     the shared bucket for that long, so every replica slows down.
//
// A sink that is unsure returns a retryable error: a wrong "retryable"
// costs a few attempts before the message is dead-lettered, a wrong
// "permanent" dead-letters a message that could have been delivered.
//
// # Concurrency
//
// Every sink in this repository is safe for concurrent use: the consumers
// call Send from many goroutines at once. Sinks that hold connections also
// implement io.Closer; call Close once no Send is running (a second Close
// is harmless).
//
// # Contract tests
//
// sinks/internal/sinktest is one suite that every sink here passes: a
// message is delivered with its body (and key and headers where the
// destination keeps them), concurrent Sends each arrive once, a Send with
// an ended context fails retryably and delivers nothing, a Send to a
// destination that does not answer returns when its context ends, the
// sink's permanent and retryable failures are classified as such, and
// Close may be called twice. A new sink adds a harness and runs it.
package sinks

// Package consumer turns messages from a broker into throttled, at-least-once
// calls to a Handler.
//
// The broker backends live in subpackages (consumer/kafka and
// consumer/rabbitmq) so that an importer pulls in only the client it uses.
// This package holds what a program needs with either, and what makes them
// behave alike: the Message, Handler and Middleware types, the limiter
// adapter (NewLimiter), the Throttle and PushBack middleware, the error
// classification that decides between retry and dead-letter, the retry
// policy, Ordering, and Options, embedded in each backend's Config. The
// guide in the repository is docs/library.md.
//
// # Flow
//
// The flow for each message is: wait on the limiter for the message's cost,
// call the handler, then commit or ack only after the handler succeeded. A
// failed handler is retried with exponential backoff and jitter, each
// attempt throttled like the first; a permanent error, or the last failed
// attempt, sends the message to the dead-letter destination and only then
// commits or acks it. Every message ends either delivered or dead-lettered.
//
// # Limiting
//
// Options.Limiter is what each message waits on: a *limiter.Bucket for a
// bucket without keyed layers, or the limiter NewLimiter returns, which
// turns a message into a limiter.Request: its keys in the bucket's keyed
// layers (LimitOptions.Keys), its class (LimitOptions.Priority, see
// PriorityFromHeader) and the slots a delay layer already booked for it
// (see Throttle). A layer's refusal becomes what the consumer does with the
// message: dead_letter fails it permanently with HeaderLimit and
// HeaderLimitReason, delay sets it aside (SetAside). Options.Priority
// orders the messages a backend holds by the same classes (see Ordering).
// Layers and classes are described in docs/layers.md and docs/priority.md.
//
// # Errors
//
// A handler's error decides what happens next. Permanent (ErrPermanent) is
// dead-lettered at once; any other error is retried under the RetryPolicy.
// RetryAfter asks for the next attempt no sooner than a delay, and the
// PushBack middleware turns it into a pause of the shared bucket for every
// replica (Options.Pauser). SetAside asks for the message to come back
// later without counting an attempt: a backend that can set messages aside
// stores it in its delay topic or queue and acks or commits it. A handler
// that panics is recovered and its message dead-lettered.
//
// # Concurrency
//
// Handlers are called from many goroutines at once: Options.Concurrency
// bounds the messages handled at once, the same on every backend, in the
// order Options.Ordering allows. Options is a plain value; NewLimiter's limiter and the
// middleware are safe for concurrent use.
package consumer

// Package httpsink is a sink that delivers each message as an HTTP request,
// for SMS gateways, push services and webhooks.
//
// Presets, response rules and push-back as a configuration user sees
// them: docs/providers.md in the repository.
//
// # Request
//
// Each message becomes one request to Config.URL with Config.Method (POST by
// default) and Config.Headers, used as given. The body is the raw message
// payload, or the output of Config.BodyTemplate, a message template of
// package msgtmpl (the same data and functions as every other template over
// a message). This is how a form-encoded SMS request is built from a JSON
// event:
//
//	To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}
//
// and a reshaped JSON body for a push service:
//
//	{"token":{{json .JSON.device}}}
//
// A template that fails for a message (a missing JSON field or header, .JSON
// of a body that is not JSON, any other execution error) makes the message
// permanent: it is dead-lettered, never sent half-rendered.
//
// The URL may hold template actions too, with the same data, for an API
// that names the recipient in the path (APNs: /3/device/{{.JSON.token}}).
//
// # Presets
//
// Config.Preset fills in what a provider needs: twilio, vonage (Messages
// API), vonage_sms (the legacy SMS API), fcm (HTTP v1) or apns (HTTP/2,
// token-based). It sets the URL (Config.URL becomes the base URL, so tests
// can point a preset at a mock), the method, content type, body template,
// authentication and response rules; every field set in Config wins over
// the preset's. Credentials come from Config.Credentials or, for its zero
// fields, from the environment variables each preset names (see
// Credentials), and key files are read in New; they never appear in logs
// or errors. Sink.Check verifies them where the provider allows it
// without sending a message (twilio: the Account resource; fcm: fetching
// an access token).
//
// # Responses and errors
//
// Each response is classified by the first matching Rule of Config.Rules,
// then of the preset, then of DefaultRules, which keep the classification
// the sink always had:
//
//   - 2xx: delivered.
//   - 429: retryable, push back: the error carries the Retry-After delay
//     (seconds or an HTTP date) with consumer.RetryAfter, or
//     Config.DefaultRetryAfter without a usable one, capped at
//     Config.MaxRetryAfter. The consumer.PushBack middleware turns that
//     delay into a pause of the shared bucket for every replica.
//   - 408 and 5xx: retryable, carrying the Retry-After delay if there is
//     one.
//   - Any other status, redirects included (they are not followed): permanent.
//
// Rules can look at the status, headers and JSON body fields, so a provider
// that answers 200 with an error in the body (Vonage's legacy SMS API) is
// classified correctly. A rule may mark a permanent answer as "recipient
// gone"; the *StatusError then asks the consumer for the dead-letter header
// x-throttle-recipient-gone: true. Besides responses:
//
//   - Network errors and timeouts: retryable.
//   - A body or URL template that fails for a message: permanent.
//   - An authorizer that cannot get a token: retryable.
//
// Error texts name the method, the URL without its query and user
// information, the status, the rule when it is not a default one, and a
// short, truncated snippet of the response body. They never include
// request headers, where credentials live, nor the URL query, where some
// providers expect an API key. A response that is not delivered is a
// *StatusError, reachable with errors.As.
//
// # Connections
//
// The sink keeps its own connection pool: at most Config.MaxConns
// connections to the host, all of them kept alive and reused. Response
// bodies are drained (up to 64 KiB) and closed so that connections go back
// to the pool. Over HTTP/1.1 a connection carries one request at a time,
// so MaxConns also bounds the Sends in flight: beyond it a Send waits for
// a connection, within its Timeout. Give it at least the consumer's
// concurrency where the provider is slow and allows that many connections.
package httpsink

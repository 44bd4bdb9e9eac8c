// Package stdout is a sink that writes each message as one line of JSON, for
// trying things out and for piping into other tools.
//
// # Format
//
// Each line is one object:
//
//	{"key":"k1","body":{"to":"+15550100"},"headers":{"h":"v"},"source":{"broker":"kafka","topic":"t","partition":0,"offset":7},"attempt":1}
//
// The body is embedded as JSON when it is valid JSON and as a string
// otherwise. The key is a string; bytes that are not valid UTF-8 become
// U+FFFD, so use another sink when keys are binary.
//
// # Concurrency
//
// A Sink is safe for concurrent use: each line is written with a single
// Write call under a mutex, so lines never interleave.
package stdout

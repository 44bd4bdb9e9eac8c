// Package config loads, expands, defaults, validates and redacts the YAML
// configuration of the throttle binary.
//
// A configuration file looks like this (every key is optional unless noted;
// see the field documentation for defaults and rules):
//
//	redis:
//	  addr: 127.0.0.1:6379
//	  password: "${REDIS_PASSWORD:-}"
//	  timeout: 250ms
//	limit:
//	  bucket: sms-outbound   # required
//	  rate: 100              # required, tokens per second
//	  burst: 200
//	source:                  # exactly one of kafka, rabbitmq
//	  kafka:
//	    brokers: ["127.0.0.1:9092"]
//	    topic: sms
//	    group: sms-sender
//	sink:                    # exactly one of http, postgres, stdout
//	  http:
//	    url: "http://127.0.0.1:8080/send"
//	delivery:
//	  max_attempts: 5
//	metrics:
//	  listen: 127.0.0.1:9464
//	log:
//	  level: info
//
// # Environment variables
//
// Scalar values may reference environment variables as ${NAME}. A reference
// to a variable that is not set is an error naming the key and the
// variable. ${NAME:-default} uses default (which may be empty) when NAME is
// unset or empty; the default is taken literally, up to the first "}". $$
// stands for a literal $, and a $ that is not followed by "{" or "$" is kept
// as is. Expansion works on the parsed YAML tree, never on the raw text, so
// a variable's value cannot change the structure of the document. It happens
// before values are converted to their Go types, so "rate: ${RATE:-100}"
// works, and a value that expands to the empty string in a non-string field
// is treated as absent. Mapping keys are never expanded.
//
// # Errors
//
// Unknown keys, values of the wrong type, bad durations and unset variables
// are all reported together, and so are validation failures; either way
// Parse returns a *ValidationError whose problems each name the dotted key
// they concern, such as "limit.rate" or "source.kafka.brokers[0]".
//
// # Secrets
//
// Error messages never echo password values. Use [Config.Redacted] or
// [Config.String] to log a configuration, and [RedactURL] to log a URL or
// connection string.
package config

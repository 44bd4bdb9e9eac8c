// Package config is the YAML model of the throttle binary: it loads,
// expands, validates and redacts the binary's configuration file, and maps
// it onto the configurations of the libraries it drives
// ([Config.Libraries]). The binary builds its pipeline from that mapping
// and nothing else, so a program may load the binary's YAML, build the
// same way, and get the same consumer.
//
// Every key, with its default, is listed in docs/configuration.md in the
// repository (a test keeps that page complete, and every YAML example of
// the documentation valid). A configuration file looks like this (every
// key is optional unless noted; see the field documentation for defaults
// and rules):
//
//	redis:
//	  addr: 127.0.0.1:6379
//	  password: "${REDIS_PASSWORD:-}"
//	  timeout: 250ms
//	limit:
//	  bucket: sms-outbound   # required
//	  rate: 100              # required: per second, or "6000/min", "5/h", "200000/d"
//	  burst: 200             # omit for the default; 0 is an error
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
// is treated as absent. Mapping keys are never expanded. Expansion happens
// here only: the libraries take values as given, so a secret holding "$" is
// never expanded twice. In a YAML flow mapping ({...}) a value holding
// ${NAME} must be quoted, since "{" is YAML syntax there.
//
// # One source of truth
//
// config holds no rule and no default of its own about what the libraries
// take. [Config.Libraries] is the one mapping of the YAML onto their
// configurations (redislimiter.Config, the limiter.Layer list,
// limiter.Options, consumer.LimitOptions, kafka.Config or rabbitmq.Config
// with their consumer.Options, httpsink.Config or postgres.Config): each
// key lands in one library field, and a value only travels from the file
// down to the library that uses it. The libraries validate and default
// what they are given: a zero field means the library's default, and
// [Config.Validate] checks the mapped result with each library's exported
// validation (redislimiter.Config.Validate, limiter.Options.Validate,
// limiter.Layers.Validate, consumer.LimitOptions.Validate,
// kafka.Config.Validate, rabbitmq.Config.Validate,
// httpsink.Config.Validate, postgres.Config.Validate). Library errors name
// Go fields; config reports them under the YAML key. What config checks
// itself is the YAML: the shape of the document, the values a key may
// take where the library's field is not a string (lease, start_offset,
// sasl.mechanism), templates, classes and time zones, the
// Redis connection, metrics and log, and that exactly one source and one
// sink are set. Where 0 means nothing (burst, timeouts, concurrency, ...),
// writing 0 in YAML is an error naming the key, while leaving the key out
// gives the default.
//
// # Errors
//
// Unknown keys, values of the wrong type, bad durations and unset variables
// are all reported together, and so are validation failures; either way
// Parse returns a *ValidationError whose problems each name the dotted key
// they concern, such as "limit.rate" or "source.kafka.brokers[0]", and the
// line of that key when it is in the document (Problem.Line).
//
// # Secrets
//
// Error messages never echo password values. Use [Config.Redacted] or
// [Config.String] to log a configuration, and [RedactURL] to log a URL or
// connection string; secrets become "xxxxx" (internal/redact, the one
// implementation).
package config

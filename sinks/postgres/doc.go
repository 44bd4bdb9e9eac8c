// Package postgres is a sink that inserts each message as a row of a
// PostgreSQL table, idempotently, with github.com/jackc/pgx/v5.
//
// In the binary: sink.postgres (docs/configuration.md in the repository).
//
// # Table
//
// The table has these columns (see DDL):
//
//	id          text PRIMARY KEY     -- the message id, see below
//	payload     jsonb                -- the body, when it is valid JSON
//	payload_raw bytea                -- the body, when it is not
//	key         bytea                -- the Kafka key or AMQP routing key
//	headers     jsonb NOT NULL       -- the message headers
//	source      jsonb NOT NULL       -- broker, topic, partition, offset, queue, ...
//	received_at timestamptz NOT NULL -- when the row was inserted (server clock)
//
// New checks at startup that the table exists with these columns and a
// unique index on id, so that a missing or wrong table is reported then and
// not at the first message. With Config.CreateTable it creates a missing
// table instead.
//
// A body that is valid JSON but that jsonb refuses (the escape \u0000, an
// unpaired UTF-16 surrogate such as \ud800, or anything else the server
// rejects as invalid jsonb input) is stored in payload_raw like any other
// body that is not JSON, never dead-lettered. Header names and values keep
// their text, except that NUL bytes, which jsonb cannot hold, become
// U+FFFD, as bytes that are not UTF-8 already do.
//
// # Idempotency
//
// Every insert is INSERT ... ON CONFLICT (id) DO NOTHING, so a redelivered
// message never adds a second row. The id is the first of these that
// applies (see MessageID):
//
//  1. The value of the header named by Config.IDHeader, when set and
//     non-empty on the message. Use it when producers stamp their own ids.
//  2. The AMQP message-id property, when the publisher set one.
//  3. For Kafka, "topic/partition/offset", which names one record.
//  4. Otherwise (an AMQP message without a message-id): "sha256:" and the
//     hex SHA-256 of the key, body and headers, leaving out the x-death
//     family that RabbitMQ adds on each dead-letter cycle. Redeliveries of
//     the same message then map to one row; the trade-off is that two
//     distinct messages with identical content are also stored once.
//
// # Errors
//
// Connection failures, timeouts, serialization failures, deadlocks, lock
// timeouts and every other error not listed here are retryable. Data
// exceptions (SQLSTATE class 22, such as invalid input), integrity
// violations (class 23, such as a NOT NULL or CHECK constraint; the
// conflict on id is never an error) and program limits (class 54, such as a
// row too large) are permanent: the message itself is at fault and
// retrying cannot help.
//
// No error of this package contains the DSN's password.
package postgres

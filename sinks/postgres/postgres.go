// Package postgres is a sink that inserts each message as a row of a
// PostgreSQL table, idempotently, with github.com/jackc/pgx/v5.
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
// JSON bodies holding the escape \u0000 are stored in payload_raw, because
// jsonb cannot hold that character.
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

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/internal/msgjson"
)

// Config configures a Sink.
type Config struct {
	// DSN is the connection string, as a URL (postgres://...) or in
	// key=value form; the standard PG* environment variables fill in what
	// it leaves out. It is required.
	DSN string
	// Table is the table to insert into: an unquoted identifier
	// ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes), optionally qualified as
	// schema.table. It is required.
	Table string
	// CreateTable creates the table at startup when it does not exist.
	CreateTable bool
	// IDHeader names the header holding a message's idempotency id. Empty
	// means no header is consulted.
	IDHeader string
	// MaxConns bounds the open connections; a Send beyond it waits for a
	// free one. Default 8.
	MaxConns int
}

// DefaultMaxConns is the default of Config.MaxConns.
const DefaultMaxConns = 8

// Sink inserts messages into a table. It is safe for concurrent use; it
// holds a connection pool, which Close releases.
type Sink struct {
	pool     *pgxpool.Pool
	table    string // quoted
	insert   string
	idHeader string
	secrets  []string
}

// columns are the columns a table needs, with the types accepted for each
// as format_type spells them.
var columns = []struct {
	name  string
	types []string
}{
	{"id", []string{"text", "character varying"}},
	{"payload", []string{"jsonb", "json"}},
	{"payload_raw", []string{"bytea"}},
	{"key", []string{"bytea"}},
	{"headers", []string{"jsonb", "json"}},
	{"source", []string{"jsonb", "json"}},
	{"received_at", []string{"timestamp with time zone"}},
}

// New connects to the database and checks the table, creating it first
// when cfg.CreateTable is set. It fails, with an error naming the problem,
// when the DSN is invalid, the database is unreachable, or the table is
// missing or lacks a needed column or the unique index on id.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if cfg.DSN == "" {
		return nil, errors.New("postgres sink: dsn is required")
	}
	ident, err := parseTable(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: %w", err)
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("postgres sink: max_conns %d is negative", cfg.MaxConns)
	}
	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	secrets := dsnSecrets(cfg.DSN)
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		// Not wrapped: the parse error carries the DSN.
		return nil, fmt.Errorf("postgres sink: dsn: %s", parseErrorText(err, secrets))
	}
	if pw := pcfg.ConnConfig.Password; pw != "" {
		secrets = append(secrets, pw)
	}
	pcfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, redactErr(fmt.Errorf("postgres sink: creating pool: %w", err), secrets)
	}
	s := &Sink{
		pool:     pool,
		table:    ident.Sanitize(),
		idHeader: cfg.IDHeader,
		secrets:  secrets,
	}
	s.insert = "INSERT INTO " + s.table +
		" (id, payload, payload_raw, key, headers, source, received_at)" +
		" VALUES ($1, $2, $3, $4, $5, $6, now()) ON CONFLICT (id) DO NOTHING"
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		s.pool.Close()
		return nil, redactErr(fmt.Errorf("postgres sink: connecting: %w", err), secrets)
	}
	err = s.check(ctx, conn.Conn(), cfg)
	conn.Release()
	if err != nil {
		s.pool.Close()
		return nil, redactErr(fmt.Errorf("postgres sink: %w", err), secrets)
	}
	return s, nil
}

// Close waits for Sends in progress and closes every connection. A Send
// after Close fails.
func (s *Sink) Close() error {
	s.pool.Close()
	return nil
}

// check verifies, and with cfg.CreateTable creates, the table.
func (s *Sink) check(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	exists, err := s.exists(ctx, conn)
	if err != nil {
		return err
	}
	if !exists {
		ddl := createSQL(s.table)
		if !cfg.CreateTable {
			return fmt.Errorf("table %q does not exist (set create_table: true or create it with: %s)", cfg.Table, ddl)
		}
		if _, err := conn.Exec(ctx, ddl); err != nil {
			// Another replica may have created it at the same moment.
			if exists, err2 := s.exists(ctx, conn); err2 != nil || !exists {
				return fmt.Errorf("creating table %q: %w", cfg.Table, err)
			}
		}
	}

	rows, err := conn.Query(ctx,
		`SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		 WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, s.table)
	if err != nil {
		return fmt.Errorf("reading the columns of table %q: %w", cfg.Table, err)
	}
	have := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			rows.Close()
			return fmt.Errorf("reading the columns of table %q: %w", cfg.Table, err)
		}
		have[name] = typ
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the columns of table %q: %w", cfg.Table, err)
	}
	var problems []string
	for _, c := range columns {
		typ, ok := have[c.name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("column %s is missing", c.name))
		case !contains(c.types, typ):
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", c.name, typ, strings.Join(c.types, " or ")))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("table %q does not fit: %s (the sink expects: %s)", cfg.Table, strings.Join(problems, "; "), createSQL(s.table))
	}

	var unique bool
	err = conn.QueryRow(ctx,
		`SELECT EXISTS (
		   SELECT 1 FROM pg_index i
		   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		   WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indnatts = 1
		     AND i.indpred IS NULL AND a.attname = 'id')`, s.table).Scan(&unique)
	if err != nil {
		return fmt.Errorf("reading the indexes of table %q: %w", cfg.Table, err)
	}
	if !unique {
		return fmt.Errorf("table %q has no primary key or unique index on id alone, which the idempotent insert needs", cfg.Table)
	}
	return nil
}

func (s *Sink) exists(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.table).Scan(&exists); err != nil {
		return false, fmt.Errorf("looking up table %s: %w", s.table, err)
	}
	return exists, nil
}

// Send inserts msg, or does nothing when a row with its id exists already.
func (s *Sink) Send(ctx context.Context, msg consumer.Message) error {
	id := MessageID(msg, s.idHeader)
	var payload, payloadRaw any
	if msgjson.IsJSON(msg.Body) && !bytes.Contains(msg.Body, []byte(`\u0000`)) {
		payload = string(msg.Body)
	} else {
		payloadRaw = msg.Body
		if msg.Body == nil {
			payloadRaw = []byte{}
		}
	}
	headers := msg.Headers
	if headers == nil {
		headers = map[string]string{}
	}
	hdrJSON, err := json.Marshal(headers)
	if err != nil {
		return consumer.Permanent(fmt.Errorf("encoding headers of message %q: %w", id, err))
	}
	srcJSON, err := json.Marshal(msgjson.FromSource(msg.Source))
	if err != nil {
		return consumer.Permanent(fmt.Errorf("encoding source of message %q: %w", id, err))
	}
	_, err = s.pool.Exec(ctx, s.insert, id, payload, payloadRaw, msg.Key, string(hdrJSON), string(srcJSON))
	if err != nil {
		return classify(redactErr(fmt.Errorf("inserting message %q into %s: %w", id, s.table, err), s.secrets))
	}
	return nil
}

// classify marks the errors that retrying cannot fix as permanent.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return err
	}
	switch pgErr.Code[:2] {
	case "22", // data exception
		"23", // integrity constraint violation
		"54": // program limit exceeded
		return consumer.Permanent(err)
	}
	return err
}

// MessageID returns the idempotency id of msg, the primary key of its row,
// following the order in the package documentation. idHeader may be empty.
func MessageID(msg consumer.Message, idHeader string) string {
	if idHeader != "" {
		if v := msg.Headers[idHeader]; v != "" {
			return v
		}
	}
	if msg.Source.MessageID != "" {
		return msg.Source.MessageID
	}
	if msg.Source.Broker == "kafka" {
		return msg.Source.Topic + "/" + strconv.Itoa(msg.Source.Partition) + "/" + strconv.FormatInt(msg.Source.Offset, 10)
	}
	return contentID(msg)
}

// contentID hashes the key, body and headers, each length-prefixed so that
// moving bytes between them changes the hash.
func contentID(msg consumer.Message) string {
	h := sha256.New()
	write := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	write(msg.Key)
	write(msg.Body)
	names := make([]string, 0, len(msg.Headers))
	for name := range msg.Headers {
		if !isDeathHeader(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		write([]byte(name))
		write([]byte(msg.Headers[name]))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// isDeathHeader reports whether name is one of the headers RabbitMQ adds
// or updates each time a message is dead-lettered.
func isDeathHeader(name string) bool {
	return name == "x-death" || strings.HasPrefix(name, "x-first-death-") || strings.HasPrefix(name, "x-last-death-")
}

// DDL returns the CREATE TABLE statement for a table the sink can use, as
// New runs it with Config.CreateTable. It fails when table is not a valid
// name as Config.Table describes.
func DDL(table string) (string, error) {
	ident, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return createSQL(ident.Sanitize()), nil
}

func createSQL(quoted string) string {
	return "CREATE TABLE IF NOT EXISTS " + quoted + " (" +
		"id text PRIMARY KEY, payload jsonb, payload_raw bytea, key bytea, " +
		"headers jsonb NOT NULL, source jsonb NOT NULL, " +
		"received_at timestamptz NOT NULL DEFAULT now())"
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseTable validates a table name, optionally schema-qualified.
func parseTable(table string) (pgx.Identifier, error) {
	if table == "" {
		return nil, errors.New("table is required")
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table %q: want table or schema.table", table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) || len(p) > 63 {
			return nil, fmt.Errorf("table %q: %q is not an unquoted identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)", table, p)
		}
	}
	return pgx.Identifier(parts), nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// dsnSecrets finds the password candidates in a DSN, even a malformed one,
// so that they can be masked in error texts. It over-approximates: masking
// too much is harmless. PGPASSWORD is included, since pgx uses it.
func dsnSecrets(dsn string) []string {
	var out []string
	if pw := os.Getenv("PGPASSWORD"); pw != "" {
		out = append(out, pw)
	}
	if _, rest, ok := strings.Cut(dsn, "://"); ok {
		// URL form: the password sits between the first ':' of the
		// userinfo and the last '@' before the path.
		if i := strings.IndexByte(rest, '/'); i >= 0 && strings.LastIndexByte(rest[:i], '@') >= 0 {
			rest = rest[:i]
		}
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
				out = append(out, pw)
			}
		}
	}
	// password=... and sslpassword=..., in key=value form or in a URL query.
	for _, m := range passwordKV.FindAllStringSubmatch(dsn, -1) {
		for _, v := range m[1:] {
			if v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

var passwordKV = regexp.MustCompile(`(?i)password=(?:'((?:[^'\\]|\\.)*)'|([^\s&]*))`)

// parseErrorText describes a DSN parse error without quoting the DSN: in a
// malformed DSN nothing tells a password from the rest, so the DSN is left
// out rather than redacted. The rest of the text is redacted all the same.
func parseErrorText(err error, secrets []string) string {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return redact(err.Error(), secrets)
	}
	// The text is "cannot parse `DSN`: reason" or "... reason (inner)".
	text := pce.Error()
	inner := errors.Unwrap(pce)
	if inner != nil {
		text = strings.TrimSuffix(text, " ("+inner.Error()+")")
	}
	if i := strings.LastIndex(text, "`: "); i >= 0 {
		text = "invalid connection string: " + text[i+len("`: "):]
	} else {
		text = "invalid connection string"
	}
	if inner != nil {
		text += " (" + inner.Error() + ")"
	}
	return redact(text, secrets)
}

// redact masks every secret in text.
func redact(text string, secrets []string) string {
	for _, s := range secrets {
		if s != "" {
			text = strings.ReplaceAll(text, s, "xxxxx")
		}
	}
	return text
}

// redactErr masks the secrets in err's text while keeping err in the chain
// for errors.Is and errors.As.
func redactErr(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	text := redact(err.Error(), secrets)
	if text == err.Error() {
		return err
	}
	return &redactedError{text: text, err: err}
}

type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }

package postgres

import (
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
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/redact"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/internal/msgjson"
	"github.com/throttlehq/throttle/sinks/internal/sinktrace"
)

// ErrNoTable is wrapped by the error of New when the table does not exist
// and Config.CreateTable is not set.
var ErrNoTable = errors.New("does not exist")

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
	spanName string // of an insert's client span
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

// Validate checks cfg without connecting, as New does first: the DSN must
// be given and parse (pgx's rules, PG* environment variables included), the
// table must be a valid name (see ValidateTable) and MaxConns must not be
// negative. It returns nil or every problem found, each a
// *sinks.FieldError naming the Go field at fault (joined with errors.Join;
// read them with sinks.FieldErrors). No error contains the DSN's password.
func (cfg Config) Validate() error {
	_, _, _, err := cfg.parse()
	return err
}

// parse validates cfg and returns the table, the pool configuration and
// the secrets to mask in error texts.
func (cfg Config) parse() (pgx.Identifier, *pgxpool.Config, []string, error) {
	var errs []error
	bad := func(field string, err error) {
		errs = append(errs, &sinks.FieldError{Field: field, Err: err})
	}
	var (
		pcfg    *pgxpool.Config
		secrets []string
	)
	if cfg.DSN == "" {
		bad("DSN", errors.New("required"))
	} else {
		secrets = dsnSecrets(cfg.DSN)
		var err error
		if scheme, _, _ := strings.Cut(cfg.DSN, "://"); redact.HasScheme(cfg.DSN) && scheme != "postgres" && scheme != "postgresql" {
			// pgx would take it for a key=value string and say only that
			// it is not one.
			bad("DSN", fmt.Errorf("URL scheme must be postgres or postgresql, got %q", scheme))
		} else if pcfg, err = pgxpool.ParseConfig(cfg.DSN); err != nil {
			// Not wrapped: the parse error carries the DSN.
			bad("DSN", errors.New(parseErrorText(err, secrets)))
		} else if pw := pcfg.ConnConfig.Password; pw != "" {
			secrets = append(secrets, pw)
		}
	}
	ident, err := parseTable(cfg.Table)
	if err != nil {
		bad("Table", err)
	}
	if cfg.MaxConns < 0 {
		bad("MaxConns", fmt.Errorf("must not be negative, got %d", cfg.MaxConns))
	}
	if len(errs) > 0 {
		return nil, nil, nil, errors.Join(errs...)
	}
	return ident, pcfg, secrets, nil
}

// ValidateTable returns an error unless table can be Config.Table: an
// unquoted identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes),
// optionally schema-qualified as schema.table.
// The error is a *sinks.FieldError for the field Table.
func ValidateTable(table string) error {
	if _, err := parseTable(table); err != nil {
		return &sinks.FieldError{Field: "Table", Err: err}
	}
	return nil
}

// New connects to the database and checks the table, creating it first
// when cfg.CreateTable is set. It fails, with an error naming the problem,
// when the DSN is invalid, the database is unreachable, or the table is
// missing or lacks a needed column or the unique index on id.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	ident, pcfg, secrets, err := cfg.parse()
	if err != nil {
		return nil, fmt.Errorf("postgres sink: %w", err)
	}
	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	pcfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("postgres sink: creating pool: %w", err), secrets...)
	}
	s := &Sink{
		pool:     pool,
		table:    ident.Sanitize(),
		spanName: "INSERT " + ident.Sanitize(),
		idHeader: cfg.IDHeader,
		secrets:  secrets,
	}
	s.insert = "INSERT INTO " + s.table +
		" (id, payload, payload_raw, key, headers, source, received_at)" +
		" VALUES ($1, $2, $3, $4, $5, $6, now()) ON CONFLICT (id) DO NOTHING"
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		s.pool.Close()
		return nil, redact.Error(fmt.Errorf("postgres sink: connecting: %w", err), secrets...)
	}
	err = s.check(ctx, conn.Conn(), cfg)
	conn.Release()
	if err != nil {
		s.pool.Close()
		return nil, redact.Error(fmt.Errorf("postgres sink: %w", err), secrets...)
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
			return fmt.Errorf("table %q %w (set Config.CreateTable, or create it with: %s)", cfg.Table, ErrNoTable, ddl)
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
// When ctx carries a span that records (a consumer's), the insert is a
// client span, "INSERT <table>", with the database semantic conventions'
// attributes.
func (s *Sink) Send(ctx context.Context, msg consumer.Message) (err error) {
	ctx, span := sinktrace.Start(ctx, s.spanName, s.spanAttrs)
	if span != nil {
		defer func() { sinktrace.End(span, err) }()
	}
	id := MessageID(msg, s.idHeader)
	var payload, payloadRaw any
	if jsonbAccepts(msg.Body) {
		payload = string(msg.Body)
	} else {
		payloadRaw = rawBody(msg.Body)
	}
	hdrJSON, err := json.Marshal(safeHeaders(msg.Headers))
	if err != nil {
		return consumer.Permanent(fmt.Errorf("encoding headers of message %q: %w", id, err))
	}
	srcJSON, err := json.Marshal(msgjson.FromSource(msg.Source))
	if err != nil {
		return consumer.Permanent(fmt.Errorf("encoding source of message %q: %w", id, err))
	}
	_, err = s.pool.Exec(ctx, s.insert, id, payload, payloadRaw, msg.Key, string(hdrJSON), string(srcJSON))
	if payload != nil && isDataException(err) {
		// The server refused the body as jsonb for a reason the check
		// above does not know: keep it as bytes, as any non-JSON body.
		_, err = s.pool.Exec(ctx, s.insert, id, nil, rawBody(msg.Body), msg.Key, string(hdrJSON), string(srcJSON))
	}
	if err != nil {
		return classify(redact.Error(fmt.Errorf("inserting message %q into %s: %w", id, s.table, err), s.secrets...))
	}
	return nil
}

// rawBody returns body for the payload_raw column: never NULL.
func rawBody(body []byte) []byte {
	if body == nil {
		return []byte{}
	}
	return body
}

// jsonbAccepts reports whether body is valid JSON that jsonb can hold: no
// \u0000 escape and no unpaired UTF-16 surrogate escape, which PostgreSQL
// refuses (SQLSTATE 22P05) although they are valid JSON.
func jsonbAccepts(body []byte) bool {
	if !msgjson.IsJSON(body) {
		return false
	}
	// In valid JSON a backslash occurs only inside strings, as an escape.
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		i++
		if body[i] != 'u' {
			continue
		}
		r := hex4(body[i+1 : i+5])
		i += 4
		switch {
		case r == 0:
			return false
		case r >= 0xDC00 && r <= 0xDFFF: // a low surrogate without a high one
			return false
		case r >= 0xD800 && r <= 0xDBFF: // a high surrogate needs a low one next
			if i+6 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' {
				return false
			}
			if lo := hex4(body[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 6
		}
	}
	return true
}

// hex4 decodes the four hex digits of a \u escape of valid JSON.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// safeHeaders returns headers fit for jsonb: never nil, with every NUL in
// a name or value replaced by U+FFFD.
func safeHeaders(headers map[string]string) map[string]string {
	if headers == nil {
		return map[string]string{}
	}
	var safe map[string]string
	for k, v := range headers {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			safe = make(map[string]string, len(headers))
			break
		}
	}
	if safe == nil {
		return headers
	}
	for k, v := range headers {
		safe[strings.ReplaceAll(k, "\x00", "\uFFFD")] = strings.ReplaceAll(v, "\x00", "\uFFFD")
	}
	return safe
}

// isDataException reports whether err is a PostgreSQL data exception
// (SQLSTATE class 22), such as invalid jsonb input.
func isDataException(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
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
	if err := ValidateTable(table); err != nil {
		return "", err
	}
	ident, _ := parseTable(table)
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
		return nil, errors.New("required")
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q: want table or schema.table", table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) || len(p) > 63 {
			if len(parts) == 1 {
				return nil, fmt.Errorf("%q is not an unquoted identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)", table)
			}
			return nil, fmt.Errorf("%q: %q is not an unquoted identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)", table, p)
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

// dsnSecrets finds the password candidates of a DSN, even a malformed one,
// so that they can be masked in error texts: what redact.Secrets finds, and
// PGPASSWORD, since pgx uses it.
func dsnSecrets(dsn string) []string {
	out := redact.Secrets(dsn)
	if pw := os.Getenv("PGPASSWORD"); pw != "" {
		out = append(out, pw)
	}
	return out
}

// parseErrorText describes a DSN parse error without quoting the DSN: in a
// malformed DSN nothing tells a password from the rest, so the DSN is left
// out rather than redacted. The rest of the text is redacted all the same.
func parseErrorText(err error, secrets []string) string {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return redact.Text(err.Error(), secrets...)
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
	return redact.Text(text, secrets...)
}

// spanAttrs returns the attributes of an insert's client span.
func (s *Sink) spanAttrs() []attribute.KeyValue {
	return []attribute.KeyValue{semconv.DBSystemNamePostgreSQL,
		semconv.DBOperationName("INSERT"), semconv.DBCollectionName(s.table)}
}

package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/sinks/postgres"
)

// db connects to the test database and returns a unique table name that is
// dropped when the test ends.
func db(t *testing.T) (dsn, table string, conn *pgx.Conn) {
	t.Helper()
	dsn = testenv.PostgresDSN(t)
	ctx := testenv.Context(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		testenv.Missing(t, "PostgreSQL", "check PGHOST/PGPORT or DATABASE_URL", err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_"))
	if len(name) > 40 {
		name = name[:40]
	}
	table = "sinktest_" + name + "_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("dropping %s: %v", table, err)
		}
		_ = conn.Close(ctx)
	})
	return dsn, table, conn
}

func newSink(t *testing.T, cfg postgres.Config) *postgres.Sink {
	t.Helper()
	s, err := postgres.New(testenv.Context(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type row struct {
	ID         string
	Payload    []byte // jsonb as text, or nil
	PayloadRaw []byte
	Key        []byte
	Headers    map[string]string
	Source     map[string]any
	Received   time.Time
}

func rows(t *testing.T, conn *pgx.Conn, table string) []row {
	t.Helper()
	r, err := conn.Query(context.Background(),
		"SELECT id, payload::text, payload_raw, key, headers, source, received_at FROM "+pgx.Identifier{table}.Sanitize()+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var out []row
	for r.Next() {
		var x row
		var payload *string
		if err := r.Scan(&x.ID, &payload, &x.PayloadRaw, &x.Key, &x.Headers, &x.Source, &x.Received); err != nil {
			t.Fatal(err)
		}
		if payload != nil {
			x.Payload = []byte(*payload)
		}
		out = append(out, x)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func kafkaMsg(offset int64, body string) consumer.Message {
	return consumer.Message{
		Key:     []byte("user-7"),
		Body:    []byte(body),
		Headers: map[string]string{"tenant": "acme"},
		Attempt: 1,
		Source:  consumer.Source{Broker: "kafka", Topic: "events", Partition: 0, Offset: offset},
	}
}

func TestInsertAndRedelivery(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true})
	ctx := testenv.Context(t, 30*time.Second)

	msg := kafkaMsg(5, `{"to": "+15550100", "n": 1}`)
	for attempt := 1; attempt <= 3; attempt++ { // a redelivery must not add rows
		msg.Attempt = attempt
		if err := s.Send(ctx, msg); err != nil {
			t.Fatalf("Send attempt %d: %v", attempt, err)
		}
	}
	got := rows(t, conn, table)
	if len(got) != 1 {
		t.Fatalf("%d rows, want 1", len(got))
	}
	r := got[0]
	var payload map[string]any
	if err := json.Unmarshal(r.Payload, &payload); err != nil || payload["to"] != "+15550100" {
		t.Errorf("payload = %s (%v), want the JSON body", r.Payload, err)
	}
	wantSource := map[string]any{"broker": "kafka", "topic": "events", "partition": float64(0), "offset": float64(5)}
	checks := []struct {
		name string
		ok   bool
	}{
		{"id is topic/partition/offset", r.ID == "events/0/5"},
		{"payload_raw is NULL", r.PayloadRaw == nil},
		{"key", string(r.Key) == "user-7"},
		{"headers", r.Headers["tenant"] == "acme" && len(r.Headers) == 1},
		{"source", fmt.Sprint(r.Source) == fmt.Sprint(wantSource)},
		{"received_at", time.Since(r.Received) < time.Hour && time.Since(r.Received) > -time.Hour},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: wrong in row %+v", c.name, r)
		}
	}
}

func TestPayloadColumns(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true})
	ctx := testenv.Context(t, 30*time.Second)

	bodies := map[int64]string{
		1: `{"a":1}`,
		2: "not json \xff\x00 bytes",
		3: `{"nul":"a\u0000b"}`, // valid JSON that jsonb cannot hold
		4: ``,
		5: `[1,2,3]`,
		// A regression: valid JSON that jsonb refuses (SQLSTATE 22P02,
		// 22P05, 22003) went to the dead letters.
		6:  `{"a":"\ud800"}`,       // a lone high surrogate
		7:  `{"a":"\udc00x"}`,      // a lone low surrogate
		8:  `{"a":"\ud800\u0041"}`, // a high surrogate followed by no low one
		9:  `{"a":1e1000000}`,      // overflows numeric: only the server knows
		10: `{"e":"\ud83d\ude00"}`, // a proper pair is fine for jsonb
		11: `{"path":"C:\\u0000"}`, // an escaped backslash, not an escape
	}
	for off, body := range bodies {
		if err := s.Send(ctx, kafkaMsg(off, body)); err != nil {
			t.Fatalf("Send %q: %v", body, err)
		}
	}
	got := rows(t, conn, table)
	if len(got) != len(bodies) {
		t.Fatalf("%d rows, want %d", len(got), len(bodies))
	}
	wantJSON := map[string]bool{"events/0/1": true, "events/0/5": true, "events/0/10": true, "events/0/11": true}
	for _, r := range got {
		var off int64
		fmt.Sscanf(r.ID, "events/0/%d", &off)
		body := bodies[off]
		if wantJSON[r.ID] {
			if r.Payload == nil || r.PayloadRaw != nil {
				t.Errorf("%s: payload=%q raw=%q, want jsonb only", r.ID, r.Payload, r.PayloadRaw)
			}
			continue
		}
		if r.Payload != nil || string(r.PayloadRaw) != body || r.PayloadRaw == nil {
			t.Errorf("%s: payload=%q raw=%q, want bytea %q only", r.ID, r.Payload, r.PayloadRaw, body)
		}
	}
}

func TestMessageIDDeduplication(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true, IDHeader: "x-event-id"})
	ctx := testenv.Context(t, 30*time.Second)

	amqp := func(id string, headers map[string]string) consumer.Message {
		return consumer.Message{Key: []byte("rk"), Body: []byte(`{"x":1}`), Headers: headers,
			Source: consumer.Source{Broker: "rabbitmq", Queue: "q", MessageID: id}}
	}
	sends := []consumer.Message{
		amqp("m-1", nil),
		amqp("m-1", nil), // redelivery, same message-id
		amqp("", map[string]string{"a": "1"}),
		amqp("", map[string]string{"a": "1", "x-death": "[count:1]"}), // redelivered through a DLX cycle
		amqp("", map[string]string{"a": "1", "x-death": "[count:2]"}), // and again
		amqp("", map[string]string{"a": "2"}),                         // different content
		amqp("m-2", map[string]string{"x-event-id": "evt-9"}),         // header wins
		kafkaMsg(1, `{}`), // topic/partition/offset
		func() consumer.Message { m := kafkaMsg(2, `{}`); m.Headers["x-event-id"] = "evt-9"; return m }(), // same event id from Kafka
	}
	for i, m := range sends {
		if err := s.Send(ctx, m); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	var ids []string
	for _, r := range rows(t, conn, table) {
		ids = append(ids, r.ID)
	}
	if len(ids) != 5 {
		t.Fatalf("ids %q: want 5 rows (m-1, two content hashes, evt-9, events/0/1)", ids)
	}
	want := []string{"events/0/1", "evt-9", "m-1"}
	for _, w := range want {
		if !strings.Contains(strings.Join(ids, " "), w) {
			t.Errorf("ids %q lack %q", ids, w)
		}
	}
	hashes := 0
	for _, id := range ids {
		if strings.HasPrefix(id, "sha256:") {
			hashes++
		}
	}
	if hashes != 2 {
		t.Errorf("ids %q: want 2 content ids", ids)
	}
}

func TestMissingTable(t *testing.T) {
	dsn, table, _ := db(t)
	_, err := postgres.New(testenv.Context(t, 30*time.Second), postgres.Config{DSN: dsn, Table: table})
	if err == nil {
		t.Fatal("New succeeded on a missing table")
	}
	if !errors.Is(err, postgres.ErrNoTable) {
		t.Errorf("error %v does not wrap ErrNoTable", err)
	}
	for _, want := range []string{fmt.Sprintf("table %q does not exist", table), "CreateTable", "CREATE TABLE IF NOT EXISTS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestCreateTableIsIdempotent(t *testing.T) {
	dsn, table, conn := db(t)
	cfg := postgres.Config{DSN: dsn, Table: "public." + table, CreateTable: true}
	var wg sync.WaitGroup
	for range 3 { // replicas starting together
		wg.Go(func() {
			s, err := postgres.New(testenv.Context(t, 30*time.Second), cfg)
			if err != nil {
				t.Errorf("New: %v", err)
				return
			}
			_ = s.Close()
		})
	}
	wg.Wait()
	// Now the table exists; a sink without CreateTable accepts it.
	s := newSink(t, postgres.Config{DSN: dsn, Table: table})
	if err := s.Send(testenv.Context(t, 10*time.Second), kafkaMsg(1, `{}`)); err != nil {
		t.Fatal(err)
	}
	if n := len(rows(t, conn, table)); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

func TestTableThatDoesNotFit(t *testing.T) {
	tests := []struct {
		name string
		ddl  string
		want []string
	}{
		{"missing columns", "CREATE TABLE %s (id text PRIMARY KEY, payload jsonb)",
			[]string{"column payload_raw is missing", "column received_at is missing", "does not fit"}},
		{"wrong type", "CREATE TABLE %s (id text PRIMARY KEY, payload text, payload_raw bytea, key bytea, headers jsonb, source jsonb, received_at timestamptz)",
			[]string{"column payload is text, want jsonb or json"}},
		{"no unique id", "CREATE TABLE %s (id text, payload jsonb, payload_raw bytea, key bytea, headers jsonb, source jsonb, received_at timestamptz)",
			[]string{"no primary key or unique index on id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dsn, table, conn := db(t)
			ctx := testenv.Context(t, 30*time.Second)
			if _, err := conn.Exec(ctx, fmt.Sprintf(tt.ddl, pgx.Identifier{table}.Sanitize())); err != nil {
				t.Fatal(err)
			}
			_, err := postgres.New(ctx, postgres.Config{DSN: dsn, Table: table, CreateTable: true})
			if err == nil {
				t.Fatal("New accepted the table")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestHeadersWithNUL is a regression test: a header
// value (or name) holding NUL, which jsonb cannot hold, failed the insert
// and dead-lettered the message. NUL becomes U+FFFD; the rest is kept.
func TestHeadersWithNUL(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true})
	msg := kafkaMsg(1, `{"a":1}`)
	msg.Headers = map[string]string{"x-nul": "a\x00b", "x\x00name": "v", "plain": "p"}
	if err := s.Send(testenv.Context(t, 30*time.Second), msg); err != nil {
		t.Fatalf("Send: %v", err)
	}
	got := rows(t, conn, table)
	if len(got) != 1 {
		t.Fatalf("%d rows, want 1", len(got))
	}
	want := map[string]string{"x-nul": "a\uFFFDb", "x\uFFFDname": "v", "plain": "p"}
	if fmt.Sprint(got[0].Headers) != fmt.Sprint(want) {
		t.Errorf("headers = %q, want %q", got[0].Headers, want)
	}
}

func TestPermanentErrors(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true, IDHeader: "id"})
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" ADD CHECK (key IS NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		msg  consumer.Message
		code string
	}{
		{"check constraint (class 23)", consumer.Message{Body: []byte(`{}`), Headers: map[string]string{"id": "a"}}, "23514"},
		{"invalid UTF-8 id (class 22)", consumer.Message{Key: []byte("k"), Headers: map[string]string{"id": "bad \xff"}}, "22021"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Send(ctx, tt.msg)
			if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), tt.code) {
				t.Fatalf("Send = %v, want a permanent error with SQLSTATE %s", err, tt.code)
			}
		})
	}
	// The sink still works after the failures.
	if err := s.Send(ctx, kafkaMsg(1, `{}`)); err != nil {
		t.Fatalf("Send after failures: %v", err)
	}
}

// withAppName tags the sink's connections so the test can find them in
// pg_stat_activity.
func withAppName(dsn, name string) string {
	switch {
	case !strings.Contains(dsn, "://"):
		return dsn + " application_name=" + name
	case strings.Contains(dsn, "?"):
		return dsn + "&application_name=" + name
	default:
		return dsn + "?application_name=" + name
	}
}

func backends(t *testing.T, conn *pgx.Conn, appName string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", appName).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConcurrentSends(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: withAppName(dsn, table), Table: table, CreateTable: true, MaxConns: 3})
	ctx := testenv.Context(t, 60*time.Second)
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			// Each message is sent twice, as a redelivery would.
			if err := s.Send(ctx, kafkaMsg(int64(i%30), `{"i":1}`)); err != nil {
				t.Errorf("Send: %v", err)
			}
		})
	}
	wg.Wait()
	if n := len(rows(t, conn, table)); n != 30 {
		t.Errorf("%d rows, want 30", n)
	}
	// Idle connections stay open, so the count shows how many were made.
	if n := backends(t, conn, table); n < 1 || n > 3 {
		t.Errorf("%d connections open, want 1..3 (MaxConns)", n)
	}
}

func TestConnectionLossIsRetryable(t *testing.T) {
	dsn, table, conn := db(t)
	s := newSink(t, postgres.Config{DSN: withAppName(dsn, table), Table: table, CreateTable: true, MaxConns: 1})
	ctx := testenv.Context(t, 30*time.Second)
	if err := s.Send(ctx, kafkaMsg(1, `{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", table); err != nil {
		t.Fatal(err)
	}
	err := s.Send(ctx, kafkaMsg(2, `{}`))
	if err == nil {
		t.Fatal("Send on a terminated connection succeeded")
	}
	if consumer.IsPermanent(err) {
		t.Fatalf("Send = %v, want a retryable error", err)
	}
	// The dead connection was dropped; the retry opens a new one.
	if err := s.Send(ctx, kafkaMsg(2, `{}`)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if n := len(rows(t, conn, table)); n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
}

func TestSendAfterClose(t *testing.T) {
	dsn, table, _ := db(t)
	s, err := postgres.New(testenv.Context(t, 30*time.Second), postgres.Config{DSN: dsn, Table: table, CreateTable: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := s.Send(context.Background(), kafkaMsg(1, `{}`)); err == nil {
		t.Fatal("Send after Close succeeded")
	}
}

func TestUnreachableDatabase(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	_, err := postgres.New(ctx, postgres.Config{DSN: "postgres://postgres:s3cret@127.0.0.1:1/test?sslmode=disable&connect_timeout=5", Table: "t"})
	if err == nil || !strings.Contains(err.Error(), "connecting") {
		t.Fatalf("New = %v, want a connection error", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error leaks the password: %v", err)
	}
}

func TestBadDSNDoesNotEchoPassword(t *testing.T) {
	dsns := []string{
		"postgres://postgres:s3cret@127.0.0.1:notaport/test",
		"postgres://postgres:s3cret@127.0.0.1:5432/test?sslmode=bogus",
		"postgres://postgres:s3cret@[::1/test",
		"postgres://postgres:s3cret@h@st:5432:9/test",
		"postgres://postgres:s3cret@127.0.0.1/test?password=s3cret&connect_timeout=x",
		"host=127.0.0.1 port=abc user=postgres password=s3cret",
		"host=127.0.0.1 user=postgres password='s3cret' sslmode=bogus",
		"host=127.0.0.1 password=s3cret connect_timeout=x",
		"port=x s3cret",
	}
	for _, dsn := range dsns {
		_, err := postgres.New(context.Background(), postgres.Config{DSN: dsn, Table: "t"})
		if err == nil {
			t.Errorf("New(%q) succeeded", dsn)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("New(%q) error leaks the password: %v", dsn, err)
		}
		if !strings.Contains(err.Error(), "DSN") {
			t.Errorf("New(%q) error %q does not name the dsn", dsn, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		cfg  postgres.Config
		want string
	}{
		{postgres.Config{Table: "t"}, "DSN: required"},
		{postgres.Config{DSN: "postgres://x/y"}, "Table: required"},
		{postgres.Config{DSN: "postgres://x/y", Table: "bad-name"}, `"bad-name" is not an unquoted identifier`},
		{postgres.Config{DSN: "postgres://x/y", Table: "a.b.c"}, "want table or schema.table"},
		{postgres.Config{DSN: "postgres://x/y", Table: `t"; DROP TABLE x; --`}, "not an unquoted identifier"},
		{postgres.Config{DSN: "postgres://x/y", Table: "t", MaxConns: -1}, "MaxConns: must not be negative"},
	}
	for _, tt := range tests {
		_, err := postgres.New(context.Background(), tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tt.cfg, err, tt.want)
		}
	}
}

func TestMessageID(t *testing.T) {
	base := consumer.Message{Key: []byte("k"), Body: []byte("b"), Headers: map[string]string{"h": "1", "id": "evt-1"}}
	with := func(f func(*consumer.Message)) consumer.Message {
		m := base
		m.Headers = map[string]string{}
		for k, v := range base.Headers {
			m.Headers[k] = v
		}
		f(&m)
		return m
	}
	kafka := consumer.Source{Broker: "kafka", Topic: "t", Partition: 3, Offset: 9}
	amqp := consumer.Source{Broker: "rabbitmq", Queue: "q", MessageID: "m-1"}
	tests := []struct {
		name     string
		msg      consumer.Message
		idHeader string
		want     string
	}{
		{"header wins", with(func(m *consumer.Message) { m.Source = amqp }), "id", "evt-1"},
		{"empty header falls through", with(func(m *consumer.Message) { m.Source = amqp; m.Headers["id"] = "" }), "id", "m-1"},
		{"amqp message id", with(func(m *consumer.Message) { m.Source = amqp }), "", "m-1"},
		{"kafka position", with(func(m *consumer.Message) { m.Source = kafka }), "other", "t/3/9"},
	}
	for _, tt := range tests {
		if got := postgres.MessageID(tt.msg, tt.idHeader); got != tt.want {
			t.Errorf("%s: MessageID = %q, want %q", tt.name, got, tt.want)
		}
	}

	hash := postgres.MessageID(base, "")
	if !strings.HasPrefix(hash, "sha256:") || len(hash) != len("sha256:")+64 {
		t.Fatalf("content id %q", hash)
	}
	same := []consumer.Message{
		with(func(m *consumer.Message) { m.Attempt = 3; m.Source.DeliveryTag = 99; m.Source.Redelivered = true }),
		with(func(m *consumer.Message) { m.Headers["x-death"] = "[count:1]"; m.Headers["x-first-death-queue"] = "q" }),
	}
	for i, m := range same {
		if got := postgres.MessageID(m, ""); got != hash {
			t.Errorf("same content %d: id %q, want %q", i, got, hash)
		}
	}
	differ := []consumer.Message{
		with(func(m *consumer.Message) { m.Body = []byte("c") }),
		with(func(m *consumer.Message) { m.Key = []byte("kb"); m.Body = nil }), // bytes moved from body to key
		with(func(m *consumer.Message) { m.Headers["h"] = "2" }),
		with(func(m *consumer.Message) { delete(m.Headers, "h") }),
	}
	for i, m := range differ {
		if got := postgres.MessageID(m, ""); got == hash {
			t.Errorf("different content %d has the same id", i)
		}
	}
}

func TestDDL(t *testing.T) {
	tests := []struct {
		table, want, wantErr string
	}{
		{table: "deliveries", want: `CREATE TABLE IF NOT EXISTS "deliveries" (`},
		{table: "app.Deliveries_2", want: `CREATE TABLE IF NOT EXISTS "app"."Deliveries_2" (`},
		{table: "", wantErr: "Table: required"},
		{table: "1abc", wantErr: "not an unquoted identifier"},
		{table: strings.Repeat("a", 64), wantErr: "at most 63 bytes"},
		{table: "a.", wantErr: "not an unquoted identifier"},
	}
	for _, tt := range tests {
		got, err := postgres.DDL(tt.table)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("DDL(%q) error = %v, want %q", tt.table, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("DDL(%q): %v", tt.table, err)
		case !strings.HasPrefix(got, tt.want):
			t.Errorf("DDL(%q) = %q, want prefix %q", tt.table, got, tt.want)
		}
	}
}

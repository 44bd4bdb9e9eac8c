package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/throttlehq/throttle/consumer"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		code     string
		wantPerm bool
	}{
		{"22P02", true},  // invalid_text_representation
		{"22021", true},  // character_not_in_repertoire
		{"23502", true},  // not_null_violation
		{"23514", true},  // check_violation
		{"54000", true},  // program_limit_exceeded
		{"40001", false}, // serialization_failure
		{"40P01", false}, // deadlock_detected
		{"08006", false}, // connection_failure
		{"57P01", false}, // admin_shutdown
		{"53300", false}, // too_many_connections
		{"55P03", false}, // lock_not_available
		{"25006", false}, // read_only_sql_transaction, e.g. after a failover
		{"42P01", false}, // undefined_table: dropped while running
		{"XX000", false}, // internal_error
	}
	for _, tt := range tests {
		err := classify(fmt.Errorf("inserting: %w", &pgconn.PgError{Code: tt.code}))
		if got := consumer.IsPermanent(err); got != tt.wantPerm {
			t.Errorf("SQLSTATE %s: permanent = %v, want %v", tt.code, got, tt.wantPerm)
		}
	}
	for _, err := range []error{errors.New("read tcp: connection reset"), context.DeadlineExceeded} {
		if consumer.IsPermanent(classify(err)) {
			t.Errorf("%v classified as permanent", err)
		}
	}
}

func TestJSONBAccepts(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"a":1}`, true},
		{`{"e":"\ud83d\ude00"}`, true},
		{`{"e":"\uD83D\uDE00"}`, true},
		{`{"p":"C:\\u0000"}`, true}, // an escaped backslash, then "u0000"
		{`"\u00e9"`, true},
		{`{"a":"\u0000"}`, false},
		{`{"a":"\ud800"}`, false},
		{`{"a":"\udc00"}`, false},
		{`{"a":"\ud800\u0041"}`, false},
		{`{"a":"\ud800\n"}`, false},
		{`"\ud800"`, false},
		{`not json`, false},
		{``, false},
	}
	for _, tt := range tests {
		if got := jsonbAccepts([]byte(tt.body)); got != tt.want {
			t.Errorf("jsonbAccepts(%s) = %v, want %v", tt.body, got, tt.want)
		}
	}
}

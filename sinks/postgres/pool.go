package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// errPoolClosed is returned by acquire after close.
var errPoolClosed = errors.New("connection pool closed")

// pool is a bounded pool of connections: at most cap(slots) connections
// exist at once, idle ones are reused most recently used first, and a
// connection that pgx has closed after a fatal error is dropped on release.
// It is safe for concurrent use.
//
// It stands in for pgxpool, which needs a module (jackc/puddle) that this
// repository does not carry.
type pool struct {
	cfg   *pgx.ConnConfig
	slots chan struct{} // one token per connection, busy or idle

	mu     sync.Mutex
	idle   []*pgx.Conn
	closed bool
}

func newPool(cfg *pgx.ConnConfig, size int) *pool {
	return &pool{cfg: cfg, slots: make(chan struct{}, size)}
}

// acquire returns an idle connection or opens a new one, waiting for a free
// slot until ctx ends.
func (p *pool) acquire(ctx context.Context) (*pgx.Conn, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.slots
		return nil, errPoolClosed
	}
	var conn *pgx.Conn
	if n := len(p.idle); n > 0 {
		conn = p.idle[n-1]
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if conn != nil {
		return conn, nil
	}
	conn, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		<-p.slots
		return nil, err
	}
	return conn, nil
}

// release returns conn to the pool, or closes it when pgx closed it already
// or the pool is closed.
func (p *pool) release(conn *pgx.Conn) {
	defer func() { <-p.slots }()
	if !conn.IsClosed() {
		p.mu.Lock()
		if !p.closed {
			p.idle = append(p.idle, conn)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
	closeConn(conn)
}

// close closes the idle connections; connections in use are closed when
// released. Later acquires fail.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		closeConn(c)
	}
}

// closeConn closes conn, giving the server a moment to receive the goodbye.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// exec runs one statement on a pooled connection.
func (p *pool) exec(ctx context.Context, sql string, args ...any) error {
	conn, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.release(conn)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

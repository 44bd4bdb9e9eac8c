// Package console is the throttle web console: one page that shows the
// shared buckets, their replicas, priority classes and layers live, and a
// small JSON API behind it, with the operator's actions (set rate, clear
// override, fill, pause, resume) allowed only with a bearer token.
//
// The package is the HTTP side only: what it shows and what the actions do
// come from a Backend, which internal/cli implements with the code of the
// 'bucket' commands, so that the console reads only what 'bucket status'
// and 'bucket watch' read (Redis and the replicas' heartbeats) and changes
// a bucket exactly as 'bucket set', 'fill', 'pause' and 'resume' do.
//
// The page is plain HTML, CSS and JavaScript embedded in the binary, with
// no build step and nothing loaded from elsewhere. It updates over
// Server-Sent Events (GET /api/events), or by polling GET /api/frame when
// the browser cannot keep a stream, at most once per Config.Interval.
//
// Endpoints:
//
//	GET    /                          the page
//	GET    /api/status                every bucket as 'bucket status --json' prints it
//	GET    /api/frame                 the latest live frame (Frame)
//	GET    /api/events                the frames as Server-Sent Events
//	POST   /api/buckets/{name}/rate   {"rate": "10/s"}: an override, as 'bucket set --rate'
//	DELETE /api/buckets/{name}/rate   clear the override, as 'bucket set --clear'
//	POST   /api/buckets/{name}/fill   as 'bucket fill'
//	POST   /api/buckets/{name}/pause  {"for": "30s"}: as 'bucket pause --for'
//	POST   /api/buckets/{name}/resume as 'bucket resume'
//
// An action needs "Authorization: Bearer TOKEN" matching Config.Token,
// compared in constant time; no cookie is read or set. Without a Config.Token
// the console is read-only and refuses every action with 403. Every action,
// allowed or refused, is logged with the client's address and the change,
// never the token.
package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

//go:embed assets
var assets embed.FS

// Backend is what the console shows and changes. internal/cli implements
// it with the code of the 'bucket' commands. Its methods may be called
// concurrently.
type Backend interface {
	// Buckets names the buckets the console shows, in order.
	Buckets() []string
	// Status reads every bucket as 'bucket status --json' prints it: a
	// value that encoding/json marshals to an array of objects.
	Status(ctx context.Context) (any, error)
	// Sample reads every bucket once for the live view. It is called by one
	// goroutine at a time, once per Config.Interval, so that it may keep
	// what it needs to turn counters into rates.
	Sample(ctx context.Context) ([]BucketFrame, error)
	// Do makes one change and returns a sentence saying what it did. Input
	// that the 'bucket' commands would refuse is a *InputError.
	Do(ctx context.Context, a Action) (string, error)
}

// Action is one change an operator asks for.
type Action struct {
	// Bucket is the bucket's name, as in the URL.
	Bucket string
	// Op is "set", "clear", "fill", "pause" or "resume".
	Op string
	// Rate is the override's rate as the operator typed it ("10/s"), for
	// set.
	Rate string
	// For is the pause's length as typed ("30s"), for pause.
	For string
}

// InputError is input that the 'bucket' commands would refuse too, with
// their message: a bucket name or rate out of range (HTTP 400), or a
// bucket that the console does not show (NotFound, HTTP 404).
type InputError struct {
	Msg      string
	NotFound bool
}

func (e *InputError) Error() string { return e.Msg }

// Frame is one live view of every bucket, as GET /api/frame returns it
// and /api/events sends it.
type Frame struct {
	// At is when it was read, in RFC 3339 (the console's clock).
	At time.Time `json:"at"`
	// ReadOnly is set when the console has no token: it refuses every
	// action.
	ReadOnly bool `json:"read_only"`
	// IntervalSeconds is how often a frame is read.
	IntervalSeconds float64 `json:"interval_seconds"`
	// HistorySeconds is how far back BucketFrame.History reaches.
	HistorySeconds float64 `json:"history_seconds"`
	// Buckets are the buckets in Backend.Buckets' order.
	Buckets []BucketFrame `json:"buckets"`
	// Error is set when the last read failed; Buckets are then those of
	// the last good read, if any.
	Error string `json:"error,omitempty"`
}

// BucketFrame is one bucket in a Frame. A nil pointer is a value not known
// (yet).
type BucketFrame struct {
	Name string `json:"name"`
	// Status is the bucket as 'bucket status --json' prints it, without
	// the layers' key counts (see Layers).
	Status any `json:"status"`
	// Mode is how the replicas limit: "shared" when every reporting
	// replica uses the shared bucket, else a summary such as "local on 1
	// of 2"; "" with no replica reporting.
	Mode string `json:"mode"`
	// Delivered is the tokens granted per second over the last seconds,
	// summed over the live replicas' heartbeats ('bucket watch').
	Delivered *float64 `json:"delivered"`
	// DeliveredNote says where Delivered comes from, or why it is unknown.
	DeliveredNote string `json:"delivered_note,omitempty"`
	// History holds Delivered once per interval over the last
	// HistorySeconds, oldest first, null where unknown. The console fills
	// it.
	History  []*float64     `json:"history"`
	Replicas []ReplicaFrame `json:"replicas"`
	Layers   []LayerFrame   `json:"layers"`
	// Backlog is the source's backlog, as the replicas last read it (every
	// 5 s) and reported it in their heartbeats; nil when none reports it.
	Backlog *BacklogFrame `json:"backlog"`
	// LayersNote says why Layers is empty or partial, if it is.
	LayersNote string `json:"layers_note,omitempty"`
}

// ReplicaFrame is one live replica, from its heartbeat.
type ReplicaFrame struct {
	ID string `json:"id"`
	// Mode is shared, local, closed or open; "" when its heartbeat carries
	// no report.
	Mode string `json:"mode"`
	Idle bool   `json:"idle"`
	// Delivered is its tokens granted per second; Share its part of the
	// bucket's Delivered (0 to 1).
	Delivered *float64 `json:"delivered"`
	Share     *float64 `json:"share"`
	// Waiting is its calls waiting for tokens, as of its last heartbeat.
	Waiting *int `json:"waiting"`
	// LastBeatSeconds is how long ago its last heartbeat ran, on Redis's
	// clock.
	LastBeatSeconds *float64 `json:"last_beat_seconds"`
	// Configured is its configured rate and burst, "" when not reported.
	Configured string `json:"configured"`
}

// BacklogFrame is the messages waiting at the broker: Ready to be
// consumed, and SetAside by a delay layer until due. The group's or
// queue's value: the largest any live replica reported.
type BacklogFrame struct {
	Ready    int64 `json:"ready"`
	SetAside int64 `json:"set_aside"`
}

// LayerFrame is one layer of limit.extra.
type LayerFrame struct {
	Name string `json:"name"`
	// Limit describes the layer ("5/min per key, dead_letter").
	Limit string `json:"limit"`
	// InRedis is what Redis holds for it ("3 keys in use", "4 of 5
	// tokens").
	InRedis string `json:"in_redis"`
	// Refused is the refusals summed over the live replicas since each
	// started, and PerMinute their increase over the last minute; nil when
	// no replica reports.
	Refused   *int64 `json:"refused"`
	PerMinute *int64 `json:"per_minute"`
}

// Config configures a Server.
type Config struct {
	// Backend is what the console shows and changes. Required.
	Backend Backend
	// Token allows the actions; empty makes the console read-only.
	Token string
	// Log receives a line per action and per failed read. Default: discard.
	Log *slog.Logger
	// Interval is how often the buckets are read for the live view.
	// Default and minimum 1s.
	Interval time.Duration
	// History is how far back each bucket's chart reaches. Default 5m.
	History time.Duration
	// LoopbackOnly refuses a request whose Host header is not a loopback
	// name or address (localhost, 127.0.0.1, [::1]) with 421: a page from
	// elsewhere cannot then reach a console on loopback through a DNS name
	// that points there (DNS rebinding). Set it when listening on
	// loopback.
	LoopbackOnly bool
}

// Server serves the console. Create it with New; it is safe for
// concurrent use.
type Server struct {
	cfg     Config
	tokenH  [sha256.Size]byte
	log     *slog.Logger
	mux     *http.ServeMux
	history int // frames kept

	mu      sync.Mutex
	frame   []byte        // the latest frame as JSON; nil before the first
	next    chan struct{} // closed when frame changes
	last    Frame
	charts  map[string][]*float64
	started bool
}

// New returns a Server for cfg. It reads nothing until Run.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("console: Config.Backend is nil")
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < time.Second {
		return nil, fmt.Errorf("console: Config.Interval must be at least 1s, got %v", cfg.Interval)
	}
	if cfg.History == 0 {
		cfg.History = 5 * time.Minute
	}
	if cfg.History < cfg.Interval {
		return nil, fmt.Errorf("console: Config.History must be at least Interval, got %v", cfg.History)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, log: cfg.Log, mux: http.NewServeMux(),
		history: int(cfg.History / cfg.Interval), next: make(chan struct{}),
		charts: map[string][]*float64{},
	}
	s.tokenH = sha256.Sum256([]byte(cfg.Token))
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	files := http.FileServerFS(static)
	s.mux.Handle("GET /{$}", files)
	s.mux.Handle("GET /console.css", files)
	s.mux.Handle("GET /console.js", files)
	s.mux.HandleFunc("GET /api/status", s.status)
	s.mux.HandleFunc("GET /api/frame", s.frameNow)
	s.mux.HandleFunc("GET /api/events", s.events)
	s.mux.HandleFunc("POST /api/buckets/{name}/rate", s.action("set"))
	s.mux.HandleFunc("DELETE /api/buckets/{name}/rate", s.action("clear"))
	s.mux.HandleFunc("POST /api/buckets/{name}/fill", s.action("fill"))
	s.mux.HandleFunc("POST /api/buckets/{name}/pause", s.action("pause"))
	s.mux.HandleFunc("POST /api/buckets/{name}/resume", s.action("resume"))
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'none'")
	if s.cfg.LoopbackOnly && !loopbackHost(r.Host) {
		writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": "this console answers only on a loopback address (localhost, 127.0.0.1, [::1])"})
		return
	}
	s.mux.ServeHTTP(w, r)
}

// loopbackHost reports whether a Host header names the loopback interface.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Run reads the buckets every Config.Interval for the live view until ctx
// ends. Call it once, in its own goroutine, next to serving the Handler;
// without it /api/frame and /api/events have nothing to show.
func (s *Server) Run(ctx context.Context) {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return
	}
	s.started = true
	s.mu.Unlock()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample reads one frame and publishes it.
func (s *Server) sample(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, max(s.cfg.Interval, 5*time.Second))
	buckets, err := s.cfg.Backend.Sample(rctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := Frame{
		At: time.Now().UTC(), ReadOnly: s.cfg.Token == "",
		IntervalSeconds: s.cfg.Interval.Seconds(), HistorySeconds: s.cfg.History.Seconds(),
	}
	if err != nil {
		s.log.Warn("console: reading the buckets", "error", err)
		f.Error = err.Error()
		f.Buckets = s.last.Buckets
		for i := range f.Buckets {
			f.Buckets[i].History = s.chart(f.Buckets[i].Name, nil)
		}
	} else {
		f.Buckets = buckets
		for i := range f.Buckets {
			f.Buckets[i].History = s.chart(f.Buckets[i].Name, f.Buckets[i].Delivered)
		}
		s.last = f
	}
	data, merr := json.Marshal(f)
	if merr != nil {
		s.log.Error("console: encoding a frame", "error", merr)
		return
	}
	s.frame = data
	close(s.next)
	s.next = make(chan struct{})
}

// chart appends x to the bucket's chart and returns a copy of it. The
// caller holds s.mu.
func (s *Server) chart(name string, x *float64) []*float64 {
	c := s.charts[name]
	if c == nil {
		c = make([]*float64, s.history)
	}
	c = append(c[1:], x)
	s.charts[name] = c
	return append([]*float64(nil), c...)
}

// latest returns the latest frame and a channel closed when it changes.
func (s *Server) latest() ([]byte, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frame, s.next
}

func (s *Server) frameNow(w http.ResponseWriter, r *http.Request) {
	data, next := s.latest()
	if data == nil { // the first read is under way
		select {
		case <-next:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "no frame read yet"})
			return
		}
		data, _ = s.latest()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

// events sends every frame as a Server-Sent Event named "frame", the
// latest one first, until the client goes.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	// A comment every so often keeps proxies from closing an idle stream.
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	data, next := s.latest()
	for {
		if data != nil {
			if _, err := fmt.Fprintf(w, "event: frame\ndata: %s\n\n", data); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
			data = nil
		case <-next:
			data, next = s.latest()
		}
	}
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	st, err := s.cfg.Backend.Status(ctx)
	if err != nil {
		s.log.Warn("console: reading the buckets", "error", err)
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// maxBody bounds an action's request body.
const maxBody = 4 << 10

// action returns the handler of an action.
func (s *Server) action(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a := Action{Bucket: r.PathValue("name"), Op: op}
		log := s.log.With("remote", clientAddr(r), "bucket", a.Bucket, "action", op)
		if fwd := r.Header.Get("X-Forwarded-For"); fwd != "" {
			log = log.With("forwarded_for", fwd)
		}
		if code, msg := s.authorize(r); code != 0 {
			log.Warn("console: action refused", "status", code, "reason", msg)
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="throttle console"`)
			}
			writeJSON(w, code, map[string]string{"error": msg})
			return
		}
		if op == "set" || op == "pause" {
			var body struct {
				Rate *string `json:"rate"`
				For  *string `json:"for"`
			}
			dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&body); err != nil {
				msg := "the body must be a JSON object: " + err.Error()
				log.Warn("console: action refused", "status", http.StatusBadRequest, "reason", msg)
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
				return
			}
			switch {
			case op == "set" && (body.Rate == nil || body.For != nil):
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": `the body must be {"rate": R}, such as {"rate": "10/s"}`})
				return
			case op == "pause" && (body.For == nil || body.Rate != nil):
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": `the body must be {"for": D}, such as {"for": "30s"}`})
				return
			case op == "set":
				a.Rate = *body.Rate
			default:
				a.For = *body.For
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		done, err := s.cfg.Backend.Do(ctx, a)
		var ie *InputError
		switch {
		case errors.As(err, &ie):
			code := http.StatusBadRequest
			if ie.NotFound {
				code = http.StatusNotFound
			}
			log.Warn("console: action refused", "status", code, "reason", ie.Msg)
			writeJSON(w, code, map[string]string{"error": ie.Msg})
		case err != nil:
			log.Error("console: action failed", "error", err)
			writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		default:
			log.Info("console: action", "done", done)
			writeJSON(w, http.StatusOK, map[string]string{"message": done})
		}
	}
}

// authorize returns 0 when r may act, else the status and the reason: 403
// when the console has no token, 401 when r does not carry it.
func (s *Server) authorize(r *http.Request) (int, string) {
	if s.cfg.Token == "" {
		return http.StatusForbidden, "the console is read-only: console.token is not set"
	}
	h := r.Header.Get("Authorization")
	const scheme = "Bearer " // the scheme is case-insensitive (RFC 9110)
	if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) || !s.tokenMatches(h[len(scheme):]) {
		return http.StatusUnauthorized, "an action needs the console token, as Authorization: Bearer TOKEN"
	}
	return 0, ""
}

// tokenMatches compares tok with the token in constant time: both are
// hashed first, so that neither the content nor the length of the token
// shows in the time taken.
func (s *Server) tokenMatches(tok string) bool {
	h := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(h[:], s.tokenH[:]) == 1 && s.cfg.Token != ""
}

// clientAddr is the client's IP as the connection gives it.
func clientAddr(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Serve serves s on ln and runs its reads until ctx ends, then shuts the
// server down, giving open requests a second, and returns.
func Serve(ctx context.Context, ln net.Listener, s *Server) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Requests live in ctx: the event streams end with it.
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.Run(ctx)
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		if srv.Shutdown(sctx) != nil {
			_ = srv.Close()
		}
		scancel()
		<-errc
	case err = <-errc:
		cancel()
	}
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

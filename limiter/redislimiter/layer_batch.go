package redislimiter

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// layerBatcher combines the concurrent TakeLayers of one Layered store on a
// single node into pipelines, as batcher does for Take (on a Cluster, only
// the leased requests of Layered.clusterStep): a call that finds
// none in flight is sent at once, alone; calls that arrive meanwhile queue
// up, and when the flight returns the head of the queue sends them all (up
// to maxBatch) as one pipeline (see send: on a Cluster, one script call
// per master). Each request is still decided atomically on its own. A
// batch is sent on a context without its callers' deadlines, so it is
// bounded by the client's timeouts; a caller whose ctx ends while queued
// leaves the queue at once, and one whose ctx ends while its batch is in
// flight gets ctx.Err() when the batch returns, its tokens refunded.
//
// The concurrency slots' releases (ReleaseSlots) share the flights: a
// release is queued and its caller returns at once; the next flight sends
// every release queued, in one script call, ahead of its takes in the
// same pipeline, so that a take queued after a release sees the slot
// free. When a flight returns with releases queued and no take, its
// caller sends them before it returns. A release that finds none in
// flight starts one, sent by a goroutine of its own that ends when the
// flight does (Layered.WaitReleases waits for it): a take queued
// meanwhile leads it instead, the releases ahead of it. On a Cluster the
// releases are one call per key in the pipeline.
//
// A layerBatcher is safe for concurrent use.
type layerBatcher struct {
	l *Layered
	// byMaster is the script of a Cluster's call per master:
	// layersKeyedClusterScript (tests set another).
	byMaster *redis.Script

	mu       sync.Mutex
	flushing bool // a call is in flight or the head of the queue leads next
	queue    []*layerPending
	// releases are the slots released while a call was in flight, for the
	// next one; set only while flushing. spare is the slice of the last
	// releases sent, reused.
	releases, spare []backend.SlotRelease
	// sender is closed when the goroutine that release started ends
	// (waitReleases); nil when none runs. There is at most one: release
	// starts it only while nothing flies, and it flies until it ends.
	sender chan struct{}
	// scratch holds send's slices, reused from flight to flight: one
	// flight at a time sends.
	scratch sendScratch
}

// sendScratch is what send builds for a single node's batch, kept to be
// reused (cleared after each flight, so that it holds no request).
type sendScratch struct {
	cmds   []*redis.Cmd
	clocks []time.Time
	keyed  []*layerPending
	kreqs  []backend.LayerRequest
	kkeys  [][]string
	res    []backend.LayerResult
	errs   []error
}

// reset returns sc's slices emptied, of at least n elements' capacity
// for cmds and clocks.
func (sc *sendScratch) reset(n int) {
	if cap(sc.cmds) < n {
		sc.cmds, sc.clocks = make([]*redis.Cmd, n), make([]time.Time, n)
	}
	sc.cmds, sc.clocks = sc.cmds[:n], sc.clocks[:n]
	sc.keyed, sc.kreqs, sc.kkeys = sc.keyed[:0], sc.kreqs[:0], sc.kkeys[:0]
}

// clear drops what sc refers to, so that the requests of a flight sent
// are not kept alive.
func (sc *sendScratch) clear() {
	clear(sc.cmds)
	clear(sc.keyed)
	clear(sc.kreqs)
	clear(sc.kkeys)
	clear(sc.res)
	clear(sc.errs)
}

type layerPending struct {
	req   backend.LayerRequest
	keys  []string
	res   backend.LayerResult
	err   error
	state pendingState // changes under layerBatcher.mu
	// ready is signalled once, when state becomes leading or done.
	ready chan struct{}
}

var layerPendingPool = sync.Pool{New: func() any { return &layerPending{ready: make(chan struct{}, 1)} }}

// release recycles p once its caller has its answer. Its ready channel is
// empty then: every signal sent to it was received.
func (p *layerPending) release() {
	*p = layerPending{ready: p.ready}
	layerPendingPool.Put(p)
}

func (b *layerBatcher) take(ctx context.Context, req backend.LayerRequest, keys []string) (backend.LayerResult, error) {
	b.mu.Lock()
	if !b.flushing {
		b.flushing = true
		b.mu.Unlock()
		res, err := b.l.takeStep(ctx, time.Time{}, req, keys, b.l.batchStep(req), 0)
		b.mu.Lock()
		b.handOffLocked(ctx)
		b.mu.Unlock()
		return res, err
	}
	p := layerPendingPool.Get().(*layerPending)
	p.req, p.keys = req, keys
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	defer p.release()

	select {
	case <-p.ready:
	case <-ctx.Done():
		b.mu.Lock()
		if p.state == queued {
			b.queue = slices.DeleteFunc(b.queue, func(q *layerPending) bool { return q == p })
			b.mu.Unlock()
			return backend.LayerResult{}, ctx.Err()
		}
		b.mu.Unlock()
		<-p.ready
	}
	if p.state == leading {
		b.lead(ctx, p)
	}
	if err := ctx.Err(); err != nil {
		if p.err == nil && p.res.Granted {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
			_ = b.l.RefundLayers(rctx, req, p.res)
			cancel()
		}
		return backend.LayerResult{}, err
	}
	return p.res, p.err
}

// lead sends the batch that p heads, sets every answer, and hands the lead
// on.
func (b *layerBatcher) lead(ctx context.Context, p *layerPending) {
	b.mu.Lock()
	n := min(len(b.queue), maxBatch-1)
	batch := append([]*layerPending{p}, b.queue[:n]...)
	b.queue = slices.Delete(b.queue, 0, n)
	for _, q := range batch {
		q.state = sent
	}
	rs := b.releases
	b.releases = nil
	b.mu.Unlock()

	ctx = context.WithoutCancel(ctx)
	b.send(ctx, batch, rs)
	b.mu.Lock()
	b.recycleLocked(rs)
	for _, q := range batch {
		q.state = done
		if q != p {
			q.ready <- struct{}{}
		}
	}
	b.handOffLocked(ctx)
	b.mu.Unlock()
}

// batchStep is the one step of a request that the batcher sends: every
// layer on a single node, Layered.clusterStep on a Cluster.
func (l *Layered) batchStep(req backend.LayerRequest) step {
	if l.cluster {
		return *l.clusterStep
	}
	return l.firstStep(req)
}

// release gives back slots: in the flight after the one in flight, or,
// when none is, in a flight of their own that a goroutine sends, which
// ends with it (see layerBatcher). Its caller never waits for a call (a
// failure leaves the slots to their leases), so that its handler is free
// at once; a take that comes meanwhile queues behind the releases and
// takes them along, as behind any flight.
func (b *layerBatcher) release(ctx context.Context, slots []backend.SlotRelease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.releases == nil {
		b.releases, b.spare = b.spare, nil
	}
	b.releases = append(b.releases, slots...)
	if b.flushing {
		return // the next flight sends them
	}
	b.flushing = true
	done := make(chan struct{})
	b.sender = done
	go func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.handOffLocked(context.WithoutCancel(ctx))
		close(done)
		b.sender = nil
	}()
}

// waitReleases waits until the goroutine that release started ended, or
// ctx ends.
func (b *layerBatcher) waitReleases(ctx context.Context) error {
	b.mu.Lock()
	sender := b.sender
	b.mu.Unlock()
	if sender == nil {
		return nil
	}
	select {
	case <-sender:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recycleLocked keeps rs, sent, for the releases of a later flight.
// b.mu must be held.
func (b *layerBatcher) recycleLocked(rs []backend.SlotRelease) {
	if cap(rs) > 0 && cap(rs) <= 4*maxReleaseBatch {
		clear(rs)
		b.spare = rs[:0]
	}
}

// send decides the requests of batch in one pipeline and sets their
// answers: the requests that leave the shared bucket out, when keyedOnly
// takes every layer, in one call of layersKeyedScript; each other request
// in its own call of layersScript. On a Cluster, one call per master
// carries the requests whose keys it holds (sendCluster), and the pipeline
// goes to every master at once. The releases rs go first, in the same
// pipeline (releaseCmds); their failure leaves the slots to their leases.
func (b *layerBatcher) send(ctx context.Context, batch []*layerPending, rs []backend.SlotRelease) {
	pipe := b.l.client.Pipeline()
	rel := b.l.releaseCmds(ctx, pipe, rs)
	if b.l.cluster {
		b.sendCluster(ctx, time.Time{}, pipe, rel, batch)
		return
	}
	keyedOnly := b.l.keyedOnly(step{layers: b.l.allLayers})
	sc := &b.scratch
	sc.reset(len(batch))
	defer sc.clear()
	cmds, clocks := sc.cmds, sc.clocks
	for i, q := range batch {
		if q.req.SkipShared && !q.req.ShadowShared && keyedOnly {
			sc.keyed = append(sc.keyed, q)
			continue
		}
		rkeys, args, clock := b.l.takeArgs(time.Time{}, q.req, q.keys, b.l.firstStep(q.req), 0)
		cmds[i], clocks[i] = layersScript.EvalSha(ctx, pipe, rkeys, args...), clock
	}
	keyed := sc.keyed
	var (
		krkeys []string
		kargs  []any
		kcmd   *redis.Cmd
	)
	if len(keyed) > 0 {
		for _, q := range keyed {
			sc.kreqs, sc.kkeys = append(sc.kreqs, q.req), append(sc.kkeys, q.keys)
		}
		krkeys, kargs = b.l.keyedArgs(time.Time{}, b.l.allLayers, sc.kreqs, sc.kkeys, 0, false)
		kcmd = layersKeyedScript.EvalSha(ctx, pipe, krkeys, kargs...)
	}
	_, _ = pipe.Exec(ctx)
	_ = b.l.releaseReplies(ctx, rel) // a failure leaves the slots to their leases
	for i, q := range batch {
		c := cmds[i]
		if c == nil {
			continue
		}
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			// Redis lost the script (a restart, SCRIPT FLUSH): Run loads it.
			q.res, q.err = b.l.takeStep(ctx, time.Time{}, q.req, q.keys, b.l.firstStep(q.req), 0)
			continue
		}
		v, err := c.Int64Slice()
		q.res, q.err = b.l.takeReply(q.req, v, err, clocks[i])
	}
	if kcmd == nil {
		return
	}
	s, err := kcmd.Text()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		s, err = layersKeyedScript.Run(ctx, b.l.client, krkeys, kargs...).Text()
	}
	if cap(sc.res) < len(keyed) {
		sc.res, sc.errs = make([]backend.LayerResult, len(keyed)), make([]error, len(keyed))
	}
	res, errs := sc.res[:len(keyed)], sc.errs[:len(keyed)]
	b.l.keyedReplies(sc.kreqs, 0, s, err, res, errs)
	for j, q := range keyed {
		q.res, q.err = res[j], errs[j]
	}
}

// sendCluster is send on a Cluster, after the releases rel queued on pipe
// (which go-redis splits by master): the requests of clusterStep grouped
// by the master that holds their keys, as the client's slot map has it,
// one call of layersKeyedClusterScript per master, carrying all its
// requests, as a single node's batch does (sendByMaster). A group that
// the slot map put on the wrong master (a slot moved or migrating) stops
// at its first request whose key is not there; those requests, not run,
// then go one call each, routed by go-redis, which follows MOVED and ASK
// (sendEach), after the slot map is reloaded. Every request is decided
// once. The requests are decided at the instant at, or at Redis TIME when
// at is zero.
func (b *layerBatcher) sendCluster(ctx context.Context, at time.Time, pipe redis.Pipeliner, rel []releaseCall, batch []*layerPending) {
	cc, _ := b.l.client.(*redis.ClusterClient)
	if cc == nil || b.l.noCrossSlot.Load() {
		b.sendEach(ctx, at, pipe, rel, batch)
		return
	}
	rest := b.sendByMaster(ctx, at, cc, pipe, rel, batch)
	if len(rest) > 0 {
		cc.ReloadState(ctx)
		b.sendEach(ctx, at, b.l.client.Pipeline(), nil, rest)
	}
}

// clusterGroup is the requests of a batch whose keys one master holds,
// and their call.
type clusterGroup struct {
	master *redis.Client
	reqs   []backend.LayerRequest
	qs     []*layerPending
	keys   [][]string
	rkeys  []string
	args   []any
	cmd    *redis.Cmd
}

// sendByMaster sends, in pipe after rel, one call of
// layersKeyedClusterScript per master for the requests of batch whose
// keys it holds, sets their answers, and returns the requests that were
// not run: those that a master did not hold, those that the slot map
// could not place, and every one when Redis does not know script flags
// (before Redis 7; Layered.noCrossSlot is then set).
func (b *layerBatcher) sendByMaster(ctx context.Context, at time.Time, cc *redis.ClusterClient, pipe redis.Pipeliner, rel []releaseCall, batch []*layerPending) []*layerPending {
	st := *b.l.clusterStep
	first := st.layers[0]
	var (
		groups []*clusterGroup
		rest   []*layerPending
	)
	for _, q := range batch {
		loc, _ := b.l.bucketLoc(first, q.keys[first])
		m, err := cc.MasterForKey(ctx, loc)
		if err != nil {
			rest = append(rest, q)
			continue
		}
		var g *clusterGroup
		for _, h := range groups {
			if h.master == m {
				g = h
				break
			}
		}
		if g == nil {
			g = &clusterGroup{master: m}
			groups = append(groups, g)
		}
		g.qs, g.reqs, g.keys = append(g.qs, q), append(g.reqs, q.req), append(g.keys, q.keys)
	}
	for _, g := range groups {
		g.rkeys, g.args = b.l.keyedArgs(at, st.layers, g.reqs, g.keys, 0, true)
		g.cmd = b.byMaster.EvalSha(ctx, pipe, g.rkeys, g.args...)
	}
	_, _ = pipe.Exec(ctx)
	_ = b.l.releaseReplies(ctx, rel) // a failure leaves the slots to their leases
	res, errs := make([]backend.LayerResult, len(batch)), make([]error, len(batch))
	for _, g := range groups {
		s, err := g.cmd.Text()
		if redis.HasErrorPrefix(err, "NOSCRIPT") { // this master lost the script: Run loads it
			s, err = b.byMaster.Run(ctx, b.l.client, g.rkeys, g.args...).Text()
		}
		if notRun(err) {
			if err != nil && strings.Contains(err.Error(), "Error compiling script") {
				// A Redis before 7 reads no shebang: one call per
				// request from now on.
				b.l.noCrossSlot.Store(true)
			}
			rest = append(rest, g.qs...)
			continue
		}
		n := b.l.keyedReplies(g.reqs, 0, s, err, res[:len(g.reqs)], errs[:len(g.reqs)])
		for j, q := range g.qs[:n] {
			q.res, q.err = res[j], errs[j]
		}
		rest = append(rest, g.qs[n:]...)
	}
	return rest
}

// notRun reports whether err is a reply that Redis gives before it runs a
// script: a redirection that go-redis did not follow to its end, or a
// script that does not compile.
func notRun(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") ||
		redis.HasErrorPrefix(err, "CROSSSLOT") || redis.HasErrorPrefix(err, "TRYAGAIN") ||
		(err != nil && strings.Contains(err.Error(), "Error compiling script"))
}

// sendEach decides each request of batch in a call of its own (its key's
// slot), in pipe after the releases rel; go-redis splits the pipeline by
// master and follows MOVED and ASK.
func (b *layerBatcher) sendEach(ctx context.Context, at time.Time, pipe redis.Pipeliner, rel []releaseCall, batch []*layerPending) {
	st := *b.l.clusterStep
	cmds := make([]*redis.Cmd, len(batch))
	args := make([][]any, len(batch))
	rkeys := make([][]string, len(batch))
	for i, q := range batch {
		rkeys[i], args[i] = b.l.keyedArgs(at, st.layers, []backend.LayerRequest{q.req}, [][]string{q.keys}, 0, false)
		cmds[i] = layersKeyedScript.EvalSha(ctx, pipe, rkeys[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx)
	_ = b.l.releaseReplies(ctx, rel) // a failure leaves the slots to their leases
	var out [1]backend.LayerResult
	var errs [1]error
	for i, q := range batch {
		s, err := cmds[i].Text()
		if redis.HasErrorPrefix(err, "NOSCRIPT") { // this master lost the script: Run loads it
			s, err = layersKeyedScript.Run(ctx, b.l.client, rkeys[i], args[i]...).Text()
		}
		b.l.keyedReplies([]backend.LayerRequest{q.req}, 0, s, err, out[:], errs[:])
		q.res, q.err = out[0], errs[0]
	}
}

// handOffLocked passes the lead to the head of the queue, or ends the
// flight. With releases queued and no take, it sends them first, on ctx
// without its deadline, unlocking b.mu meanwhile. b.mu must be held.
func (b *layerBatcher) handOffLocked(ctx context.Context) {
	for len(b.queue) == 0 && len(b.releases) > 0 {
		rs := b.releases
		b.releases = nil
		b.mu.Unlock()
		_ = b.l.releaseSlots(context.WithoutCancel(ctx), rs) // a failure leaves the slots to their leases
		b.mu.Lock()
		b.recycleLocked(rs)
	}
	if len(b.queue) == 0 {
		b.flushing = false
		return
	}
	head := b.queue[0]
	b.queue = slices.Delete(b.queue, 0, 1)
	head.state = leading
	head.ready <- struct{}{}
}

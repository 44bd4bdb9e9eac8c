package limiter

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// paidSecretSize is the size of a secret the Bucket makes.
const paidSecretSize = 32

// minPaidSecret is the shortest secret a Bucket accepts from its store.
const minPaidSecret = 16

// paidReread is how long a Bucket waits between two reads of its store's
// secret: after one failed, or after a slot with a signature failed to
// verify (the secret may have changed in the store: deleted and made again
// by another replica).
const paidReread = 5 * time.Second

// processSecret is the secret of the Buckets on a store that keeps none.
var processSecret = sync.OnceValue(randomSecret)

func randomSecret() []byte {
	b := make([]byte, paidSecretSize)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

// paidKey is a bucket's name and secret. It is never logged.
type paidKey struct {
	bucket string
	secret []byte
}

// sign returns the signature of slot s: base64 (URL alphabet, no padding)
// of the HMAC-SHA256 of the bucket's name, s's layer and key, each
// length-prefixed, s's Due and, when set, its Booked, in Unix nanoseconds
// (a slot without Booked, signed by an older version, is signed without
// it, and still verifies).
func (k *paidKey) sign(s PaidSlot) string {
	return base64.RawURLEncoding.EncodeToString(k.mac(s))
}

// mac is the HMAC-SHA256 that sign encodes.
func (k *paidKey) mac(s PaidSlot) []byte {
	m := hmac.New(sha256.New, k.secret)
	buf := make([]byte, 0, 72+len(k.bucket)+len(s.Layer)+len(s.Key))
	version := "throttle paid slot v1"
	if !s.Booked.IsZero() {
		version = "throttle paid slot v2"
	}
	buf = append(buf, version...)
	for _, f := range []string{k.bucket, s.Layer, s.Key} {
		buf = binary.AppendUvarint(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	buf = binary.BigEndian.AppendUint64(buf, uint64(s.Due.UnixNano()))
	if !s.Booked.IsZero() {
		buf = binary.BigEndian.AppendUint64(buf, uint64(s.Booked.UnixNano()))
	}
	m.Write(buf)
	return m.Sum(nil)
}

// verify reports whether s carries k's signature of it.
func (k *paidKey) verify(s PaidSlot) bool {
	if k == nil || s.Sig == "" {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(s.Sig)
	if err != nil {
		return false
	}
	return hmac.Equal(got, k.mac(s))
}

// paidSigner is a Bucket's secret for its paid slots, read from its store
// once and kept, and the count of the slots it refused.
type paidSigner struct {
	key atomic.Pointer[paidKey]
	// lock lets one caller at a time read the secret from the store.
	once sync.Once
	lock chan struct{}
	// lastRead is when the secret was last read (the Bucket's clock, Unix
	// nanoseconds), guarded by lock.
	lastRead int64
	refused  atomic.Int64
	// forfeit counts the paid slots not honoured (paidForfeit).
	forfeit atomic.Int64
	// local signs the slots the local fallback books (localPaidKey).
	localOnce sync.Once
	local     *paidKey
}

// localPaidKey returns the key that signs the slots this Bucket's local
// fallback books: a random secret of the Bucket's own, never stored. Such
// a slot is known to the local bucket alone, so it passes the local
// fallback of this Bucket only: back on the store, or at another replica,
// its layer decides again (verifyPaid, WaitN), rather than let it out
// beside the store's bookings of its key.
func (b *Bucket) localPaidKey() *paidKey {
	ps := &b.layered.paid
	ps.localOnce.Do(func() { ps.local = &paidKey{bucket: "local fallback", secret: randomSecret()} })
	return ps.local
}

// paidKey returns the Bucket's secret, reading it from the store (one round
// trip, at most one caller at a time) if it has none yet, or if stale is
// the one it has, and fetch is set; at most once per paidReread. It returns
// nil when the Bucket has no secret: the store failed, or fetch is off.
func (b *Bucket) paidKey(ctx context.Context, fetch bool, stale *paidKey) *paidKey {
	ps := &b.layered.paid
	k := ps.key.Load()
	if (k != nil && k != stale) || !fetch {
		return k
	}
	store, ok := b.store.(backend.PaidSecretStore)
	if !ok {
		ps.key.CompareAndSwap(nil, &paidKey{secret: processSecret()})
		return ps.key.Load()
	}
	ps.once.Do(func() { ps.lock = make(chan struct{}, 1) })
	select {
	case ps.lock <- struct{}{}:
	case <-ctx.Done():
		return k
	}
	defer func() { <-ps.lock }()
	if k = ps.key.Load(); k != nil && k != stale {
		return k // read by another caller meanwhile
	}
	now := b.clock.Now().UnixNano()
	if ps.lastRead != 0 && now-ps.lastRead < int64(paidReread) {
		return k
	}
	ps.lastRead = now
	// Keep the secret this Bucket has if the store lost its own, so that
	// the slots this replica signed still pass.
	candidate := randomSecret()
	if k != nil {
		candidate = k.secret
	}
	rctx, cancel := context.WithTimeout(ctx, b.opts.ProbeInterval)
	defer cancel()
	bucket, secret, err := store.PaidSecret(rctx, candidate)
	if err == nil && len(secret) < minPaidSecret {
		err = &ParamError{Param: "paid secret", Msg: "is shorter than 16 bytes"}
	}
	if err != nil {
		b.log.Warn("reading the secret that signs paid slots failed: slots booked meanwhile are not signed, and returned ones book their layer again", "error", err)
		return k
	}
	nk := &paidKey{bucket: bucket, secret: secret}
	ps.key.Store(nk)
	return nk
}

// signPaid signs the slot that le booked, if it did (LimitError.Sig): with
// the store's secret, or for a slot the local fallback booked (local),
// with the Bucket's own (localPaidKey). It reads the store's secret only in
// ModeShared, once per replica; a slot left unsigned books its layer again
// when it comes back.
func (b *Bucket) signPaid(ctx context.Context, le *LimitError, local bool) {
	if le == nil || !le.Reserved {
		return
	}
	if local {
		le.Sig = b.localPaidKey().sign(le.Slot())
		return
	}
	if k := b.paidKey(ctx, b.Mode() == ModeShared, nil); k != nil {
		le.Sig = k.sign(le.Slot())
	}
}

// verifyPaid returns the slots of paid that carry this Bucket's signature:
// shared, signed with the store's secret (paid itself when all are), and
// local, signed with the Bucket's own (localPaidKey), which only its local
// fallback honours. Each slot it drops (a missing or wrong signature, or
// no secret to check it with) is logged at debug, counted
// (Stats.PaidRefused) and reported to Observer.PaidRefused, naming its
// layer only when the store has it; its layer then decides as if the
// message named no slot. A wrong signature makes it read the secret again
// (at most once per paidReread), in case the store's changed.
func (b *Bucket) verifyPaid(ctx context.Context, paid []PaidSlot) (shared, local []PaidSlot) {
	if len(paid) == 0 {
		return paid, nil
	}
	fetch := b.Mode() == ModeShared
	k := b.paidKey(ctx, fetch, nil)
	lk := b.localPaidKey()
	all := true
	for _, s := range paid {
		if k.verify(s) {
			continue
		}
		all = false
		if !lk.verify(s) && s.Sig != "" && k != nil && fetch {
			k = b.paidKey(ctx, true, k)
			break
		}
	}
	if all {
		return paid, nil
	}
	var layers []Layer
	if ls := b.layeredStore(); ls != nil {
		layers = ls.Layers()
	}
	for _, s := range paid {
		switch {
		case k.verify(s):
			shared = append(shared, s)
			continue
		case lk.verify(s):
			local = append(local, s)
			continue
		}
		// The layer's name is the message's word: only a layer of the
		// store is named, so that metrics keep a bounded set of labels.
		layer := ""
		if slices.ContainsFunc(layers, func(l Layer) bool { return l.Name == s.Layer }) {
			layer = s.Layer
		}
		b.layered.paid.refused.Add(1)
		b.log.Debug("a paid slot is refused: its signature is missing or wrong; its layer decides as usual",
			"layer", layer, "signed", s.Sig != "")
		if o := b.opts.Observer; o != nil && o.PaidRefused != nil {
			o.PaidRefused(layer)
		}
	}
	return shared, local
}

package backend

import "context"

// PaidSecretStore is a LayeredStore that keeps the secret with which the
// Buckets on it sign the slots its delay layers book (LimitError.Sig,
// PaidSlot.Sig), where every replica of the bucket reads the same one. A
// Bucket on a store without it signs with a random secret of this process:
// a slot then passes only a Bucket of this process, and one back at
// another replica books its layer again.
//
// A slot passes a layer only when its signature is the Bucket's HMAC-SHA256
// of the bucket's name, the slot's layer, key and due instant: a producer,
// who does not know the secret, cannot make one, nor move a genuine slot
// to another layer, key or instant.
type PaidSecretStore interface {
	// PaidSecret returns the name of the store's bucket and its secret,
	// at least 16 bytes. When the store keeps none yet, it keeps candidate
	// (random, 32 bytes) first, atomically: of the replicas that start
	// together, the first to write wins and all of them return its secret.
	PaidSecret(ctx context.Context, candidate []byte) (bucket string, secret []byte, err error)
}

// Slot returns the slot that e booked (with Reserved), as the message
// carries it back in Request.Paid: Layer, Key, RetryAt (in UTC), the
// instant the store booked it and Sig.
func (e *LimitError) Slot() PaidSlot {
	s := PaidSlot{Layer: e.Layer, Key: e.Key, Due: e.RetryAt.UTC(), Sig: e.Sig}
	if !e.booked.IsZero() {
		s.Booked = e.booked.UTC()
	}
	return s
}

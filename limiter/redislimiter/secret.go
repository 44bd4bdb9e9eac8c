package redislimiter

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// paidSecretSuffix ends the name of the key that holds a bucket's paid-slot
// secret: PREFIX{NAME}:paid-secret.
const paidSecretSuffix = ":paid-secret"

// paidSecretScript keeps a candidate secret unless the key holds one
// already, and returns the one it holds: lua/paid_secret.lua, without the
// prelude.
var paidSecretScript = redis.NewScript(luaSource("paid_secret.lua"))

// PaidSecret implements backend.PaidSecretStore: the secret with which the
// Buckets of every replica sign the slots that the delay layers book. It
// lives in the key PREFIX{NAME}:paid-secret, in the bucket's slot, without
// a TTL: candidate if the key did not exist, else the secret already there.
// A Bucket reads it once (one script call) and keeps it. Deleting the key
// costs the slots signed before their pass, never more: such a message
// books its layer again when it comes back (set aside once more). A
// replica reads the key again when a signed slot fails to verify (at most
// every few seconds), offering the secret it has, so the replicas come to
// share one again. The secret never appears in errors or logs.
func (s *Store) PaidSecret(ctx context.Context, candidate []byte) (bucket string, secret []byte, err error) {
	if len(candidate) == 0 {
		return "", nil, &limiter.ParamError{Param: "candidate", Msg: "must not be empty"}
	}
	v, err := paidSecretScript.Run(ctx, s.client, []string{s.paidSecretKey()}, candidate).Text()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			err = fmt.Errorf("%w: no secret after SET NX", backend.ErrMalformedReply)
		}
		return "", nil, s.fail("read paid secret", err)
	}
	return s.cfg.Bucket, []byte(v), nil
}

// paidSecretKey names the key of the bucket's paid-slot secret.
func (s *Store) paidSecretKey() string {
	return s.cfg.Prefix + "{" + s.cfg.Bucket + "}" + paidSecretSuffix
}

var _ backend.PaidSecretStore = (*Layered)(nil)

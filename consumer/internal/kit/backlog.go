package kit

import "github.com/throttlehq/throttle/consumer"

// BacklogTotal returns every message of b, ready or set aside, or 0 and
// err when err is not nil: a backend's Backlog from its BacklogParts.
func BacklogTotal(b consumer.Backlog, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return b.Ready + b.SetAside, nil
}

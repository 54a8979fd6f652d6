package registry

import (
	"math/rand/v2"
	"time"
)

// minBackoff is the first retry delay.
const minBackoff = 100 * time.Millisecond

// backoff is a capped exponential backoff with jitter: each delay is drawn
// from [d/2, d], where d doubles from minBackoff up to max.
type backoff struct {
	max time.Duration
	cur time.Duration
}

func newBackoff(limit time.Duration) *backoff {
	return &backoff{max: max(limit, minBackoff)}
}

// next returns the next delay.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = minBackoff
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

// reset starts over from minBackoff.
func (b *backoff) reset() { b.cur = 0 }

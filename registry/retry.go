package registry

import (
	"context"
	"errors"
	"time"

	"github.com/beaconplane/beacon/store"
)

// heartbeatAttempts bounds the attempts of one heartbeat's store call.
const heartbeatAttempts = 4

// retryTimedOut runs call with a deadline of limit, again at once while an
// attempt ran out of its time with the store unavailable, up to
// heartbeatAttempts attempts and while ctx allows: one attempt at a time.
// An attempt that failed before its deadline is an answer, as is a
// success.
//
// Attempts are not hedged (a second started beside a slow first): in the
// lease drill, hedged ownership reads made a leader resumed from SIGSTOP
// end 15 of 16 HTTP registrations that had been renewed in time (none
// without), while shorter sequential attempts for reads removed the
// failed renewals as well.
func retryTimedOut[T any](ctx context.Context, limit time.Duration, call func(context.Context) (T, error)) (T, error) {
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, limit)
		v, err := call(actx)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil || ctx.Err() != nil || !timedOut || !errors.Is(err, store.ErrUnavailable) || n == heartbeatAttempts {
			return v, err
		}
	}
}

package bus

import (
	"context"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Dedup wraps h into an idempotent consumer: an event whose envelope ID is
// among the IDs of the last window events h handled successfully is skipped
// (the wrapper returns nil without calling h). An ID is remembered only once
// h returned nil for it, so a failed attempt is retried (Retry), not skipped.
//
// The memory is an LRU of window IDs (github.com/hashicorp/golang-lru/v2),
// about 100 bytes per entry plus the ID, allocated as IDs arrive; safe for
// concurrent use. Two deliveries of one ID that run at the same time (on
// different keys, which the bus does not order) can both call h. Use one
// Dedup per Subscribe: the memory belongs to the returned handler.
//
// It returns an error wrapping keysched.ErrInvalidOption, and a nil
// handler, for a nil h or a window below 1.
func Dedup[K comparable, E any](h Handler[K, E], window int) (Handler[K, E], error) {
	if h == nil {
		return nil, argError("Dedup: nil handler")
	}
	if window < 1 {
		return nil, argError("Dedup: window %d (the number of event IDs remembered): need at least 1", window)
	}
	seen, err := lru.New[string, struct{}](window)
	if err != nil { // only for window < 1, excluded above
		return nil, argError("Dedup: window %d: %w", window, err)
	}
	return func(ctx context.Context, env Envelope[K], event E) error {
		if seen.Contains(env.ID) {
			return nil
		}
		if err := h(ctx, env, event); err != nil {
			return err
		}
		seen.Add(env.ID, struct{}{})
		return nil
	}, nil
}

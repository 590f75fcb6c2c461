package trace

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
)

// Synthetic generates a stream of n events over keys keys whose popularity
// follows a Zipf law: the key of rank k (0-based, "key-0" the hottest) is
// drawn with probability proportional to 1/(k+1)^exponent, so exponent 0 is
// uniform and larger exponents are more skewed (around 1 is typical of real
// traffic). Keys that are never drawn do not appear.
//
// Events carry the same precondition chain as a real stream: the first event
// of a key adds it (status A, PrevBlob all zeros), later ones modify it (M),
// and about one event in 64 deletes it (D, NextBlob all zeros), after which
// the next event adds it again. Blob ids are unique 40-digit hex numbers.
// Each event is a commit of its own, one second after the previous one.
//
// The stream depends only on the arguments: the same seed gives the same
// stream. Synthetic fails for n < 0, keys < 1, or a negative or non-finite
// exponent.
func Synthetic(n, keys int, exponent float64, seed uint64) ([]Event, error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("trace: synthetic: %d events: need at least 0", n)
	case keys < 1:
		return nil, fmt.Errorf("trace: synthetic: %d keys: need at least 1", keys)
	case exponent < 0 || math.IsNaN(exponent) || math.IsInf(exponent, 0):
		return nil, fmt.Errorf("trace: synthetic: Zipf exponent %v: need a finite number >= 0", exponent)
	}
	cdf := make([]float64, keys)
	total := 0.0
	for k := range cdf {
		total += math.Pow(float64(k+1), -exponent)
		cdf[k] = total
	}
	if total == 0 || math.IsInf(total, 0) {
		return nil, errors.New("trace: synthetic: the Zipf weights do not sum to a finite positive number")
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	names := make([]string, keys)
	state := make([]string, keys) // "" = absent
	events := make([]Event, n)
	const t0 = 1_700_000_000
	for i := range events {
		k := sort.SearchFloat64s(cdf, rng.Float64()*total)
		if k >= keys { // rounding at the very top
			k = keys - 1
		}
		if names[k] == "" {
			names[k] = "key-" + strconv.Itoa(k)
		}
		e := Event{
			Seq:      int64(i),
			UnixTime: t0 + int64(i),
			Commit:   fmt.Sprintf("%040x", uint64(i)+1<<40),
			Key:      names[k],
			PrevBlob: state[k],
			NextBlob: fmt.Sprintf("%040x", i+1),
			Status:   'M',
		}
		switch {
		case e.PrevBlob == "":
			e.PrevBlob, e.Status = ZeroID, 'A'
		case rng.IntN(64) == 0:
			e.NextBlob, e.Status = ZeroID, 'D'
		}
		if e.Status == 'D' {
			state[k] = ""
		} else {
			state[k] = e.NextBlob
		}
		events[i] = e
	}
	return events, nil
}

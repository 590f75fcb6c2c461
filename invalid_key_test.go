package keysched

import (
	"context"
	"math"
	"strings"
	"testing"
)

// ErrInvalidKey's message says which case it found: a key holding a value
// that is not comparable (naming its type), or one not equal to itself (a
// NaN), for Submit, SubmitBatch and Resume alike.
func TestInvalidKeyErrorSaysWhichCase(t *testing.T) {
	s, err := New[any](WithWorkers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	nop := func(context.Context) error { return nil }
	type pair struct{ A, B any }
	for _, c := range []struct {
		key       any
		want, not string
	}{
		{[]int{1}, "not comparable (runtime error: comparing uncomparable type []int)", "NaN"},
		{pair{1, map[string]int{}}, "not comparable (runtime error: comparing uncomparable type map[string]int)", "NaN"},
		{math.NaN(), "a float64 key that is not equal to itself (it holds a NaN)", "comparable"},
		{pair{1, math.NaN()}, "a keysched.pair key that is not equal to itself (it holds a NaN)", "comparable"},
	} {
		_, err := s.Submit(context.Background(), c.key, nop)
		_, errB := s.SubmitBatch(context.Background(), []BatchItem[any]{{Key: 1, Task: nop}, {Key: c.key, Task: nop}})
		errR := s.Resume(c.key)
		for _, err := range []error{err, errB, errR} {
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), c.not) {
				t.Errorf("key %#v: %v, want an error saying %q and not %q", c.key, err, c.want, c.not)
			}
		}
	}
}

package optcheck

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/panjf2000/ants/v2"
)

// Each check accepts the values at its bounds and refuses those past them,
// naming the option and showing the value as the refusal's text does.
func TestChecksRefuseOnlyValuesPastTheirBounds(t *testing.T) {
	released, err := ants.NewPool(1)
	if err != nil {
		t.Fatal(err)
	}
	released.Release()
	pool, err := ants.NewPool(1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Release()
	logger := slog.New(slog.DiscardHandler)
	type policy int
	for _, tc := range []struct {
		name  string
		r     *Refusal
		value string // "" and ok: accepted
		ok    bool
	}{
		{"workers 1", Workers("W", 1), "", true},
		{"workers MaxInt32", Workers("W", math.MaxInt32), "", true},
		{"workers 0", Workers("W", 0), "0", false},
		{"workers above int32", Workers("W", math.MaxInt32+1), "2147483648", false},
		{"pool", Pool("W", pool), "", true},
		{"nil pool", Pool("W", nil), "nil", false},
		{"released pool", Pool("W", released), "", false},
		{"logger", Logger("W", logger), "", true},
		{"nil logger", Logger("W", nil), "nil", false},
		{"function", NotNil("W", false, "a function"), "", true},
		{"nil function", NotNil("W", true, "a function"), "nil", false},
		{"at least 1: 1", AtLeast("W", 1, 1), "", true},
		{"at least 1: 0", AtLeast("W", 0, 1), "0", false},
		{"at least 0: 0", AtLeast("W", 0, 0), "", true},
		{"at least 0: -1", AtLeast("W", -1, 0), "-1", false},
		{"positive 1ns", Positive("W", 1), "", true},
		{"positive 0", Positive("W", 0), "0s", false},
		{"not negative 0", NotNegative("W", 0), "", true},
		{"not negative -1ns", NotNegative("W", -1), "-1ns", false},
		{"within: low", Within("W", time.Second, time.Second, time.Minute), "", true},
		{"within: high", Within("W", time.Minute, time.Second, time.Minute), "", true},
		{"within: below", Within("W", time.Second-1, time.Second, time.Minute), "999.999999ms", false},
		{"within: above", Within("W", time.Minute+1, time.Second, time.Minute), "1m0.000000001s", false},
		{"text", Text("W", "a", 1), "", true},
		{"empty text", Text("W", "", 0), `""`, false},
		{"long text", Text("W", "ab", 1), `"ab"`, false},
		{"one of", OneOf("W", policy(1), "policy", 0, 1), "", true},
		{"none of", OneOf("W", policy(7), "policy", 0, 1), "7", false},
	} {
		if tc.ok {
			if tc.r != nil {
				t.Errorf("%s: refused: %+v", tc.name, *tc.r)
			}
			continue
		}
		if tc.r == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if tc.r.Option != "W" || tc.r.Value != tc.value || tc.r.Reason == "" || tc.r.With != "" {
			t.Errorf("%s: %+v, want Option W, Value %q and a reason", tc.name, *tc.r, tc.value)
		}
	}
	if r := NilOption(2, "RelayOption"); r.Option != "opts[2]" || r.Reason != "nil RelayOption" {
		t.Errorf("NilOption: %+v", *r)
	}
	if r := WorkersWithPool("WithWorkers", "WithPool"); r.Option != "WithWorkers" || r.With != "WithPool" || r.Value != "" {
		t.Errorf("WorkersWithPool: %+v", *r)
	}
}

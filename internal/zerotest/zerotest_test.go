package zerotest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

var errZero = errors.New("zero handle")

// good guards every method.
type good struct{ m map[string]int }

func (g *good) zero() bool { return g == nil || g.m == nil }
func (g *good) Get(ctx context.Context, k string) (int, error) {
	if g.zero() {
		return 0, errZero
	}
	return g.m[k], ctx.Err()
}
func (g *good) Len() int {
	if g.zero() {
		return 0
	}
	return len(g.m)
}
func (g *good) Opts(ctx context.Context, opts ...string) error {
	if g.zero() {
		return errZero
	}
	return nil
}

// bad has one flaw per method.
type bad struct {
	m  map[string]int
	ch chan int
}

func (b *bad) Panics() int                 { return len(b.m) }            // nil deref on a nil *bad
func (b *bad) WrongErr() error             { return errors.New("other") } // not errZero
func (b *bad) NilErr() error               { return nil }                 // silently "works"
func (b *bad) NonZero() string             { return "x" }                 // not a zero value
func (b *bad) Hangs(context.Context) error { <-b.ch; return errZero }     // blocks on a nil channel

func TestGood(t *testing.T) {
	Check[good](t, errZero, []string{"Get", "Len", "Opts"})
}

func TestBad(t *testing.T) {
	old := Watchdog
	Watchdog = 50 * time.Millisecond // the hang is certain: a nil channel never delivers
	defer func() { Watchdog = old }()
	for _, recv := range []*bad{nil, new(bad)} {
		ps := Problems(func() any { return recv }, errZero, []string{"Panics", "WrongErr", "NilErr", "NonZero", "Hangs", "Gone"})
		all := strings.Join(ps, "\n")
		for _, want := range []string{
			"no exported method Gone",
			".WrongErr: result 0 is other",
			".NilErr: result 0 is <nil>",
			".NonZero: result 0 is \"x\"",
		} {
			if !strings.Contains(all, want) {
				t.Errorf("%v: problems lack %q:\n%s", describe0(recv), want, all)
			}
		}
		hang := ".Hangs did not return" // on new(bad); a nil *bad panics reading b.ch
		if recv == nil {
			hang = ".Hangs panicked"
		}
		if !strings.Contains(all, hang) {
			t.Errorf("%v: problems lack %q:\n%s", describe0(recv), hang, all)
		}
		if got := strings.Contains(all, ".Panics panicked"); got != (recv == nil) {
			t.Errorf("%v: Panics reported as panicking: %v:\n%s", describe0(recv), got, all)
		}
	}
	// A Special replaces the default rule for its method.
	ps := Problems(func() any { return new(bad) }, errZero, []string{"Panics", "WrongErr", "NilErr", "NonZero", "Hangs"},
		Special{"NonZero", func(res []any) error {
			if res[0] != "x" {
				return errors.New("want x")
			}
			return nil
		}},
		Special{"NilErr", func([]any) error { return errors.New("special said no") }},
		Special{"WrongErr", func([]any) error { panic("boom") }})
	all := strings.Join(ps, "\n")
	if strings.Contains(all, ".NonZero") || !strings.Contains(all, ".NilErr: special said no") ||
		!strings.Contains(all, ".WrongErr: check panicked: boom") {
		t.Errorf("specials not applied:\n%s", all)
	}
	// A method missing from the list is reported.
	ps = Problems(func() any { return new(good) }, errZero, []string{"Get", "Len"})
	if len(ps) != 1 || !strings.Contains(ps[0], "Opts is not in the test's method list") {
		t.Errorf("unlisted method: got %q", ps)
	}
}

func describe0(b *bad) string {
	if b == nil {
		return "nil"
	}
	return "zero"
}

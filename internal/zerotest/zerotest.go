// Package zerotest checks that a handle type's nil and zero values are safe:
// every exported method, called on a nil pointer or on new(T), returns an
// error matching the package's sentinel (errors.Is) from each error result
// and zero values from the others, instead of panicking or hanging.
//
// The tests of this repository's modules use it on their handle types
// (kafka.Consumer, outbox.Outbox, ...). The caller lists the methods it
// expects the type to have: a method added to the type and not to the list
// fails the check, so a new method without a zero check is caught.
package zerotest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

// Watchdog is how long one call may take before Problems reports it as hung.
// It is a backstop that turns a hang into a named failure, not a timing
// assertion: a zero-value method returns at once or never.
var Watchdog = 30 * time.Second

var (
	ctxType = reflect.TypeFor[context.Context]()
	errType = reflect.TypeFor[error]()
)

// Problems calls every exported method of a receiver made by recv (a
// pointer: nil, or new(T); a fresh one for each method, so that one call's
// effect on a zero value does not hide another's), with context.Background() for each context.Context parameter and zero
// values for the others (an empty variadic part), and returns one line per
// thing wrong:
//
//   - methods is not exactly the set of recv's exported methods;
//   - a call panicked, or did not return within Watchdog;
//   - an error result was not errors.Is(err, want) (nil included);
//   - another result was not its type's zero value.
//
// A Special replaces the last two rules for its method. It returns nil when
// everything holds. recv must make a pointer.
func Problems(recv func() any, want error, methods []string, special ...Special) []string {
	typ := reflect.TypeOf(recv())
	if typ.Kind() != reflect.Pointer {
		return []string{fmt.Sprintf("%v is not a pointer type", typ)}
	}
	var out []string
	var have []string
	for i := range typ.NumMethod() {
		have = append(have, typ.Method(i).Name)
	}
	for _, m := range have {
		if !slices.Contains(methods, m) {
			out = append(out, fmt.Sprintf("%v.%s is not in the test's method list (add it, and give it a zero check)", typ, m))
		}
	}
	for _, m := range methods {
		if !slices.Contains(have, m) {
			out = append(out, fmt.Sprintf("%v has no exported method %s (listed by the test)", typ, m))
		}
	}
	for _, name := range have {
		var sp func([]any) error
		for _, s := range special {
			if s.Method == name {
				sp = s.Check
			}
		}
		out = append(out, call(reflect.ValueOf(recv()), name, want, sp)...)
	}
	return out
}

// A Special checks one method's results instead of the default rule, for a
// result whose zero value would be wrong (a nil http.Handler, say, which
// http.Server replaces with http.DefaultServeMux). Check gets the results
// and returns what is wrong with them, or nil.
type Special struct {
	Method string
	Check  func(results []any) error
}

func call(v reflect.Value, name string, want error, special func([]any) error) []string {
	m := v.MethodByName(name)
	mt := m.Type()
	n := mt.NumIn()
	if mt.IsVariadic() {
		n--
	}
	args := make([]reflect.Value, n)
	for i := range n {
		if in := mt.In(i); in == ctxType {
			args[i] = reflect.ValueOf(context.Background())
		} else {
			args[i] = reflect.Zero(in)
		}
	}
	type result struct {
		outs  []reflect.Value
		panic any
		ok    bool
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if !r.ok {
				r.panic = recover()
			}
			done <- r
		}()
		r.outs = m.Call(args)
		r.ok = true
	}()
	label := fmt.Sprintf("(%v)(%s).%s", v.Type(), describe(v), name)
	var r result
	select {
	case r = <-done:
	case <-time.After(Watchdog):
		return []string{fmt.Sprintf("%s did not return within %v (hang)", label, Watchdog)}
	}
	if !r.ok {
		return []string{fmt.Sprintf("%s panicked: %v", label, r.panic)}
	}
	if special != nil {
		res := make([]any, len(r.outs))
		for i, o := range r.outs {
			res[i] = o.Interface()
		}
		if err := runSpecial(special, res); err != nil {
			return []string{fmt.Sprintf("%s: %v", label, err)}
		}
		return nil
	}
	var out []string
	for i, o := range r.outs {
		if mt.Out(i) == errType {
			err, _ := o.Interface().(error)
			if !errors.Is(err, want) {
				out = append(out, fmt.Sprintf("%s: result %d is %v, want an error matching %q", label, i, err, want))
			}
			continue
		}
		if !o.IsZero() {
			out = append(out, fmt.Sprintf("%s: result %d is %#v, want the zero %v", label, i, o.Interface(), o.Type()))
		}
	}
	return out
}

// runSpecial runs a Special's check, turning its panic (a handler returned
// by a zero value that panics when served, say) into an error.
func runSpecial(check func([]any) error, res []any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("check panicked: %v", p)
		}
	}()
	return check(res)
}

func describe(v reflect.Value) string {
	if v.IsNil() {
		return "nil"
	}
	return "zero"
}

// Check runs Problems on a nil *T and on new(T) (fresh for each method), as subtests "nil" and
// "zero", and reports each problem with t.Error.
func Check[T any](t *testing.T, want error, methods []string, special ...Special) {
	t.Helper()
	for _, c := range []struct {
		name string
		recv func() *T
	}{{"nil", func() *T { return nil }}, {"zero", func() *T { return new(T) }}} {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range Problems(func() any { return c.recv() }, want, methods, special...) {
				t.Error(p)
			}
		})
	}
}

// Package schedopt tells the modules below github.com/keysched/keysched
// which settings a keysched.Option makes, so that an adapter that sets some
// of them itself (the outbox relay: its dead letter, failure policy and
// bounds) can refuse a caller's option it would otherwise override without
// a word. keysched.Option is a function over an unexported config, so only
// package keysched can look inside one: it sets Settings when it is
// initialized (this package cannot import it: keysched imports this
// package). Like optcheck it is the modules' shared contract, versioned with
// the core: add names, never change or remove one.
package schedopt

// Settings returns the names of the keysched options, among
// "WithDeadLetter", "WithFailurePolicy", "WithMaxPending",
// "WithMaxKeyDepth", "WithRetryPanics" and "WithObserver", whose setting o
// (a keysched.Option) makes, in that order; nil for anything else and for a
// nil option. One of them that refuses its value (WithMaxPending(0)) is
// named all the same (keysched.New would refuse it); another option that
// refuses its value gives nil.
// It is set by package keysched's initialization, so it is non-nil in any
// program that imports keysched.
var Settings func(o any) []string

package otelkeysched

import (
	"fmt"
	"reflect"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Registrations in force, by meter, instrument family, what they read and
// attribute set: two callbacks observing the same instruments with the same
// attributes are merged by the SDK into one series, counters summed. For two
// schedulers (two members of a Kafka group in one process) that is their
// total; for one scheduler registered twice it counts every task twice,
// silently. claim refuses the second registration of one target.
const (
	familyScheduler = "scheduler" // Register, RegisterSubscription (both)
	familyBus       = "bus"       // RegisterBus
)

type claimKey struct {
	meter  metric.Meter
	family string
	target any // the scheduler, subscription or bus read
	attrs  attribute.Distinct
}

var claims struct {
	mu sync.Mutex
	m  map[claimKey]struct{}
}

// claim records a registration of family's instruments on meter reading
// target with attrs, or returns an error wrapping ErrRegistered if one is in
// force. release ends the claim. A meter or target whose dynamic type cannot
// be a map key (a MeterProvider of one's own with uncomparable fields) is
// not tracked.
func claim(meter metric.Meter, family string, target any, attrs []attribute.KeyValue) (release func(), err error) {
	if !hashable(meter) || !hashable(target) {
		return func() {}, nil
	}
	set := attribute.NewSet(attrs...)
	k := claimKey{meter: meter, family: family, target: target, attrs: set.Equivalent()}
	claims.mu.Lock()
	defer claims.mu.Unlock()
	if _, dup := claims.m[k]; dup {
		return nil, fmt.Errorf("%w: otelkeysched: this %s is registered already on this MeterProvider with the attributes {%s}: "+
			"its series would be counted twice", ErrRegistered, family, set.Encoded(attribute.DefaultEncoder()))
	}
	if claims.m == nil {
		claims.m = map[claimKey]struct{}{}
	}
	claims.m[k] = struct{}{}
	var once sync.Once
	return func() {
		once.Do(func() {
			claims.mu.Lock()
			delete(claims.m, k)
			claims.mu.Unlock()
		})
	}, nil
}

// hashable reports whether v can be a map key (comparing an interface whose
// dynamic value is not comparable panics).
func hashable(v any) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	_ = v == v
	return true
}

// isNil reports whether v is nil or an interface holding a nil pointer (a
// typed nil *bus.Bus or *bus.Subscription passed as an interface): calling
// its methods would panic, at registration or, worse, at every collection
// in the exporter's goroutine.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

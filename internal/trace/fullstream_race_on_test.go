//go:build race

package trace

// fullStreamUnderRace: the race detector makes loading and replaying the
// whole 96,875-event stream take 25-50 s on 2 busy cores; .ci/run runs the
// full-stream tests without it (go test -run FullStream), the race run skips
// them.
const fullStreamUnderRace = true

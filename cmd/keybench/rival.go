package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// A rival is one scheduler under comparison, seen through the smallest
// interface every candidate has: run fn for key, after the key's earlier
// functions if the rival promises per-key order.
//
// Submit may wait for room (that is the rival's admission control: keybench
// publishes from one goroutine, so a waiting Submit holds back every later
// event) and must return ctx's error if ctx ends while it waits. Close waits
// until every accepted fn has returned, then releases the rival; it reports
// anything the rival noticed going wrong (a task lost, failed or panicked).
type rival interface {
	Submit(ctx context.Context, key string, fn func()) error
	Close() error
}

// A taskRival also takes a task in keysched's shape directly. keybench
// prefers SubmitTask when a rival has it, so that adapting func() to
// func(context.Context) error costs no allocation in the measurement.
type taskRival interface {
	rival
	SubmitTask(ctx context.Context, key string, task func(context.Context) error) error
}

// rivalConfig sizes a rival. Every rival gets the same one: sizes are
// comparable across rivals by construction.
type rivalConfig struct {
	// Workers is how many events may run at once: keysched's pool size,
	// striped's lane count, the plain pool's size. Unbounded rivals ignore it.
	Workers int
	// Queue bounds accepted, unfinished events for the rivals that bound
	// them: keysched's WithMaxPending, striped's lane buffers (Queue/Workers
	// each). 0 means the rival's own default.
	Queue int
	// KeyDepth bounds one key's queued plus running events, for the rivals
	// that bound it (keysched's WithMaxKeyDepth). 0 means the rival's default.
	KeyDepth int
	// Seed is the run's seed: striped hashes keys onto lanes with it.
	Seed uint64
}

// rivalInfo registers a rival under a name.
type rivalInfo struct {
	// Name is what --schedulers takes: lower case, no commas or spaces.
	Name string
	// Doc is one line for --help and the docs: what the rival is.
	Doc string
	// Ordered tells whether the rival promises per-key order. An ordered
	// rival's order violations or state mismatches are a bug: keybench exits
	// non-zero when it sees one.
	Ordered bool
	// Order places the rival in the default run ("all"): lower runs first.
	Order int
	// New builds a fresh rival; each run gets its own.
	New func(rivalConfig) (rival, error)
}

// rivals is the registry: every scheduler keybench can compare, by name.
// Add one from a file of its own with an init function:
//
//	func init() {
//		register(rivalInfo{Name: "bus", Doc: "…", Ordered: true, Order: 50, New: newBus})
//	}
var rivals = map[string]rivalInfo{}

// register adds a rival to the registry. It panics on a duplicate or
// malformed entry: that is a programming error, found at start-up.
func register(info rivalInfo) {
	switch {
	case info.Name == "" || strings.ContainsAny(info.Name, ", \t") || strings.ToLower(info.Name) != info.Name:
		panic(fmt.Sprintf("keybench: bad rival name %q", info.Name))
	case info.Name == "all":
		panic("keybench: rival name \"all\" is reserved")
	case info.New == nil:
		panic(fmt.Sprintf("keybench: rival %q has no constructor", info.Name))
	}
	if _, dup := rivals[info.Name]; dup {
		panic(fmt.Sprintf("keybench: rival %q registered twice", info.Name))
	}
	rivals[info.Name] = info
}

// rivalNames returns the registered names in their default run order.
func rivalNames() []string {
	names := make([]string, 0, len(rivals))
	for n := range rivals {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if oa, ob := rivals[a].Order, rivals[b].Order; oa != ob {
			return oa - ob
		}
		return strings.Compare(a, b)
	})
	return names
}

// pickRivals resolves --schedulers: names in the order given, "all" for every
// registered rival. Unknown names and repeats are errors.
func pickRivals(list []string) ([]rivalInfo, error) {
	var out []rivalInfo
	seen := map[string]bool{}
	for _, raw := range list {
		name := strings.TrimSpace(raw)
		if name == "" {
			continue
		}
		names := []string{name}
		if name == "all" {
			names = rivalNames()
		}
		for _, n := range names {
			info, ok := rivals[n]
			if !ok {
				return nil, fmt.Errorf("--schedulers: unknown scheduler %q (known: %s, or all)", n, strings.Join(rivalNames(), ", "))
			}
			if seen[n] {
				return nil, fmt.Errorf("--schedulers: %q given twice", n)
			}
			seen[n] = true
			out = append(out, info)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--schedulers: no scheduler given (known: %s, or all)", strings.Join(rivalNames(), ", "))
	}
	return out, nil
}

package keysched

import (
	"errors"
	"fmt"

	"github.com/keysched/keysched/internal/optcheck"
)

// Sentinel errors. Compare with errors.Is: the errors returned by this package
// often wrap one of these together with a cause (a context's error, say).
var (
	// ErrClosed is returned by Submit and TrySubmit once Close has started,
	// and by Resume and Skip once Close gave up on unfinished tasks or
	// returned.
	ErrClosed = errors.New("keysched: scheduler closed")
	// ErrKeyFull means the key already holds WithMaxKeyDepth queued and
	// running tasks. TrySubmit and submissions made from inside a task return
	// it at once; Submit returns it (wrapped with ctx's error) when ctx ends
	// before room appeared.
	ErrKeyFull = errors.New("keysched: key at its depth bound")
	// ErrFull means the scheduler already holds WithMaxPending accepted,
	// unfinished tasks. Returned like ErrKeyFull.
	ErrFull = errors.New("keysched: scheduler at its pending bound")
	// ErrAborted is the outcome of an accepted task that Close gave up on
	// (its context ended first) and that therefore never runs (again).
	// Close's own error wraps it too. A task that never ran has ErrAborted
	// itself as its outcome; one that had run and failed (parked, or waiting
	// out a retry backoff or a Snooze) has an error that says so and matches
	// ErrAborted with errors.Is ("keysched: parked task aborted by Close
	// (it ran and failed; it does not run again)").
	ErrAborted = errors.New("keysched: task aborted by Close before it ran")
	// ErrNilTask is returned when the task is nil. Nothing is enqueued.
	ErrNilTask = errors.New("keysched: nil task")
	// ErrInvalidKey is returned for a key that cannot be used as a map key:
	// an interface key whose dynamic value is not comparable (a slice, a map,
	// a func, or a struct holding one), or a key that is not equal to itself
	// (a floating-point NaN anywhere in it). Nothing is enqueued, and the
	// scheduler keeps working for every other key.
	ErrInvalidKey = errors.New("keysched: invalid key")
	// ErrEmptyBatch is returned by SubmitBatch and TrySubmitBatch for a
	// batch with no items.
	ErrEmptyBatch = errors.New("keysched: empty batch")
	// ErrNilCompletion is what Err and Wait return on a nil *Completion:
	// the one Submit (or TrySubmit) returns together with its error. Check
	// Submit's error first; a nil Completion's Done channel is closed. A
	// zero Completion (made by the caller, not returned by a scheduler)
	// answers the same.
	ErrNilCompletion = errors.New("keysched: nil *Completion (the task was not accepted: check Submit's error)")
	// ErrNilContext is returned when a nil context.Context is passed.
	ErrNilContext = errors.New("keysched: nil context")
	// ErrZeroScheduler is returned by the methods of a nil or zero-value
	// Scheduler (one not made by New) that return an error; the others
	// return zero values. Nothing is enqueued.
	ErrZeroScheduler = errors.New("keysched: nil or zero Scheduler (make one with New)")
	// ErrInsideTask is returned by Drain and Close when called with the
	// context a keysched task received (or DeadLetter.Context), of any
	// scheduler: the call could wait for the very task that makes it. The
	// context is how the call is known to come from a task: made from a task
	// with another context, Close waits for that task for ever (see Close).
	ErrInsideTask = errors.New("keysched: called with a task's context; it could wait for that task")
	// ErrDeadlock is returned (wrapped) by Completion.Wait, called with the
	// context of a running task T, when the wait could never end:
	//
	//   - the waited task is T itself, or a later task of T's own key (it
	//     can run only after T returns);
	//   - the wait closes a cycle of waits: the waited task N can run only
	//     after the task now running at the head of N's key, which itself
	//     waits (with its own context) for a task that can run only after
	//     ..., back to T's key. Cycles of any length up to 65,536 waits, across
	//     keys and schedulers, are found when the wait that closes them
	//     begins, by a walk that costs nothing to tasks that never wait.
	//
	// A wait on another key's task that can still run is allowed. Only waits
	// made with the task's context are seen: a task waiting with another
	// context (context.Background()), by receiving from Completion.Done, or
	// with goroutines of its own is invisible (a wait that could never end
	// then blocks, silently, until that context ends), as are deadlocks through
	// anything other than Completion.Wait (a channel, a mutex, a pool with
	// every worker waiting). A wait made with the task's context by a
	// goroutine the task started counts as the task's own: a cycle through
	// it is reported even while the task itself is not blocked (a false
	// positive). When two waits close one cycle at the same
	// instant, both may fail (each saw the other's wait); a cycle is reported
	// only if every wait in it was seen in progress at one instant, so a
	// chain of waits that moves on while it is walked is never reported.
	ErrDeadlock = errors.New("keysched: wait could never end (deadlock)")
	// ErrNotParked is returned by Resume and Skip for a key that is not parked.
	ErrNotParked = errors.New("keysched: key is not parked")
	// ErrInvalidOption is matched (errors.Is) by every error New returns for
	// a bad option: each is an *OptionError, which names the option.
	ErrInvalidOption = errors.New("keysched: invalid option")
)

// PanicError is the outcome (Completion.Err, DeadLetter.Err) of a task that
// panicked. The panic is recovered on the worker, the worker lives on, and the
// key goes on with its next task. Retrieve it with errors.As.
type PanicError struct {
	// Value is the value passed to panic. A task that called runtime.Goexit
	// (testing.T.FailNow does) is reported as a panic with a Value that is
	// an error saying so.
	Value any
	// Stack is the panicking goroutine's stack trace, as runtime/debug.Stack
	// formats it.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("keysched: task panicked: %v", e.Value) }

// Unwrap returns the panic value when it is an error, so errors.Is and
// errors.As see through a panic(err).
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// errGoexit is the PanicError value of a task that called runtime.Goexit.
var errGoexit = errors.New("keysched: task called runtime.Goexit (t.FailNow, t.SkipNow or similar)")

// permanentError marks an error that must not be retried.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent wraps err so that a retry policy does not retry it: the task goes
// straight to the dead letter (or, without one, the log) after the attempt
// that returned it. errors.Is(Permanent(e), e) holds. Permanent(nil) is nil:
// a task returning it succeeded.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was made by Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// OptionError is the error New returns for an option it refuses: a value out
// of its range, a function or observer for another key type, or two options
// that cannot both hold (see Option for which those are). errors.Is(err,
// ErrInvalidOption) holds for it; errors.As retrieves it, so that code that
// passes options on to New (the bus, the Kafka adapter, the outbox relay)
// can tell which one was refused, by its name, and say so in its own terms
// rather than matching the error's text.
//
// It is also the error of every module of keysched for an option of its own
// that it refuses: the bus (wrapped, "bus: ..."), the Kafka adapter, the
// outbox and its relay, the inbox and otelkeysched. So one
//
//	var oe *keysched.OptionError
//	if errors.As(err, &oe) { ... oe.Option ... }
//
// finds the refused option whichever module refused it. Such an error has
// the module's own sentinel in Sentinel (kafka.ErrInvalidOption,
// outbox.ErrInvalidOption, inbox.ErrInvalidOption): errors.Is matches both
// that and ErrInvalidOption.
type OptionError struct {
	// Option names the refused option as the caller writes it, without its
	// arguments: "WithWorkers", "WithRetry", "WithDeadLetter"; for a nil
	// Option, "opts[i]" with its index in New's arguments.
	Option string
	// Value is the refused argument as given (fmt's %v; a string quoted),
	// or "" where the reason says it (a RetryPolicy's field, say).
	Value string
	// With names the other option when the two cannot both hold
	// ("WithPool" for WithWorkers given with WithPool); otherwise "".
	With string
	// Reason says what is wrong, with the value given.
	Reason string
	// Err is the cause when a library below refused the value (the error
	// of ants.NewPool), or nil.
	Err error
	// Sentinel is, for an option of another module of keysched, that
	// module's ErrInvalidOption (kafka.ErrInvalidOption,
	// outbox.ErrInvalidOption, inbox.ErrInvalidOption): errors.Is matches
	// it as well as ErrInvalidOption, and Error begins with its text. nil
	// for the options of this package, of the bus and of otelkeysched,
	// whose sentinel is ErrInvalidOption itself.
	Sentinel error
}

// Error reads "keysched: invalid option: Option(Value): Reason", with the
// Sentinel's text in place of "keysched: invalid option" when there is one
// ("outbox: invalid option: WithBatchSize(0): need at least 1").
func (e *OptionError) Error() string {
	msg := ErrInvalidOption.Error()
	if e.Sentinel != nil {
		msg = e.Sentinel.Error()
	}
	msg += ": " + e.Option
	if e.Value != "" {
		msg += "(" + e.Value + ")"
	}
	msg += ": " + e.Reason
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrInvalidOption, which every OptionError is,
// or the Sentinel.
func (e *OptionError) Is(target error) bool {
	return target == ErrInvalidOption || e.Sentinel != nil && target == e.Sentinel
}

// Unwrap returns the cause (Err), or nil.
func (e *OptionError) Unwrap() error { return e.Err }

// optionError makes the *OptionError refusing option's argument value (nil:
// none shown) for the reason format and args say.
func optionError(option string, value any, format string, args ...any) error {
	return refused(optcheck.Refuse(option, value, format, args...))
}

// refused is the *OptionError of r, a refusal of the shared checks
// (internal/optcheck), or nil for nil: a check's result can be returned as
// it is.
func refused(r *optcheck.Refusal) error {
	if r == nil {
		return nil
	}
	return &OptionError{Option: r.Option, Value: r.Value, With: r.With, Reason: r.Reason}
}

// invalidKey is the ErrInvalidKey error for a key validKey refused, saying
// which case it found: a key holding a value that is not comparable (the
// runtime's message names its type), or one not equal to itself (a NaN,
// possibly inside a struct, array or interface).
func invalidKey[K comparable](k K) error {
	var why string
	func() {
		defer func() {
			if r := recover(); r != nil {
				why = fmt.Sprintf("a %T key that is not comparable (%v)", k, r)
			}
		}()
		if k != k {
			why = fmt.Sprintf("a %T key that is not equal to itself (it holds a NaN)", k)
		}
	}()
	if why == "" {
		why = fmt.Sprintf("a %T key", k) // not reached: validKey refused k
	}
	return fmt.Errorf("%w: %s", ErrInvalidKey, why)
}

// abortedAfterRun is the outcome of a task Close gave up on after it had
// run: parked, or waiting to run again. It matches ErrAborted (errors.Is);
// its text says the task ran, which ErrAborted's does not.
type abortedAfterRun struct{ msg string }

func (e *abortedAfterRun) Error() string { return e.msg }
func (e *abortedAfterRun) Unwrap() error { return ErrAborted }

var (
	errAbortedParked = &abortedAfterRun{"keysched: parked task aborted by Close (it ran and failed; it does not run again)"}
	errAbortedRerun  = &abortedAfterRun{"keysched: task aborted by Close before it ran again (it ran, and waited out a retry backoff or a Snooze)"}
)

// abortErr is the outcome of c aborted by Close: ErrAborted if it never
// ran, else an error that says it ran (parked: it was parked when taken).
func abortErr(c *Completion, parked bool) error {
	switch {
	case parked:
		return errAbortedParked
	case c.attempts() > 0:
		return errAbortedRerun
	default:
		return ErrAborted
	}
}

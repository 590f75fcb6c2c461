package schedopt_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/schedopt"
)

// Settings names what each option sets, even when it refuses its value, and
// nothing for the others (refused or not) or for a nil option.
func TestSettingsNamesWhatAnOptionSets(t *testing.T) {
	for _, c := range []struct {
		opt  keysched.Option
		want []string
	}{
		{keysched.WithDeadLetter(func(keysched.DeadLetter[string]) {}), []string{"WithDeadLetter"}},
		{keysched.WithFailurePolicy(keysched.Continue), []string{"WithFailurePolicy"}},
		{keysched.WithFailurePolicy(keysched.Park), []string{"WithFailurePolicy"}},
		{keysched.WithMaxPending(5), []string{"WithMaxPending"}},
		{keysched.WithMaxKeyDepth(5), []string{"WithMaxKeyDepth"}},
		{keysched.WithRetryPanics(), []string{"WithRetryPanics"}},
		{keysched.WithObserver(keysched.Observer[string]{}), []string{"WithObserver"}},
		{keysched.WithTaskAges(), nil},
		{keysched.WithWorkers(3), nil},
		{keysched.WithLogger(slog.Default()), nil},
		{keysched.WithMaxPending(0), []string{"WithMaxPending"}},
		{keysched.WithDeadLetter[string](nil), []string{"WithDeadLetter"}},
		{keysched.WithWorkers(0), nil},
		{nil, nil},
	} {
		require.Equal(t, c.want, schedopt.Settings(c.opt))
	}
	require.Nil(t, schedopt.Settings("not an option"))
}

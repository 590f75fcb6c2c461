package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/service"
)

// main prints run's error with one "webhook: " prefix: a config error read
// "webhook: webhook: invalid config: ...".
func TestErrorLineHasOnePrefix(t *testing.T) {
	_, err := service.New(context.Background(), service.Config{})
	require.ErrorIs(t, err, service.ErrInvalidConfig)
	line := errorLine(err)
	require.True(t, strings.HasPrefix(line, "webhook: invalid config: "), line)
	require.Equal(t, "webhook: -workers 0: need at least 1", errorLine(errors.New("-workers 0: need at least 1")))
}

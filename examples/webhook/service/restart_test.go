// Restart: a new process on the same database delivers what the last one
// left.

package service

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/sim"
)

// A restart on the same database delivers what the last process left.
func TestRestartDeliversBacklog(t *testing.T) {
	h := newHarness(t, map[string]sim.Behavior{"p": {Down: true}}, nil)
	for i := range 10 {
		h.post("p", i)
	}
	cfg := h.svc.cfg
	h.stop()
	h.eps["p"].Set(sim.Behavior{})
	cfg.Store = nil
	h.start(cfg)
	// One snapshot: backlog and delivered are read under one lock (two
	// status calls raced with the relay and counted a delivery twice).
	st := h.status("p")
	require.Equal(t, 10, st.Backlog+int(st.Delivered))
	require.Eventually(t, func() bool { return h.delivered("p") }, waitLong, 5*time.Millisecond)
	h.checkOrder("p")
}

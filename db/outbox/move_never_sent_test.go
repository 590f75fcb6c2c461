package outbox_test

import (
	"context"
	"database/sql"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/outbox"
)

// A Resume, Skip or SkipHead whose connection could not be made (the server
// is down: connection refused) surely moved nothing: its error does not wrap
// ErrOutcomeUnknown, which tells the operator to look before trying again.
// Before, every connection-class error was "outcome unknown", a connection
// never made included.
func TestMoveThatCouldNotConnectIsNotOutcomeUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().(*net.TCPAddr)
	require.NoError(t, ln.Close()) // nothing listens there now
	db, err := sql.Open("pgx", "host=127.0.0.1 port="+strconv.Itoa(addr.Port)+" dbname=x user=x connect_timeout=5")
	require.NoError(t, err)
	defer db.Close()
	ob, err := outbox.New(db, outbox.WithDialect(outbox.Postgres))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = ob.SkipHead(ctx, "k")
	require.Error(t, err)
	require.NotErrorIs(t, err, outbox.ErrOutcomeUnknown)
	err = ob.Resume(ctx, "k")
	require.Error(t, err)
	require.NotErrorIs(t, err, outbox.ErrOutcomeUnknown)
}

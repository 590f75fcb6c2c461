package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// listen keeps a LISTEN on the outbox's channel open on one connection of
// the pool and wakes the relay on every notification (the schema's trigger
// sends one per committed inserting transaction). When the connection fails
// it retries after the poll interval; polling goes on meanwhile.
//
// On an Outbox made WithNotify(false) it returns at once: no trigger sends
// notifications, so a LISTEN would only hold a connection.
func (r *Relay) listen(ctx context.Context) {
	if !r.o.notify {
		r.log.Debug("outbox relay: no LISTEN, the outbox has no NOTIFY trigger (WithNotify(false)): polling only", "table", r.o.table)
		return
	}
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	defer wait.Stop()
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNotPgx) {
			// Not a database fault: polling alone it is.
			r.log.Error("outbox relay: no LISTEN (polling only)", "table", r.o.table, "err", err)
			r.dbOK(groupListen)
			return
		}
		r.dbError(opListen, err)
		wait.Reset(max(r.cfg.poll, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
	}
}

var errNotPgx = errors.New("outbox: LISTEN needs pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib)")

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.o.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errNotPgx
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, `LISTEN "`+r.o.q.listenChannel+`"`); err != nil {
			return err
		}
		defer func() {
			// Leave no LISTEN behind on a connection going back to the
			// pool (a cancelled wait usually closes it anyway).
			if !pc.IsClosed() {
				uctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if _, err := pc.Exec(uctx, `UNLISTEN *`); err != nil {
					pc.Close(uctx)
				}
			}
		}()
		r.dbOK(groupListen)
		r.st.listening.Store(true)
		defer r.st.listening.Store(false)
		r.signal() // rows committed before the LISTEN took effect
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				return err
			}
			r.st.notifications.Add(1)
			r.signal()
		}
	})
}

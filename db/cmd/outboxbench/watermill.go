package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
)

// errNoWatermillSQLite: watermill-sql v4 has schema adapters for MySQL and
// PostgreSQL only.
var errNoWatermillSQLite = errors.New("watermill-sql v4 has no SQLite adapter (MySQL and PostgreSQL only)")

// watermillSystem is Watermill's outbox shape (its forwarder component): the
// application publishes through a forwarder.Publisher wrapping a SQL
// publisher on its transaction; a forwarder subscribes to the SQL topic and
// publishes each message to the real publisher (here the sink).
type watermillSystem struct {
	db     *sql.DB
	topic  string
	keys   int
	schema wsql.DefaultPostgreSQLSchema
	drop   func()
}

func newWatermillSystem(ctx context.Context, env *dbEnv, keys int) (system, error) {
	if env.name != "postgres" {
		return nil, errNoWatermillSQLite
	}
	db, closeDB, err := env.openSQL(ctx)
	if err != nil {
		return nil, err
	}
	topic := env.tableName("wm")
	s := &watermillSystem{db: db, topic: topic, keys: keys}
	s.drop = func() {
		_, _ = db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "watermill_`+topic+`"`)
		_, _ = db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "watermill_offsets_`+topic+`"`)
		closeDB()
	}
	// Create the topic's tables before the first transactional publish
	// (a publisher on a transaction may not create them).
	sub, err := s.subscriber()
	if err != nil {
		s.drop()
		return nil, err
	}
	if err := sub.SubscribeInitialize(topic); err != nil {
		s.drop()
		return nil, fmt.Errorf("watermill: initialize: %w", err)
	}
	return s, nil
}

func (s *watermillSystem) close() { s.drop() }

func (s *watermillSystem) tables() string { return "%.watermill_%" + s.topic }

func (s *watermillSystem) subscriber() (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(s.db), wsql.SubscriberConfig{
		SchemaAdapter:    s.schema,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     20 * time.Millisecond,  // as the relay's poll here
		ResendInterval:   100 * time.Millisecond, // a nacked message again after 100 ms
	}, watermill.NopLogger{})
}

func (s *watermillSystem) writeTx(ctx context.Context, idx []int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	p, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: s.schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	fp := forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: s.topic})
	for _, i := range idx {
		m := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		m.Metadata.Set("key", keyName(i%s.keys))
		if err := fp.Publish("events", m); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// sinkPublisher is the forwarder's destination: the sink.
type sinkPublisher struct {
	deliver func(context.Context, int) error
}

func (p sinkPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		i, err := strconv.Atoi(string(m.Payload))
		if err != nil {
			return fmt.Errorf("payload %q: %w", m.Payload, err)
		}
		if err := p.deliver(m.Context(), i); err != nil {
			return err
		}
	}
	return nil
}

func (sinkPublisher) Close() error { return nil }

func (s *watermillSystem) start(ctx context.Context, n int, deliver func(context.Context, int) error) (func(context.Context) error, error) {
	var fs []*forwarder.Forwarder
	var subs []*wsql.Subscriber
	errs := make(chan error, n)
	for range n {
		sub, err := s.subscriber()
		if err != nil {
			return nil, err
		}
		f, err := forwarder.NewForwarder(sub, sinkPublisher{deliver}, watermill.NopLogger{},
			forwarder.Config{ForwarderTopic: s.topic, CloseTimeout: time.Second})
		if err != nil {
			return nil, err
		}
		go func() { errs <- f.Run(ctx) }()
		<-f.Running()
		fs = append(fs, f)
		subs = append(subs, sub)
	}
	return func(context.Context) error {
		var all []error
		for _, f := range fs {
			all = append(all, f.Close())
		}
		for range fs {
			all = append(all, <-errs)
		}
		for _, sub := range subs {
			all = append(all, sub.Close())
		}
		return errors.Join(all...)
	}, nil
}

// Package otelkeysched reports keysched schedulers and buses as OpenTelemetry
// metrics, so that a Prometheus scrape, an OTLP collector or any
// OpenTelemetry backend sees them with no glue code. It depends on the
// OpenTelemetry metric API only: bring your own SDK and exporter.
//
// For a scheduler:
//
//	m, err := otelkeysched.New[string](mp, otelkeysched.WithAttributes(attribute.String("scheduler", "ledger")))
//	s, err := keysched.New[string](keysched.WithObserver(m.Observer()))
//	err = m.Register(s)
//	defer m.Unregister()
//
// The instruments (names in the constants below; units UCUM, counts
// annotated):
//
//	keysched.tasks.pending        UpDownCounter {task}  accepted, unfinished tasks
//	keysched.tasks.running        UpDownCounter {task}  attempts running now (the pool's use)
//	keysched.keys.live            UpDownCounter {key}   keys with queued or running tasks
//	keysched.keys.parked          UpDownCounter {key}   parked keys
//	keysched.tasks.finished       Counter {task}        by outcome: succeeded, failed, panicked, cancelled, aborted
//	keysched.tasks.retried        Counter {retry}       retries scheduled
//	keysched.tasks.snoozed        Counter {run}         runs that returned keysched.Snooze (not attempts)
//	keysched.tasks.dead_lettered  Counter {task}        dead letters
//	keysched.tasks.rejected       Counter {task}        refused submissions
//	keysched.task.queue_wait      Histogram s           acceptance to first start
//	keysched.task.duration        Histogram s           one run, by outcome: succeeded, failed, panicked, snoozed
//	keysched.tasks.oldest_age     Gauge s               age of the oldest unfinished task
//
// The counters and gauges are asynchronous: they read Scheduler.Stats and
// Scheduler.OldestAge when the SDK collects, so the scheduler's hot path pays
// nothing for them. Only the two histograms are recorded per task, through
// the keysched.Observer that Metrics.Observer returns.
//
// A bus subscriber reports the same, with the attribute
// subscription=<name>, plus keysched.bus.events.dropped, .skipped, .ejected
// and keysched.bus.subscriptions.ejected:
//
//	m, err := otelkeysched.New[string](mp, otelkeysched.ForSubscription("mailer"))
//	sub, err := bus.Subscribe(b, "mailer", handler, bus.Observe(m.Observer()))
//	err = m.RegisterSubscription(sub)
//
// (RegisterSubscription, the function, reports a subscription's counters
// without the histograms.) RegisterBus reports the bus's own counters.
//
// Never a key as an attribute value: keys are account and user ids, unbounded
// in number and often personal data. Per-key detail comes from
// keysched.Scheduler.Keys, on demand.
package otelkeysched

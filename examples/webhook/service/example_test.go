package service_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/keysched/keysched/examples/webhook/service"
	"github.com/keysched/keysched/examples/webhook/sim"
)

// A service with one partner whose endpoint is a simulated customer: an
// event posted to the intake is delivered to it, with its ID in the
// Webhook-Id header.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "webhook-example-")
	defer os.RemoveAll(dir)

	rec := sim.NewRecorder()
	delivered := make(chan sim.Delivery, 1)
	rec.OnDelivery = func(d sim.Delivery) { delivered <- d }
	endpoint, _ := sim.NewEndpoint(rec, sim.Behavior{})
	defer endpoint.Close()
	// The partner's signing secret: the endpoint verifies every request's
	// webhook-signature with it (package signing).
	secret, _ := rec.NewSecret("acme")

	store, err := service.OpenSQLite(ctx, filepath.Join(dir, "webhook.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	svc, err := service.New(ctx, service.Config{
		Partners: map[string]string{"acme": endpoint.URL},
		Secrets:  map[string][]string{"acme": {secret}},
		Store:    store,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer svc.Close(ctx)
	intake := httptest.NewServer(svc.IntakeHandler())
	defer intake.Close()

	resp, err := http.Post(intake.URL+"/events/acme", "application/json",
		bytes.NewBufferString(`{"type":"order.created","data":{"order":42}}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("intake:", resp.Status)

	select {
	case d := <-delivered:
		fmt.Println("delivered to", d.Partner, "with its Webhook-Id:", d.ID != "")
	case <-time.After(10 * time.Second):
		fmt.Println("not delivered")
	}
	// Output:
	// intake: 202 Accepted
	// delivered to acme with its Webhook-Id: true
}

package service

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/keysched/keysched/internal/zerotest"
)

// TestZeroValues calls every exported method of a nil and a zero handle (not
// made by its constructor): each error result is the type's ErrZero...
// sentinel, each other result the zero value, and nothing panics or hangs.
// A Service's handlers are not nil (http.Server would serve
// http.DefaultServeMux in place of nil) but answer 500 with ErrZeroService.
// A method added to a type and not to its list here fails the test.
func TestZeroValues(t *testing.T) {
	answers500 := func(res []any) error {
		h, _ := res[0].(http.Handler)
		if h == nil {
			return errors.New("nil http.Handler")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/events/acme", strings.NewReader("{}")))
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), ErrZeroService.Error()) {
			return fmt.Errorf("answered %d %q, want 500 with %q", rec.Code, rec.Body.String(), ErrZeroService.Error())
		}
		return nil
	}
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Service", func(t *testing.T) {
			zerotest.Check[Service](t, ErrZeroService, []string{
				"AdminHandler", "Close", "Event", "IntakeHandler", "LatestEvents", "Parked", "Replay", "ReplayRange", "Resume", "Skip", "Status",
			}, zerotest.Special{Method: "AdminHandler", Check: answers500},
				zerotest.Special{Method: "IntakeHandler", Check: answers500})
		}},
		{"Deliverer", func(t *testing.T) {
			zerotest.Check[Deliverer](t, ErrZeroDeliverer, []string{
				"BreakerState", "Close", "Deliver", "Destination",
			})
		}},
		{"Store", func(t *testing.T) {
			zerotest.Check[Store](t, ErrZeroStore, []string{"Close", "Outbox"})
		}},
	} {
		t.Run(c.name, c.run)
	}
}

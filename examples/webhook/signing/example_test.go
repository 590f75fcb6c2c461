package signing_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
)

// A receiver checks a request by hand: the body exactly as received, then
// the headers. The secret is the one the sender's operator gave out.
func ExampleVerifier_Verify() {
	v, err := signing.NewVerifier([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		// The example's request is from 2021; a real receiver keeps the
		// default clock.
		signing.WithClock(func() time.Time { return time.Unix(1614265330, 0) }))
	if err != nil {
		panic(err)
	}
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	fmt.Println(v.Verify(h, []byte(`{"test": 2432232314}`)))
	fmt.Println(v.Verify(h, []byte(`{"test":2432232314}`)))
	// Output:
	// <nil>
	// signing: no matching signature: 1 v1 signatures, 1 secrets
}

// A receiver wraps its handler: unsigned or stale requests get 401 with the
// reason, signed ones reach the handler with their body intact.
func ExampleVerifier_Middleware() {
	secret, _ := signing.NewSecret() // in real life: signing.ParseSecret(os.Getenv("WEBHOOK_SECRET"))
	v, _ := signing.NewVerifier([]string{secret.Encode()})
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("handler got %s from %s\n", body, r.Header.Get("webhook-id"))
	})))
	defer srv.Close()

	body := `{"type":"order.created"}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
	signing.SetHeaders(req.Header, "evt-1", time.Now(), []byte(body), secret)
	resp, _ := http.DefaultClient.Do(req)
	resp.Body.Close()
	fmt.Println(resp.StatusCode)

	req, _ = http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
	signing.SetHeaders(req.Header, "evt-1", time.Now().Add(-time.Hour), []byte(body), secret) // a replay
	resp, _ = http.DefaultClient.Do(req)
	reason, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, strings.Contains(string(reason), "too old"))
	// Output:
	// handler got {"type":"order.created"} from evt-1
	// 200
	// 401 true
}

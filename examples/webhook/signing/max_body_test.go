package signing_test

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched/examples/webhook/signing"
	"github.com/stretchr/testify/require"
)

// TestMiddlewareWithLargestMaxBodyPassesTheBody: WithMaxBody(math.MaxInt64),
// the natural way to say "no bound", lets a signed request through with its
// body. Found by attacking the code: the Middleware read through
// io.LimitReader(body, maxBody+1), which wrapped to a negative limit and
// read nothing, so every signed request with a body got 401 (ErrNoMatch:
// the signature was checked against an empty body), and a request signed
// over the empty body reached the handler with its body gone.
func TestMiddlewareWithLargestMaxBodyPassesTheBody(t *testing.T) {
	sec, err := signing.NewSecret()
	require.NoError(t, err)
	v, err := signing.NewVerifier([]string{sec.Encode()}, signing.WithMaxBody(math.MaxInt64))
	require.NoError(t, err)
	var got []byte
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	const body = `{"a":1}`
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	signing.SetHeaders(req.Header, "evt-1", time.Now(), []byte(body), sec)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Equal(t, body, string(got), "the handler reads the body as sent")
}

package service

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// MinAdminTokenBytes is the shortest Config.AdminToken New accepts.
const MinAdminTokenBytes = 16

// adminRealm is named in the 401's challenges.
const adminRealm = `realm="webhook admin"`

// requireToken lets through only requests carrying the admin token: as
// "Authorization: Bearer <token>" (scripts, the admin API, a Prometheus
// scrape), or as the password of HTTP Basic authentication, any user name
// (a browser: the 401's Basic challenge makes it ask the operator once).
// Anything else, a missing header, a wrong token, another scheme, gets the
// same 401 with the same body and challenges: the answer does not say which
// it was. The comparison takes constant time (of SHA-256 digests, so the
// token's length does not show either).
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got, ok := presentedToken(r); ok {
			sum := sha256.Sum256([]byte(got))
			if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
				next.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Add("WWW-Authenticate", "Bearer "+adminRealm)
		w.Header().Add("WWW-Authenticate", "Basic "+adminRealm+`, charset="UTF-8"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	})
}

// presentedToken returns the token a request carries, if any.
func presentedToken(r *http.Request) (string, bool) {
	if _, pass, ok := r.BasicAuth(); ok {
		return pass, true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

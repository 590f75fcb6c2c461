package service

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"unicode/utf8"
)

// The intake's JSON comes from partners: any body and Content-Type gets an
// answer, never a panic. A body it accepts is one JSON object of UTF-8 text
// (the body the customer endpoint receives must parse), whose type matches the
// documented shape and whose data is a JSON object; a refusal is a 4xx with
// a reason.
func FuzzParseIntake(f *testing.F) {
	for _, s := range []struct{ ct, body string }{
		{"application/json", `{"type":"order.created","data":{"id":1}}`},
		{"", `{"type":"a","data":{}}`},
		{"application/json; charset=utf-8", ` {"data":{"x":[1,2,{"y":null}]},"type":"a:b/c-d_e.f"} `},
		{"text/plain", `{"type":"a","data":{}}`},
		{"application/json", `{"type":"a","data":[]}`},
		{"application/json", `{"type":"a","data":{},"extra":1}`},
		{"application/json", `{"type":"a","data":{}} {"type":"b","data":{}}`},
		{"application/json", `{"type":"a","data":{}}]`},
		{"application/json", `{"type":"a","data":{}}}`},
		{"application/json", "{\"type\":\"a\",\"data\":{\"s\":\"\xff\"}}"},
		{"application/json", `{"type":"","data":{}}`},
		{"application/json", `null`},
		{"application/json", ``},
	} {
		f.Add(s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/events/p", bytes.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		req, code, err := parseIntake(r, httptest.NewRecorder())
		if err != nil {
			if code < 400 || code > 499 || err.Error() == "" {
				t.Fatalf("refused with code %d, error %v", code, err)
			}
			return
		}
		if code != 0 {
			t.Fatalf("accepted with code %d", code)
		}
		if !utf8.Valid(body) || !json.Valid(body) {
			t.Fatalf("accepted a body that is not one JSON text: %q", body)
		}
		if !typeRe.MatchString(req.Type) || !json.Valid(req.Data) {
			t.Fatalf("accepted type %q, data %q", req.Type, req.Data)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(req.Data, &obj); err != nil {
			t.Fatalf("accepted data %q that is not an object: %v", req.Data, err)
		}
		// What the endpoint receives parses back to the same type and data.
		env, err := json.Marshal(Envelope{ID: "id", Partner: "p", Type: req.Type, Data: req.Data})
		if err != nil {
			t.Fatalf("envelope of an accepted event: %v", err)
		}
		var back Envelope
		if err := json.Unmarshal(env, &back); err != nil || back.Type != req.Type {
			t.Fatalf("envelope %q does not parse back (%v)", env, err)
		}
		var a, b bytes.Buffer
		if json.Compact(&a, req.Data) != nil || json.Compact(&b, back.Data) != nil || a.String() != b.String() {
			t.Fatalf("data %q came back as %q", req.Data, back.Data)
		}
	})
}

package outbox

import (
	"database/sql"
	"errors"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"
)

// Write refuses exactly the events whose fields could not be stored and read
// back as written (validate: an empty key; an ID, key or type over its bound,
// with a NUL byte or invalid UTF-8; a header name or value of invalid UTF-8),
// always with ErrInvalidEvent, never a panic; the headers of an event it
// accepts come back from the column unchanged: decode(encode(h)) == h. And any
// text in the headers column (written by anyone with the database) decodes
// to headers or an error, never a panic.
func FuzzEventFields(f *testing.F) {
	for _, s := range [][5]string{
		{"", "acct-1", "order.created", "trace-id", "abc"},
		{"id", "k", "", "", ""},
		{"id", "", "t", "h", "v"},
		{"a\x00b", "k", "t", "h", "v"},
		{"id", "k\xff", "t", "h", "v"},
		{"id", "k", "t", "h\xc3", "v"},
		{"id", "k", "t", "h", "v\x00\"<>&\u2028é"},
		{strings.Repeat("i", MaxIDLen+1), strings.Repeat("k", MaxKeyLen), strings.Repeat("t", MaxTypeLen+1), "h", "v"},
		{"id", "k", "t", `{"a":"b"}`, `{"a":1}`},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, id, key, typ, hname, hvalue string) {
		bad := func(v string, max int) bool {
			return len(v) > max || strings.ContainsRune(v, 0) || !utf8.ValidString(v)
		}
		headers := map[string]string{hname: hvalue, "n-" + hvalue: hname}
		e := Event{ID: id, Key: key, Type: typ, Headers: headers}
		wantBad := key == "" || bad(id, MaxIDLen) || bad(key, MaxKeyLen) || bad(typ, MaxTypeLen) ||
			!utf8.ValidString(hname) || !utf8.ValidString(hvalue)
		err := validate(&e)
		if (err != nil) != wantBad {
			t.Fatalf("validate(%+v) = %v, want refused: %v", e, err, wantBad)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("refusal %v is not ErrInvalidEvent", err)
			}
			return
		}
		col, err := encodeHeaders(headers)
		if err != nil {
			t.Fatalf("encodeHeaders of valid headers: %v", err)
		}
		got, err := decodeHeaders(sql.NullString{String: col.(string), Valid: true})
		if err != nil || !maps.Equal(got, headers) {
			t.Fatalf("headers %q stored as %q came back as %q (%v)", headers, col, got, err)
		}
		// Arbitrary column text: headers or an error.
		if m, err := decodeHeaders(sql.NullString{String: hvalue, Valid: true}); err == nil && m != nil && len(m) == 0 {
			t.Fatalf("%q decoded to an empty non-nil map", hvalue)
		}
	})
}

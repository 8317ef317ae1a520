package gateway

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestParsePurchase(t *testing.T) {
	cases := []struct {
		in     string
		qty    int64
		region string
		ok     bool
	}{
		{"", 1, "", true},
		{"  ", 1, "", true},
		{"{}", 1, "", true},
		{` { "quantity" : 3 , "region" : "sh" } `, 3, "sh", true},
		{`{"region":"bj"}`, 1, "bj", true},
		{`{"quantity":-1}`, -1, "", true}, // parsed; refused by the range check
		{`{"quantity":0}`, 0, "", true},
		{`{"quantity":01}`, 0, "", false},
		{`{"quantity":1.0}`, 0, "", false},
		{`{"quantity":1e2}`, 0, "", false},
		{`{"quantity":"1"}`, 0, "", false},
		{`{"quantity":null}`, 0, "", false},
		{`{"quantity":1,}`, 0, "", false},
		{`{"quantity":1}}`, 0, "", false},
		{`{"quantity":1`, 0, "", false},
		{`{"region":"b\"j"}`, 0, "", false},
		{`{"region":1}`, 0, "", false},
		{`{"Quantity":1}`, 0, "", false},
		{`{"quantity":1,"quantity":2}`, 0, "", false},
		{`{"quantity":1234567890123456789}`, 0, "", false},
		{`[]`, 0, "", false},
		{`null`, 0, "", false},
		{"{\"region\":\"\x80\"}", 0, "", false},
		{"{\"region\":\"b\xc3\"}", 0, "", false},
		{"{\"address\":\"\xff street\"}", 0, "", false},
		{"{\"address\":\"\\n\xed\xa0\x80\"}", 0, "", false},  // escaped, and a UTF-16 surrogate encoded in UTF-8
		{"{\"region\":\"\xe5\x8c\x97\"}", 1, "\u5317", true}, // valid UTF-8 passes (and is then an unknown region)
		{"{\"address\":\"\xe5\x8c\x97\\n\"}", 1, "", true},
	}
	for _, c := range cases {
		p, err := parsePurchase([]byte(c.in))
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok=%v", c.in, err, c.ok)
			continue
		}
		if c.ok && (p.Quantity != c.qty || string(p.Region) != c.region) {
			t.Errorf("%q: got %d %q, want %d %q", c.in, p.Quantity, p.Region, c.qty, c.region)
		}
	}
}

// FuzzParsePurchase: never panics, and whatever it accepts encoding/json reads
// the same way (it may refuse more: escapes, fractions, huge numbers).
func FuzzParsePurchase(f *testing.F) {
	for _, s := range []string{"", "{}", `{"quantity":2,"region":"bj"}`, `{"quantity":-0}`, `{"region":"\u0041"}`, `{"quantity":1e3}`,
		`{"address":"a\"b\u00e9"}`, "{\"region\":\"\x80\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePurchase(b)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return
		}
		var ref struct {
			Quantity *int64  `json:"quantity"`
			Region   *string `json:"region"`
			Address  *string `json:"address"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ref); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		want := int64(1)
		if ref.Quantity != nil {
			want = *ref.Quantity
		}
		if p.Quantity != want || (ref.Region != nil && *ref.Region != string(p.Region)) ||
			(ref.Address != nil && *ref.Address != string(p.Address)) {
			t.Fatalf("%q: parsed %d %q %q, encoding/json %d %v %v", b, p.Quantity, p.Region, p.Address, want, ref.Region, ref.Address)
		}
		if !utf8.Valid(p.Region) || !utf8.Valid(p.Address) {
			t.Fatalf("%q: accepted a string that is not UTF-8: %q %q", b, p.Region, p.Address)
		}
	})
}

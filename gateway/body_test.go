package gateway

import (
	"bytes"
	"encoding/json"
	"testing"
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
	for _, s := range []string{"", "{}", `{"quantity":2,"region":"bj"}`, `{"quantity":-0}`, `{"region":"\u0041"}`, `{"quantity":1e3}`} {
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
		if p.Quantity != want || (ref.Region != nil && *ref.Region != string(p.Region)) {
			t.Fatalf("%q: parsed %d %q, encoding/json %d %v", b, p.Quantity, p.Region, want, ref.Region)
		}
	})
}

package clip

import (
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{`{"a":1}`, `"{\"a\":1}"`},
		{"line\nforged=1\r\n", `"line\nforged=1\r\n"`},
		{"\xff\xfe", `"\xff\xfe"`},
		{strings.Repeat("a", Max), `"` + strings.Repeat("a", Max) + `"`},
		{strings.Repeat("b", Max+10), `"` + strings.Repeat("b", Max) + `"…(10 more bytes)`},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%.20q) = %.60q, want %.60q", tc.in, got, tc.want)
		}
		if got := Quote([]byte(tc.in)); got != tc.want {
			t.Errorf("Quote([]byte %.20q) = %.60q", tc.in, got)
		}
	}
	if q := Quote(strings.Repeat("\x00", 10000)); len(q) > 4*Max+40 || strings.ContainsAny(q, "\x00\n") {
		t.Errorf("10,000 NULs quoted as %d bytes", len(q))
	}
}

func TestText(t *testing.T) {
	if got := Text("a\r\nb"); got != `a\r\nb` {
		t.Errorf("Text = %q", got)
	}
	long := strings.Repeat("x", 1000)
	if got := Text([]byte(long)); got != strings.Repeat("x", Max)+"…(744 more bytes)" {
		t.Errorf("Text of 1000 bytes = %.40q… (%d bytes)", got, len(got))
	}
}

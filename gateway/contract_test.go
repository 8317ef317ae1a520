package gateway

import (
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/api"
)

// TestIdempotencyKeyRuleIsTheDocumented: the gateway takes exactly the keys
// api/openapi.yaml's pattern for the Idempotency-Key header allows (1-64 of
// [A-Za-z0-9_-]), and refuses every other with 400 invalid_request and a
// message stating that rule.
func TestIdempotencyKeyRuleIsTheDocumented(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.YAML())
	if err != nil {
		t.Fatal(err)
	}
	var pattern string
	for _, p := range doc.Paths.Find("/v1/sales/{sale}/orders").Post.Parameters {
		if p.Value.Name == "Idempotency-Key" {
			pattern = p.Value.Schema.Value.Pattern
		}
	}
	if pattern == "" {
		t.Fatal("api/openapi.yaml gives the Idempotency-Key header no pattern")
	}
	documented := regexp.MustCompile(pattern)

	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 100, 100, 1 })
	tok := e.token("keys")
	const rule = "Idempotency-Key must be 1-64 characters of [A-Za-z0-9_-]"
	for _, key := range []string{
		"k", "Key_1-a", strings.Repeat("Az09_-", 10) + "abcd", // 64
		strings.Repeat("k", 65), "a/b", "a.b", "a b", "a:b", "k\xc3\xa9", "~", "a+b", "a=b",
	} {
		r := e.buy(s, tok, `{}`, map[string]string{"Idempotency-Key": key})
		switch allowed := documented.MatchString(key); {
		case allowed && r.Status != 202:
			t.Errorf("key %q: the document allows it, the gateway answered %d %s", key, r.Status, r.Raw)
		case !allowed && (r.Status != 400 || r.Code != string(flashgate.CodeInvalidRequest) || r.Message != rule):
			t.Errorf("key %q: the document refuses it, the gateway answered %d %s; want 400 invalid_request %q", key, r.Status, r.Raw, rule)
		}
	}
	// An empty key (net/http drops empty headers: sent raw).
	if r := rawPost(t, e.g.Addr(), "/v1/sales/"+s.ID+"/orders", tok, "Idempotency-Key: \r\n"); r.Status != 400 || r.Message != rule {
		t.Errorf("empty key: %d %s; want 400 %q", r.Status, r.Raw, rule)
	}
}

package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/flashgate/flashgate/api"
	"github.com/flashgate/flashgate/internal/eventcheck"
)

// TestAsyncAPIDocument: api/asyncapi.yaml is an AsyncAPI 3.0 document whose
// references resolve, whose event schema compiles, and whose examples pass
// it; a body with a field missing, a field it does not know, or a bad time
// fails it. (The events a real backend publishes are checked against the same
// schema by the backend's and the chaos suite's event tests.)
func TestAsyncAPIDocument(t *testing.T) {
	var doc map[string]any
	if err := yaml.Unmarshal(api.AsyncAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["asyncapi"] != "3.0.0" {
		t.Fatalf("asyncapi %v, want 3.0.0", doc["asyncapi"])
	}
	// Every $ref points at something.
	var walk func(v any)
	refs := 0
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if r, ok := x["$ref"].(string); ok {
				refs++
				if resolve(doc, r) == nil {
					t.Errorf("$ref %s resolves to nothing", r)
				}
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
	if refs < 3 {
		t.Fatalf("%d $refs: the walk is broken", refs)
	}
	validate, err := eventcheck.SchemaValidator()
	if err != nil {
		t.Fatal(err)
	}
	msg := resolve(doc, "#/components/messages/OrderEvent").(map[string]any)
	examples := msg["examples"].([]any)
	if len(examples) == 0 {
		t.Fatal("no examples")
	}
	var good []byte
	for _, e := range examples {
		b, err := json.Marshal(e.(map[string]any)["payload"])
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(b); err != nil {
			t.Errorf("example %s: %v", b, err)
		}
		good = b
	}
	for name, edit := range map[string]func(m map[string]any){
		"missing seq":   func(m map[string]any) { delete(m, "seq") },
		"unknown field": func(m map[string]any) { m["extra"] = 1 },
		"bad time":      func(m map[string]any) { m["occurred_at"] = "yesterday" },
		"numeric id":    func(m map[string]any) { m["order_id"] = 1 },
		"bad type":      func(m map[string]any) { m["type"] = "refunded" },
	} {
		var m map[string]any
		_ = json.Unmarshal(good, &m)
		edit(m)
		b, _ := json.Marshal(m)
		if validate(b) == nil {
			t.Errorf("%s: %s passed the schema", name, b)
		}
	}
}

func resolve(doc map[string]any, ref string) any {
	var v any = doc
	for _, p := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

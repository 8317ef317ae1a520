package api

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestDocumentIsValid: the document is OpenAPI 3.1 as kin-openapi reads and
// validates it, and /openapi.json serves the same document as JSON.
func TestDocumentIsValid(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(YAML())
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q: want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml does not validate: %v", err)
	}
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/openapi.json", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	fromJSON, err := openapi3.NewLoader().LoadFromData(rec.Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(doc)
	b, _ := json.Marshal(fromJSON)
	if string(a) != string(b) {
		t.Fatal("/openapi.json is not api/openapi.yaml")
	}
	n := 0
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			n += op.Responses.Len()
		}
	}
	t.Logf("%d paths, %d documented responses", doc.Paths.Len(), n)
}

// TestReferenceNamesEveryOperation: docs/api.md has a row for every
// operation of the document, naming each of its status codes.
func TestReferenceNamesEveryOperation(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(YAML())
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(line, "| `") {
			op, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			rows[op] = line
		}
	}
	n := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			row, ok := rows[method+" "+path]
			if !ok {
				t.Errorf("docs/api.md has no row for %s %s", method, path)
				continue
			}
			for status := range op.Responses.Map() {
				if !strings.Contains(row, status) {
					t.Errorf("docs/api.md's row for %s %s does not name %s", method, path, status)
				}
			}
			n++
		}
	}
	t.Logf("%d operations named in docs/api.md", n)
}

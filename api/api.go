// Package api holds the HTTP contract of flashgate: api/openapi.yaml, the
// OpenAPI 3.1 document of the public API and both admin APIs (docs/api.md).
// Both admin ports serve it as /openapi.json.
package api

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"gopkg.in/yaml.v3"
)

//go:embed openapi.yaml
var document []byte

// YAML is the document as written.
func YAML() []byte { return document }

// JSON is the document as JSON, converted once.
var JSON = sync.OnceValue(func() []byte {
	var v any
	if err := yaml.Unmarshal(document, &v); err != nil {
		panic("api/openapi.yaml: " + err.Error()) // embedded and tested: cannot happen in a build
	}
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		panic("api/openapi.yaml: " + err.Error())
	}
	return b
})

// jsonable turns YAML's map[any]any (a map with a key that is not a string)
// into map[string]any.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
		return x
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
		return x
	}
	return v
}

// Handler serves GET /openapi.json.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(JSON())
	})
}

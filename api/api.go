// Package api holds the contracts of flashgate with outside programs:
// api/openapi.yaml, the OpenAPI 3.1 document of the public API and both admin
// APIs (docs/api.md), which both admin ports serve as /openapi.json; and
// api/asyncapi.yaml, the AsyncAPI 3.0 document of the order events
// (docs/events.md).
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

//go:embed asyncapi.yaml
var asyncDocument []byte

// AsyncAPI is the order events' AsyncAPI document as written.
func AsyncAPI() []byte { return asyncDocument }

// OrderEventSchema is the JSON schema of an order event's payload (the
// AsyncAPI document's components.schemas.OrderEvent), as JSON.
var OrderEventSchema = sync.OnceValues(func() ([]byte, error) {
	var doc struct {
		Components struct {
			Schemas map[string]any `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(asyncDocument, &doc); err != nil {
		return nil, fmt.Errorf("api/asyncapi.yaml: %w", err)
	}
	s, ok := doc.Components.Schemas["OrderEvent"]
	if !ok {
		return nil, fmt.Errorf("api/asyncapi.yaml: no components.schemas.OrderEvent")
	}
	return json.Marshal(jsonable(s))
})

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

package eventcheck

import (
	"bytes"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/flashgate/flashgate/api"
)

// SchemaValidator checks a message body against the order event's schema
// of api/asyncapi.yaml, formats (date-time) included.
func SchemaValidator() (func([]byte) error, error) {
	raw, err := api.OrderEventSchema()
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("order-event.json", doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile("order-event.json")
	if err != nil {
		return nil, fmt.Errorf("order event schema: %w", err)
	}
	return func(body []byte) error {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			return err
		}
		return sch.Validate(v)
	}, nil
}

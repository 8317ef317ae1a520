package loadgen

import (
	"encoding/json"
	"fmt"
	"os"
)

// WriteJSON writes v, indented, to path ("" writes nothing), through a
// temporary file so that a reader never sees half of it.
func WriteJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("json: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("json: %w", err)
	}
	return nil
}

package bus

import (
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/clip"
)

// TestDecodeErrorsQuoteAtMost256Bytes: a refused message's error (logged by
// the backend, and the dead letter's Flashgate-Dead-Error header) quotes at
// most clip.Max bytes of it, escaped: a 1 MB message with CR LF in it can
// neither fill a log line nor forge a header.
func TestDecodeErrorsQuoteAtMost256Bytes(t *testing.T) {
	pad := strings.Repeat("A", 100000)
	for name, body := range map[string]string{
		"invalid fields": "{\"id\":\"1\",\r\n\"sale\":\"no such sale\",\"user\":\"u\",\"qty\":1,\"pad\":\"" + pad + "\"}",
		"bad subject":    `{"id":"1","sale":"s","user":"u","qty":1,"phone":"` + strings.Repeat("\\n", 5000) + `"}`,
	} {
		_, err := DecodeOrder([]byte(body))
		if err == nil {
			t.Fatalf("%s: decoded", name)
		}
		e := err.Error()
		if len(e) > 4*clip.Max+100 || strings.ContainsAny(e, "\r\n") {
			t.Errorf("%s: the error is %d bytes (CR/LF: %v): %.100q", name, len(e), strings.ContainsAny(e, "\r\n"), e)
		}
	}
	if err := pubAckError([]byte("\r\n" + pad)); err == nil || len(err.Error()) > 4*clip.Max+100 {
		t.Errorf("an unexpected publish answer: %d bytes of error", len(err.Error()))
	}
}

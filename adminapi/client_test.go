package adminapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

func TestClient(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Authorization") != "Bearer tok":
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"code":"unauthorized","message":"admin token required"}`)
		case r.Method == http.MethodPost && r.URL.Path == "/admin/v1/sales":
			if r.Header.Get("Content-Type") != "application/json" {
				w.WriteHeader(http.StatusUnsupportedMediaType)
				return
			}
			b, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			w.Write(b)
		default:
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "upstream down\n")
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	c := New(config.Config{Admin: config.Admin{URL: srv.URL + "/", Token: "tok"}})

	body, err := c.CreateSale(ctx, &flashgate.Sale{ID: "s1", Total: 5})
	if err != nil || !strings.Contains(string(body), `"id":"s1"`) {
		t.Fatalf("create: %s, %v", body, err)
	}
	// A body that is not the API's error shape is the message as it came.
	_, err = c.Do(ctx, http.MethodGet, "/admin/v1/sales/s1", nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Message != "upstream down" {
		t.Fatalf("502: %v", err)
	}
	// Refused for want of a token: the error says where a token comes from.
	_, err = New(config.Config{Admin: config.Admin{URL: srv.URL}}).Do(ctx, http.MethodGet, "/admin/v1/sales/s1", nil)
	if !errors.As(err, &ae) || ae.Code != "unauthorized" || !strings.Contains(err.Error(), "FLASHGATE_ADMIN_TOKEN") {
		t.Fatalf("401: %v", err)
	}
}

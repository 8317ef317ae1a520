// Package adminapi is a client of the backend's admin API: the CLI's sale
// commands, the load bench's --create and the ingest bench use it.
package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// Client is a client of the backend's admin API.
type Client struct {
	base, token string
	hc          *http.Client
}

// New is a client of the admin API at admin.url, with admin.token.
func New(cfg config.Config) *Client {
	return &Client{
		base:  strings.TrimSuffix(cfg.Admin.URL, "/"),
		token: cfg.Admin.Token,
		hc:    &http.Client{Timeout: 2 * time.Minute},
	}
}

// APIError is a non-2xx answer: the API's {"code","message"}.
type APIError struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
	hint    string
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	if e.Code != "" {
		s += ": " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s + e.hint
}

func (a *Client) CreateSale(ctx context.Context, s *flashgate.Sale) ([]byte, error) {
	return a.Do(ctx, http.MethodPost, "/admin/v1/sales", s)
}

// Stream calls GET path and copies a 2xx answer's body to w as it comes
// (an export of any size); an answer cut short is an error.
func (a *Client) Stream(ctx context.Context, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	hc := *a.hc
	hc.Timeout = 0 // as long as the export takes; ctx bounds it
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API (is the backend up?): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return fmt.Errorf("admin API GET %s: %w", path, a.apiError(resp.StatusCode, out))
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("admin API GET %s: cut short: %w", path, err)
	}
	return nil
}

// Do calls the admin API and returns the body of a 2xx answer.
func (a *Client) Do(ctx context.Context, method, path string, in any) ([]byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API (is the backend up?): %w", err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("admin API %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return out, nil
	}
	return nil, fmt.Errorf("admin API %s %s: %w", method, path, a.apiError(resp.StatusCode, out))
}

// apiError is the APIError of a non-2xx answer with body out.
func (a *Client) apiError(status int, out []byte) *APIError {
	e := &APIError{Status: status}
	if json.Unmarshal(out, e) != nil || e.Code == "" {
		e.Message = strings.TrimSpace(string(out))
	}
	if status == http.StatusUnauthorized && a.token == "" {
		e.hint = " (no admin token: set FLASHGATE_ADMIN_TOKEN or admin.token)"
	}
	return e
}

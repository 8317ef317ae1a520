package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2025, 11, 11, 0, 0, 7, 600_000_000, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"now", time.Date(2025, 11, 11, 0, 0, 7, 0, time.UTC)},
		{"+30s", time.Date(2025, 11, 11, 0, 0, 37, 0, time.UTC)},
		{"+1h30m", time.Date(2025, 11, 11, 1, 30, 7, 0, time.UTC)},
		{"-5m", time.Date(2025, 11, 10, 23, 55, 7, 0, time.UTC)},
		{"2025-11-11T20:00:00+08:00", time.Date(2025, 11, 11, 12, 0, 0, 0, time.UTC)},
		{"2025-11-11T12:00:00.5Z", time.Date(2025, 11, 11, 12, 0, 0, 500_000_000, time.UTC)},
	} {
		got, err := parseTime(tc.in, now)
		if err != nil {
			t.Errorf("parseTime(%q): %v", tc.in, err)
			continue
		}
		if !got.Equal(tc.want) {
			t.Errorf("parseTime(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"", "Now", "30s", "+30", "+", "tomorrow", "2025-11-11", "2025-11-11 12:00:00"} {
		if _, err := parseTime(bad, now); err == nil {
			t.Errorf("parseTime(%q) took it", bad)
		}
	}
}

func TestSaleWindow(t *testing.T) {
	now := time.Date(2025, 11, 11, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		starts, ends string
		d            time.Duration
		wantEnd      time.Time
		bad          bool
	}{
		{starts: "now", wantEnd: now.Add(time.Hour)},
		{starts: "+10s", d: time.Minute, wantEnd: now.Add(70 * time.Second)},
		{starts: "now", ends: "+2h", wantEnd: now.Add(2 * time.Hour)},
		{starts: "now", ends: "+2h", d: time.Hour, bad: true},
		{starts: "now", d: -time.Second, bad: true},
		{starts: "later", bad: true},
		{starts: "now", ends: "never", bad: true},
	} {
		_, end, err := saleWindow(tc.starts, tc.ends, tc.d, now)
		if (err != nil) != tc.bad {
			t.Errorf("saleWindow(%q, %q, %v): err %v", tc.starts, tc.ends, tc.d, err)
			continue
		}
		if !tc.bad && !end.Equal(tc.wantEnd) {
			t.Errorf("saleWindow(%q, %q, %v) ends %v, want %v", tc.starts, tc.ends, tc.d, end, tc.wantEnd)
		}
	}
}

func TestRegionFlag(t *testing.T) {
	m := mapFlag{}
	for _, s := range []string{"bj=400", "sh=600"} {
		if err := m.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	if m["bj"] != 400 || m["sh"] != 600 || len(m) != 2 {
		t.Fatalf("%v", m)
	}
	for _, bad := range []string{"bj", "=3", "gz=x", "bj=1"} {
		if err := m.Set(bad); err == nil {
			t.Errorf("Set(%q) took it", bad)
		}
	}
}

func TestCommandLine(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"help"}, &out, &errOut); err != nil || !strings.Contains(out.String(), "sale create") {
		t.Fatalf("help: %v %q", err, out.String())
	}
	var code exitCode
	if err := run([]string{"frobnicate"}, &out, &errOut); !errors.As(err, &code) || code != 2 ||
		!strings.Contains(errOut.String(), `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: %v %q", err, errOut.String())
	}
	errOut.Reset()
	if err := run([]string{"bench", "--config", "", "--users", "5"}, &out, &errOut); !errors.As(err, &code) ||
		!strings.Contains(errOut.String(), "--sale is required") {
		t.Fatalf("bench without a sale: %v %q", err, errOut.String())
	}
	t.Setenv("FLASHGATE_JWT_SECRET", "")
	if err := run([]string{"token", "--config", "", "--user", "42"}, &out, &errOut); !errors.Is(err, errNoSecret) {
		t.Fatalf("token without a secret: %v", err)
	}
	t.Setenv("FLASHGATE_DEV", "0")
	t.Setenv("FLASHGATE_JWT_SECRET", "s3cret-of-32-bytes-or-more-0123456")
	out.Reset()
	// Positional arguments and flags mix in any order.
	c := newCommand("x", "", &errOut)
	user := c.String("user", "", "")
	pos, err := c.parse([]string{"a", "--user", "7", "b"})
	if err != nil || *user != "7" || strings.Join(pos, ",") != "a,b" {
		t.Fatalf("parse: %v %q %q", err, *user, pos)
	}
	if err := run([]string{"token", "--config", "", "--user", "42"}, &out, &errOut); err != nil ||
		strings.Count(strings.TrimSpace(out.String()), ".") != 2 {
		t.Fatalf("token: %v %q", err, out.String())
	}
	errOut.Reset()
	if err := run([]string{"token", "--config", "", "--user", "42", "--ttl", "25h"}, &out, &errOut); err == nil ||
		!strings.Contains(errOut.String(), "max_token_ttl") {
		t.Fatalf("token past the maximum lifetime: %v %q", err, errOut.String())
	}
	// With a signing kid, the token names it and verifies under that key.
	const k2 = "the-k2-secret-of-32-bytes-or-more-xyz"
	t.Setenv("FLASHGATE_AUTH_KEYS", "[{kid: k2, secret: "+k2+"}]")
	t.Setenv("FLASHGATE_AUTH_SIGNING_KID", "k2")
	out.Reset()
	if err := run([]string{"token", "--config", "", "--user", "42"}, &out, &errOut); err != nil {
		t.Fatalf("token with a signing kid: %v", err)
	}
	tok := strings.TrimSpace(out.String())
	hdr, _ := base64.RawURLEncoding.DecodeString(tok[:strings.IndexByte(tok, '.')])
	only := config.Auth{Keys: []config.Key{{Kid: "k2", Secret: k2}}}
	if v, err := auth.NewVerifier(only); err != nil || !strings.Contains(string(hdr), `"kid":"k2"`) {
		t.Fatalf("token header %s, %v", hdr, err)
	} else if c, err := v.Verify(tok); err != nil || c.Subject != "42" {
		t.Fatalf("token signed with k2: %+v %v", c, err)
	}
}

package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

const partnerSecret = "a-partner-secret-of-at-least-32-bytes"

// TestTokenTrust: a token must name its key's issuer, a subject under its
// key's prefix and the flashgate audience; anything else is 401
// unauthorized and reserves nothing.
func TestTokenTrust(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.Auth.Keys = append(c.Auth.Keys, config.Key{Kid: "acme", Secret: partnerSecret, Issuer: "acme-shop", SubjectPrefix: "acme_"})
	})
	s := e.sale(func(s *flashgate.Sale) { s.Total = 100 })
	now := time.Now().Unix()
	claims := func(edit func(map[string]any)) map[string]any {
		c := map[string]any{"sub": "acme_" + testenv.ID("u"), "iss": "acme-shop", "aud": "flashgate", "iat": now, "exp": now + 600}
		if edit != nil {
			edit(c)
		}
		return c
	}
	acme := map[string]any{"alg": "HS256", "kid": "acme"}
	rawToken := func(h, c map[string]any, secret string) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(c))
		if kid, ok := h["kid"]; ok {
			tok.Header["kid"] = kid
		}
		s, _ := tok.SignedString([]byte(secret))
		return s
	}
	for _, tc := range []struct {
		name  string
		token string
		want  int
	}{
		{"partner, own namespace", rawToken(acme, claims(nil), partnerSecret), 202},
		{"wrong iss", rawToken(acme, claims(func(c map[string]any) { c["iss"] = "flashgate" }), partnerSecret), 401},
		{"no iss", rawToken(acme, claims(func(c map[string]any) { delete(c, "iss") }), partnerSecret), 401},
		{"sub outside the prefix", rawToken(acme, claims(func(c map[string]any) { c["sub"] = "victim" }), partnerSecret), 401},
		{"missing aud", rawToken(acme, claims(func(c map[string]any) { delete(c, "aud") }), partnerSecret), 401},
		{"operator's key, missing aud", rawToken(map[string]any{"alg": "HS256"},
			claims(func(c map[string]any) { c["iss"] = "flashgate"; delete(c, "aud") }), e.cfg.Auth.JWTSecret), 401},
		{"operator's key, partner's iss", rawToken(map[string]any{"alg": "HS256"}, claims(nil), e.cfg.Auth.JWTSecret), 401},
	} {
		r := e.buy(s, tc.token, `{}`, nil)
		if r.Status != tc.want || tc.want == 401 && r.Code != string(flashgate.CodeUnauthorized) {
			t.Errorf("%s: %d %s %s, want %d", tc.name, r.Status, r.Code, r.Message, tc.want)
		}
	}
	if rem, resv := e.stock(s); rem != 99 || resv != 1 {
		t.Errorf("stock %d, reservations %d: want 99 and 1 (only the good token bought)", rem, resv)
	}
}

// TestDeniedSubjectRefusedWithinASecond: a buyer's token that this gateway
// has verified and cached is refused 401 within a second of its subject (or
// its jti) going on the denylist in Redis, and accepted again once lifted.
func TestDeniedSubjectRefusedWithinASecond(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.Total = 100; s.PerUserLimit = 100; s.PerOrderMax = 1 })
	ctx := context.Background()
	for _, kind := range []string{auth.DenySubject, auth.DenyTokenID} {
		user, jti := testenv.ID("bot"), testenv.ID("jti")
		tok, err := auth.MintHS256(e.cfg.Auth.JWTSecret, user, auth.MintOptions{ID: jti})
		if err != nil {
			t.Fatal(err)
		}
		if r := e.buy(s, tok, `{}`, nil); r.Status != 202 {
			t.Fatalf("%s: before: %d %s", kind, r.Status, r.Code)
		}
		if r := e.buy(s, tok, `{}`, nil); r.Status != 202 {
			t.Fatalf("%s: before, from the cache: %d %s", kind, r.Status, r.Code)
		}
		id := map[string]string{auth.DenySubject: user, auth.DenyTokenID: jti}[kind]
		entry := auth.DenyEntry(kind, id)
		t.Cleanup(func() { _, _ = lua.Undeny(context.Background(), e.rc, entry) })
		if err := lua.Deny(ctx, e.rc, entry, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		denied := time.Now()
		var took time.Duration
		for {
			r := e.buy(s, tok, `{}`, nil)
			if r.Status == 401 && r.Code == string(flashgate.CodeUnauthorized) {
				took = time.Since(denied)
				break
			}
			if time.Since(denied) > 3*time.Second {
				t.Fatalf("%s: a denied token still answered %d %s after 3 s", kind, r.Status, r.Code)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s denied: refused after %v", kind, took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("%s: refused only after %v, want within a second", kind, took)
		}
		// Another buyer is untouched; the entry lifted, the token buys again.
		if r := e.buy(s, e.token(testenv.ID("ok")), `{}`, nil); r.Status != 202 {
			t.Errorf("%s: another buyer: %d %s", kind, r.Status, r.Code)
		}
		if _, err := lua.Undeny(ctx, e.rc, entry); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Second)
		for r := e.buy(s, tok, `{}`, nil); r.Status != 202; r = e.buy(s, tok, `{}`, nil) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: lifted, the token still answers %d %s", kind, r.Status, r.Code)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

package auth_test

import (
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
)

// TestKeyNamespaces: each key verifies only its own issuer's tokens and only
// for subjects under its prefix, so a partner's key cannot sign for the
// operator's buyers (or another partner's), and aud is required unless
// audience_optional says otherwise.
func TestKeyNamespaces(t *testing.T) {
	const partnerSecret = "the-partner-secret-of-32-bytes-or-more"
	cfg := config.Auth{JWTSecret: secret, Keys: []config.Key{
		{Kid: "acme", Secret: partnerSecret, Issuer: "acme-shop", SubjectPrefix: "acme_"},
	}}
	v := verifier(t, cfg)
	acme := func(edit func(map[string]any)) string {
		return craft(map[string]any{"alg": "HS256", "kid": "acme"}, claims(func(c map[string]any) {
			c["iss"], c["sub"] = "acme-shop", "acme_42"
			if edit != nil {
				edit(c)
			}
		}), hmacWith(sha256.New, partnerSecret))
	}
	for _, tc := range []struct {
		name, token, sub string // sub "": refused
	}{
		{"partner, own namespace", acme(nil), "acme_42"},
		{"operator's key, any user", hs256(func(c map[string]any) { c["sub"] = "acme_42" }), "acme_42"},
		{"partner signs for an operator's buyer", acme(func(c map[string]any) { c["sub"] = "u1" }), ""},
		{"partner signs the bare prefix", acme(func(c map[string]any) { c["sub"] = "acme_" }), ""},
		{"partner with the operator's issuer", acme(func(c map[string]any) { c["iss"] = auth.DefaultIssuer }), ""},
		{"partner without iss", acme(func(c map[string]any) { delete(c, "iss") }), ""},
		{"operator's key with the partner's issuer", hs256(func(c map[string]any) { c["iss"] = "acme-shop" }), ""},
		{"partner without aud", acme(func(c map[string]any) { delete(c, "aud") }), ""},
	} {
		c, err := v.Verify(tc.token)
		switch {
		case tc.sub == "" && !errors.Is(err, auth.ErrUnauthorized):
			t.Errorf("%s: Verify = %+v, %v; want ErrUnauthorized", tc.name, c, err)
		case tc.sub != "" && (err != nil || c.Subject != tc.sub):
			t.Errorf("%s: Verify = %+v, %v; want sub %s", tc.name, c, err, tc.sub)
		}
	}
	if got := auth.IssuerOf(cfg, "acme"); got != "acme-shop" {
		t.Errorf("IssuerOf(acme) = %q", got)
	}
	cfg.AudienceOptional = true
	v = verifier(t, cfg)
	if _, err := v.Verify(acme(func(c map[string]any) { delete(c, "aud") })); err != nil {
		t.Errorf("audience_optional: a token without aud: %v", err)
	}
	if _, err := v.Verify(acme(func(c map[string]any) { c["aud"] = "other" })); !errors.Is(err, auth.ErrUnauthorized) {
		t.Errorf("audience_optional: a token naming another audience: %v", err)
	}
}

// TestDenylistCachedToken: a token the cache holds is refused as soon as its
// subject, or its jti, is on the denylist, and accepted again once lifted
// or lapsed. A denied token retrying allocates nothing.
func TestDenylistCachedToken(t *testing.T) {
	v := verifier(t, config.Auth{JWTSecret: secret})
	c := auth.NewCache(v, 1024)
	tok, _ := auth.MintHS256(secret, "bot_7", auth.MintOptions{ID: "t-1"})
	other, _ := auth.MintHS256(secret, "honest", auth.MintOptions{ID: "t-2"})
	now := time.Now()
	for _, tk := range []string{tok, other} {
		if _, err := c.Verify([]byte(tk), now); err != nil {
			t.Fatal(err)
		}
	}
	d := c.Denylist()
	for _, entry := range []string{auth.DenyEntry(auth.DenySubject, "bot_7"), auth.DenyEntry(auth.DenyTokenID, "t-1")} {
		d.Replace(map[string]int64{entry: now.Add(time.Minute).Unix()})
		if _, err := c.Verify([]byte(tok), now); !errors.Is(err, auth.ErrDenied) || !errors.Is(err, auth.ErrUnauthorized) {
			t.Fatalf("%s: the cached token: %v, want ErrDenied", entry, err)
		}
		if _, err := v.Verify(tok); !errors.Is(err, auth.ErrDenied) {
			t.Fatalf("%s: the verifier alone: %v, want ErrDenied", entry, err)
		}
		if _, err := c.Verify([]byte(other), now); err != nil {
			t.Fatalf("%s: another buyer's token: %v", entry, err)
		}
		buf := []byte(tok)
		if n := testing.AllocsPerRun(100, func() { _, _ = c.Verify(buf, now) }); n != 0 {
			t.Fatalf("a denied cached token allocates %v times", n)
		}
		// Lapsed: the entry no longer refuses.
		if _, err := c.Verify([]byte(tok), now.Add(2*time.Minute)); err != nil && errors.Is(err, auth.ErrDenied) {
			t.Fatalf("%s: a lapsed entry still refuses", entry)
		}
	}
	d.Replace(nil)
	if _, err := c.Verify([]byte(tok), now); err != nil {
		t.Fatalf("lifted: %v", err)
	}
}

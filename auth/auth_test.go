package auth_test

import (
	"crypto"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"hash"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
)

const secret = "test-secret-of-some-length"

func b64(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// craft builds a token by hand: header and claims as given, signed by sign
// (nil: an empty signature).
func craft(header, claims map[string]any, sign func(input string) []byte) string {
	input := b64(header) + "." + b64(claims)
	var sig []byte
	if sign != nil {
		sig = sign(input)
	}
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func hmacWith(h func() hash.Hash, key string) func(string) []byte {
	return func(input string) []byte {
		m := hmac.New(h, []byte(key))
		m.Write([]byte(input))
		return m.Sum(nil)
	}
}

func hdr(alg string) map[string]any { return map[string]any{"alg": alg, "typ": "JWT"} }

// claims are valid claims for user u1; edit changes them.
func claims(edit func(map[string]any)) map[string]any {
	c := map[string]any{"sub": "u1", "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(),
		"iss": auth.DefaultIssuer, "aud": auth.Audience}
	if edit != nil {
		edit(c)
	}
	return c
}

func hs256(edit func(map[string]any)) string {
	return craft(hdr("HS256"), claims(edit), hmacWith(sha256.New, secret))
}

func verifier(t testing.TB, cfg config.Auth) *auth.Verifier {
	t.Helper()
	v, err := auth.NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerifyHS256(t *testing.T) {
	v := verifier(t, config.Auth{JWTSecret: secret})
	now := time.Now()
	minted, err := auth.MintHS256(secret, "user_42-X", auth.MintOptions{Phone: "+8613800000000", Device: "ios-1"})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 64)
	bad := func(alg string, h func() hash.Hash) string {
		return craft(hdr(alg), claims(nil), hmacWith(h, secret))
	}
	valid := hs256(nil)
	flipped := valid[:strings.LastIndexByte(valid, '.')+1] + flip(valid[strings.LastIndexByte(valid, '.')+1:])
	for _, tc := range []struct {
		name  string
		token string
		sub   string // "" for a token that must be refused
	}{
		{"minted", minted, "user_42-X"},
		{"hand-made", valid, "u1"},
		{"aud flashgate", hs256(func(c map[string]any) { c["aud"] = "flashgate" }), "u1"},
		{"aud list with flashgate", hs256(func(c map[string]any) { c["aud"] = []string{"other", "flashgate"} }), "u1"},
		{"sub of 64", hs256(func(c map[string]any) { c["sub"] = long }), long},
		{"expired within leeway", hs256(func(c map[string]any) { c["exp"] = now.Add(-2 * time.Second).Unix() }), "u1"},
		{"no iat", hs256(func(c map[string]any) { delete(c, "iat") }), "u1"},
		{"lifetime of 24h", hs256(func(c map[string]any) { c["exp"] = now.Add(24 * time.Hour).Unix(); c["iat"] = now.Unix() }), "u1"},
		{"iat 20s ahead", hs256(func(c map[string]any) { c["iat"] = now.Add(20 * time.Second).Unix() }), "u1"},
		{"nbf 20s ahead", hs256(func(c map[string]any) { c["nbf"] = now.Add(20 * time.Second).Unix() }), "u1"},
		{"no iat, exp 23h ahead", hs256(func(c map[string]any) { delete(c, "iat"); c["exp"] = now.Add(23 * time.Hour).Unix() }), "u1"},

		{"lifetime over 24h", hs256(func(c map[string]any) { c["exp"] = now.Add(24*time.Hour + time.Minute).Unix(); c["iat"] = now.Unix() }), ""},
		{"lifetime over 24h, issued long ago", hs256(func(c map[string]any) {
			c["exp"] = now.Add(time.Hour).Unix()
			c["iat"] = now.Add(-30 * time.Hour).Unix()
		}), ""},
		{"no iat, exp 25h ahead", hs256(func(c map[string]any) { delete(c, "iat"); c["exp"] = now.Add(25 * time.Hour).Unix() }), ""},
		{"exp in 100 years", hs256(func(c map[string]any) { c["exp"] = now.AddDate(100, 0, 0).Unix() }), ""},
		{"iat 40s ahead", hs256(func(c map[string]any) { c["iat"] = now.Add(40 * time.Second).Unix() }), ""},
		{"nbf 40s ahead", hs256(func(c map[string]any) { c["nbf"] = now.Add(40 * time.Second).Unix() }), ""},
		{"expired 10s ago (past exp's 5s leeway)", hs256(func(c map[string]any) { c["exp"] = now.Add(-10 * time.Second).Unix() }), ""},
		{"exp a string", hs256(func(c map[string]any) { c["exp"] = "soon" }), ""},
		{"unknown kid", craft(map[string]any{"alg": "HS256", "kid": "nope"}, claims(nil), hmacWith(sha256.New, secret)), ""},
		{"kid not a string", craft(map[string]any{"alg": "HS256", "kid": 1}, claims(nil), hmacWith(sha256.New, secret)), ""},
		{"kid empty", craft(map[string]any{"alg": "HS256", "kid": ""}, claims(nil), hmacWith(sha256.New, secret)), ""},

		{"expired", hs256(func(c map[string]any) { c["exp"] = now.Add(-time.Minute).Unix() }), ""},
		{"expired long ago", hs256(func(c map[string]any) { c["exp"] = 1 }), ""},
		{"no exp", hs256(func(c map[string]any) { delete(c, "exp") }), ""},
		{"not yet valid", hs256(func(c map[string]any) { c["nbf"] = now.Add(time.Hour).Unix() }), ""},
		{"bad signature", flipped, ""},
		{"no signature", valid[:strings.LastIndexByte(valid, '.')+1], ""},
		{"wrong secret", craft(hdr("HS256"), claims(nil), hmacWith(sha256.New, "another-secret")), ""},
		{"alg none", craft(hdr("none"), claims(nil), nil), ""},
		{"alg None", craft(hdr("None"), claims(nil), nil), ""},
		{"alg none with a signature", craft(hdr("none"), claims(nil), hmacWith(sha256.New, secret)), ""},
		{"no alg", craft(map[string]any{"typ": "JWT"}, claims(nil), hmacWith(sha256.New, secret)), ""},
		{"HS384", bad("HS384", sha512.New384), ""},
		{"HS512", bad("HS512", sha512.New), ""},
		{"RS256 header, HMAC signature", bad("RS256", sha256.New), ""},
		{"EdDSA header, HMAC signature", bad("EdDSA", sha256.New), ""},
		{"sub missing", hs256(func(c map[string]any) { delete(c, "sub") }), ""},
		{"sub empty", hs256(func(c map[string]any) { c["sub"] = "" }), ""},
		{"sub of 65", hs256(func(c map[string]any) { c["sub"] = long + "a" }), ""},
		{"sub with a space", hs256(func(c map[string]any) { c["sub"] = "u 1" }), ""},
		{"sub with a dot", hs256(func(c map[string]any) { c["sub"] = "u.1" }), ""},
		{"sub with a pipe", hs256(func(c map[string]any) { c["sub"] = "u|1" }), ""},
		{"sub not ascii", hs256(func(c map[string]any) { c["sub"] = "用户" }), ""},
		{"sub a number", hs256(func(c map[string]any) { c["sub"] = 42 }), ""},
		{"aud other", hs256(func(c map[string]any) { c["aud"] = "other" }), ""},
		{"no aud (required by default)", hs256(func(c map[string]any) { delete(c, "aud") }), ""},
		{"no iss", hs256(func(c map[string]any) { delete(c, "iss") }), ""},
		{"iss of another", hs256(func(c map[string]any) { c["iss"] = "partner" }), ""},
		{"iss not a string", hs256(func(c map[string]any) { c["iss"] = 7 }), ""},
		{"aud empty", hs256(func(c map[string]any) { c["aud"] = "" }), ""},
		{"aud list without flashgate", hs256(func(c map[string]any) { c["aud"] = []string{"a", "b"} }), ""},
		{"empty", "", ""},
		{"two parts", "a.b", ""},
		{"three junk parts", "a.b.c", ""},
		{"dots", "..", ""},
		{"garbage", "garbage", ""},
		{"bearer prefix", "Bearer " + valid, ""},
		{"four parts", valid + ".x", ""},
		{"header not json", base64.RawURLEncoding.EncodeToString([]byte("{")) + "." + b64(claims(nil)) + ".x", ""},
		{"claims not an object", b64(hdr("HS256")) + "." + b64([]int{1}) + ".x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(tc.token)
			if tc.sub == "" {
				if err == nil || !errors.Is(err, auth.ErrUnauthorized) || c != nil {
					t.Fatalf("Verify = %+v, %v; want ErrUnauthorized", c, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if c.Subject != tc.sub {
				t.Fatalf("sub = %q, want %q", c.Subject, tc.sub)
			}
		})
	}
}

// flip changes the first character of a base64url string (the last may only
// carry padding bits).
func flip(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}

func TestMint(t *testing.T) {
	v := verifier(t, config.Auth{JWTSecret: secret})
	tok, err := auth.MintHS256(secret, "u9", auth.MintOptions{Phone: "p", Device: "d", TTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "u9" || c.Phone != "p" || c.Device != "d" || len(c.Audience) != 1 || c.Audience[0] != auth.Audience {
		t.Fatalf("claims = %+v", c)
	}
	if ttl := c.ExpiresAt.Sub(c.IssuedAt.Time); ttl != 10*time.Minute {
		t.Fatalf("exp - iat = %v", ttl)
	}
	tok, _ = auth.MintHS256(secret, "u9", auth.MintOptions{})
	if c, err := v.Verify(tok); err != nil || c.ExpiresAt.Sub(c.IssuedAt.Time) != time.Hour {
		t.Fatalf("default TTL: %+v, %v", c, err)
	}
	for _, user := range []string{"", "a b", strings.Repeat("x", 65)} {
		if _, err := auth.MintHS256(secret, user, auth.MintOptions{}); err == nil {
			t.Errorf("MintHS256(%q): no error", user)
		}
	}
}

func TestNewVerifier(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []config.Auth{
		{},
		{EdDSAPublicKeyFile: filepath.Join(dir, "missing.pem")},
		{EdDSAPublicKeyFile: garbage},
		{JWTSecret: secret, EdDSAPublicKeyFile: garbage},
		{Keys: []config.Key{{Kid: "a", PublicKeyFile: garbage}}},
		{Keys: []config.Key{{Kid: "a"}}},
		{Keys: []config.Key{{Kid: "", Secret: secret}}},
		{Keys: []config.Key{{Kid: "a", Secret: secret}, {Kid: "a", Secret: secret}}},
	} {
		if v, err := auth.NewVerifier(cfg); err == nil {
			t.Errorf("NewVerifier(%+v) = %v, no error", cfg, v)
		}
	}
}

func TestMaxTokenTTL(t *testing.T) {
	v := verifier(t, config.Auth{JWTSecret: secret, MaxTokenTTL: time.Hour})
	ok, _ := auth.MintHS256(secret, "u1", auth.MintOptions{TTL: time.Hour})
	long, _ := auth.MintHS256(secret, "u1", auth.MintOptions{TTL: time.Hour + time.Second})
	if _, err := v.Verify(ok); err != nil {
		t.Fatalf("a 1h token under a 1h maximum: %v", err)
	}
	if _, err := v.Verify(long); !errors.Is(err, auth.ErrUnauthorized) {
		t.Fatalf("a token past the maximum lifetime: %v", err)
	}
}

// TestKeyRotation: the secret rotates during a sale. Tokens of the old key
// (no kid, or its kid) keep verifying while new ones carry the new kid; a
// kid decides the key, and a key verifies only its own algorithm.
func TestKeyRotation(t *testing.T) {
	const newSecret = "the-new-secret-of-at-least-32-bytes!"
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	cfg := config.Auth{JWTSecret: secret, SigningKid: "k2", Keys: []config.Key{
		{Kid: "k2", Secret: newSecret}, {Kid: "ed", PublicKeyFile: writeKey(t, pub)},
	}}
	v := verifier(t, cfg)
	signSecret, kid, err := auth.SigningSecret(cfg)
	if err != nil || signSecret != newSecret || kid != "k2" {
		t.Fatalf("SigningSecret = %q %q %v", signSecret, kid, err)
	}
	old, _ := auth.MintHS256(secret, "old_buyer", auth.MintOptions{})
	rotated, _ := auth.MintHS256(signSecret, "new_buyer", auth.MintOptions{Kid: kid})
	ed, _ := auth.MintEdDSA(priv, "ed_buyer", auth.MintOptions{Kid: "ed"})
	for tok, sub := range map[string]string{old: "old_buyer", rotated: "new_buyer", ed: "ed_buyer"} {
		if c, err := v.Verify(tok); err != nil || c.Subject != sub {
			t.Errorf("%s: %+v %v", sub, c, err)
		}
	}
	for name, tok := range map[string]string{
		"new secret, no kid":          craft(hdr("HS256"), claims(nil), hmacWith(sha256.New, newSecret)),
		"old secret, new kid":         craft(map[string]any{"alg": "HS256", "kid": "k2"}, claims(nil), hmacWith(sha256.New, secret)),
		"EdDSA without kid":           func() string { t, _ := auth.MintEdDSA(priv, "x", auth.MintOptions{}); return t }(),
		"EdDSA with the HS256 kid":    func() string { t, _ := auth.MintEdDSA(priv, "x", auth.MintOptions{Kid: "k2"}); return t }(),
		"HS256 keyed with the ed key": craft(map[string]any{"alg": "HS256", "kid": "ed"}, claims(nil), hmacWith(sha256.New, string(pub))),
	} {
		if c, err := v.Verify(tok); !errors.Is(err, auth.ErrUnauthorized) {
			t.Errorf("%s: Verify = %+v, %v; want ErrUnauthorized", name, c, err)
		}
	}
	// The old key retired: its tokens stop verifying, the new ones go on.
	cfg.JWTSecret = ""
	v = verifier(t, cfg)
	if _, err := v.Verify(old); !errors.Is(err, auth.ErrUnauthorized) {
		t.Errorf("a token of the retired key: %v", err)
	}
	if _, err := v.Verify(rotated); err != nil {
		t.Errorf("a token of the new key after the old one retired: %v", err)
	}
	if _, _, err := auth.SigningSecret(config.Auth{SigningKid: "ed", Keys: cfg.Keys}); err == nil {
		t.Error("SigningSecret of a public key: no error")
	}
	if _, _, err := auth.SigningSecret(config.Auth{}); !errors.Is(err, auth.ErrNoSecret) {
		t.Errorf("SigningSecret of nothing: %v", err)
	}
}

func writeKey(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "jwt.pub.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVerifyEdDSA(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	v := verifier(t, config.Auth{EdDSAPublicKeyFile: writeKey(t, pub)})
	good, err := auth.MintEdDSA(priv, "ed_user", auth.MintOptions{Device: "d"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(good)
	if err != nil || c.Subject != "ed_user" || c.Device != "d" {
		t.Fatalf("Verify = %+v, %v", c, err)
	}
	otherKey, _ := auth.MintEdDSA(otherPriv, "ed_user", auth.MintOptions{})
	hsToken, _ := auth.MintHS256(secret, "ed_user", auth.MintOptions{})
	edSign := func(k ed25519.PrivateKey) func(string) []byte {
		return func(input string) []byte {
			sig, err := k.Sign(rand.Reader, []byte(input), crypto.Hash(0))
			if err != nil {
				panic(err)
			}
			return sig
		}
	}
	for name, tok := range map[string]string{
		"HS256 token":  hsToken,
		"other key":    otherKey,
		"alg none":     craft(hdr("none"), claims(nil), nil),
		"expired":      craft(hdr("EdDSA"), claims(func(c map[string]any) { c["exp"] = 1 }), edSign(priv)),
		"no exp":       craft(hdr("EdDSA"), claims(func(c map[string]any) { delete(c, "exp") }), edSign(priv)),
		"bad sub":      craft(hdr("EdDSA"), claims(func(c map[string]any) { c["sub"] = "a/b" }), edSign(priv)),
		"aud other":    craft(hdr("EdDSA"), claims(func(c map[string]any) { c["aud"] = "other" }), edSign(priv)),
		"HS256 header": craft(hdr("HS256"), claims(nil), edSign(priv)),
		// An HMAC keyed with the public key: the classic key confusion.
		"HS256 with the public key": craft(hdr("HS256"), claims(nil), hmacWith(sha256.New, string(pub))),
	} {
		if c, err := v.Verify(tok); err == nil || !errors.Is(err, auth.ErrUnauthorized) {
			t.Errorf("%s: Verify = %+v, %v; want ErrUnauthorized", name, c, err)
		}
	}
	if c, err := v.Verify(craft(hdr("EdDSA"), claims(nil), edSign(priv))); err != nil || c.Subject != "u1" {
		t.Fatalf("hand-made EdDSA token: %+v, %v", c, err)
	}
}

func FuzzVerify(f *testing.F) {
	v := verifier(f, config.Auth{JWTSecret: secret})
	minted, _ := auth.MintHS256(secret, "u1", auth.MintOptions{TTL: 23 * time.Hour})
	long, _ := auth.MintHS256(secret, "u1", auth.MintOptions{TTL: 100 * 365 * 24 * time.Hour})
	kidded, _ := auth.MintHS256(secret, "u1", auth.MintOptions{Kid: "k2"})
	for _, s := range []string{minted, long, kidded, hs256(nil), craft(hdr("none"), claims(nil), nil), "", "a.b", "a.b.c", "...",
		"eyJhbGciOiJIUzI1NiJ9.e30.", "garbage"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(token)
		if err != nil {
			if !errors.Is(err, auth.ErrUnauthorized) || c != nil {
				t.Fatalf("Verify(%q) = %+v, %v", token, c, err)
			}
			return
		}
		// Whatever is accepted names a valid user, expires within the
		// maximum lifetime and was not issued in the future.
		now := time.Now()
		if !flashgate.ValidID(c.Subject) || c.ExpiresAt == nil || c.ExpiresAt.Sub(now) > auth.DefaultMaxTTL ||
			(c.IssuedAt != nil && (c.IssuedAt.Sub(now) > 31*time.Second || c.ExpiresAt.Sub(c.IssuedAt.Time) > auth.DefaultMaxTTL)) ||
			(c.NotBefore != nil && c.NotBefore.Sub(now) > 31*time.Second) {
			t.Fatalf("Verify(%q) accepted %+v", token, c)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	v := verifier(b, config.Auth{JWTSecret: secret})
	tok, err := auth.MintHS256(secret, "user-42", auth.MintOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyRejectBadSignature(b *testing.B) {
	v := verifier(b, config.Auth{JWTSecret: secret})
	tok := craft(hdr("HS256"), claims(nil), hmacWith(sha256.New, "wrong"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok); err == nil {
			b.Fatal("accepted")
		}
	}
}

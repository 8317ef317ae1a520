// Package auth verifies buyers' JWTs (DESIGN.md §3) with the algorithm pinned by
// configuration: HS256 with a shared secret, or EdDSA with a public key. Tokens
// with alg "none" or any other algorithm are rejected by the parser itself.
package auth

import (
	"crypto"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// Audience is the only audience a token may name.
const Audience = "flashgate"

// Claims are the claims flashgate reads.
type Claims struct {
	jwt.RegisteredClaims
	Phone  string `json:"phone,omitempty"`
	Device string `json:"device,omitempty"`
}

// ErrUnauthorized wraps every verification failure.
var ErrUnauthorized = errors.New("unauthorized")

// Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	parser *jwt.Parser
	key    any
	now    func() time.Time // the parser's clock, for exp; time.Now but in tests
}

// NewVerifier pins the algorithm from cfg.
func NewVerifier(cfg config.Auth) (*Verifier, error) {
	switch {
	case cfg.JWTSecret != "":
		return newVerifier(jwt.SigningMethodHS256.Alg(), []byte(cfg.JWTSecret)), nil
	case cfg.EdDSAPublicKeyFile != "":
		pem, err := os.ReadFile(cfg.EdDSAPublicKeyFile)
		if err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
		pub, err := jwt.ParseEdPublicKeyFromPEM(pem)
		if err != nil {
			return nil, fmt.Errorf("auth: %s: %w", cfg.EdDSAPublicKeyFile, err)
		}
		return newVerifier(jwt.SigningMethodEdDSA.Alg(), pub), nil
	}
	return nil, errors.New("auth: set auth.jwt_secret (FLASHGATE_JWT_SECRET) or auth.eddsa_public_key_file")
}

func newVerifier(alg string, key any) *Verifier {
	v := &Verifier{key: key, now: time.Now}
	v.parser = jwt.NewParser(
		jwt.WithValidMethods([]string{alg}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(func() time.Time { return v.now() }),
	)
	return v
}

// leeway is the clock skew tolerated on exp (and nbf).
const leeway = 5 * time.Second

// Verify checks a token and returns its claims.
func (v *Verifier) Verify(token string) (*Claims, error) {
	c := new(Claims)
	if _, err := v.parser.ParseWithClaims(token, c, func(*jwt.Token) (any, error) { return v.key, nil }); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	if !flashgate.ValidID(c.Subject) {
		return nil, fmt.Errorf("%w: sub must be 1-64 characters of [A-Za-z0-9_-]", ErrUnauthorized)
	}
	if len(c.Audience) > 0 && !slices.Contains(c.Audience, Audience) {
		return nil, fmt.Errorf("%w: aud must be %q", ErrUnauthorized, Audience)
	}
	return c, nil
}

// MintOptions are a minted token's optional claims.
type MintOptions struct {
	Phone, Device string
	TTL           time.Duration // default 1h
}

// MintHS256 makes an HS256 token for user (`flashgate token`, load tests).
func MintHS256(secret, user string, o MintOptions) (string, error) {
	return mint(jwt.SigningMethodHS256, []byte(secret), user, o)
}

// MintEdDSA makes an EdDSA token for user.
func MintEdDSA(key ed25519.PrivateKey, user string, o MintOptions) (string, error) {
	return mint(jwt.SigningMethodEdDSA, crypto.Signer(key), user, o)
}

func mint(m jwt.SigningMethod, key any, user string, o MintOptions) (string, error) {
	if !flashgate.ValidID(user) {
		return "", errors.New("auth: user must be 1-64 characters of [A-Za-z0-9_-]")
	}
	if o.TTL <= 0 {
		o.TTL = time.Hour
	}
	now := time.Now()
	return jwt.NewWithClaims(m, Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   user,
			Audience:  jwt.ClaimStrings{Audience},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(o.TTL)),
		},
		Phone:  o.Phone,
		Device: o.Device,
	}).SignedString(key)
}

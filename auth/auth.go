// Package auth verifies buyers' JWTs with the algorithm pinned by
// configuration, per key: HS256 with a shared secret, or EdDSA with a public
// key, chosen by the token's kid header (docs/security.md). Tokens with alg
// "none" or any other algorithm are rejected by the parser itself.
package auth

import (
	"cmp"
	"crypto"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// Audience is the only audience a token may name.
const Audience = "flashgate"

// DefaultIssuer is the iss of the operator's own tokens (auth.issuer's
// default, and what MintHS256 and MintEdDSA write when told none).
const DefaultIssuer = "flashgate"

// Claims are the claims flashgate reads.
type Claims struct {
	jwt.RegisteredClaims
	Phone  string `json:"phone,omitempty"`
	Device string `json:"device,omitempty"`
}

// ErrNoSecret is SigningSecret's answer when there is nothing to sign with.
var ErrNoSecret = errors.New("no JWT secret: set FLASHGATE_JWT_SECRET (or auth.jwt_secret, or auth.keys and auth.signing_kid)")

// ErrUnauthorized wraps every verification failure.
var ErrUnauthorized = errors.New("unauthorized")

// Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	parser  *jwt.Parser
	keys    map[string]verifyKey // by kid; "" is the default key, for tokens without kid
	keyfunc jwt.Keyfunc          // v.keyFor, bound once
	maxTTL  time.Duration
	audOpt  bool             // auth.audience_optional
	now     func() time.Time // the parser's clock, for exp; time.Now but in tests
	deny    *Denylist        // revoked subjects and token ids (denylist.go)
}

// verifyKey is one key, the only algorithm it verifies (an HMAC secret must
// never check an EdDSA token's signature or the reverse), the issuer its
// tokens must name and the prefix their subjects must start with: a key
// signs for its own namespace of users, not for anyone's.
type verifyKey struct {
	alg    string
	key    any
	iss    string
	prefix string
}

// NewVerifier pins each key's algorithm from cfg: the default key
// (jwt_secret or eddsa_public_key_file) and every auth.keys entry.
func NewVerifier(cfg config.Auth) (*Verifier, error) {
	keys := map[string]verifyKey{}
	iss := IssuerOf(cfg, "")
	switch {
	case cfg.JWTSecret != "" && cfg.EdDSAPublicKeyFile != "":
		return nil, errors.New("auth: set jwt_secret or eddsa_public_key_file, not both")
	case cfg.JWTSecret != "":
		keys[""] = verifyKey{jwt.SigningMethodHS256.Alg(), []byte(cfg.JWTSecret), iss, cfg.SubjectPrefix}
	case cfg.EdDSAPublicKeyFile != "":
		pub, err := readEdKey(cfg.EdDSAPublicKeyFile)
		if err != nil {
			return nil, err
		}
		keys[""] = verifyKey{jwt.SigningMethodEdDSA.Alg(), pub, iss, cfg.SubjectPrefix}
	}
	for _, k := range cfg.Keys {
		if _, dup := keys[k.Kid]; dup || k.Kid == "" {
			return nil, fmt.Errorf("auth: kid %q is empty or given twice", k.Kid)
		}
		kiss := IssuerOf(cfg, k.Kid)
		switch {
		case k.Secret != "" && k.PublicKeyFile == "":
			keys[k.Kid] = verifyKey{jwt.SigningMethodHS256.Alg(), []byte(k.Secret), kiss, k.SubjectPrefix}
		case k.PublicKeyFile != "" && k.Secret == "":
			pub, err := readEdKey(k.PublicKeyFile)
			if err != nil {
				return nil, err
			}
			keys[k.Kid] = verifyKey{jwt.SigningMethodEdDSA.Alg(), pub, kiss, k.SubjectPrefix}
		default:
			return nil, fmt.Errorf("auth: key %q: set secret or public_key_file, exactly one", k.Kid)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("auth: set auth.jwt_secret (FLASHGATE_JWT_SECRET), auth.eddsa_public_key_file or auth.keys")
	}
	var algs []string
	for _, k := range keys {
		if !slices.Contains(algs, k.alg) {
			algs = append(algs, k.alg)
		}
	}
	v := &Verifier{keys: keys, maxTTL: cfg.MaxTokenTTL, audOpt: cfg.AudienceOptional, now: time.Now, deny: NewDenylist()}
	if v.maxTTL <= 0 {
		v.maxTTL = DefaultMaxTTL
	}
	v.keyfunc = v.keyFor
	v.parser = jwt.NewParser(
		jwt.WithValidMethods(algs),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		// The parser's leeway is the skew allowed on iat and nbf; exp gets
		// the tighter expLeeway in Verify.
		jwt.WithLeeway(futureSkew),
		jwt.WithTimeFunc(func() time.Time { return v.now() }),
	)
	return v, nil
}

// IssuerOf is the iss the tokens of key kid ("": the default key) must
// carry: the key's own issuer, else auth.issuer, else DefaultIssuer.
func IssuerOf(cfg config.Auth, kid string) string {
	if kid != "" {
		for _, k := range cfg.Keys {
			if k.Kid == kid && k.Issuer != "" {
				return k.Issuer
			}
		}
	}
	if cfg.Issuer != "" {
		return cfg.Issuer
	}
	return DefaultIssuer
}

func readEdKey(path string) (ed25519.PublicKey, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	pub, err := jwt.ParseEdPublicKeyFromPEM(pem)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", path, err)
	}
	return pub.(ed25519.PublicKey), nil
}

// keyFor picks the key by the token's kid (none: the default key) and
// refuses a token whose alg is not that key's.
func (v *Verifier) keyFor(t *jwt.Token) (any, error) {
	kid := ""
	if h, ok := t.Header["kid"]; ok {
		s, ok := h.(string)
		if !ok || s == "" {
			return nil, errors.New("kid must be a non-empty string")
		}
		kid = s
	}
	k, ok := v.keys[kid]
	if !ok {
		return nil, errors.New("unknown kid")
	}
	if t.Method.Alg() != k.alg {
		return nil, errors.New("alg does not match the key")
	}
	return k.key, nil
}

const (
	// expLeeway is the clock skew tolerated on exp: a token is refused once
	// its exp is this far behind, and the cache keeps it no longer.
	expLeeway = 5 * time.Second
	// futureSkew is how far ahead of this clock a token's iat or nbf may be.
	futureSkew = 30 * time.Second
	// DefaultMaxTTL is the longest token lifetime when none is configured.
	DefaultMaxTTL = 24 * time.Hour
)

// Verify checks a token and returns its claims: signature by the key its kid
// names, exp present and not past, iat and nbf not ahead by more than 30 s, a
// lifetime (exp - iat, or exp - now without iat) within the maximum, iss the
// key's issuer, a valid sub starting with the key's subject prefix, aud
// naming flashgate (required unless auth.audience_optional), and neither
// sub nor jti on the denylist.
func (v *Verifier) Verify(token string) (*Claims, error) {
	c, err := v.verify(token)
	if err != nil {
		return nil, err
	}
	if v.deny.Denied(c, v.now().Unix()) {
		return nil, errDenied
	}
	return c, nil
}

// verify is Verify but for the denylist, which the cache checks on every
// hit (Cache.Verify).
func (v *Verifier) verify(token string) (*Claims, error) {
	c := new(Claims)
	t, err := v.parser.ParseWithClaims(token, c, v.keyfunc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	kid, _ := t.Header["kid"].(string)
	k := v.keys[kid] // keyFor found it, or the parse failed
	if c.Issuer != k.iss {
		return nil, fmt.Errorf("%w: iss must be %q", ErrUnauthorized, k.iss)
	}
	now := v.now()
	exp := c.ExpiresAt.Time
	if now.After(exp.Add(expLeeway)) {
		return nil, fmt.Errorf("%w: token is expired", ErrUnauthorized)
	}
	from := now
	if c.IssuedAt != nil {
		from = c.IssuedAt.Time
	}
	if exp.Sub(from) > v.maxTTL {
		return nil, fmt.Errorf("%w: token lifetime over %v", ErrUnauthorized, v.maxTTL)
	}
	if !flashgate.ValidID(c.Subject) {
		return nil, fmt.Errorf("%w: sub must be 1-64 characters of [A-Za-z0-9_-]", ErrUnauthorized)
	}
	if !strings.HasPrefix(c.Subject, k.prefix) || len(c.Subject) == len(k.prefix) && k.prefix != "" {
		return nil, fmt.Errorf("%w: sub must start with %q", ErrUnauthorized, k.prefix)
	}
	if len(c.Audience) == 0 && !v.audOpt {
		return nil, fmt.Errorf("%w: aud is required", ErrUnauthorized)
	}
	if len(c.Audience) > 0 && !slices.Contains(c.Audience, Audience) {
		return nil, fmt.Errorf("%w: aud must be %q", ErrUnauthorized, Audience)
	}
	return c, nil
}

// Denylist is the verifier's denylist, which the gateway keeps current.
func (v *Verifier) Denylist() *Denylist { return v.deny }

// SigningSecret is the HS256 secret and kid `flashgate token` and the load
// tools sign with: auth.signing_kid's key, or jwt_secret (no kid) when it
// is not set.
func SigningSecret(cfg config.Auth) (secret, kid string, err error) {
	if cfg.SigningKid == "" {
		if cfg.JWTSecret == "" {
			return "", "", ErrNoSecret
		}
		return cfg.JWTSecret, "", nil
	}
	for _, k := range cfg.Keys {
		if k.Kid == cfg.SigningKid && k.Secret != "" {
			return k.Secret, k.Kid, nil
		}
	}
	return "", "", fmt.Errorf("auth.signing_kid %q names no key of auth.keys with a secret", cfg.SigningKid)
}

// MintOptions are a minted token's optional claims.
type MintOptions struct {
	Phone, Device string
	TTL           time.Duration // default 1h
	Kid           string        // the kid header naming the signing key ("": none, the default key)
	Issuer        string        // iss (default DefaultIssuer): IssuerOf the signing key
	ID            string        // jti ("": none), what the denylist can name one token by
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
	t := jwt.NewWithClaims(m, Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   user,
			Issuer:    cmp.Or(o.Issuer, DefaultIssuer),
			ID:        o.ID,
			Audience:  jwt.ClaimStrings{Audience},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(o.TTL)),
		},
		Phone:  o.Phone,
		Device: o.Device,
	})
	if o.Kid != "" {
		t.Header["kid"] = o.Kid
	}
	return t.SignedString(key)
}

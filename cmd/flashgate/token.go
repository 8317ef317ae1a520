package main

import (
	"fmt"
	"io"
	"time"

	"github.com/flashgate/flashgate/auth"
)

// tokenCmd prints an HS256 token for one user, signed with auth.signing_kid's
// key (jwt_secret when none is set) and naming that key's issuer.
func tokenCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("token", "--user ID [--ttl 1h] [--phone P] [--device D] [--jti J]", stderr)
	user := c.String("user", "", "user `id` (the sub claim): 1-64 characters of [A-Za-z0-9_-]")
	ttl := c.Duration("ttl", time.Hour, "lifetime")
	phone := c.String("phone", "", "phone claim")
	device := c.String("device", "", "device claim")
	jti := c.String("jti", "", "token `id` (the jti claim), which `flashgate deny add --jti` can revoke alone")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("token takes no arguments")
	}
	if *user == "" {
		return c.usageError("--user is required")
	}
	if *ttl <= 0 {
		return c.usageError("--ttl must be positive")
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	if *ttl > cfg.Auth.MaxTokenTTL {
		return c.usageError("--ttl %v is over auth.max_token_ttl (%v): the gateway would refuse the token", *ttl, cfg.Auth.MaxTokenTTL)
	}
	secret, kid, err := auth.SigningSecret(cfg.Auth)
	if err != nil {
		return err
	}
	tok, err := auth.MintHS256(secret, *user, auth.MintOptions{Phone: *phone, Device: *device, TTL: *ttl, Kid: kid,
		Issuer: auth.IssuerOf(cfg.Auth, kid), ID: *jti})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

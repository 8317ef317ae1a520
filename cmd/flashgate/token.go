package main

import (
	"fmt"
	"io"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/flashgate/flashgate/auth"
)

// tokenCmd prints an HS256 token for one user, signed with auth.signing_kid's
// key (jwt_secret when none is set).
func tokenCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("token", "--user ID [--ttl 1h] [--phone P] [--device D]", stderr)
	user := c.String("user", "", "user `id` (the sub claim): 1-64 characters of [A-Za-z0-9_-]")
	ttl := c.Duration("ttl", time.Hour, "lifetime")
	phone := c.String("phone", "", "phone claim")
	device := c.String("device", "", "device claim")
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
	tok, err := auth.MintHS256(secret, *user, auth.MintOptions{Phone: *phone, Device: *device, TTL: *ttl, Kid: kid})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// benchUser is the user id of load user i.
func benchUser(i int) string { return "user-" + strconv.Itoa(i) }

// mintTokens makes the Authorization header values of n load users, on all
// cores: HMAC and JSON for 20,000 users take a moment on one.
func mintTokens(secret, kid string, n int, ttl time.Duration) ([][]byte, error) {
	tokens := make([][]byte, n)
	workers := min(runtime.GOMAXPROCS(0), n)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				tok, err := auth.MintHS256(secret, benchUser(i), auth.MintOptions{TTL: ttl, Kid: kid})
				if err != nil {
					errs[w] = err
					return
				}
				tokens[i] = []byte("Bearer " + tok)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("mint tokens: %w", err)
		}
	}
	return tokens, nil
}

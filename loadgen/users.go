package loadgen

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/flashgate/flashgate/auth"
)

// User is the user id of load user i.
func User(i int) string { return "user-" + strconv.Itoa(i) }

// MintTokens makes the Authorization header values of n load users, signed
// with secret under kid and naming iss (auth.IssuerOf the key; "": the
// default issuer), on all cores: HMAC and JSON for 20,000 users take a moment
// on one.
func MintTokens(secret, kid, iss string, n int, ttl time.Duration) ([][]byte, error) {
	tokens := make([][]byte, n)
	workers := min(runtime.GOMAXPROCS(0), n)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				tok, err := auth.MintHS256(secret, User(i), auth.MintOptions{TTL: ttl, Kid: kid, Issuer: iss})
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

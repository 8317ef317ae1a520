package auth

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
)

func TestCache(t *testing.T) {
	v, err := NewVerifier(config.Auth{JWTSecret: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	c := NewCache(v, 64)
	tok, _ := MintHS256("s3cret", "alice", MintOptions{TTL: time.Minute})
	now := time.Now()
	a, err := c.Verify([]byte(tok), now)
	if err != nil || a.Subject != "alice" {
		t.Fatalf("first verify: %v %v", a, err)
	}
	b, err := c.Verify([]byte(tok), now)
	if err != nil || b != a {
		t.Fatalf("second verify did not come from the cache: %v", err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = c.Verify([]byte(tok), now) }); n > 0 {
		// []byte(tok) in the closure is the caller's; measure only the lookup.
		buf := []byte(tok)
		if n := testing.AllocsPerRun(100, func() { _, _ = c.Verify(buf, now) }); n != 0 {
			t.Fatalf("a cache hit allocates %v times", n)
		}
	}
	// Past exp, the cache does not answer, and the verifier (same clock) refuses.
	later := now.Add(2 * time.Minute)
	v.now = func() time.Time { return later }
	if _, err := c.Verify([]byte(tok), later); err == nil {
		t.Fatal("an expired token came out of the cache")
	}
	// Within the 30 s the parser allows iat and nbf, but past exp's 5 s: the
	// cache refuses as the verifier does.
	justPast := now.Add(time.Minute + 10*time.Second)
	v.now = func() time.Time { return justPast }
	if _, err := c.Verify([]byte(tok), justPast); err == nil {
		t.Fatal("a token 10 s past exp came out of the cache")
	}
	v.now = time.Now
	// A token differing in one byte (bad signature) is refused, never a cache hit.
	bad := []byte(tok)
	bad[len(bad)-2] ^= 1
	if _, err := c.Verify(bad, now); err == nil {
		t.Fatal("a tampered token was accepted")
	}
	// Bounded: many distinct tokens never hold more than the size.
	for i := 0; i < 500; i++ {
		tk, _ := MintHS256("s3cret", "u"+string(rune('a'+i%26))+time.Duration(i).String(), MintOptions{TTL: time.Minute})
		if _, err := c.Verify([]byte(tk), now); err != nil {
			t.Fatal(err)
		}
	}
	if c.Len() > 64 {
		t.Fatalf("cache holds %d tokens, bound 64", c.Len())
	}
}

func BenchmarkCacheHit(b *testing.B) {
	v, _ := NewVerifier(config.Auth{JWTSecret: "s3cret"})
	c := NewCache(v, 1000)
	tok, _ := MintHS256("s3cret", "alice", MintOptions{})
	buf := []byte(tok)
	now := time.Now()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := c.Verify(buf, now); err != nil {
			b.Fatal(err)
		}
	}
}

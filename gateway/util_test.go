package gateway

import (
	"bufio"
	"net"
	"testing"
	"time"
)

func bufioReader(t testing.TB, addr, raw string) *bufio.Reader {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(c)
}

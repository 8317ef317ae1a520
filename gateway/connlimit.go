package gateway

import (
	"net"
	"net/netip"
	"strconv"
	"sync"
)

// connLimit caps concurrent connections per peer address. fasthttp has
// MaxConnsPerIP, but answers it with a plain-text body; this answers with the
// DESIGN.md §3 JSON of every other refusal.
type connLimit struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[netip.Addr]int
	refused func()
}

var tooManyConns = func() []byte {
	body := `{"code":"rate_limited","message":"too many connections from your address"}`
	return []byte("HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := peerAddr(c.RemoteAddr())
		l.mu.Lock()
		if l.open[ip] >= l.max {
			l.mu.Unlock()
			l.refused()
			_, _ = c.Write(tooManyConns)
			_ = c.Close()
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &countedConn{Conn: c, l: l, ip: ip}, nil
	}
}

type countedConn struct {
	net.Conn
	l    *connLimit
	ip   netip.Addr
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		if c.l.open[c.ip]--; c.l.open[c.ip] <= 0 {
			delete(c.l.open, c.ip)
		}
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

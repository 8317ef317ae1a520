package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flashgate/flashgate/internal/tick"
)

// Edge marks (docs/gateway.md, "Sold out at nginx's price"): while a sale is
// sold out (every region of it), the gateway keeps an empty file
// <sale>.<unix second> in gateway.edge_marks_dir for the current second and
// the next. An nginx on the same host (nginx/nginx.conf, the orders location)
// answers a purchase of that sale 409 sold_out itself while the file of its
// sale and of the current second exists: one stat, served from nginx's
// open-file cache, instead of a proxied request or a cache lookup.
//
// A mark names its second, so it lapses by itself: a gateway that dies, or
// a fleet whose every gateway does, leaves nothing nginx answers from past
// the next second. A restock removes the sale's files at once; nginx's
// open-file cache holds what it saw for at most the rest of that second, so
// no purchase sent a second after the restock is answered from a mark. Every
// gateway of the host writes the same files (idempotent); the one that hears
// of a restock first removes them.
type edgeMarks struct {
	dir string
	mu  sync.Mutex
	// held: the seconds this gateway wrote a file for, by sale.
	held map[string][]int64
	// swept is the second of the last sweep.
	swept atomic.Int64
}

// edgeMarkTick is how often the marks follow the sold-out flags.
const edgeMarkTick = 100 * time.Millisecond

func newEdgeMarks(dir string) *edgeMarks {
	if dir == "" {
		return nil
	}
	return &edgeMarks{dir: dir, held: map[string][]int64{}}
}

func (m *edgeMarks) path(sale string, sec int64) string {
	return filepath.Join(m.dir, sale+"."+strconv.FormatInt(sec, 10))
}

// prepare creates the directory (readable by an nginx worker of another
// user), refuses one that someone else could write marks into, and sweeps it.
func (m *edgeMarks) prepare(now time.Time) error {
	if _, err := os.Lstat(m.dir); os.IsNotExist(err) {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return err
		}
		// Whatever the process's umask: nginx's workers may run as another user. (A
		// directory the operator made keeps the mode they gave it.)
		if err := os.Chmod(m.dir, 0o755); err != nil {
			return err
		}
	}
	if err := trustedDir(m.dir); err != nil {
		return err
	}
	m.sweep(now)
	return nil
}

// trustedDir checks that only this process's user (or root) can put a file
// in dir: nginx answers 409 sold_out for any mark it finds there, so a
// directory another user may write is a way to stop a sale at the edge.
func trustedDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory (a symbolic link is not followed)", dir)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by group or others (mode %v): anyone of them could mark a sale sold out at nginx", dir, fi.Mode().Perm())
	case ok && st.Uid != uint32(os.Geteuid()) && st.Uid != 0:
		return fmt.Errorf("%s belongs to uid %d, not this process's (%d)", dir, st.Uid, os.Geteuid())
	}
	return nil
}

// sweep removes from the directory what nginx must not trust: marks of past
// seconds (left by gateways that stopped), of seconds past the next (no
// gateway writes those: a clock gone wrong, or a planted file that would
// answer sold_out for as long as its name says), and anything that is not
// a regular file of this process's user with no write bit for others.
func (m *edgeMarks) sweep(now time.Time) {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		slog.Warn("gateway: edge marks", "err", err)
		return
	}
	sec := now.Unix()
	uid := uint32(os.Geteuid())
	for _, e := range ents {
		name := e.Name()
		i := strings.LastIndexByte(name, '.')
		s, perr := strconv.ParseInt(name[i+1:], 10, 64)
		if i <= 0 || perr != nil {
			continue // not a mark's name: nginx never asks for it
		}
		drop := s < sec || s > sec+1
		if !drop {
			fi, err := os.Lstat(filepath.Join(m.dir, name))
			if err != nil {
				continue
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			drop = !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 || ok && st.Uid != uid
		}
		if drop {
			if err := os.Remove(filepath.Join(m.dir, name)); err != nil && !os.IsNotExist(err) {
				slog.Warn("gateway: edge marks: cannot remove an untrusted mark", "file", name, "err", err)
			}
		}
	}
}

// set makes the marks of sale follow soldOut at now: the files of this
// second and the next while it is sold out, none otherwise. Files of past
// seconds are removed.
func (m *edgeMarks) set(sale string, soldOut bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sec := now.Unix()
	held := m.held[sale]
	keep := held[:0]
	for _, s := range held {
		if soldOut && s >= sec {
			keep = append(keep, s)
			continue
		}
		if err := os.Remove(m.path(sale, s)); err != nil && !os.IsNotExist(err) {
			slog.Warn("gateway: edge mark", "sale", sale, "err", err)
		}
	}
	if soldOut {
		for s := sec; s <= sec+1; s++ {
			if containsSec(keep, s) {
				continue
			}
			f, err := os.OpenFile(m.path(sale, s), os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				slog.Warn("gateway: edge mark", "sale", sale, "err", err)
				continue
			}
			_ = f.Close()
			keep = append(keep, s)
		}
	}
	if len(keep) == 0 {
		delete(m.held, sale)
		return
	}
	m.held[sale] = keep
}

// clear removes every mark of sale this gateway may have written or another
// gateway of the host may have (the current second and the next): a restock.
func (m *edgeMarks) clear(sale string, now time.Time) {
	m.set(sale, false, now)
	for s := now.Unix(); s <= now.Unix()+1; s++ {
		_ = os.Remove(m.path(sale, s))
	}
}

func containsSec(l []int64, s int64) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// edgeMarkLoop keeps the marks of every sale in step with its sold-out
// flags, every edgeMarkTick.
func (g *Gateway) edgeMarkLoop(ctx context.Context) { tick.Every(ctx, edgeMarkTick, g.syncEdgeMarks) }

func (g *Gateway) syncEdgeMarks(now time.Time) {
	nowMS := now.UnixMilli()
	// Once a second (at the tick that crosses into it), what nginx must not
	// trust is swept out of the directory.
	if sec := now.Unix(); sec != g.marks.swept.Swap(sec) {
		g.marks.sweep(now)
	}
	all := *g.sales.m.Load()
	for id, s := range all {
		if s.allSoldOut() && !s.closed.Load() && nowMS >= s.startsMS && nowMS < s.endsMS {
			g.marks.set(id, true, now)
		}
	}
	// Marks of sales no longer sold out, or no longer known here.
	for _, id := range g.marks.sales() {
		if s := all[id]; s == nil || !s.allSoldOut() || s.closed.Load() || nowMS < s.startsMS || nowMS >= s.endsMS {
			g.marks.set(id, false, now)
		}
	}
}

// sales are the sales this gateway holds marks of.
func (m *edgeMarks) sales() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.held))
	for id := range m.held {
		out = append(out, id)
	}
	return out
}

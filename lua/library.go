package lua

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// The scripts ship to Redis as one function library (FUNCTION LOAD), not as
// EVAL scripts: a role that may FCALL them runs flashgate's functions and no
// Lua of its own (the gateway's Redis user has no EVAL, EVALSHA, SCRIPT or
// FUNCTION, docs/credentials.md). The library is generated here from the
// scripts' sources, unchanged: each becomes a function whose body is the
// script, called with the same KEYS and ARGV.
//
// Its name, and every function's, carries a hash of the whole library, as
// EVALSHA named a script by its hash: two versions of flashgate (a rolling
// upgrade) each call their own functions, and loading one never replaces the
// other's. Redis runs a function's commands with the caller's ACL (functions
// do not raise privileges), so what a role may write is still set by its key
// patterns; what it loses is any Lua but this library's.
//
// Who loads it: a role allowed FUNCTION LOAD (the backend, the operator, the
// tests' admin), at start (LoadLibrary) and again whenever a call finds it
// missing (a Redis restarted without persistence, a fresh node after a
// failover). A caller without that right (the gateway) gets Redis's "Function
// not found" (IsNoLibrary), an error like any other (503), until a loader has
// reloaded it.

// LibraryName is the prefix of the library's name in Redis: the library is
// LibraryName + "_" + its hash (FUNCTION LIST LIBRARYNAME flashgate).
const LibraryName = "flashgate"

// Script is one function of the library.
type Script struct {
	base string // the script's name, e.g. "admit"
	src  string
	ro   bool // no-writes: called with FCALL_RO, which a read-only key pattern allows
	// read are the positions (1-based, ascending) of KEYS the script only
	// reads. FCALL checks every key it names against the caller's ACL for
	// reading and writing, so these travel in ARGV instead (before the
	// script's own arguments) and the function puts them back into KEYS:
	// a role that may only read them (the gateway and a sale's meta and epoch)
	// can still call it. They share the declared keys' hash tag, which is
	// all Redis asks of a key a function names itself.
	read []int
	name string
}

var (
	scripts []*Script
	// libOnce builds the library when the first call needs it (all the
	// package's scripts are registered by then: they are package variables).
	libOnce sync.Once
	libCode string
	libID   string
)

// newScript registers a script of the library (package variables only).
func newScript(base, src string) *Script {
	s := &Script{base: base, src: src}
	scripts = append(scripts, s)
	return s
}

// reading marks positions of s's KEYS that s only reads (Script.read).
func (s *Script) reading(pos ...int) *Script {
	s.read = pos
	return s
}

// newReadScript registers a script that writes nothing (flag no-writes).
func newReadScript(base, src string) *Script {
	s := newScript(base, src)
	s.ro = true
	return s
}

func buildLibrary() {
	libOnce.Do(func() {
		// By name: every binary that links this package builds the same library.
		slices.SortFunc(scripts, func(a, b *Script) int { return strings.Compare(a.base, b.base) })
		h := sha1.New()
		// Of the generated code (names without the hash): a change of a
		// script or of the wrapping makes another library.
		for _, s := range scripts {
			s.name = "fg_" + s.base
			h.Write([]byte(wrap(s)))
		}
		libID = hex.EncodeToString(h.Sum(nil))[:12]
		var b strings.Builder
		fmt.Fprintf(&b, "#!lua name=%s_%s\n", LibraryName, libID)
		for _, s := range scripts {
			s.name = "fg_" + s.base + "_" + libID
			b.WriteString(wrap(s))
		}
		libCode = b.String()
	})
}

// wrap is s as a function of the library: KEYS and ARGV as the script's
// parameters, so that its body reads them as it did under EVAL; with read
// positions, rebuilt from the declared keys and the first arguments.
func wrap(s *Script) string {
	flags := "{}"
	if s.ro {
		flags = "{'no-writes'}"
	}
	if len(s.read) == 0 {
		return fmt.Sprintf("redis.register_function{function_name='%s', flags=%s, callback=function(KEYS, ARGV)\n%s\nend}\n",
			s.name, flags, s.src)
	}
	pos := make([]string, len(s.read))
	for i, p := range s.read {
		pos[i] = strconv.Itoa(p)
	}
	// Each read key moves from the front of ARGV to its place in KEYS (the
	// places ascending, so each lands where the script expects it).
	moves := make([]string, len(s.read))
	for i, p := range pos {
		moves[i] = "table.insert(KEYS, " + p + ", table.remove(ARGV, 1))"
	}
	return fmt.Sprintf("redis.register_function{function_name='%s', flags=%s, callback=function(KEYS, ARGV)\n%s\n%s\nend}\n",
		s.name, flags, strings.Join(moves, " "), s.src)
}

// Library is the library's source as FUNCTION LOAD takes it, and its name.
func Library() (code, name string) {
	buildLibrary()
	return libCode, LibraryName + "_" + libID
}

// FunctionName is the name Redis knows script base ("admit", …) by: for
// operators and tests that watch Redis (SLOWLOG, commandstats, ACL DRYRUN).
func FunctionName(base string) string {
	buildLibrary()
	for _, s := range scripts {
		if s.base == base {
			return s.name
		}
	}
	return ""
}

// LoadLibrary loads the library on every master of c (FUNCTION LOAD
// REPLACE: loading it again is harmless). A replica gets it from its master;
// one that answers READONLY is skipped.
func LoadLibrary(ctx context.Context, c rueidis.Client) error {
	code, name := Library()
	for addr, n := range c.Nodes() {
		err := n.Do(ctx, n.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error()
		if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(re.Error(), "READONLY") {
			continue
		}
		if err != nil {
			return fmt.Errorf("function load %s on %s: %w", name, addr, err)
		}
	}
	return nil
}

// loads serialises reloads after a miss, and remembers a refusal for a while
// so that a caller without the right does not ask again on every call.
var loads struct {
	sync.Mutex
	deniedUntil time.Time
}

// reload loads the library after a call found it missing; false when this
// caller may not (or could not).
func reload(ctx context.Context, c rueidis.Client) bool {
	loads.Lock()
	defer loads.Unlock()
	if time.Now().Before(loads.deniedUntil) {
		return false
	}
	err := LoadLibrary(ctx, c)
	if err != nil && strings.Contains(err.Error(), "NOPERM") {
		loads.deniedUntil = time.Now().Add(5 * time.Second)
	}
	return err == nil
}

// notFound is Redis's answer to an FCALL of a function it does not have.
func notFound(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.Contains(re.Error(), "Function not found")
}

// cmd is the FCALL (FCALL_RO) of s on keys and args.
func (s *Script) cmd(c rueidis.Client, keys, args []string) rueidis.Completed {
	buildLibrary()
	if s.ro {
		return c.B().FcallRo().Function(s.name).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	if len(s.read) == 0 {
		return c.B().Fcall().Function(s.name).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	// The declared keys are the runs between the read positions; the read
	// ones go first in ARGV.
	k := c.B().Fcall().Function(s.name).Numkeys(int64(len(keys) - len(s.read))).Key()
	from := 0
	for _, p := range s.read {
		k = k.Key(keys[from : p-1]...)
		from = p
	}
	k = k.Key(keys[from:]...)
	a := k.Arg()
	for _, p := range s.read {
		a = a.Arg(keys[p-1])
	}
	return a.Arg(args...).Build()
}

// Exec calls s. A Redis without the library gets it loaded, if this caller
// may, and the call again; otherwise the answer is Redis's (IsNoLibrary).
func (s *Script) Exec(ctx context.Context, c rueidis.Client, keys, args []string) rueidis.RedisResult {
	r := c.Do(ctx, s.cmd(c, keys, args))
	if !notFound(r.Error()) {
		return r
	}
	if reload(ctx, c) {
		return c.Do(ctx, s.cmd(c, keys, args))
	}
	return r
}

// execMulti calls s followed by more on the same connection (a WAIT), as
// Exec does.
func (s *Script) execMulti(ctx context.Context, c rueidis.Client, keys, args []string, more func() rueidis.Completed) []rueidis.RedisResult {
	rs := c.DoMulti(ctx, s.cmd(c, keys, args), more())
	if !notFound(rs[0].Error()) {
		return rs
	}
	if reload(ctx, c) {
		return c.DoMulti(ctx, s.cmd(c, keys, args), more())
	}
	return rs
}

// IsNoLibrary reports whether err is Redis's answer to a call of a function
// it does not have: the library is not loaded there, and this caller may not
// load it (it is an error as any other: the gateway answers 503).
func IsNoLibrary(err error) bool { return notFound(err) }

// EnsureLibrary loads the library on every master of c that does not have
// it (FUNCTION LIST, then FUNCTION LOAD there): the loader's check after a
// Redis restarted without persistence or a failover to a node that never had
// it, which otherwise answers the gateways "Function not found".
func EnsureLibrary(ctx context.Context, c rueidis.Client) error {
	code, name := Library()
	for addr, n := range c.Nodes() {
		l, err := n.Do(ctx, n.B().FunctionList().Libraryname(name).Build()).ToArray()
		if err != nil {
			return fmt.Errorf("function list on %s: %w", addr, err)
		}
		if len(l) > 0 {
			continue
		}
		err = n.Do(ctx, n.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error()
		if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(re.Error(), "READONLY") {
			continue
		}
		if err != nil {
			return fmt.Errorf("function load %s on %s: %w", name, addr, err)
		}
	}
	return nil
}

// KeepLibrary checks the library every interval (EnsureLibrary) until ctx
// ends; failures are passed to failed (a Redis away is the outage paths'
// business).
func KeepLibrary(ctx context.Context, c rueidis.Client, every time.Duration, failed func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, every)
		if err := EnsureLibrary(cctx, c); err != nil && ctx.Err() == nil {
			failed(err)
		}
		cancel()
	}
}

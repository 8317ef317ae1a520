package lua

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestLibraryKeysRoundTrip: a function whose read-only keys travel in ARGV
// sees them back in KEYS at their places, and its own arguments in ARGV, for
// each position the library moves (first, middle, last) and any number of
// keys after them.
func TestLibraryKeysRoundTrip(t *testing.T) {
	c := testenv.Redis(t, testenv.RedisAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lib := "#!lua name=fgtest_echo\n"
	cases := [][]int{{1}, {3}, {7}, {1, 3}}
	for i, read := range cases {
		s := &Script{base: "echo" + strconv.Itoa(i), src: "return {KEYS, ARGV}", read: read, name: "fgtest_echo_" + strconv.Itoa(i)}
		lib += wrap(s)
	}
	if err := c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(lib).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Do(context.Background(), c.B().FunctionDelete().LibraryName("fgtest_echo").Build()).Error()
	})
	for i, read := range cases {
		s := &Script{read: read, name: "fgtest_echo_" + strconv.Itoa(i)}
		for extra := 0; extra < 3; extra++ {
			var keys []string
			for k := 1; k <= read[len(read)-1]+extra; k++ {
				keys = append(keys, "fg:{s:echo}:k"+strconv.Itoa(k))
			}
			args := []string{"a1", "a2"}
			v, err := c.Do(ctx, s.cmd(c, keys, args)).ToArray()
			if err != nil || len(v) != 2 {
				t.Fatalf("read %v, %d keys: %v %v", read, len(keys), v, err)
			}
			gotK, _ := v[0].AsStrSlice()
			gotA, _ := v[1].AsStrSlice()
			if strings.Join(gotK, ",") != strings.Join(keys, ",") || strings.Join(gotA, ",") != "a1,a2" {
				t.Errorf("read %v: KEYS %v ARGV %v; want %v and [a1 a2]", read, gotK, gotA, keys)
			}
		}
	}
}

// BenchmarkAdmitCall: the admission by FCALL of the library's function (its
// meta key in ARGV, put back into KEYS by the wrapper) against the same
// script by EVALSHA, on one Redis, in one run.
func BenchmarkAdmitCall(b *testing.B) {
	c := testenv.Redis(b, testenv.RedisAddrs())
	ctx := context.Background()
	if err := LoadLibrary(ctx, c); err != nil {
		b.Fatal(err)
	}
	sum := sha1.Sum([]byte(admitSrc))
	sha := hex.EncodeToString(sum[:])
	if err := c.Do(ctx, c.B().ScriptLoad().Script(admitSrc).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	var user, id atomic.Int64
	id.Store(1 << 40)
	for _, mode := range []string{"evalsha", "fcall"} {
		b.Run(mode, func(b *testing.B) {
			// A sale of its own: the buyers' hashes of one would grow from
			// the first mode to the second.
			now := time.Now()
			spec := &flashgate.Sale{ID: testenv.ID("bench"), Title: "t", Total: flashgate.MaxSaleUnits, StartsAt: now.Add(-time.Minute),
				EndsAt: now.Add(time.Hour), PerUserLimit: 1, PerOrderMax: 1}
			if ok, err := Load().Warm(ctx, c, spec, map[string]int64{"": spec.Total}); !ok || err != nil {
				b.Fatalf("warm: %v %v", ok, err)
			}
			b.Cleanup(func() { _, _ = Retire(context.Background(), c, spec) })
			k := KeysOf(spec)
			if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					a := AdmitArgs{User: "u" + strconv.FormatInt(user.Add(1), 10), Quantity: 1, OrderID: uint64(id.Add(1)), Now: time.Now()}
					a.PayBy = a.Now.Add(15 * time.Minute)
					keys, args, err := admitCall(k, a)
					if err != nil {
						b.Fatal(err)
					}
					var adm Admission
					if mode == "fcall" {
						adm, err = admitted(k, a, admitScript.Exec(ctx, c, keys, args))
					} else {
						adm, err = admitted(k, a, c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()))
					}
					if err != nil || adm.Outcome != Admitted {
						b.Fatalf("%s: %+v %v", mode, adm, err)
					}
				}
			})
			// Redis's own time per call (commandstats): the script's cost on
			// the server, apart from the client's and the network's.
			b.StopTimer()
			info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
			if err != nil {
				b.Fatal(err)
			}
			for _, line := range strings.Split(info, "\n") {
				if !strings.HasPrefix(line, "cmdstat_"+mode+":") {
					continue
				}
				for _, f := range strings.Split(strings.TrimSpace(line), ",") {
					if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
						us, _ := strconv.ParseFloat(v, 64)
						b.ReportMetric(us, "redis-µs/call")
					}
				}
			}
		})
	}
}

// BenchmarkAdmitCallPaired: each iteration admits once by EVALSHA and once by
// FCALL (each on a sale of its own), so that both see the same load of a
// shared machine; it reports each one's mean round trip and Redis's own time
// per call (commandstats), and their ratios (FCALL / EVALSHA).
func BenchmarkAdmitCallPaired(b *testing.B) {
	c := testenv.Redis(b, testenv.RedisAddrs())
	ctx := context.Background()
	if err := LoadLibrary(ctx, c); err != nil {
		b.Fatal(err)
	}
	sum := sha1.Sum([]byte(admitSrc))
	sha := hex.EncodeToString(sum[:])
	if err := c.Do(ctx, c.B().ScriptLoad().Script(admitSrc).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	sale := func() *Keys {
		now := time.Now()
		spec := &flashgate.Sale{ID: testenv.ID("bench"), Title: "t", Total: flashgate.MaxSaleUnits, StartsAt: now.Add(-time.Minute),
			EndsAt: now.Add(time.Hour), PerUserLimit: 1, PerOrderMax: 1}
		if ok, err := Load().Warm(ctx, c, spec, map[string]int64{"": spec.Total}); !ok || err != nil {
			b.Fatalf("warm: %v %v", ok, err)
		}
		b.Cleanup(func() { _, _ = Retire(context.Background(), c, spec) })
		return KeysOf(spec)
	}
	ke, kf := sale(), sale()
	if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
		b.Fatal(err)
	}
	var user, id atomic.Int64
	id.Store(1 << 40)
	var evalNs, fcallNs atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for _, mode := range []string{"evalsha", "fcall"} {
				k := ke
				if mode == "fcall" {
					k = kf
				}
				a := AdmitArgs{User: "u" + strconv.FormatInt(user.Add(1), 10), Quantity: 1, OrderID: uint64(id.Add(1)), Now: time.Now()}
				a.PayBy = a.Now.Add(15 * time.Minute)
				keys, args, err := admitCall(k, a)
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				var adm Admission
				if mode == "fcall" {
					adm, err = admitted(k, a, admitScript.Exec(ctx, c, keys, args))
					fcallNs.Add(int64(time.Since(start)))
				} else {
					adm, err = admitted(k, a, c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()))
					evalNs.Add(int64(time.Since(start)))
				}
				if err != nil || adm.Outcome != Admitted {
					b.Fatalf("%s: %+v %v", mode, adm, err)
				}
			}
		}
	})
	b.StopTimer()
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	server := map[string]float64{}
	for _, line := range strings.Split(info, "\n") {
		for _, mode := range []string{"evalsha", "fcall"} {
			if !strings.HasPrefix(line, "cmdstat_"+mode+":") {
				continue
			}
			for _, f := range strings.Split(strings.TrimSpace(line), ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					server[mode], _ = strconv.ParseFloat(v, 64)
				}
			}
		}
	}
	e, f := float64(evalNs.Load())/float64(b.N), float64(fcallNs.Load())/float64(b.N)
	b.ReportMetric(e/1e3, "evalsha-µs")
	b.ReportMetric(f/1e3, "fcall-µs")
	b.ReportMetric(f/e, "fcall/evalsha")
	b.ReportMetric(server["evalsha"], "redis-evalsha-µs")
	b.ReportMetric(server["fcall"], "redis-fcall-µs")
	if server["evalsha"] > 0 {
		b.ReportMetric(server["fcall"]/server["evalsha"], "redis-fcall/evalsha")
	}
}

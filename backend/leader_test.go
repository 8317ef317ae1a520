package backend

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis/rueidislock"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/dial"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// The tests of the sweeper (lifecycle_test.go) run it themselves and count
// what it expired: the leader's own sweeper would race them.
func init() { leaderSweepEvery = 0 }

// testLocker is the leader's locker with a short validity, on a lock name of
// the test's own.
func testLocker(t *testing.T, addrs []string, validity time.Duration, noCache bool) rueidislock.Locker {
	t.Helper()
	var l rueidislock.Locker
	var err error
	if noCache {
		// A holder that hears nothing: it learns it lost the lock only when a
		// renewal finds the key taken (a paused or partitioned process).
		l, err = rueidislock.NewLocker(rueidislock.LockerOption{
			ClientOption: testenv.RedisOption(addrs),
			KeyPrefix:    leaderKeyPrefix, KeyValidity: validity, KeyMajority: 1, TryNextAfter: lockAttemptTimeout,
		})
	} else {
		l, err = dial.Locker(config.Redis{Addrs: addrs, Username: testenv.RedisUsername(), Password: testenv.RedisPassword()}, LeaderLockerOption(validity))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func lockKey(name string) string { return leaderKeyPrefix + ":0:" + name }

func alive(ctx context.Context) bool { return ctx.Err() == nil }

// Only the holder releases the lock: a second locker can neither take it nor
// release it, not even one that held it before and lost it without noticing.
func TestLeaderLockOwnerOnly(t *testing.T) {
	t.Parallel()
	for _, target := range testenv.RedisTargets(t) {
		t.Run(target.Name, func(t *testing.T) {
			t.Parallel()
			name := testenv.ID("lock")
			a := testLocker(t, target.Addrs, 2*time.Second, false)
			b := testLocker(t, target.Addrs, 2*time.Second, true)
			rc := target.Client

			// b holds the lock; it vanishes behind b's back (an expiry while b
			// was paused), a takes it.
			bctx, bRelease, err := b.TryWithContext(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			if err := rc.Do(ctx(t), rc.B().Del().Key(lockKey(name)).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			actx, aRelease, err := a.WithContext(ctx(t), name)
			if err != nil {
				t.Fatal(err)
			}
			defer aRelease()
			owner, err := rc.Do(ctx(t), rc.B().Get().Key(lockKey(name)).Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}

			// b's next renewal finds the key taken: b's context ends.
			select {
			case <-bctx.Done():
			case <-time.After(3 * time.Second):
				t.Fatal("the stale holder's context outlived its lock")
			}
			// b's release, and a third attempt by b, do nothing to a's lock.
			bRelease()
			if _, cancel, err := b.TryWithContext(context.Background(), name); !errors.Is(err, rueidislock.ErrNotLocked) {
				t.Fatalf("second locker took a held lock: %v", err)
			} else if cancel != nil {
				cancel()
			}
			time.Sleep(200 * time.Millisecond)
			if got, err := rc.Do(ctx(t), rc.B().Get().Key(lockKey(name)).Build()).ToString(); err != nil || got != owner {
				t.Fatalf("lock key after another's release: %q %v, want the holder's value", got, err)
			}
			if !alive(actx) {
				t.Fatal("the holder's context ended on another's release")
			}

			// The holder's release frees it: b gets it at once.
			aRelease()
			began := time.Now()
			c2, rel2, err := b.WithContext(ctx(t), name)
			if err != nil {
				t.Fatal(err)
			}
			defer rel2()
			if alive(actx) {
				t.Fatal("released lock's context still alive")
			}
			if !alive(c2) || time.Since(began) > time.Second {
				t.Fatalf("lock taken after the owner's release in %v", time.Since(began))
			}
		})
	}
}

// The lock outlives its validity while its holder lives: it renews itself.
func TestLeaderLockRenews(t *testing.T) {
	t.Parallel()
	for _, target := range testenv.RedisTargets(t) {
		t.Run(target.Name, func(t *testing.T) {
			t.Parallel()
			// Renewed at half the validity: 2 s leaves room for a loaded machine.
			const validity = 2 * time.Second
			name := testenv.ID("lock")
			a := testLocker(t, target.Addrs, validity, false)
			other := testLocker(t, target.Addrs, validity, false)
			actx, release, err := a.TryWithContext(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			time.Sleep(4 * validity)
			if !alive(actx) {
				t.Fatal("lock lost while its holder lived")
			}
			pttl, err := target.Client.Do(ctx(t), target.Client.B().Pttl().Key(lockKey(name)).Build()).AsInt64()
			if err != nil || pttl <= 0 || pttl > validity.Milliseconds() {
				t.Fatalf("lock key pttl %d %v after 4 validities, want 0 < pttl <= %d", pttl, err, validity.Milliseconds())
			}
			if _, cancel, err := other.TryWithContext(context.Background(), name); !errors.Is(err, rueidislock.ErrNotLocked) {
				t.Fatalf("another took a renewed lock: %v", err)
			} else if cancel != nil {
				cancel()
			}
			// Someone deletes the key: the holder's context ends at once.
			if err := target.Client.Do(ctx(t), target.Client.B().Del().Key(lockKey(name)).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-actx.Done():
			case <-time.After(validity):
				t.Fatal("the holder's context outlived its deleted key")
			}
		})
	}
}

// leaders counts the backends that say they lead.
func leaders(bs ...*Backend) int {
	n := 0
	for _, b := range bs {
		if b.IsLeader() {
			n++
		}
	}
	return n
}

// Two backends of one group: never two leaders at one moment, and one leads
// (a lease renewal starved of CPU may leave none for a moment, which is safe:
// the work waits; two never lead); when it shuts down the other leads at once
// (the lock is released, not left to expire).
func TestOneLeader(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	other, err := dialAndStart(t, s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Shutdown(context.Background()) })
	eventually(t, 5*time.Second, "one leader", func() bool { return leaders(s.b, other) == 1 })
	for range 200 {
		if n := leaders(s.b, other); n > 1 {
			t.Fatalf("%d leaders", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	eventually(t, 5*time.Second, "one leader", func() bool { return leaders(s.b, other) == 1 })
	lead, follower := s.b, other
	if other.IsLeader() {
		lead, follower = other, s.b
	}
	var status map[string]any
	res, err := http.Get("http://" + lead.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(res.Body).Decode(&status)
	res.Body.Close()
	if status["leader"] != true {
		t.Errorf("leader's readyz: %v", status)
	}

	began := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- lead.Shutdown(ctx(t)) }()
	eventually(t, leaderValidity, "the other backend leads", follower.IsLeader)
	t.Logf("takeover after a shutdown began: %v", time.Since(began).Round(time.Millisecond))
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if lead.IsLeader() {
		t.Fatal("a stopped backend still says it leads")
	}
}

// A leader killed with SIGKILL (no release) is replaced within the lock's
// validity, and its work runs on the new leader: a stale reservation whose
// order never reached NATS is republished and written.
func TestLeaderKilledTakenOver(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "flashgate")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/flashgate").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	e := newEnv(t, testenv.RedisAddrs())
	admin := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	proc := spawnBackend(t, bin, e.cfg, admin)
	eventually(t, 10*time.Second, "the process leads", func() bool { return readyzLeader(t, admin) })

	b, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown(context.Background()) })
	time.Sleep(time.Second)
	if b.IsLeader() {
		t.Fatal("two leaders")
	}

	killed := time.Now()
	proc.Process.Kill() // SIGKILL: no release
	proc.Wait()
	// Within the validity in practice (logged); the bound only guards liveness
	// on a loaded machine.
	eventually(t, leaderValidity+10*time.Second, "the in-process backend leads", b.IsLeader)
	took := time.Since(killed)
	t.Logf("takeover after kill -9: %v (lock validity %v)", took.Round(time.Millisecond), leaderValidity)

	// The new leader's reconciler runs: an order admitted a minute ago whose
	// gateway died before publishing it.
	sale := spec(5, 1, nil)
	k := e.createSale(sale)
	now := time.Now().Add(-time.Minute)
	a := lua.AdmitArgs{User: "orphan", Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(15 * time.Minute)}
	if got, err := e.scripts.Admit(ctx(t), e.rc, k, a); err != nil || got.Outcome != lua.Admitted {
		t.Fatalf("admit: %v %v", got, err)
	}
	eventually(t, reconcileEvery+10*time.Second, "the orphan order written by the new leader's reconcile", func() bool {
		st, _, ok := e.order(a.OrderID)
		return ok && st == "confirmed"
	})
	eventually(t, 5*time.Second, "reservation settled", func() bool { return reservations(t, e.rc, k) == 0 })
	if r := check(t, e, sale.ID, []uint64{a.OrderID}); !r.OK() {
		t.Errorf("audit: %v", r)
	}
}

// spawnBackend runs `flashgate backend` on cfg with its admin API on admin,
// and waits until it is ready.
func spawnBackend(t *testing.T, bin string, cfg config.Config, admin string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "backend", "--config", "")
	cmd.Env = append(append(os.Environ(), config.Environ(cfg)...),
		"FLASHGATE_BACKEND_ADMIN_LISTEN="+admin,
		"FLASHGATE_BACKEND_ACK_WAIT=2s",
	)
	logf, err := os.Create(filepath.Join(t.TempDir(), "backend.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("backend process log:\n%s", b)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if res, err := http.Get("http://" + admin + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return cmd
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("backend process not ready")
	return nil
}

func readyzLeader(t *testing.T, admin string) bool {
	res, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return false
	}
	defer res.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(res.Body).Decode(&body)
	return body["leader"] == true
}

package testenv

import (
	"database/sql"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Server is a Redis or NATS server of the test's own: a real process on a free
// loopback port that the test may kill and start again (on the same port and
// data directory) to inject a fault without disturbing other tests.
type Server struct {
	Addr string
	t    testing.TB
	bin  string
	args []string
	cmd  *exec.Cmd
	log  string
	// ready reports whether the server serves; nil means "accepts TCP".
	ready func() error
}

// StartRedis starts a private redis-server (no persistence: a restart loses
// its data, like a crash without AOF).
func StartRedis(t testing.TB) *Server {
	t.Helper()
	port := FreePort(t)
	s := &Server{t: t, bin: "redis-server", Addr: "127.0.0.1:" + strconv.Itoa(port), args: []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--enable-debug-command", "local"}}
	// The tests' own user beside the default one: a configuration with the
	// tests' credentials (which the processes a test starts inherit) logs in
	// here as on the stack, and a client without any still gets in.
	if u := RedisUsername(); u != "" {
		s.args = append(s.args, "--user", u, "on", ">"+RedisPassword(), "~*", "&*", "+@all")
	}
	s.t.Cleanup(s.Kill)
	s.Start()
	return s
}

// StartNATS starts a private nats-server with JetStream.
func StartNATS(t testing.TB) *Server {
	t.Helper()
	port := FreePort(t)
	s := &Server{t: t, bin: "nats-server", Addr: "127.0.0.1:" + strconv.Itoa(port), args: []string{
		"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir()}}
	// As for Redis: the tests' user exists, and a client without credentials
	// logs in as it.
	if u := NATSUser(); u != "" {
		conf := filepath.Join(t.TempDir(), "nats.conf")
		body := fmt.Sprintf("authorization { users = [ { user: %q, password: %q } ] }\nno_auth_user: %q\n", u, NATSPassword(), u)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s.args = append(s.args, "-c", conf)
	}
	s.t.Cleanup(s.Kill)
	s.Start()
	return s
}

// URL is the server's address as a nats:// URL.
func (s *Server) URL() string { return "nats://" + s.Addr }

// Start starts the server (again) and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	path, err := exec.LookPath(s.bin)
	if err != nil {
		s.t.Fatalf("%s not found (make deps installs it): %v", s.bin, err)
	}
	f, err := os.CreateTemp(s.t.TempDir(), filepath.Base(s.bin)+"-*.log")
	if err != nil {
		s.t.Fatal(err)
	}
	s.log = f.Name()
	s.cmd = exec.Command(path, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = f, f
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.bin, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.log)
			s.t.Fatalf("%s on %s did not come up: %v\n%s", s.bin, s.Addr, err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) check() error {
	if s.ready != nil {
		return s.ready()
	}
	c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err
}

// StartMariaDB starts a private MariaDB (a data directory of its own, made by
// mariadb-install-db) with an empty database flashgate; DSN points at it.
func StartMariaDB(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	install := command(InstallTimeout, "mariadb-install-db", args...)
	if out, err := install.CombinedOutput(); install.Done(err) != nil {
		t.Fatalf("mariadb-install-db (make deps installs it): %v\n%s", err, out)
	}
	port := FreePort(t)
	s := &Server{t: t, bin: "mariadbd", Addr: "127.0.0.1:" + strconv.Itoa(port)}
	s.args = []string{"--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "mysqld.sock"), "--skip-name-resolve",
		"--innodb-buffer-pool-size=64M", "--max-connections=200", "--character-set-server=utf8mb4",
		"--log-error=" + filepath.Join(dir, "error.log")}
	if os.Geteuid() == 0 {
		s.args = append(s.args, "--user=root")
	}
	s.ready = func() error {
		db, err := sql.Open("mysql", "root@tcp("+s.Addr+")/?timeout=1s&readTimeout=2s&writeTimeout=2s")
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.Exec("CREATE DATABASE IF NOT EXISTS flashgate")
		return err
	}
	s.t.Cleanup(s.Kill)
	s.Start()
	return s
}

// DSN is the private MariaDB's database flashgate.
func (s *Server) DSN() string { return "root@tcp(" + s.Addr + ")/flashgate" }

// Kill stops the server with SIGKILL and waits for it to be gone.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// FreePort returns a loopback port nobody listens on right now.
//
// The port is drawn below the kernel's ephemeral range (32768 and up here):
// a port the kernel handed out for :0 is free only until the caller binds it,
// and in between any process's outgoing connection may take it as its local
// port (seen when every package's tests run at once: a gateway of the chaos
// suite failed with "address already in use"). Outgoing connections never
// take a port below that range, so only another caller of FreePort could, and
// it draws at random from thousands.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		port := freeLow + mathrand.IntN(freeHigh-freeLow)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			l.Close()
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The range FreePort draws from: below the ephemeral ports, above the local
// stack's own (8000-18222), and below the Redis Cluster's bus ports (27001-).
const freeLow, freeHigh = 20000, 27000

// Pause stops the server with SIGSTOP: it keeps its connections and its data
// and answers nothing (the kernel still accepts and buffers), as a server
// stalled by the host would, until Resume.
func (s *Server) Pause() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		s.t.Fatalf("pause %s: not running", s.bin)
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pause %s: %v", s.bin, err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		s.t.Fatalf("resume %s: not running", s.bin)
	}
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("resume %s: %v", s.bin, err)
	}
}

// NewServer is a server of bin listening on addr, started with args (Start);
// the test kills it at its end if it runs.
func NewServer(t testing.TB, bin, addr string, args ...string) *Server {
	return &Server{t: t, bin: bin, Addr: addr, args: args}
}

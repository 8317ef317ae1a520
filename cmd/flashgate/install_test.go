package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestMakeInstall runs `make install PREFIX=<tmp>` and checks what it laid
// down: the binary (which carries the Lua scripts: no .lua file is
// installed, and the binary runs from anywhere), the configuration, the
// license, and systemd units whose paths name PREFIX. The units are checked by
// `systemd-analyze verify` where the machine has it; without it, the test
// parses them itself and says so.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	tmp := t.TempDir()
	prefix := filepath.Join(tmp, "prefix")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command("make", "-s", "-C", "../..", "install", "PREFIX="+prefix, "BIN="+filepath.Join(tmp, "flashgate"), "GO="+goBin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	bin := filepath.Join(prefix, "bin", "flashgate")
	for _, f := range []string{bin, "etc/flashgate/flashgate.yaml", "share/doc/flashgate/LICENSE", "share/doc/flashgate/openapi.yaml",
		"share/doc/flashgate/docs", "lib/systemd/system/flashgate-gateway.service", "lib/systemd/system/flashgate-backend.service"} {
		if !filepath.IsAbs(f) {
			f = filepath.Join(prefix, f)
		}
		if _, err := os.Stat(f); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode()&0o111 == 0 {
		t.Errorf("%s is not executable: %v", bin, fi.Mode())
	}
	want, _ := os.ReadFile("../../configs/flashgate.yaml")
	if got, _ := os.ReadFile(filepath.Join(prefix, "etc/flashgate/flashgate.yaml")); !bytes.Equal(got, want) {
		t.Error("the installed configuration is not configs/flashgate.yaml")
	}

	// The Lua scripts are in the binary, not beside it.
	_ = filepath.WalkDir(prefix, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".lua") {
			t.Errorf("a Lua file is installed: %s (the scripts are embedded)", p)
		}
		return nil
	})
	admit, err := os.ReadFile("../../lua/admit.lua")
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(exe, bytes.TrimSpace(admit)) {
		t.Error("the installed binary does not carry lua/admit.lua")
	}
	run := exec.Command(bin, "version")
	run.Dir = tmp // away from the repository: nothing is read from it
	if out, err := run.CombinedOutput(); err != nil || !strings.Contains(string(out), "commit ") || strings.Contains(string(out), "commit unknown") {
		t.Errorf("%s version: %v\n%s", bin, err, out)
	}

	units, _ := filepath.Glob(filepath.Join(prefix, "lib/systemd/system/*.service"))
	if len(units) != 2 {
		t.Fatalf("units installed: %v", units)
	}
	for _, u := range units {
		b, _ := os.ReadFile(u)
		if bytes.Contains(b, []byte("/usr/local")) || !bytes.Contains(b, []byte("ExecStart="+bin+" ")) ||
			!bytes.Contains(b, []byte("--config "+filepath.Join(prefix, "etc/flashgate/flashgate.yaml"))) {
			t.Errorf("%s does not name the PREFIX's binary and configuration:\n%s", u, b)
		}
	}
	if path, err := exec.LookPath("systemd-analyze"); err == nil {
		out, err := exec.Command(path, append([]string{"verify"}, units...)...).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
		t.Logf("systemd-analyze verify: %d units clean", len(units))
		return
	}
	for _, u := range units {
		checkUnit(t, u)
	}
	t.Logf("systemd-analyze is not on this machine: the %d units were parsed and checked by the test instead", len(units))
}

// checkUnit parses a unit file: sections and key=value lines only, the
// sections a service needs, an ExecStart whose program exists.
func checkUnit(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sections := map[string]map[string]string{}
	var cur map[string]string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			cur = map[string]string{}
			sections[line[1:len(line)-1]] = cur
		case cur != nil && strings.Contains(line, "="):
			k, v, _ := strings.Cut(line, "=")
			cur[k] = v
		default:
			t.Errorf("%s:%d: not a section or key=value: %q", path, n, line)
		}
	}
	for _, s := range []string{"Unit", "Service", "Install"} {
		if sections[s] == nil {
			t.Errorf("%s: no [%s] section", path, s)
		}
	}
	exe, _, _ := strings.Cut(sections["Service"]["ExecStart"], " ")
	if fi, err := os.Stat(exe); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("%s: ExecStart program %q is not an executable: %v", path, exe, err)
	}
}

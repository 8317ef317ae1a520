package nginx_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// headerName is a row of the template's header table: "#   NGINX_NAME   what   default".
var headerName = regexp.MustCompile(`(?m)^#   (NGINX_[A-Z_]+) `)

// TestHeaderRendersTheTemplate: nginx/nginx.conf rendered the way its own header says (envsubst,
// substituting the names its table lists and only those) is a config nginx -t accepts. A name the
// template uses but the header leaves out stays "${NGINX_…}" in the output, which nginx reads as
// a variable it does not know and refuses. The header, scripts/stack.sh's list (NGINX_VARS) and the
// template's body must also name the same set.
func TestHeaderRendersTheTemplate(t *testing.T) {
	bin := nginxBin(t)
	if _, err := exec.LookPath("envsubst"); err != nil {
		t.Fatal("envsubst not found: run `make deps` (installs gettext-base)")
	}
	raw, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := string(raw)
	header, body, ok := strings.Cut(tmpl, "\nworker_processes")
	if !ok {
		t.Fatal("nginx.conf: no worker_processes line after the header")
	}
	var names []string
	for _, m := range headerName.FindAllStringSubmatch(header, -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatal("nginx.conf's header lists no NGINX_* names")
	}

	// Values for every name a header may list: a name the test does not know is a failure, so
	// that a new name is given a value here (and checked by nginx -t) when it is added.
	dir := t.TempDir()
	html, err := filepath.Abs("html")
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{
		"NGINX_LISTEN":             freeAddr(t),
		"NGINX_UPSTREAM_SERVERS":   "        server 127.0.0.1:1 max_fails=3 fail_timeout=5s;",
		"NGINX_RATE":               "20",
		"NGINX_BURST":              "40",
		"NGINX_CONN":               "32",
		"NGINX_BODY_CONN":          "8",
		"NGINX_NET_RATE":           "320",
		"NGINX_NET_BURST":          "640",
		"NGINX_NET_CONN":           "512",
		"NGINX_NET_BODY_CONN":      "128",
		"NGINX_LISTEN_EXTRA":       "",
		"NGINX_READ_TIMEOUT":       "5s",
		"NGINX_HTML":               html,
		"NGINX_LOG_DIR":            dir,
		"NGINX_PID":                filepath.Join(dir, "nginx.pid"),
		"NGINX_RLIMIT_NOFILE":      "4096",
		"NGINX_WORKER_CONNECTIONS": "2016",
		"NGINX_MARKS":              t.TempDir(),
	}
	format := ""
	env := envWithoutNginx()
	for _, n := range names {
		v, ok := values[n]
		if !ok {
			t.Fatalf("the header lists %s, for which this test has no value: add one", n)
		}
		format += "${" + n + "} "
		env = append(env, n+"="+v)
	}
	cmd := exec.Command("envsubst", format)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(tmpl)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("envsubst: %v", err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Command(bin, "-t", "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", globals("")).CombinedOutput()
	if err != nil {
		t.Errorf("nginx -t on nginx.conf rendered by its header's names %v: %v\n%s", names, err, res)
	}

	// The same set in the header, in the template's body and in scripts/stack.sh's NGINX_VARS.
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`\$\{(NGINX_[A-Z_]+)\}`).FindAllStringSubmatch(body, -1) {
		used[m[1]] = true
	}
	stack, err := os.ReadFile("../scripts/stack.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^NGINX_VARS='([^']*)'`).FindSubmatch(stack)
	if m == nil {
		t.Fatal("scripts/stack.sh: no NGINX_VARS='…' line")
	}
	listed := map[string]bool{}
	for _, w := range strings.Fields(string(m[1])) {
		listed[strings.TrimSuffix(strings.TrimPrefix(w, "${"), "}")] = true
	}
	inHeader := map[string]bool{}
	for _, n := range names {
		inHeader[n] = true
	}
	for _, c := range []struct {
		what string
		set  map[string]bool
	}{{"the template's body", used}, {"scripts/stack.sh's NGINX_VARS", listed}} {
		if d := diff(inHeader, c.set); d != "" {
			t.Errorf("nginx.conf's header and %s differ: %s", c.what, d)
		}
	}
}

// diff names what one set holds and the other does not ("" when they are equal).
func diff(a, b map[string]bool) string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, "only in the header: "+k)
		}
	}
	for k := range b {
		if !a[k] {
			out = append(out, "not in the header: "+k)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// TestUpstreamIsRoundRobin: the gateways' upstream names no balancing method, so nginx spreads
// requests round-robin and one client address reaches every gateway, as docs/gateway.md says
// (each gateway's per-IP limit is its own; nginx's limit_req is the fleet's). A method that pins
// clients (hash, ip_hash, sticky) would change what those limits mean: change the page with it.
func TestUpstreamIsRoundRobin(t *testing.T) {
	raw, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\n\s*upstream flashgate_gateways \{(.*?)\n    \}`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatal("nginx.conf: no upstream flashgate_gateways block")
	}
	for _, line := range strings.Split(m[1], "\n") {
		f := strings.Fields(strings.TrimSpace(line))
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.TrimSuffix(f[0], ";") {
		case "hash", "ip_hash", "least_conn", "least_time", "random", "sticky":
			t.Errorf("the upstream balances by %q, not round-robin: docs/gateway.md (Rate limits) says round-robin", line)
		}
	}
	doc, err := os.ReadFile("../docs/gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "round-robin") {
		t.Error("docs/gateway.md does not say how nginx spreads requests over the gateways (round-robin)")
	}
}

package api

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// The sources whose answers the document must hold: the gateway, the backend,
// the admin-token guard they share, and the edge nginx in front of them.
var answerSources = []string{"../gateway", "../backend", "../auth"}

// outsideTheContract are files that answer HTTP outside the document, and why.
var outsideTheContract = map[string]string{
	// Like /debug/pprof/: HTML pages and form redirects (301, 303) for a
	// browser on the backend's admin port (docs/observability.md).
	"../backend/ui.go": "the live view at /ui/",
}

// transportFuncs and transportFiles answer a request before (or whatever)
// its path is routed: framing, fasthttp's own refusals, the connection caps,
// a method a path has no operation for. Their statuses can meet a request to
// any public path, so every public operation must list them.
var (
	transportFiles = map[string]bool{"../gateway/framing.go": true, "../gateway/server.go": true, "../gateway/listener.go": true}
	transportFuncs = map[string]bool{"methodNotAllowed": true}
)

// answers are what the sources can answer: status → where, code → where.
type answers struct {
	statuses  map[int][]string
	transport map[int][]string
	codes     map[string][]string
}

func (a *answers) status(n int, where string, transport bool) {
	a.statuses[n] = append(a.statuses[n], where)
	if transport {
		a.transport[n] = append(a.transport[n], where)
	}
}

// codeBody finds a body's code in a string: {"code":"sold_out", …}.
var codeBody = regexp.MustCompile(`"code"\s*:\s*"([a-z_]+)"`)

// TestEveryAnswerIsDocumented: every HTTP status and every error code that an
// answer of the gateway, the backend or nginx can carry is in api/openapi.yaml.
// Statuses are read from the Go sources (each http.Status*/fasthttp.Status*
// they name, their own status constants, the raw refusals the listener writes)
// and from nginx/nginx.conf (error_page, return); codes from the
// flashgate.Code* constants the sources name, the codes written as strings and
// the bodies nginx returns. A status must be on at least one operation, and a
// status answered before routing on every public (/v1/) operation; a code must
// be in the Error schema's enum.
func TestEveryAnswerIsDocumented(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(YAML())
	if err != nil {
		t.Fatal(err)
	}
	a := collectAnswers(t)
	if len(a.statuses) < 10 || len(a.transport) < 5 || len(a.codes) < 10 {
		t.Fatalf("found too little to check (statuses %v, transport %v, codes %v): has the code moved?", keys(a.statuses), keys(a.transport), keys(a.codes))
	}

	documented := map[int]bool{}
	public := map[string]map[int]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			on := map[int]bool{}
			for s := range op.Responses.Map() {
				n, err := strconv.Atoi(s)
				if err != nil {
					t.Fatalf("%s %s: response %q is not a status", method, path, s)
				}
				on[n], documented[n] = true, true
			}
			if strings.HasPrefix(path, "/v1/") {
				public[method+" "+path] = on
			}
		}
	}
	for _, n := range keys(a.statuses) {
		if !documented[n] {
			t.Errorf("status %d is answered (%s) but no operation of api/openapi.yaml lists it", n, strings.Join(a.statuses[n], ", "))
		}
	}
	for _, n := range keys(a.transport) {
		for op, on := range public {
			if !on[n] {
				t.Errorf("status %d is answered to any request whatever its path (%s) but %s does not list it", n, strings.Join(a.transport[n], ", "), op)
			}
		}
	}

	enum := map[string]bool{}
	for _, v := range doc.Components.Schemas["Error"].Value.Properties["code"].Value.Enum {
		enum[v.(string)] = true
	}
	accepted := doc.Components.Schemas["Accepted"].Value.Properties["code"].Value.Const
	for _, c := range keys(a.codes) {
		if !enum[c] && c != accepted {
			t.Errorf("code %q is answered (%s) but is not in the Error schema's code enum", c, strings.Join(a.codes[c], ", "))
		}
	}
	if !t.Failed() {
		t.Logf("%d statuses (%d before routing), %d codes: all in the document", len(a.statuses), len(a.transport), len(a.codes))
	}
}

func collectAnswers(t *testing.T) *answers {
	t.Helper()
	a := &answers{statuses: map[int][]string{}, transport: map[int][]string{}, codes: map[string][]string{}}
	httpStatus := netHTTPStatuses(t)
	domainCodes := constStrings(t, "../flashgate.go", "Code")
	fset := token.NewFileSet()
	for _, dir := range answerSources {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") || outsideTheContract[path] != "" {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			name := strings.TrimPrefix(path, "../")
			// Which function each position is in.
			funcAt := func(p token.Pos) string {
				for _, d := range f.Decls {
					if fd, ok := d.(*ast.FuncDecl); ok && fd.Pos() <= p && p < fd.End() {
						return fd.Name.Name
					}
				}
				return ""
			}
			where := func(n ast.Node) (string, bool) {
				pos := fset.Position(n.Pos())
				fn := funcAt(n.Pos())
				return name + ":" + strconv.Itoa(pos.Line), transportFiles[path] || transportFuncs[fn]
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					pkg, ok := x.X.(*ast.Ident)
					if !ok {
						return true
					}
					switch {
					case (pkg.Name == "http" || pkg.Name == "fasthttp") && strings.HasPrefix(x.Sel.Name, "Status"):
						// fasthttp's status names are net/http's.
						st, ok := httpStatus[x.Sel.Name]
						if !ok {
							t.Fatalf("%s: %s.%s is not a net/http status name", name, pkg.Name, x.Sel.Name)
						}
						w, tr := where(x)
						a.status(st, w, tr)
					case pkg.Name == "flashgate" && strings.HasPrefix(x.Sel.Name, "Code"):
						if c, ok := domainCodes[x.Sel.Name]; ok {
							w, _ := where(x)
							a.codes[c] = append(a.codes[c], w)
						}
					}
				case *ast.ValueSpec:
					// The package's own status constants (statusTooEarly = 425).
					for i, id := range x.Names {
						if strings.HasPrefix(id.Name, "status") && i < len(x.Values) {
							if st, ok := intLit(x.Values[i]); ok && st >= 100 && st <= 599 {
								w, tr := where(x)
								a.status(st, w, tr)
							}
						}
					}
				case *ast.CallExpr:
					fn := ""
					switch f := x.Fun.(type) {
					case *ast.Ident:
						fn = f.Name
					case *ast.SelectorExpr:
						fn = f.Sel.Name
					}
					// Raw refusals written to a socket: rawJSONRefusals(503, …).
					if strings.HasPrefix(fn, "rawJSON") && len(x.Args) > 0 {
						if st, ok := intLit(x.Args[0]); ok {
							w, tr := where(x)
							a.status(st, w, tr)
						}
					}
					// A code written as a string: writeError(w, status, "not_found", …).
					if fn == "writeError" && len(x.Args) > 2 {
						if lit, ok := x.Args[2].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							c, _ := strconv.Unquote(lit.Value)
							w, _ := where(x)
							a.codes[c] = append(a.codes[c], w)
						}
					}
				case *ast.BasicLit:
					if x.Kind == token.STRING {
						s, _ := strconv.Unquote(x.Value)
						for _, m := range codeBody.FindAllStringSubmatch(s, -1) {
							w, _ := where(x)
							a.codes[m[1]] = append(a.codes[m[1]], w)
						}
					}
				}
				return true
			})
		}
	}

	// nginx: every status it maps an error to, or returns, and the codes of its bodies; all of
	// them can meet a request to any public path (the error pages are the server's).
	conf, err := os.ReadFile("../nginx/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(conf), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		w := "nginx/nginx.conf:" + strconv.Itoa(i+1)
		if m := regexp.MustCompile(`^error_page\s+(\d{3})\s+(?:=(\d{3})\s+)?`).FindStringSubmatch(line); m != nil {
			st := m[1]
			if m[2] != "" {
				st = m[2] // error_page 494 =431: the client sees 431
			}
			n, _ := strconv.Atoi(st)
			a.status(n, w, true)
		}
		for _, m := range regexp.MustCompile(`\breturn\s+(\d{3})\b`).FindAllStringSubmatch(line, -1) {
			n, _ := strconv.Atoi(m[1])
			a.status(n, w, false)
		}
		for _, m := range codeBody.FindAllStringSubmatch(line, -1) {
			a.codes[m[1]] = append(a.codes[m[1]], w)
		}
	}
	return a
}

// netHTTPStatuses reads net/http's status constants (name → number) from the
// Go installation's source, so a status named in the code is checked by its
// number.
func netHTTPStatuses(t *testing.T) map[string]int {
	t.Helper()
	path := filepath.Join(build.Default.GOROOT, "src", "net", "http", "status.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatalf("net/http's status names: %v", err)
	}
	out := map[string]int{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if i < len(vs.Values) {
					if n, ok := intLit(vs.Values[i]); ok {
						out[id.Name] = n
					}
				}
			}
		}
	}
	if out["StatusTooManyRequests"] != 429 {
		t.Fatalf("%s: StatusTooManyRequests not read as 429 (%d names)", path, len(out))
	}
	return out
}

// constStrings reads the string constants of a file whose names start with
// prefix (flashgate.go's Code* constants).
func constStrings(t *testing.T, path, prefix string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, id := range vs.Names {
				if lit, ok := valueAt(vs, i).(*ast.BasicLit); ok && lit.Kind == token.STRING && strings.HasPrefix(id.Name, prefix) {
					out[id.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
		return true
	})
	if len(out) == 0 {
		t.Fatalf("%s: no %s* string constants", path, prefix)
	}
	return out
}

func valueAt(vs *ast.ValueSpec, i int) ast.Expr {
	if i < len(vs.Values) {
		return vs.Values[i]
	}
	return nil
}

func intLit(e ast.Expr) (int, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.INT {
		return 0, false
	}
	n, err := strconv.Atoi(lit.Value)
	return n, err == nil
}

func keys[K int | string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// docCode is an error code as the documents write it after its status:
// 503 `unavailable`, `503 unavailable`.
var docCode = regexp.MustCompile("\\b[45][0-9][0-9] `([a-z][a-z_]*)`|`[45][0-9][0-9] ([a-z][a-z_]*)`")

// TestDocsNameOnlyDocumentedCodes: a code the README or docs/ gives with its
// status is one the Error schema's enum holds (not, say, a service_unavailable
// no answer carries).
func TestDocsNameOnlyDocumentedCodes(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(YAML())
	if err != nil {
		t.Fatal(err)
	}
	enum := map[string]bool{}
	for _, v := range doc.Components.Schemas["Error"].Value.Properties["code"].Value.Enum {
		enum[v.(string)] = true
	}
	files, _ := filepath.Glob("../docs/*.md")
	files = append(files, "../README.md")
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range docCode.FindAllStringSubmatch(line, -1) {
				code := m[1] + m[2]
				n++
				if !enum[code] {
					t.Errorf("%s:%d names the code %q, which no answer carries (api/openapi.yaml's Error enum)", f, i+1, code)
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("found only %d status-and-code mentions in the docs: has the test stopped reading them?", n)
	}
}

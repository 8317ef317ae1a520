package lua

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// scriptOutcomeType names, per script of this folder, the Go type of its
// outcomes ("" for a script that answers only a count). A new script must be
// listed here, or TestScriptOutcomes fails.
var scriptOutcomeType = map[string]string{
	"admit.lua":     "Outcome",
	"release.lua":   "ReleaseOutcome",
	"claim.lua":     "ClaimStatus",
	"restock.lua":   "RestockOutcome",
	"fence.lua":     "",
	"install.lua":   "installReply",
	"warm.lua":      "warmReply",
	"confirm.lua":   "",
	"take.lua":      "takeReply",
	"give.lua":      "giveReply",
	"gcra.lua":      "gcraReply",
	"view.lua":      "",
	"hold.lua":      "holdReply",
	"unhold.lua":    "unholdReply",
	"holdcheck.lua": "holdCheckReply",
}

var (
	// The words a script's code returns: as the first element of a returned
	// table ("return {'ok', ...}", "local out = {'ok'}"), as an element of
	// a returned list ("out[i] = 'ok'", "words[j], x[j] = 'ok', ..."), or a
	// literal number ("return 1").
	codeWord = []*regexp.Regexp{
		regexp.MustCompile(`return \{'(\w+)'`),
		regexp.MustCompile(`local out = \{'(\w+)'`),
		regexp.MustCompile(`(?m)^\s*\w+\[\w+\](?:,\s*\w+\[\w+\])*\s*=\s*'(\w+)'`),
		regexp.MustCompile(`(?m)^\s*return (\d+)\s*$`),
	}
	// The words a script's "-- Returns" block names: quoted words in that
	// line and the indented comment lines after it.
	docWord = regexp.MustCompile(`'(\w+)'`)
)

func scriptWords(t *testing.T, src string) (code, doc []string) {
	t.Helper()
	for _, re := range codeWord {
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			code = append(code, m[1])
		}
	}
	in := false
	for _, line := range strings.Split(src, "\n") {
		switch {
		case strings.HasPrefix(line, "-- Returns"):
			in = true
		case in && strings.HasPrefix(line, "--  "):
		default:
			in = false
		}
		if in {
			for _, m := range docWord.FindAllStringSubmatch(line, -1) {
				doc = append(doc, m[1])
			}
		}
	}
	return uniq(code), uniq(doc)
}

func uniq(s []string) []string {
	sort.Strings(s)
	return slices.Compact(s)
}

// outcomeConst is one constant of an outcome type and the word it stands for.
type outcomeConst struct{ name, word string }

// outcomeConsts reads this package's non-test sources for every constant of
// each type, with its word: a string or number constant's own value, or, for
// an enum, its entry in the "...Wire" table keyed by constants.
func outcomeConsts(t *testing.T) map[string][]outcomeConst {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	typeOf := map[string]string{}  // const name → its type
	literal := map[string]string{} // const name → its string or number value
	wire := map[string]string{}    // const name → its word in a Wire table
	wireOf := map[string]string{}  // Wire table → the type of its keys (via the first)
	var wireKeys = map[string][]string{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || (gd.Tok != token.CONST && gd.Tok != token.VAR) {
				continue
			}
			var typ string // an iota group's type carries over to the specs after it
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				switch gd.Tok {
				case token.CONST:
					if id, ok := vs.Type.(*ast.Ident); ok {
						typ = id.Name
					} else if vs.Type != nil || len(vs.Values) > 0 && !usesIota(vs.Values[0]) {
						typ = ""
					}
					for i, n := range vs.Names {
						if typ == "" {
							continue
						}
						typeOf[n.Name] = typ
						if i < len(vs.Values) {
							if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
								v := lit.Value
								if lit.Kind == token.STRING {
									v, _ = strconv.Unquote(v)
								}
								literal[n.Name] = v
							}
						}
					}
				case token.VAR:
					for i, n := range vs.Names {
						if !strings.HasSuffix(n.Name, "Wire") || i >= len(vs.Values) {
							continue
						}
						cl, ok := vs.Values[i].(*ast.CompositeLit)
						if !ok {
							t.Fatalf("%s: not a composite literal", n.Name)
						}
						for _, e := range cl.Elts {
							kv, ok := e.(*ast.KeyValueExpr)
							if !ok {
								t.Fatalf("%s: an entry without its constant as key", n.Name)
							}
							k, ok1 := kv.Key.(*ast.Ident)
							v, ok2 := kv.Value.(*ast.BasicLit)
							if !ok1 || !ok2 {
								t.Errorf("%s: entries must be Constant: \"word\"", n.Name)
								continue
							}
							word, _ := strconv.Unquote(v.Value)
							if _, dup := wire[k.Name]; dup {
								t.Errorf("%s is in two Wire tables", k.Name)
							}
							wire[k.Name] = word
							wireKeys[n.Name] = append(wireKeys[n.Name], k.Name)
						}
					}
				}
			}
		}
	}
	for table, keys := range wireKeys {
		wireOf[table] = typeOf[keys[0]]
		for _, k := range keys {
			if typeOf[k] != wireOf[table] {
				t.Errorf("%s mixes %s and %s keys", table, typeOf[keys[0]], typeOf[k])
			}
		}
	}
	enum := map[string]bool{}
	for _, typ := range wireOf {
		enum[typ] = true
	}
	out := map[string][]outcomeConst{}
	for name, typ := range typeOf {
		c := outcomeConst{name: name}
		if enum[typ] {
			w, ok := wire[name]
			if !ok {
				t.Errorf("%s (%s) has no entry in its Wire table", name, typ)
			}
			c.word = w
		} else {
			c.word = literal[name]
		}
		out[typ] = append(out[typ], c)
	}
	return out
}

func usesIota(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == "iota" {
			found = true
		}
		return true
	})
	return found
}

// TestScriptOutcomes: every word a script in this folder can return has its
// Go constant, and every constant of a script's outcome type is a word the
// script returns (none orphaned). A script's documented "-- Returns" block
// names the same words as its code.
func TestScriptOutcomes(t *testing.T) {
	consts := outcomeConsts(t)
	scripts, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(scripts) < len(scriptOutcomeType) {
		t.Fatalf("found %d scripts, %d expected", len(scripts), len(scriptOutcomeType))
	}
	for _, name := range scripts {
		typ, listed := scriptOutcomeType[name]
		if !listed {
			t.Errorf("%s: not in scriptOutcomeType: name the Go type of its outcomes", name)
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		code, doc := scriptWords(t, string(src))
		var strs []string
		for _, w := range code {
			if _, err := strconv.Atoi(w); err != nil {
				strs = append(strs, w)
			}
		}
		if !slices.Equal(strs, doc) {
			t.Errorf("%s: its code returns %q, its Returns block names %q", name, strs, doc)
		}
		var words []string
		for _, c := range consts[typ] {
			if c.word == "" {
				t.Errorf("%s: constant %s (%s) stands for no word", name, c.name, typ)
			}
			if !slices.Contains(code, c.word) {
				t.Errorf("%s: constant %s = %q is orphaned: the script never returns it", name, c.name, c.word)
			}
			if slices.Contains(words, c.word) {
				t.Errorf("%s: two %s constants stand for %q", name, typ, c.word)
			}
			words = append(words, c.word)
		}
		for _, w := range code {
			if !slices.Contains(words, w) {
				t.Errorf("%s returns %q, which no %s constant stands for", name, w, typ)
			}
		}
		if typ == "" && len(code) > 0 {
			t.Errorf("%s returns %q but names no outcome type", name, code)
		}
	}
	for _, typ := range scriptOutcomeType {
		if typ != "" && len(consts[typ]) == 0 {
			t.Errorf("type %s has no constants in this package", typ)
		}
	}
}

// The extraction finds each way a script answers.
func TestScriptWords(t *testing.T) {
	src := `-- Returns {'a', n} | {'b'}
--   {'c'}
-- not 'x'
if x then return {'a', 1} end
local out = {'c'}
out[i] = 'b'
words[j], users[j] = 'd', u
if words[j] == 'e' then end
return 0
`
	code, doc := scriptWords(t, src)
	if want := []string{"0", "a", "b", "c", "d"}; !slices.Equal(code, want) {
		t.Errorf("code = %q, want %q", code, want)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(doc, want) {
		t.Errorf("doc = %q, want %q", doc, want)
	}
}

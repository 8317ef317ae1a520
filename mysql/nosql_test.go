package mysql

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sqlStatement matches a string literal that begins like an SQL statement
// (not an HTTP route such as "DELETE /admin/v1/…").
var sqlStatement = regexp.MustCompile(`^\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|ALTER|DROP|TRUNCATE|RENAME|SAVEPOINT|ROLLBACK|GRANT|SET|LOCK|UNLOCK)\s+[^/\s]`)

// SQL lives in this package only: every statement the product runs is here,
// behind a function named for what it decides. bench/seedsync (the seeds'
// synchronous design, kept as a yardstick), internal/testenv (test
// databases) and roles (the accounts and grants it renders for a provisioner:
// DCL, not the product's data) are the exceptions; tests may speak SQL to
// check the tables.
func TestNoSQLOutsideTheStore(t *testing.T) {
	skip := map[string]bool{"mysql": true, "bench/seedsync": true, "internal/testenv": true, "roles": true}
	var found []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skip[rel] || (rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "var" || d.Name() == "testdata" || d.Name() == "node_modules")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && sqlStatement.MatchString(s) {
				found = append(found, rel+": "+strings.Fields(s)[0]+" …")
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("SQL outside the store: %s", f)
	}
}

// The search itself finds a statement: a literal the store holds.
func TestNoSQLSearchSees(t *testing.T) {
	for _, s := range []string{"SELECT 1", "\n\t\tUPDATE sales SET", "CREATE DATABASE `x`", "SAVEPOINT fg_order"} {
		if !sqlStatement.MatchString(s) {
			t.Errorf("%q not recognised as SQL", s)
		}
	}
	for _, s := range []string{"DELETE /admin/v1/denylist/{kind}/{id}", "SET"} {
		if sqlStatement.MatchString(s) {
			t.Errorf("%q taken for SQL", s)
		}
	}
	for _, s := range []string{"select a sale", "UPDATED", "sold out"} {
		if sqlStatement.MatchString(s) {
			t.Errorf("%q taken for SQL", s)
		}
	}
}

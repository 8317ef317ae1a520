package flashgate_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdCitation is a path to a Markdown document as the repository's files cite
// one: docs/design.md, BENCHMARKS.md, bench/README.md.
var mdCitation = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:[A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_-]*\.md)\b`)

// outside are citations of documents that are not in the repository (the
// project's working notes): spelled in pieces so this file does not cite them.
var outside = []string{
	"DESIGN" + ".md", "DESIGN" + " §", "STYLE" + ".md", "../" + "shared", "/work/" + "shared", "/work/" + "main",
}

// TestNoCitationOfMissingDocuments: no file of the repository sends its reader
// to a document the repository does not hold: every path to a .md file it
// names exists (from the repository root or from the citing file's folder),
// and nothing names the project's working notes outside it.
func TestNoCitationOfMissingDocuments(t *testing.T) {
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	skip := map[string]bool{".git": true, "var": true, "bin": true, "node_modules": true}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if skip[rel] || (rel != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || rel == "LICENSE" || rel == ".git" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary
		}
		files++
		for i, line := range strings.Split(string(b), "\n") {
			for _, o := range outside {
				if strings.Contains(line, o) {
					t.Errorf("%s:%d cites %q, which is not in the repository", rel, i+1, o)
				}
			}
			for _, m := range mdCitation.FindAllStringSubmatch(line, -1) {
				doc := m[1]
				if strings.Contains(doc, "://") {
					continue
				}
				if exists(filepath.Join(root, doc)) || exists(filepath.Join(filepath.Dir(path), doc)) {
					continue
				}
				t.Errorf("%s:%d cites %s, which is not in the repository", rel, i+1, doc)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d files: is this the repository root?", files)
	}
	t.Logf("%d files read, every cited document exists", files)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestEveryDocIsIndexed: the README's Documentation table links every page
// of docs/, so a reader who starts at the README can find each one.
func TestEveryDocIsIndexed(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob("docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("docs/*.md: %v %v", pages, err)
	}
	for _, p := range pages {
		if !bytes.Contains(readme, []byte("]("+p+")")) {
			t.Errorf("README.md's Documentation table does not link %s", p)
		}
	}
}

package outboxplugin

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
)

// The capture (internal/capture) has its own names for values this package exports; they are
// converted as they are, so they must stay equal.
func TestCaptureSharesExportedValues(t *testing.T) {
	for _, c := range []struct {
		public  PayloadMode
		capture capture.PayloadMode
	}{{PayloadKey, capture.PayloadKey}, {PayloadRow, capture.PayloadRow}, {PayloadChanges, capture.PayloadChanges}} {
		if capture.PayloadMode(c.public) != c.capture {
			t.Errorf("PayloadMode %v is %d here and %d in the capture", c.public, c.public, c.capture)
		}
	}
	for _, c := range []struct {
		public  ChangesetType
		capture capture.Op
	}{{ChangesetCreate, capture.OpCreate}, {ChangesetUpdate, capture.OpUpdate}, {ChangesetDelete, capture.OpDelete}} {
		if string(c.public) != string(c.capture) {
			t.Errorf("ChangesetType %q is %q in the capture", c.public, c.capture)
		}
	}
	if p := New(); p.c.Table != DefaultTableName || !p.c.Notify {
		t.Errorf("the capture of New() writes to %q, notify %v", p.c.Table, p.c.Notify)
	}
}

// The layout's rule (docs/architecture.md): the capture and the relay never import each other, and no
// package under internal/ imports the root. Read from the source files' import lines, so that a change
// that breaks the rule fails here and not only in a reviewer's eye.
func TestLayoutImportRules(t *testing.T) {
	const module = "github.com/gorm-outbox/outboxplugin"
	imports := map[string][]string{} // package directory → what its non-test files import from the module
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		for _, spec := range f.Imports {
			p, _ := strconv.Unquote(spec.Path.Value)
			if p == module || strings.HasPrefix(p, module+"/") {
				imports[dir] = append(imports[dir], strings.TrimPrefix(strings.TrimPrefix(p, module), "/"))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(imports["internal/capture"]) == 0 || len(imports["internal/relay"]) == 0 {
		t.Fatalf("read no imports of internal/capture or internal/relay: %v", imports)
	}
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for dir, ps := range imports {
		for _, p := range ps {
			switch {
			case p == "":
				t.Errorf("%s imports the root package", dir)
			case under(dir, "internal/capture") && under(p, "internal/relay"):
				t.Errorf("%s (the capture) imports %s (the relay)", dir, p)
			case under(dir, "internal/relay") && under(p, "internal/capture"):
				t.Errorf("%s (the relay) imports %s (the capture)", dir, p)
			}
		}
	}
}

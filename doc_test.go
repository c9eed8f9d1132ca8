package cheetah

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestExportedMethodsHaveDocs: every exported method of the types an
// application holds has a doc comment that starts with its name, as go doc
// shows it.
func TestExportedMethodsHaveDocs(t *testing.T) {
	requireMethodDocs(t, ".", "Manager", "Handle", "History")
	// The remote SDK's backend, client and errors.
	requireMethodDocs(t, "remote", "backend", "Client", "StatusError", "RateLimitedError")
}

// requireMethodDocs checks the exported methods of the named types declared
// in the non-test files of dir.
func requireMethodDocs(t *testing.T, dir string, types ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, ty := range types {
		want[ty] = true
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || !fn.Name.IsExported() {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			id, ok := recv.(*ast.Ident)
			if !ok || !want[id.Name] {
				continue
			}
			seen++
			if fn.Doc == nil || !strings.HasPrefix(fn.Doc.Text(), fn.Name.Name+" ") {
				t.Errorf("%s: (%s).%s has no doc comment starting with its name", fset.Position(fn.Pos()), id.Name, fn.Name.Name)
			}
		}
	}
	if seen == 0 {
		t.Fatalf("no exported method of %v found in %s", types, dir)
	}
}

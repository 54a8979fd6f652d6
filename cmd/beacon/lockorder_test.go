package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestLockOrderWritten: a method that takes a second lock while it holds
// one belongs to a type whose declaration says, in a line beginning "Lock
// order", in which order its locks are taken. (A lock is held from
// x.Lock() to x.Unlock() in the text of one function, to its end when
// the unlock is deferred.)
func TestLockOrderWritten(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	decls := map[string]string{}    // "dir.Type" -> the text of its declaration's comments
	nested := map[string][]string{} // "dir.Type" -> where it nests locks
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", "lab", "testkit", "examples":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if !ok {
						continue
					}
					decls[dir+"."+ts.Name.Name] = declComments(d, ts)
				}
			case *ast.FuncDecl:
				if d.Recv == nil || d.Body == nil {
					continue
				}
				if pairs := nestedLocks(fset, d.Body); len(pairs) > 0 {
					typ := recvType(d.Recv.List[0].Type)
					nested[dir+"."+typ] = append(nested[dir+"."+typ], d.Name.Name+" ("+strings.Join(pairs, ", ")+")")
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for typ, where := range nested {
		if !strings.Contains(decls[typ], "Lock order") {
			t.Errorf("%s takes one lock while holding another in %s, but its declaration does not say the order: add a line \"Lock order: ...\"",
				strings.TrimPrefix(typ, root+"/"), strings.Join(where, "; "))
		}
	}
}

// declComments is the doc comment of a type and the comments inside its
// declaration (its fields').
func declComments(d *ast.GenDecl, ts *ast.TypeSpec) string {
	var b strings.Builder
	for _, cg := range []*ast.CommentGroup{d.Doc, ts.Doc} {
		if cg != nil {
			b.WriteString(cg.Text())
		}
	}
	if st, ok := ts.Type.(*ast.StructType); ok {
		for _, f := range st.Fields.List {
			for _, cg := range []*ast.CommentGroup{f.Doc, f.Comment} {
				if cg != nil {
					b.WriteString(cg.Text())
				}
			}
		}
	}
	return b.String()
}

func recvType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// nestedLocks lists "a -> b" for each lock b a function body takes while
// it holds lock a (function literals are not followed).
func nestedLocks(fset *token.FileSet, body *ast.BlockStmt) []string {
	held := map[string]bool{}
	var pairs []string
	ast.Inspect(body, func(n ast.Node) bool {
		var call *ast.CallExpr
		deferred := false
		switch x := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.DeferStmt:
			call, deferred = x.Call, true
		case *ast.CallExpr:
			call = x
		default:
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, sel.X); err != nil {
			return true
		}
		lock := b.String()
		switch sel.Sel.Name {
		case "Lock", "RLock":
			for h := range held {
				if h != lock {
					pairs = append(pairs, h+" -> "+lock)
				}
			}
			held[lock] = true
		case "Unlock", "RUnlock":
			if !deferred {
				delete(held, lock)
			}
		}
		return !deferred
	})
	return pairs
}

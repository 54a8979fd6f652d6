package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest function body the production code may have:
// one a reader holds in their head. Tables (a composite literal and
// nothing else) are not functions in this sense and are not counted.
const maxFuncLines = 100

// TestFunctionsFitInTheHead: no function of the code the binary links
// (the tooling of beacon bench included; tests and examples not) has a
// body over maxFuncLines lines.
func TestFunctionsFitInTheHead(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", "testkit", "examples":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			name := "a function literal"
			switch x := n.(type) {
			case *ast.FuncDecl:
				body, name = x.Body, x.Name.Name
			case *ast.FuncLit:
				body = x.Body
			}
			if body == nil || isTable(body) {
				return true
			}
			if lines := fset.Position(body.End()).Line - fset.Position(body.Pos()).Line - 1; lines > maxFuncLines {
				t.Errorf("%s: %s is %d lines long (at most %d): split it by what its parts do", fset.Position(body.Pos()), name, lines, maxFuncLines)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// isTable reports a body that only returns a composite literal (a table
// or a declaration such as a CRD schema).
func isTable(body *ast.BlockStmt) bool {
	if len(body.List) != 1 {
		return false
	}
	ret, ok := body.List[0].(*ast.ReturnStmt)
	if !ok || len(ret.Results) != 1 {
		return false
	}
	_, ok = ret.Results[0].(*ast.CompositeLit)
	if !ok {
		if u, isUnary := ret.Results[0].(*ast.UnaryExpr); isUnary {
			_, ok = u.X.(*ast.CompositeLit)
		}
	}
	return ok
}

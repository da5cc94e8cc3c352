package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// mdLink is a Markdown link's target: ](target) or ](target#anchor).
	mdLink = regexp.MustCompile(`\]\(([^)#\s]+)(?:#[^)]*)?\)`)
	// codePath is a path in backquotes that starts outside the tree.
	codePath = regexp.MustCompile("`(\\.\\./[^`]*)`")
)

// The README and the docs link only to what a clone holds: every relative
// link resolves to a file or folder of the repository, and none points
// above it (a notes folder beside the clone, for instance).
func TestDocsLinkInsideTheClone(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			docs = append(docs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 5 {
		t.Fatalf("found %d Markdown files under %s", len(docs), root)
	}
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p := filepath.Join(filepath.Dir(doc), target)
			if r, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s links to %s, outside the repository", rel, target)
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to %s, which the repository does not hold", rel, target)
			}
		}
		for _, m := range codePath.FindAllStringSubmatch(string(b), -1) {
			p := filepath.Join(filepath.Dir(doc), m[1])
			if r, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s names %s, outside the repository", rel, m[1])
			}
		}
	}
}

package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPages are the pages operators read: the README and docs/.
func docPages(t *testing.T) map[string][]byte {
	t.Helper()
	root := repoRoot(t)
	names, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string][]byte{}
	for _, name := range append(names, filepath.Join(root, "README.md")) {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, name)
		pages[rel] = text
	}
	return pages
}

// The nginx and HAProxy blocks of the README and docs/ are excerpts of
// the example files the tests run: every line of a block is in one of
// them, in the same order, so that what operators copy is what was
// tested.
func TestDocsFrontConfigsAreTheTestedExampleFiles(t *testing.T) {
	root := repoRoot(t)
	seen := map[string]int{}
	for page, text := range docPages(t) {
		for lang, pattern := range map[string]string{"nginx": "nginx*.conf", "haproxy": "haproxy*.cfg"} {
			files, _ := filepath.Glob(filepath.Join(root, "examples", "*", pattern))
			var examples []string
			for _, f := range files {
				text, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				examples = append(examples, string(text))
			}
			for _, block := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllSubmatch(text, -1) {
				seen[lang]++
				if !excerptOfAny(string(block[1]), examples) {
					t.Errorf("%s: a %s block is not an excerpt of any of %q:\n%s", page, lang, files, block[1])
				}
			}
		}
	}
	if seen["nginx"] == 0 || seen["haproxy"] == 0 {
		t.Fatalf("blocks found: %v; want nginx and haproxy blocks in the docs", seen)
	}
}

// excerptOfAny tells whether every non-empty line of block is, trimmed, a
// line of one of the files, in the same order.
func excerptOfAny(block string, files []string) bool {
	for _, file := range files {
		lines, at, whole := strings.Split(file, "\n"), 0, true
		for _, want := range strings.Split(block, "\n") {
			if want = strings.TrimSpace(want); want == "" {
				continue
			}
			for at < len(lines) && strings.TrimSpace(lines[at]) != want {
				at++
			}
			if at == len(lines) {
				whole = false
				break
			}
			at++
		}
		if whole {
			return true
		}
	}
	return false
}

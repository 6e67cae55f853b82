package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's nginx and HAProxy blocks are excerpts of the example files
// the cluster tests run: every line of a block is in the file, in the same
// order, so that what operators copy is what was tested.
func TestReadmeFrontConfigsAreTheTestedExampleFiles(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for lang, file := range map[string]string{"nginx": "nginx.conf", "haproxy": "haproxy.cfg"} {
		example, err := os.ReadFile(filepath.Join(root, "examples", "cluster", file))
		if err != nil {
			t.Fatal(err)
		}
		blocks := regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllSubmatch(readme, -1)
		if len(blocks) == 0 {
			t.Fatalf("README has no %s block", lang)
		}
		lines := strings.Split(string(example), "\n")
		for _, block := range blocks {
			at := 0
			for _, want := range strings.Split(string(block[1]), "\n") {
				want = strings.TrimSpace(want)
				if want == "" {
					continue
				}
				found := false
				for ; at < len(lines); at++ {
					if strings.TrimSpace(lines[at]) == want {
						found, at = true, at+1
						break
					}
				}
				if !found {
					t.Errorf("README's %s block has %q, which examples/cluster/%s does not have there", lang, want, file)
					break
				}
			}
		}
	}
}

package caddymodule_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Every Caddyfile block of the README and docs/ adapts and loads as
// `caddy validate` loads it (each module provisioned and validated), so
// that what operators copy works. A block made of directives alone is
// loaded inside a site, each mcp_serializer block on its own when it
// holds several (they are alternatives); ports written in capitals are a
// template's and filled in. Blocks that show syntax (`<duration>`,
// `forward|synthesize|reject`) are left out.
func TestEveryCaddyfileInTheDocsLoads(t *testing.T) {
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for _, page := range append(pages, "../README.md") {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("(?ms)^( *)```caddyfile\n(.*?)```").FindAllSubmatch(text, -1) {
			// A block in a list is indented.
			block := regexp.MustCompile("(?m)^"+string(m[1])).ReplaceAllString(string(m[2]), "")
			block = fillPorts(block)
			if strings.Contains(block, "<") || strings.Contains(block, "|") {
				continue
			}
			for _, caddyfile := range asCaddyfiles(block) {
				loaded++
				cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
				if err == nil {
					err = caddy.Validate(mustConfig(t, cfg))
				}
				if err != nil {
					t.Errorf("%s: a Caddyfile block does not load: %v\n%s", page, err, caddyfile)
				}
				for _, w := range warnings {
					t.Errorf("%s: a Caddyfile block adapts with a warning: %s\n%s", page, w.Message, caddyfile)
				}
			}
		}
	}
	if loaded < 10 {
		t.Fatalf("only %d Caddyfile blocks found in the docs", loaded)
	}
}

// asCaddyfiles makes whole Caddyfiles of a docs block: as it is when it
// has a site address, else its directives inside a site.
func asCaddyfiles(block string) []string {
	first := strings.Fields(strings.SplitN(strings.TrimSpace(block), "\n", 2)[0])[0]
	if first == "{" || strings.ContainsAny(first, ".:") && !strings.HasPrefix(first, "@") {
		return []string{block}
	}
	site := func(directives string) string {
		lines := strings.Split(strings.TrimRight(directives, "\n"), "\n")
		for i, l := range lines {
			if l != "" {
				lines[i] = "\t" + l
			}
		}
		return "http://localhost:8080 {\n" + strings.Join(lines, "\n") + "\n}\n"
	}
	items := topLevelItems(block)
	alternatives := len(items) > 1
	for _, item := range items {
		alternatives = alternatives && strings.HasPrefix(item, "mcp_serializer")
	}
	if !alternatives {
		return []string{site(block)}
	}
	var out []string
	for _, item := range items {
		out = append(out, site(item))
	}
	return out
}

// topLevelItems splits a block into its top-level directives, each with
// its own braces.
func topLevelItems(block string) []string {
	var items []string
	var cur strings.Builder
	depth := 0
	for _, line := range strings.Split(block, "\n") {
		if strings.TrimSpace(line) == "" && depth == 0 {
			continue
		}
		cur.WriteString(line + "\n")
		depth += strings.Count(line, "{") - strings.Count(line, "}")
		if depth == 0 {
			items = append(items, cur.String())
			cur.Reset()
		}
	}
	return items
}

// fillPorts gives each port written in capitals (:PORT1, :UPSTREAM_FAST)
// a number of its own.
func fillPorts(block string) string {
	ports := map[string]string{}
	return regexp.MustCompile(`:[A-Z][A-Z0-9_]+`).ReplaceAllStringFunc(block, func(name string) string {
		if _, ok := ports[name]; !ok {
			ports[name] = ":" + strconv.Itoa(9001+len(ports))
		}
		return ports[name]
	})
}

func mustConfig(t *testing.T, raw []byte) *caddy.Config {
	t.Helper()
	var cfg caddy.Config
	if err := caddy.StrictUnmarshalJSON(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

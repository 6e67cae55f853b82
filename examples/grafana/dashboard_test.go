package grafana_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
)

// exported is what the module registers into a config's metrics registry:
// each metric's labels, and which metrics are histograms.
type exported struct {
	labels     map[string][]string
	histograms map[string]bool
}

// moduleMetrics provisions the handler as Caddy does and reads the
// collectors it registered.
func moduleMetrics(t *testing.T) exported {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &caddymodule.Handler{Name: "dashboard-test"}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	reg := ctx.GetMetricsRegistry()

	descs := make(chan *prometheus.Desc)
	go func() { reg.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	variable := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	m := exported{labels: map[string][]string{}, histograms: map[string]bool{}}
	for d := range descs {
		s := d.String()
		name := fqName.FindStringSubmatch(s)[1]
		var labels []string
		if v := variable.FindStringSubmatch(s)[1]; v != "" {
			labels = strings.Split(v, ",")
		}
		m.labels[name] = labels
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetType().String() == "HISTOGRAM" {
			m.histograms[f.GetName()] = true
		}
	}
	return m
}

// panel is what the test reads of a Grafana panel; rows nest panels.
type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

var (
	quoted       = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchers     = regexp.MustCompile(`\{[^}]*\}`)
	ranges       = regexp.MustCompile(`\[[^\]]*\]`)
	grouping     = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	identifier   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	selector     = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	labelValues  = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// Labels every scraped series has, and le on histogram buckets.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// metricNames returns the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges and grouping
// clauses are gone, that are neither function calls nor keywords.
func metricNames(expr string) []string {
	e := quoted.ReplaceAllString(expr, `""`)
	e = matchers.ReplaceAllString(e, "{}")
	e = ranges.ReplaceAllString(e, "[]")
	e = grouping.ReplaceAllString(e, "")
	var names []string
	for _, loc := range identifier.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsRune("0123456789.", rune(e[loc[0]-1])) {
			continue // a unit (1h) or an exponent, not a name
		}
		rest := strings.TrimLeft(e[loc[1]:], " ")
		if strings.HasPrefix(rest, "(") || promqlKeywords[name] {
			continue
		}
		names = append(names, name)
	}
	return names
}

var promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "offset": true, "inf": true, "nan": true}

// exports resolves a selected series name to the module's metric: the
// metric itself, or a histogram's _bucket, _sum or _count.
func (m exported) resolve(name string) (metric string, labels []string, ok bool) {
	if l, ok := m.labels[name]; ok {
		return name, l, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suffix)
		if found && m.histograms[base] {
			l := m.labels[base]
			if suffix == "_bucket" {
				l = append(l[:len(l):len(l)], "le")
			}
			return base, l, true
		}
	}
	return "", nil, false
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// Every query of the dashboard names metrics the module exports, with
// labels those metrics have: a renamed metric or label fails here rather
// than as an empty panel.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	m := moduleMetrics(t)
	data, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	used := map[string]bool{}
	queries := 0
	for _, p := range allPanels(d.Panels) {
		for _, target := range p.Targets {
			queries++
			names := metricNames(target.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no metric", p.Title, target.Expr)
			}
			var exprLabels []string
			for _, name := range names {
				metric, labels, ok := m.resolve(name)
				if !ok {
					t.Errorf("panel %q: %s is not a metric the module exports", p.Title, name)
					continue
				}
				used[metric] = true
				exprLabels = append(exprLabels, labels...)
			}
			for _, sel := range selector.FindAllStringSubmatch(quoted.ReplaceAllString(target.Expr, `""`), -1) {
				_, labels, _ := m.resolve(sel[1])
				for _, l := range matcherLabel.FindAllStringSubmatch(sel[2], -1) {
					if !scrapeLabels[l[1]] && !contains(labels, l[1]) {
						t.Errorf("panel %q: %s has no label %s", p.Title, sel[1], l[1])
					}
				}
			}
			for _, g := range grouping.FindAllStringSubmatch(target.Expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); l != "" && !scrapeLabels[l] && !contains(exprLabels, l) {
						t.Errorf("panel %q: grouping by %s, a label none of %v has", p.Title, l, names)
					}
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		for _, lv := range labelValues.FindAllStringSubmatch(string(v.Query), -1) {
			if _, ok := m.labels[lv[1]]; !ok {
				t.Errorf("variable %s: %s is not a metric the module exports", v.Name, lv[1])
			}
		}
	}
	if queries == 0 {
		t.Fatal("the dashboard has no queries")
	}
	for name := range m.labels {
		if strings.HasPrefix(name, "caddy_mcp_serializer_") && !used[name] {
			t.Logf("not on the dashboard: %s", name)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The parser the test relies on finds metric names and skips the rest.
func TestMetricNamesOfPromQL(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (reason) (rate(caddy_x_total{instance=~"$instance",le="0.1"}[$__rate_interval]))`: "caddy_x_total",
		`histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) - b offset 1h`:                "a_bucket b",
		`label_values(x, instance)`: "x instance",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// Laravel as most servers run it (Forge, Ploi, plain Debian): nginx
// serving the application with PHP-FPM. examples/laravel-nginx sends only
// /mcp to a local Caddy with mcp_serializer on the same pool. Pipelined
// connects through nginx, straight to PHP-FPM and through the recipe:
// straight, the race breaks sessions; through the recipe, none fails, and
// progress events still stream through nginx ahead of the result.
func TestLaravelBehindNginxSendsOnlyTheMCPRouteThroughTheModule(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	local := runCaddy(t, exampleCaddyfileAsIs(t, "laravel-nginx", map[string]string{
		"{$MCP_PORT:8090}":                           "{$MCP_TEST_PORT}",
		"{$APP_ROOT:/var/www/app}":                   filepath.Dir(fpm.PublicDir),
		"{$PHP_FPM_SOCKET:/run/php/php8.2-fpm.sock}": fpm.Socket,
	}))
	n := clusterN(t, 300)

	nginx := func(recipe bool) (url string) {
		t.Helper()
		addr := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
		edits := [][2]string{
			{"listen 127.0.0.1:8080;", "listen " + addr + ";"},
			{"server 127.0.0.1:8090;", "server " + strings.TrimPrefix(local.URL, "http://") + ";"},
			{"root /var/www/app/public;", "root " + fpm.PublicDir + ";"},
			{"fastcgi_pass unix:/run/php/php8.2-fpm.sock;", "fastcgi_pass unix:" + fpm.Socket + ";"},
		}
		if !recipe { // the site before the recipe: /mcp goes to PHP like any route
			edits = append(edits, [2]string{"location /mcp {", "location /not-mcp {"})
		}
		conf := renderExample(t, "laravel-nginx", "nginx.conf", edits)
		if os.Geteuid() == 0 {
			// nginx started as root runs its workers as nobody, which may
			// not reach the test's PHP-FPM socket; a site's nginx runs
			// them as the user PHP-FPM's socket is made for.
			conf = "user root;\n" + conf
		}
		startNginx(t, conf, addr)
		return "http://" + addr + "/mcp"
	}
	// --get skip: straight to PHP-FPM, the SDK's GET stream would pin a
	// worker per session for its whole life (through the module it is
	// answered 405, which wantStreamedProgress checks through nginx).
	pipeline := func(label, url string) pipelineResult { return runConnects(t, label, url, n, "skip") }

	before := readModuleCounts(t, local.Admin)
	straight := pipeline("nginx straight to PHP-FPM", nginx(false))
	if d := readModuleCounts(t, local.Admin).minus(before); d.Waits != 0 {
		t.Errorf("nginx without the recipe sent requests to Caddy: %+v", d)
	}
	if straight.Connects == 0 || straight.Rejections+straight.Broken == 0 {
		t.Errorf("straight to PHP-FPM, no session was rejected or broken: the race is not reproduced (%s)", straight.summary())
	}

	url := nginx(true)
	through := pipeline("nginx, /mcp through mcp_serializer", url)
	wantEveryConnect(t, through, n)
	if d := readModuleCounts(t, local.Admin).minus(before); d.Waits < float64(n) {
		t.Errorf("through the recipe, the module saw %v turns for %d connects: nginx did not send /mcp to it", d.Waits, n)
	}

	wantStreamedProgress(t, url)
}

// The recipe's nginx.conf passes nginx's own check as written, and keeps
// what event streams need.
func TestLaravelNginxExampleConfigChecks(t *testing.T) {
	text := renderExample(t, "laravel-nginx", "nginx.conf", nil)
	for _, want := range []string{"location /mcp {", "proxy_http_version 1.1;", `proxy_set_header Connection "";`, "proxy_buffering off;", "proxy_read_timeout 1h;", "proxy_set_header Host $host;"} {
		if !strings.Contains(text, want) {
			t.Errorf("examples/laravel-nginx/nginx.conf lacks %q", want)
		}
	}
	conf := filepath.Join(repoRoot(t), "examples", "laravel-nginx", "nginx.conf")
	if _, err := os.Stat("/etc/nginx/fastcgi_params"); err != nil {
		t.Fatalf("the recipe includes /etc/nginx/fastcgi_params: %v (apt-get install -y nginx)", err)
	}
	out, err := exec.Command(sbinTool(t, "nginx"), nginxArgs(t.TempDir(), conf, "-t")...).CombinedOutput()
	if err != nil {
		t.Errorf("nginx -t %s: %v\n%s", conf, err, out)
	}
}

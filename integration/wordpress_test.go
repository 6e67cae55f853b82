package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// adapterPath is where WordPress's MCP Adapter serves its default server.
const adapterPath = "/wp-json/mcp/mcp-adapter-default-server"

// runUsers runs 5 rounds of 4 clients of each of 2 users at once at url
// and fails the test unless every session kept working.
func runUsers(t *testing.T, label, url string) {
	t.Helper()
	wantNoSessionLost(t, label, connectUsers(t, label, url, 5, "distinct"))
}

// The WordPress example, run as written in front of PHP-FPM serving a
// backend that keeps each user's sessions in one record as the adapter
// does: several clients of one user lose no session, with pretty
// permalinks or without (the module's matcher takes both).
func TestWordPressExampleKeepsEverySessionOfAUser(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	base := startCaddy(t, exampleCaddyfileAsIs(t, "wordpress", map[string]string{
		"{$SITE_ADDRESS:wordpress.example.com}":      "http://127.0.0.1:{$MCP_TEST_PORT}",
		"{$WP_ROOT:/var/www/wordpress}":              fpm.PublicDir,
		"{$PHP_FPM_SOCKET:/run/php/php8.2-fpm.sock}": fpm.Socket,
	}))
	runUsers(t, "pretty permalinks", base+adapterPath)
	runUsers(t, "rest_route", base+"/?rest_route="+strings.TrimPrefix(adapterPath, "/wp-json"))
}

// WordPress as nginx serves it, with only the adapter's routes sent to a
// local Caddy with mcp_serializer (examples/wordpress-nginx): several
// clients of one user through nginx lose no session.
func TestWordPressBehindNginxKeepsEverySessionOfAUser(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	local := runCaddy(t, exampleCaddyfileAsIs(t, "wordpress-nginx", map[string]string{
		"{$MCP_PORT:8090}":                           "{$MCP_TEST_PORT}",
		"{$WP_ROOT:/var/www/wordpress}":              fpm.PublicDir,
		"{$PHP_FPM_SOCKET:/run/php/php8.2-fpm.sock}": fpm.Socket,
	}))
	addr := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	conf := renderExample(t, "wordpress-nginx", "nginx.conf", [][2]string{
		{"listen 127.0.0.1:8080;", "listen " + addr + ";"},
		{"server 127.0.0.1:8090;", "server " + strings.TrimPrefix(local.URL, "http://") + ";"},
		{"root /var/www/wordpress;", "root " + fpm.PublicDir + ";"},
		{"fastcgi_pass unix:/run/php/php8.2-fpm.sock;", "fastcgi_pass unix:" + fpm.Socket + ";"},
	})
	if os.Geteuid() == 0 {
		conf = "user root;\n" + conf // as in the Laravel recipe's test
	}
	startNginx(t, conf, addr)
	before := readModuleCounts(t, local.Admin)
	runUsers(t, "through nginx", "http://"+addr+adapterPath)
	if d := readModuleCounts(t, local.Admin).minus(before); d.Waits == 0 {
		t.Error("the module saw no request: nginx did not send the adapter's routes to it")
	}
}

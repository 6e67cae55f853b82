<?php
/**
 * Installs WordPress (no wp-cli here), activates the MCP Adapter plugin and
 * creates Application Passwords for the admin user.
 *
 * Usage: php setup.php <wordpress dir> [count]
 * (wp-config.php must exist; `run` writes it.)
 * Creates count Application Passwords (default 1) and prints one line per
 * password: "<user>:<application password>".
 */

if ( PHP_SAPI !== 'cli' || $argc < 2 ) {
	fwrite( STDERR, "usage: php setup.php <wordpress dir>\n" );
	exit( 2 );
}

$wp_dir = rtrim( $argv[1], '/' );
$count  = isset( $argv[2] ) ? (int) $argv[2] : 1;
if ( $count < 1 ) {
	fwrite( STDERR, "count must be 1 or more\n" );
	exit( 2 );
}

define( 'WP_INSTALLING', true );
$_SERVER['HTTP_HOST']   = parse_url( getenv( 'MEASURE_SITE_URL' ) ?: 'http://127.0.0.1', PHP_URL_HOST );
$_SERVER['REQUEST_URI'] = '/';

require $wp_dir . '/wp-load.php';
// wp_install() mails the admin; nothing to mail with here.
if ( ! function_exists( 'wp_new_blog_notification' ) ) {
	function wp_new_blog_notification( ...$args ) {}
}

require_once ABSPATH . 'wp-admin/includes/upgrade.php';
require_once ABSPATH . 'wp-admin/includes/plugin.php';

$user = 'mcp';
if ( ! is_blog_installed() ) {
	$result = wp_install( 'MCP measure', $user, 'mcp@example.invalid', false, '', wp_generate_password( 24 ) );
	if ( is_wp_error( $result ) || empty( $result['user_id'] ) ) {
		fwrite( STDERR, "wp_install failed\n" );
		exit( 1 );
	}
}

// Pretty permalinks, so /wp-json/ routes (php_fastcgi's try_files sends
// everything that is not a file to index.php).
update_option( 'permalink_structure', '/%postname%/' );
flush_rewrite_rules( false );

$activated = activate_plugin( 'mcp-adapter/mcp-adapter.php' );
if ( is_wp_error( $activated ) ) {
	fwrite( STDERR, 'activate_plugin: ' . $activated->get_error_message() . "\n" );
	exit( 1 );
}

$u = get_user_by( 'login', $user );
if ( ! $u ) {
	fwrite( STDERR, "no user $user\n" );
	exit( 1 );
}
if ( ! wp_is_application_passwords_available_for_user( $u ) ) {
	fwrite( STDERR, "application passwords are not available (WP_ENVIRONMENT_TYPE must be local over plain HTTP)\n" );
	exit( 1 );
}
// One password: named as before. Several: one per client, as WordPress's
// UI makes one per application.
$lines = array();
for ( $i = 1; $i <= $count; $i++ ) {
	$name    = 1 === $count ? 'mcp-measure' : "mcp-measure-client-$i";
	$created = WP_Application_Passwords::create_new_application_password( $u->ID, array( 'name' => $name ) );
	if ( is_wp_error( $created ) ) {
		fwrite( STDERR, 'application password: ' . $created->get_error_message() . "\n" );
		exit( 1 );
	}
	$lines[] = $user . ':' . $created[0];
}

echo implode( "\n", $lines ) . "\n";

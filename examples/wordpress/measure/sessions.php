<?php
/**
 * Looks at the adapter's per-user session map (user meta
 * `mcp_adapter_sessions` of user "mcp").
 *
 * Usage: php sessions.php <wordpress dir> count|clear
 *   count: prints how many sessions the map holds
 *   clear: deletes the map (before each configuration, so that left-over
 *          sessions of one configuration do not count against the adapter's
 *          32-sessions-per-user limit in the next)
 */

if ( PHP_SAPI !== 'cli' || $argc < 3 ) {
	fwrite( STDERR, "usage: php sessions.php <wordpress dir> count|clear\n" );
	exit( 2 );
}
$_SERVER['HTTP_HOST']   = '127.0.0.1';
$_SERVER['REQUEST_URI'] = '/';
require rtrim( $argv[1], '/' ) . '/wp-load.php';

$u = get_user_by( 'login', 'mcp' );
if ( ! $u ) {
	fwrite( STDERR, "no user mcp\n" );
	exit( 1 );
}
if ( 'clear' === $argv[2] ) {
	delete_user_meta( $u->ID, 'mcp_adapter_sessions' );
	echo "0\n";
	exit( 0 );
}
$sessions = get_user_meta( $u->ID, 'mcp_adapter_sessions', true );
echo ( is_array( $sessions ) ? count( $sessions ) : 0 ) . "\n";

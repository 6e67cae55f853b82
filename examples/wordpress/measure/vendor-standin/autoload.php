<?php
/**
 * STAND-IN for the MCP Adapter plugin's Composer vendor/autoload.php
 * (Composer's registry is not reachable here, so `composer install` cannot
 * run). `run` copies this file to <plugin>/vendor/autoload.php and the
 * schema stand-in beside it.
 *
 * - PSR-4 `WP\MCP\` => <plugin>/includes/, as the plugin's composer.json says.
 * - `WP\McpSchema\` (package wordpress/php-mcp-schema): see
 *   mcp-schema-standin.php.
 */

spl_autoload_register(
	static function ( string $class ): void {
		$prefix = 'WP\\MCP\\';
		if ( 0 !== strncmp( $class, $prefix, strlen( $prefix ) ) ) {
			return;
		}
		$file = dirname( __DIR__ ) . '/includes/' . str_replace( '\\', '/', substr( $class, strlen( $prefix ) ) ) . '.php';
		if ( is_file( $file ) ) {
			require $file;
		}
	}
);

require_once __DIR__ . '/mcp-schema-standin.php';

return true;

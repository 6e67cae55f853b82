<?php
/**
 * STAND-IN for the Composer package wordpress/php-mcp-schema (v0.1.x,
 * namespace WP\McpSchema\), which the MCP Adapter plugin requires and which
 * cannot be installed here (no Composer registry, no snapshot of its
 * repository).
 *
 * It defines only the classes the adapter names, as generic data holders:
 * fromArray() keeps the array, toArray() gives it back (nested DTOs turned
 * into arrays, null fields left out, except `id` of a JSON-RPC error
 * response), and getFoo() returns the field `foo`. Nested fields that the
 * adapter reads as objects (error, annotations, icons, execution, content
 * blocks, ...) are turned into the matching stand-in class. There is no
 * validation.
 *
 * None of this is on the session path that the measurement is about
 * (SessionManager, HttpSessionValidator, HttpRequestHandler are the real
 * plugin code); it only shapes the JSON of the initialize, tools/list,
 * prompts/list, resources/list and error answers.
 */

declare(strict_types=1);

namespace WP\McpSchema\Common {

	final class McpConstants {
		public const JSONRPC_VERSION  = '2.0';
		public const LATEST_PROTOCOL_VERSION = '2025-11-25';
		public const PARSE_ERROR      = -32700;
		public const INVALID_REQUEST  = -32600;
		public const METHOD_NOT_FOUND = -32601;
		public const INVALID_PARAMS   = -32602;
		public const INTERNAL_ERROR   = -32603;
	}

	abstract class AbstractDataTransferObject {
		/** field => [class, 'one'|'list'] or 'content' / 'content-list' */
		protected const NESTED = array();
		/** fields kept in toArray() even when null */
		protected const KEEP_NULL = array();

		/** @var array<string, mixed> */
		protected array $data = array();

		final public function __construct() {}

		/** @return static */
		public static function fromArray( array $data ): self {
			$o = new static();
			foreach ( $data as $k => $v ) {
				$o->data[ $k ] = static::hydrate( (string) $k, $v );
			}
			return $o;
		}

		protected static function hydrate( string $field, $value ) {
			if ( ! isset( static::NESTED[ $field ] ) || ! is_array( $value ) ) {
				return $value;
			}
			$spec = static::NESTED[ $field ];
			if ( 'content' === $spec ) {
				return \WP\McpSchema\Common\Protocol\Union\ContentBlocks::make( $value );
			}
			if ( 'content-list' === $spec ) {
				return array_map(
					static fn( $b ) => is_array( $b ) ? \WP\McpSchema\Common\Protocol\Union\ContentBlocks::make( $b ) : $b,
					$value
				);
			}
			list( $class, $shape ) = $spec;
			if ( 'one' === $shape ) {
				return $class::fromArray( $value );
			}
			return array_map( static fn( $i ) => is_array( $i ) ? $class::fromArray( $i ) : $i, $value );
		}

		protected static function plain( $v ) {
			if ( $v instanceof self ) {
				return $v->toArray();
			}
			if ( is_array( $v ) ) {
				return array_map( array( self::class, 'plain' ), $v );
			}
			return $v;
		}

		public function toArray(): array {
			$out = array();
			foreach ( $this->data as $k => $v ) {
				if ( null === $v && ! in_array( $k, static::KEEP_NULL, true ) ) {
					continue;
				}
				$out[ $k ] = self::plain( $v );
			}
			return $out;
		}

		public function toJson(): string {
			return json_encode( $this->toArray(), JSON_THROW_ON_ERROR );
		}

		/** @return static */
		public static function fromJson( string $json ): self {
			return static::fromArray( json_decode( $json, true, 512, JSON_THROW_ON_ERROR ) );
		}

		public function __call( string $name, array $args ) {
			if ( 0 === strpos( $name, 'get' ) ) {
				return $this->data[ lcfirst( substr( $name, 3 ) ) ] ?? null;
			}
			throw new \BadMethodCallException( static::class . '::' . $name . ' (not in the php-mcp-schema stand-in)' );
		}
	}
}

namespace WP\McpSchema\Common\Protocol\Union {

	interface ContentBlockInterface {
		public function toArray(): array;
	}

	final class ContentBlocks {
		public static function make( array $b ) {
			switch ( $b['type'] ?? '' ) {
				case 'image':
					return \WP\McpSchema\Common\Content\DTO\ImageContent::fromArray( $b );
				case 'audio':
					return \WP\McpSchema\Common\Content\DTO\AudioContent::fromArray( $b );
				case 'resource':
					return \WP\McpSchema\Common\Protocol\DTO\EmbeddedResource::fromArray( $b );
				default:
					return \WP\McpSchema\Common\Content\DTO\TextContent::fromArray( $b );
			}
		}
	}
}

namespace WP\McpSchema\Common\Core\DTO {
	class Icon extends \WP\McpSchema\Common\AbstractDataTransferObject {}
}

namespace WP\McpSchema\Common\Protocol\DTO {

	use WP\McpSchema\Common\AbstractDataTransferObject;
	use WP\McpSchema\Common\Protocol\Union\ContentBlockInterface;

	class Annotations extends AbstractDataTransferObject {}
	class Result extends AbstractDataTransferObject {}
	class InitializeResult extends AbstractDataTransferObject {}
	class TextResourceContents extends AbstractDataTransferObject {}
	class BlobResourceContents extends AbstractDataTransferObject {}
	class EmbeddedResource extends AbstractDataTransferObject implements ContentBlockInterface {
		public const TYPE     = 'resource';
		protected const NESTED = array( 'annotations' => array( Annotations::class, 'one' ) );
	}
}

namespace WP\McpSchema\Common\Content\DTO {

	use WP\McpSchema\Common\AbstractDataTransferObject;
	use WP\McpSchema\Common\Protocol\DTO\Annotations;
	use WP\McpSchema\Common\Protocol\Union\ContentBlockInterface;

	class TextContent extends AbstractDataTransferObject implements ContentBlockInterface {
		public const TYPE     = 'text';
		protected const NESTED = array( 'annotations' => array( Annotations::class, 'one' ) );
	}
	class ImageContent extends AbstractDataTransferObject implements ContentBlockInterface {
		public const TYPE     = 'image';
		protected const NESTED = array( 'annotations' => array( Annotations::class, 'one' ) );
	}
	class AudioContent extends AbstractDataTransferObject implements ContentBlockInterface {
		public const TYPE     = 'audio';
		protected const NESTED = array( 'annotations' => array( Annotations::class, 'one' ) );
	}
}

namespace WP\McpSchema\Common\JsonRpc\DTO {

	use WP\McpSchema\Common\AbstractDataTransferObject;

	class Error extends AbstractDataTransferObject {}
	class JSONRPCErrorResponse extends AbstractDataTransferObject {
		protected const NESTED    = array( 'error' => array( Error::class, 'one' ) );
		protected const KEEP_NULL = array( 'id' );
	}
}

namespace WP\McpSchema\Common\Lifecycle\DTO {
	class Implementation extends \WP\McpSchema\Common\AbstractDataTransferObject {
		protected const NESTED = array( 'icons' => array( \WP\McpSchema\Common\Core\DTO\Icon::class, 'list' ) );
	}
}

namespace WP\McpSchema\Server\Lifecycle\DTO {
	class ServerCapabilities extends \WP\McpSchema\Common\AbstractDataTransferObject {}
}

namespace WP\McpSchema\Server\Tools\DTO {

	use WP\McpSchema\Common\AbstractDataTransferObject;
	use WP\McpSchema\Common\Core\DTO\Icon;

	class ToolAnnotations extends AbstractDataTransferObject {}
	class ToolExecution extends AbstractDataTransferObject {}
	class Tool extends AbstractDataTransferObject {
		protected const NESTED = array(
			'annotations' => array( ToolAnnotations::class, 'one' ),
			'execution'   => array( ToolExecution::class, 'one' ),
			'icons'       => array( Icon::class, 'list' ),
		);

		public function toArray(): array {
			$out = parent::toArray();
			// As php-mcp-schema 0.1.2: `properties` is always a JSON object.
			foreach ( array( 'inputSchema', 'outputSchema' ) as $k ) {
				if ( isset( $out[ $k ] ) && is_array( $out[ $k ] ) ) {
					$p                        = $out[ $k ]['properties'] ?? array();
					$out[ $k ]['properties'] = ( is_array( $p ) && array() === $p ) ? new \stdClass() : $p;
				}
			}
			return $out;
		}
	}
	class CallToolResult extends AbstractDataTransferObject {
		protected const NESTED = array( 'content' => 'content-list' );
	}
	class ListToolsResult extends AbstractDataTransferObject {
		protected const NESTED = array( 'tools' => array( Tool::class, 'list' ) );
	}
}

namespace WP\McpSchema\Server\Prompts\DTO {

	use WP\McpSchema\Common\AbstractDataTransferObject;
	use WP\McpSchema\Common\Core\DTO\Icon;

	class PromptArgument extends AbstractDataTransferObject {}
	class Prompt extends AbstractDataTransferObject {
		protected const NESTED = array(
			'arguments' => array( PromptArgument::class, 'list' ),
			'icons'     => array( Icon::class, 'list' ),
		);
	}
	class PromptMessage extends AbstractDataTransferObject {
		protected const NESTED = array( 'content' => 'content' );
	}
	class ListPromptsResult extends AbstractDataTransferObject {
		protected const NESTED = array( 'prompts' => array( Prompt::class, 'list' ) );
	}
	class GetPromptResult extends AbstractDataTransferObject {
		protected const NESTED = array( 'messages' => array( PromptMessage::class, 'list' ) );
	}
}

namespace WP\McpSchema\Server\Resources\DTO {

	use WP\McpSchema\Common\AbstractDataTransferObject;
	use WP\McpSchema\Common\Core\DTO\Icon;
	use WP\McpSchema\Common\Protocol\DTO\Annotations;

	class Resource extends AbstractDataTransferObject {
		protected const NESTED = array(
			'annotations' => array( Annotations::class, 'one' ),
			'icons'       => array( Icon::class, 'list' ),
		);
	}
	class ListResourcesResult extends AbstractDataTransferObject {
		protected const NESTED = array( 'resources' => array( Resource::class, 'list' ) );
	}
	class ReadResourceResult extends AbstractDataTransferObject {}
}

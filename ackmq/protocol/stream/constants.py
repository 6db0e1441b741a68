"""RabbitMQ's stream protocol (rabbitmq_stream's PROTOCOL.adoc): command keys, response
codes and offset types, named as the document names them."""

from __future__ import annotations

from typing import Final

# command keys (a response has the top bit set: RESPONSE | key)
DECLARE_PUBLISHER: Final = 0x0001
PUBLISH: Final = 0x0002
PUBLISH_CONFIRM: Final = 0x0003
PUBLISH_ERROR: Final = 0x0004
QUERY_PUBLISHER_SEQUENCE: Final = 0x0005
DELETE_PUBLISHER: Final = 0x0006
SUBSCRIBE: Final = 0x0007
DELIVER: Final = 0x0008
CREDIT: Final = 0x0009
STORE_OFFSET: Final = 0x000A
QUERY_OFFSET: Final = 0x000B
UNSUBSCRIBE: Final = 0x000C
CREATE: Final = 0x000D
DELETE: Final = 0x000E
METADATA: Final = 0x000F
METADATA_UPDATE: Final = 0x0010
PEER_PROPERTIES: Final = 0x0011
SASL_HANDSHAKE: Final = 0x0012
SASL_AUTHENTICATE: Final = 0x0013
TUNE: Final = 0x0014
OPEN: Final = 0x0015
CLOSE: Final = 0x0016
HEARTBEAT: Final = 0x0017
ROUTE: Final = 0x0018
PARTITIONS: Final = 0x0019
CONSUMER_UPDATE: Final = 0x001A
EXCHANGE_COMMAND_VERSIONS: Final = 0x001B
STREAM_STATS: Final = 0x001C
CREATE_SUPER_STREAM: Final = 0x001D
DELETE_SUPER_STREAM: Final = 0x001E
RESOLVE_OFFSET_SPEC: Final = 0x001F
RESPONSE: Final = 0x8000

# response codes
OK: Final = 0x01
STREAM_DOES_NOT_EXIST: Final = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS: Final = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST: Final = 0x04
STREAM_ALREADY_EXISTS: Final = 0x05
STREAM_NOT_AVAILABLE: Final = 0x06
SASL_MECHANISM_NOT_SUPPORTED: Final = 0x07
AUTHENTICATION_FAILURE: Final = 0x08
SASL_ERROR: Final = 0x09
SASL_CHALLENGE: Final = 0x0A
SASL_AUTHENTICATION_FAILURE_LOOPBACK: Final = 0x0B
VIRTUAL_HOST_ACCESS_FAILURE: Final = 0x0C
UNKNOWN_FRAME: Final = 0x0D
FRAME_TOO_LARGE: Final = 0x0E
INTERNAL_ERROR: Final = 0x0F
ACCESS_REFUSED: Final = 0x10
PRECONDITION_FAILED: Final = 0x11
PUBLISHER_DOES_NOT_EXIST: Final = 0x12
NO_OFFSET: Final = 0x13

# the codes RabbitMQ counts as rabbitmq_global_stream_error_<name>_total (rabbit_stream
# plugin's protocol counters; OK and NO_OFFSET have none)
ERROR_NAMES: Final = {
    STREAM_DOES_NOT_EXIST: "stream_does_not_exist",
    SUBSCRIPTION_ID_ALREADY_EXISTS: "subscription_id_already_exists",
    SUBSCRIPTION_ID_DOES_NOT_EXIST: "subscription_id_does_not_exist",
    STREAM_ALREADY_EXISTS: "stream_already_exists",
    STREAM_NOT_AVAILABLE: "stream_not_available",
    SASL_MECHANISM_NOT_SUPPORTED: "sasl_mechanism_not_supported",
    AUTHENTICATION_FAILURE: "authentication_failure",
    SASL_ERROR: "sasl_error",
    SASL_CHALLENGE: "sasl_challenge",
    SASL_AUTHENTICATION_FAILURE_LOOPBACK: "sasl_authentication_failure_loopback",
    VIRTUAL_HOST_ACCESS_FAILURE: "vhost_access_failure",
    UNKNOWN_FRAME: "unknown_frame",
    FRAME_TOO_LARGE: "frame_too_large",
    INTERNAL_ERROR: "internal_error",
    ACCESS_REFUSED: "access_refused",
    PRECONDITION_FAILED: "precondition_failed",
    PUBLISHER_DOES_NOT_EXIST: "publisher_does_not_exist",
}

# offset specification types (Subscribe, ConsumerUpdate's answer)
OFFSET_NONE: Final = 0
OFFSET_FIRST: Final = 1
OFFSET_LAST: Final = 2
OFFSET_NEXT: Final = 3
OFFSET_OFFSET: Final = 4
OFFSET_TIMESTAMP: Final = 5

# osiris chunks (Deliver's payload)
CHUNK_MAGIC_VERSION: Final = 0x50  # magic 5, version 0
CHUNK_USER: Final = 0
SUBENTRY_FLAG: Final = 0x80  # an entry's first bit: a sub-entry batch
COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1

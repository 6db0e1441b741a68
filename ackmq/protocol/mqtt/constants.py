"""MQTT's numbers as tables: packet types, protocol levels, reason codes (5.0 and the 3.1.1
CONNACK return codes) and the 5.0 properties (identifier, name, type, the packets that
may carry it). Names are the specification's, in snake case."""

from __future__ import annotations

# -- packet types (fixed header, high nibble) ---------------------------------------------
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP = 8, 9, 10, 11, 12, 13
DISCONNECT, AUTH = 14, 15
PACKET_NAMES = {1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC",
                6: "PUBREL", 7: "PUBCOMP", 8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE",
                11: "UNSUBACK", 12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH"}
# the fixed header's low nibble where the specification fixes it (PUBLISH's carries flags)
FIXED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0,
               14: 0, 15: 0}

# -- protocol levels ------------------------------------------------------------------------
MQTT31, MQTT311, MQTT5 = 3, 4, 5
PROTOCOL_NAMES = {MQTT31: "MQIsdp", MQTT311: "MQTT", MQTT5: "MQTT"}

# -- the largest remaining length a variable byte integer holds (256 MB) --------------------
MAX_VARINT = 268_435_455

# -- 3.1/3.1.1 CONNACK return codes ---------------------------------------------------------
ACCEPTED = 0
REFUSED_PROTOCOL_VERSION = 1
REFUSED_IDENTIFIER_REJECTED = 2
REFUSED_SERVER_UNAVAILABLE = 3
REFUSED_BAD_USERNAME_PASSWORD = 4
REFUSED_NOT_AUTHORIZED = 5

# -- 5.0 reason codes -----------------------------------------------------------------------
SUCCESS = 0x00                      # also normal disconnection, granted QoS 0
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
RE_AUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# a 5.0 refusal of CONNECT as the 3.1.1 return code that says the most of it
V311_CONNACK = {UNSUPPORTED_PROTOCOL_VERSION: REFUSED_PROTOCOL_VERSION,
                CLIENT_IDENTIFIER_NOT_VALID: REFUSED_IDENTIFIER_REJECTED,
                BAD_USER_NAME_OR_PASSWORD: REFUSED_BAD_USERNAME_PASSWORD,
                NOT_AUTHORIZED: REFUSED_NOT_AUTHORIZED, QUOTA_EXCEEDED: REFUSED_NOT_AUTHORIZED,
                SERVER_UNAVAILABLE: REFUSED_SERVER_UNAVAILABLE,
                SERVER_BUSY: REFUSED_SERVER_UNAVAILABLE}

# -- 5.0 properties -------------------------------------------------------------------------
# value types
BYTE, TWO, FOUR, VARINT, UTF8, BINARY, PAIR = range(7)
_WILL = 0  # the will properties of CONNECT's payload: a pseudo packet type
_ALL_ACKS = {PUBACK, PUBREC, PUBREL, PUBCOMP}
# identifier: (name, type, packet types that may carry it)
PROPERTIES: dict[int, tuple[str, int, frozenset[int]]] = {
    0x01: ("payload_format_indicator", BYTE, frozenset({PUBLISH, _WILL})),
    0x02: ("message_expiry_interval", FOUR, frozenset({PUBLISH, _WILL})),
    0x03: ("content_type", UTF8, frozenset({PUBLISH, _WILL})),
    0x08: ("response_topic", UTF8, frozenset({PUBLISH, _WILL})),
    0x09: ("correlation_data", BINARY, frozenset({PUBLISH, _WILL})),
    0x0B: ("subscription_identifier", VARINT, frozenset({PUBLISH, SUBSCRIBE})),
    0x11: ("session_expiry_interval", FOUR, frozenset({CONNECT, CONNACK, DISCONNECT})),
    0x12: ("assigned_client_identifier", UTF8, frozenset({CONNACK})),
    0x13: ("server_keep_alive", TWO, frozenset({CONNACK})),
    0x15: ("authentication_method", UTF8, frozenset({CONNECT, CONNACK, AUTH})),
    0x16: ("authentication_data", BINARY, frozenset({CONNECT, CONNACK, AUTH})),
    0x17: ("request_problem_information", BYTE, frozenset({CONNECT})),
    0x18: ("will_delay_interval", FOUR, frozenset({_WILL})),
    0x19: ("request_response_information", BYTE, frozenset({CONNECT})),
    0x1A: ("response_information", UTF8, frozenset({CONNACK})),
    0x1C: ("server_reference", UTF8, frozenset({CONNACK, DISCONNECT})),
    0x1F: ("reason_string", UTF8, frozenset({CONNACK, SUBACK, UNSUBACK, DISCONNECT, AUTH}
                                           | _ALL_ACKS)),
    0x21: ("receive_maximum", TWO, frozenset({CONNECT, CONNACK})),
    0x22: ("topic_alias_maximum", TWO, frozenset({CONNECT, CONNACK})),
    0x23: ("topic_alias", TWO, frozenset({PUBLISH})),
    0x24: ("maximum_qos", BYTE, frozenset({CONNACK})),
    0x25: ("retain_available", BYTE, frozenset({CONNACK})),
    0x26: ("user_property", PAIR, frozenset(range(16))),
    0x27: ("maximum_packet_size", FOUR, frozenset({CONNECT, CONNACK})),
    0x28: ("wildcard_subscription_available", BYTE, frozenset({CONNACK})),
    0x29: ("subscription_identifier_available", BYTE, frozenset({CONNACK})),
    0x2A: ("shared_subscription_available", BYTE, frozenset({CONNACK})),
}
PROPERTY_IDS = {name: (ident, kind) for ident, (name, kind, _) in PROPERTIES.items()}
# properties that may repeat: a list of values (user properties: a list of (name, value))
REPEATABLE = frozenset({"user_property", "subscription_identifier"})
WILL = _WILL

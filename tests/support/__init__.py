"""Test helpers shared by the test modules (not tests themselves): raw AMQP and STOMP
peers, management-API targets, pika and client helpers, a connection-cutting proxy, TLS
files. Imported as `from support.x import …` (tests/ is on pytest's path)."""

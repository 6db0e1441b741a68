"""The STOMP 1.0-1.2 front end (SPEC W): `StompConnection` on the same broker model as
AMQP, with its subscriptions and named transactions."""

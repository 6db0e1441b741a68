"""The AMQP 1.0 front end (SPEC A): connection.py (SASL, open, close, heartbeats),
session.py (a session is one model channel), links.py (sender and receiver links)."""

"""RabbitMQ's stream protocol front end (port 5552): docs/stream-protocol.md."""

"""Sans-IO codec of RabbitMQ's stream protocol (rabbitmq_stream, port 5552): frames and
commands (frames.py, one table of request layouts), osiris chunks (chunk.py), the
protocol's keys and codes (constants.py). docs/stream-protocol.md."""

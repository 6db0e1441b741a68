"""The AMQP 0-9-1 front end: `AMQPConnection` (handshake, channels, heartbeats) and
`AMQPChannel` (methods to model calls, model output to frames)."""

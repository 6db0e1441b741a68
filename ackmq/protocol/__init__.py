"""Wire protocols spoken by ackmq (AMQP 0-9-1 in `ackmq.protocol.amqp`)."""

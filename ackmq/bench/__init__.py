"""`ackmq bench`: the benchmark suite, run side by side against any AMQP 0-9-1 broker."""

"""Building blocks the runners share: an `ackmq serve` of a run's own with its log in a
file (ownbroker.py) and a minimal raw AMQP 0-9-1 peer for hostile input (rawpeer.py)."""

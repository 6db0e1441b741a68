"""Measurement runners beyond `ackmq bench` (docs/benchmarks.md, docs/scaling.md): the
scaling report (scaling.py), broker CPU per message (cpu.py), deep queues, many queues,
streams, management and UI listings under load, and in-process cost probes (codec.py,
access_cost.py, stats_cost.py, storebench.py). They print figures; the tests check they
run, not what they print."""

"""The operations-surface audit (SPEC M8): the same management, health-check and
Prometheus calls against RabbitMQ 3.10 and ackmq, their answers compared.

`probes.py` makes the calls and keeps of each answer what a script or dashboard reads
(codes, reason texts, keys, property values, metric families and label names);
`compare.py` lists the differences and the ones that stay on purpose (`KNOWN`, each
with its reason, documented in docs/management.md and docs/metrics.md);
`rabbitmq-3.10.json` holds RabbitMQ's answers, so the comparison runs without it.

    python -m tools.audit record                       # re-record RabbitMQ's answers
    python -m tools.audit compare --url http://127.0.0.1:15672 --amqp-port 5672
"""

"""`ackmq ctl`: rabbitmqctl's verbs against a running broker, over its admin socket
(socket_client.py; the broker's side is server/ctl/) or, with `--url`, a broker's
management HTTP API (http_client.py). command.py parses and prints; access.py and
topology.py are the verbs that need more than one request."""

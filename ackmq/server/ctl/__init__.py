"""The `ackmq ctl` front end: the admin socket `<data dir>/ctl.sock` (listener.py), a
front end beside amqp/, stomp/ and http/, built from the management context
(`HttpContext`: the broker, access model, connections, resource monitor and listener
ports), with rabbitmqctl's verbs (verbs.py: access; topology.py: listings, purge,
delete, close, status, through server/views.py and server/ops.py as the HTTP API;
alarms.py: resource alarms)."""

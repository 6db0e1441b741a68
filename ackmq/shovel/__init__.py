"""Dynamic shovels with RabbitMQ's interface (SPEC V1, V2): a shovel moves messages from
a queue (or an exchange) to a queue or an exchange, on this broker (`amqp://`) or
another (ackmq or RabbitMQ), speaking AMQP 0-9-1 through ackmq.client.

Above the client in the layers: the server never imports this package; `ackmq serve`
(cli.py) registers `ShovelComponent` in the server's parameter registry
(server/parameters.py), which saves, lists and runs shovels. config.py checks a
shovel's definition with RabbitMQ's texts; worker.py moves the messages (on-confirm:
acked at the source only once the destination confirmed); component.py runs one worker
per shovel and answers the status API. docs/shovels.md."""

"""The `shovel` component of the server's parameter registry (server/parameters.py):
checks a definition (config.py's RabbitMQ texts), runs one Worker per shovel, answers
the status API (/api/shovels, `ackmq ctl shovel_status`) as RabbitMQ 3.10's
rabbit_shovel_status, and deletes a shovel whose src-delete-after is reached."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ackmq.server.parameters import ParameterError, Parameters
from ackmq.shovel.config import parse, redact, validate

if TYPE_CHECKING:
    from ackmq.shovel.worker import Worker

NAME = "shovel"


class ShovelComponent:
    name = NAME

    def __init__(self, registry: Parameters) -> None:
        self.registry = registry
        self.workers: dict[tuple[str, str], Worker] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def validate(self, vhost: str, name: str, value: Any, user: str) -> None:
        errors = validate(name, value)
        if errors:
            raise ParameterError(errors)

    def set(self, vhost: str, name: str, value: Any, user: str) -> None:
        from ackmq.shovel.worker import Worker  # ackmq.client: loaded with the first shovel
        self.clear(vhost, name)
        w = Worker(parse(vhost, name, value), self.registry.local, user, self._done)
        self.workers[(vhost, name)] = w
        w.start()

    def clear(self, vhost: str, name: str) -> None:
        w = self.workers.pop((vhost, name), None)
        if w is not None:
            self._stop_later(w)

    def _stop_later(self, w: Worker) -> None:
        task = asyncio.get_running_loop().create_task(w.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _done(self, w: Worker) -> None:
        """src-delete-after reached: the shovel deletes itself, as RabbitMQ's."""
        if self.workers.get((w.cfg.vhost, w.cfg.name)) is w:
            self.registry.clear(NAME, w.cfg.vhost, w.cfg.name)

    def restart(self, vhost: str, name: str) -> bool:
        w = self.workers.get((vhost, name))
        if w is None:
            return False
        self.set(vhost, name, w.cfg.value, w.user)
        return True

    async def stop(self) -> None:
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.stop() for w in workers), *self._stopping,
                             return_exceptions=True)

    def status(self, vhost: str | None) -> list[dict[str, Any]]:
        out = []
        for (v, n), w in sorted(self.workers.items()):
            if vhost is not None and v != vhost:
                continue
            s: dict[str, Any] = {
                "node": self.registry.local.node,
                "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.since)),
                "name": n, "vhost": v, "type": "dynamic", "state": w.state}
            if w.state == "running":
                cfg = w.cfg
                s.update({"src_uri": redact(w.src_uri), "src_protocol": cfg.src.protocol,
                          "dest_protocol": cfg.dest.protocol,
                          "dest_uri": redact(w.dest_uri)})
                for key, val in (("src_exchange", cfg.src.exchange),
                                 ("src_exchange_key", cfg.src.exchange_key),
                                 ("src_queue", cfg.src.queue),
                                 ("src_address", cfg.src.address),
                                 ("dest_exchange", cfg.dest.exchange),
                                 ("dest_exchange_key", cfg.dest.exchange_key),
                                 ("dest_queue", cfg.dest.queue),
                                 ("dest_address", cfg.dest.address)):
                    if val is not None:
                        s[key] = val
            elif w.state == "terminated" and w.reason is not None:
                s["reason"] = w.reason
            out.append(s)
        return out

"""A databuffer Redis per machine: the driver's side of `services.databuffer_per_machine`.

siiRL starts one data buffer per trainer node; dagrl by default sends every shard of every
rank through one Redis, the point a large job chokes on. With one instance per machine a
producer writes its shard on its own machine and consumers read it from there
(`dagrl_databuffer.keys`: where a shard lives), so the bytes of a step spread over the
machines as the plan's layout does.

For each planned machine the driver starts a `MachineRedis` actor on the Ray node bound to
it (no CPU reserved: Redis is I/O). The actor starts a private redis-server on that node's
address, on a free port, with a random password (in a private config file, not on the command
line) and `die_with_parent`, so it ends with the actor however the actor ends. The URLs, in
the plan's machine order, reach every rank through `WorkerSpec.machine_buffer_urls`. A run
restarted after a failure starts new instances (its data namespace is new anyway).

`services.databuffer_urls` gives the instances instead (one URL per planned machine, for
Redis servers run by the cluster's operator); `machine_buffer_urls` checks their number.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import redis
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dagrl.config import ServicesConfig
from dagrl.local import LocalRedis
from dagrl_worker.driver.placement import MachineNeed, PlacementError

START_TIMEOUT_S = 60.0


@ray.remote(num_cpus=0)
class MachineRedis:
    """A redis-server on the node this actor runs on, living as long as the actor."""

    def __init__(self, maxmemory_bytes: int) -> None:
        self.server = LocalRedis(host=ray.util.get_node_ip_address(),
                                 password=secrets.token_hex(16),
                                 maxmemory_bytes=maxmemory_bytes, die_with_parent=True).start()

    def url(self) -> str:
        return self.server.url

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def stop(self) -> int:
        """Stop the server; returns the bytes it received over its life (its traffic in)."""
        with redis.Redis.from_url(self.server.url, socket_timeout=5) as client:
            received = int(client.info("stats")["total_net_input_bytes"])
        self.server.stop()
        return received


def machine_buffer_urls(services: ServicesConfig, needs: Sequence[MachineNeed],
                        binding: Mapping[str, str]) -> tuple[tuple[str, ...], list[Any]]:
    """(one databuffer URL per planned machine in plan order, the actors started for them);
    ((), []) when the job keeps every shard in one Redis."""
    if services.databuffer_urls:
        if len(services.databuffer_urls) != len(needs):
            raise PlacementError(
                f"services.databuffer_urls lists {len(services.databuffer_urls)} Redis URL(s) "
                f"but the plan has {len(needs)} machine(s) "
                f"({', '.join(need.name for need in needs)}); give one per machine, in that "
                "order")
        return tuple(services.databuffer_urls), []
    if not services.databuffer_per_machine:
        return (), []
    memory = int(services.databuffer_memory_gib * (1 << 30))
    actors = [MachineRedis.options(  # type: ignore[attr-defined]
        scheduling_strategy=NodeAffinitySchedulingStrategy(binding[need.name], soft=False),
    ).remote(memory) for need in needs]
    try:
        urls = ray.get([actor.url.remote() for actor in actors], timeout=START_TIMEOUT_S)
    except Exception as exc:
        stop_machine_buffers(actors)
        raise PlacementError(
            f"could not start a databuffer Redis on every machine "
            f"(services.databuffer_per_machine): {str(exc).strip().splitlines()[-1][:300]}; "
            "each Ray node needs redis-server on its PATH (`make install` installs it)") from exc
    return tuple(urls), actors


def stop_machine_buffers(actors: Sequence[Any]) -> list[int | None]:
    """Stop the servers, then the actors; each one's bytes received, None where it could not
    say (best effort: a lost node's actor is gone, and its server with it)."""
    stops = [actor.stop.remote() for actor in actors]
    ray.wait(stops, num_returns=len(stops), timeout=10)
    received: list[int | None] = []
    for stop in stops:
        try:
            received.append(ray.get(stop, timeout=0))
        except Exception:  # the actor died with its node, or its server did
            received.append(None)
    for actor in actors:
        ray.kill(actor, no_restart=True)
    return received

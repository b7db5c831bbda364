"""Local helper processes for the embedded single-machine mode, tests and benches."""

from dagrl.local.processes import stop_process
from dagrl.local.redis_server import LocalRedis

__all__ = ["LocalRedis", "stop_process"]

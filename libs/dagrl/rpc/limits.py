"""gRPC message-size limits: each one used by both ends of its service.

A server's options and its clients' channel options take the same constant from here, so a
message one side may send the other side may receive (gRPC's default is 4 MiB on receive).
"""

from __future__ import annotations

# A plan of a built-in workflow on the largest cluster the planner accepts (131072 slots, e.g.
# `dagrl plan --nodes 16384 --devices-per-node 8`) is 6-8 MiB; requests carry the cluster too.
SCHEDULER_MAX_MESSAGE_BYTES = 64 << 20
DATABUFFER_MAX_MESSAGE_BYTES = 64 << 20  # the largest PutShard/GetShard chunk message


def message_size_options(max_bytes: int) -> list[tuple[str, int]]:
    """Channel or server options that let messages up to `max_bytes` through, both ways."""
    return [("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes)]

"""Planning: a validated workflow and a cluster in, a deterministic `Plan` out. Pure functions.

    plan = make_plan(load_workflow("two_agent"), Cluster.homogeneous(4, 8, device_kind="cuda"))
    plan.to_proto()  # what the worker reads

Modules, in the order `make_plan` uses them: `split` (irreducible subgraphs), `demands` (cost
and needs from node config), `apportion` (ranks per subgraph), `placement` (ranks on machines),
`groups` (process groups, layouts), `plan` (the result and its proto form), `choice` (the
split plan or the workflow unsplit, by cost). No I/O, no Redis, no gRPC server here.
"""

from dagrl_scheduler.planning.apportion import Allotment, Share, apportion, largest_remainder
from dagrl_scheduler.planning.cluster import Cluster, ClusterNode, Requirement
from dagrl_scheduler.planning.demands import NodeDemand, format_size, node_demands, parse_size
from dagrl_scheduler.planning.errors import InsufficientResourcesError, PlanningError
from dagrl_scheduler.planning.groups import NodeLayout, ProcessGroup
from dagrl_scheduler.planning.plan import (
    Plan,
    RankPlacement,
    SubgraphPlan,
    cluster_from_proto,
    cluster_to_proto,
)
from dagrl_scheduler.planning.planner import make_plan
from dagrl_scheduler.planning.split import split_workflow

__all__ = [
    "Allotment",
    "Cluster",
    "ClusterNode",
    "InsufficientResourcesError",
    "NodeDemand",
    "NodeLayout",
    "Plan",
    "PlanningError",
    "ProcessGroup",
    "RankPlacement",
    "Requirement",
    "Share",
    "SubgraphPlan",
    "apportion",
    "cluster_from_proto",
    "cluster_to_proto",
    "format_size",
    "largest_remainder",
    "make_plan",
    "node_demands",
    "parse_size",
    "split_workflow",
]

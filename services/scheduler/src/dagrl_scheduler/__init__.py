"""dagrl scheduler service: plans a workflow onto a cluster; accepts, launches and tracks jobs."""

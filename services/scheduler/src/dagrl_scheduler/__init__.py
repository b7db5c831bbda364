"""dagrl scheduler service: planning a workflow onto a cluster (subgraphs, ranks, placement, process groups) and the job API."""

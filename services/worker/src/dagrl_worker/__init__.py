"""dagrl worker service: the job driver and the Ray DAGWorker actors that execute DAG nodes."""

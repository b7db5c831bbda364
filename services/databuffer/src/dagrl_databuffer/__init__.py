"""dagrl databuffer service: Batch shards in Redis between DAG nodes: put, resharded get, lifecycle, quotas."""

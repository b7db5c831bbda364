"""dagrl databuffer: Batch shards between DAG nodes in Redis — put, resharded get, lifecycle.

Workers use the client library (`dagrl_databuffer.client.DataBufferClient`) over Redis
directly; `python -m dagrl_databuffer` serves the same operations over gRPC.
"""

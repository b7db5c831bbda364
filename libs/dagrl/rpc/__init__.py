"""gRPC plumbing shared by services and clients.

`dagrl.rpc.gen` holds the stubs generated from proto/ (`make protos`; never edit them);
`dagrl.rpc.status` maps dagrl errors to gRPC status codes and back, in one place.
"""

"""gRPC plumbing shared by services and clients.

`dagrl.rpc.gen` holds the stubs generated from proto/ (`make protos`; never edit them);
`dagrl.rpc.status` maps dagrl errors to gRPC status codes and back, in one place;
`dagrl.rpc.jobspec` reads a JobSpec into a checked config and workflow (scheduler and CLI);
`dagrl.rpc.limits` holds the message-size limits both ends of a service use;
`dagrl.rpc.serving` is the main loop of a service process and how its servers bind.
"""

"""The `dagrl` command: a client-side tool (it never imports a service)."""

"""Agent programs trained as they are: an OpenAI-compatible endpoint per rollout rank that
records every call as exact tokens (`gateway`, `protocol`, `rendering`, `batcher`,
`sessions`), and the episodes that run a user's program against it (`episodes`). The ROLLOUT
node's executor is `dagrl_worker.rank.executors.agent`."""

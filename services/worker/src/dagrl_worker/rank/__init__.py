"""What runs on one rank: a Ray actor (`actors`) around a `dag_worker.DAGWorker` that walks its
nodes of the workflow each step.

- the rank's build: `rank_parts` (per attempt), `rank_groups` (process groups), `builder`
  (models), `device`, `prompts`, `checkpoint` / `checkpoint_files`;
- the step: `graph_runner` (the walk), `dataflow` (edges: local cache or the databuffer),
  `evaluation`, `weight_sync` / `weight_layout` (trained weights to their users);
- the nodes: `executors` (one per node kind), with `rollout` (generation backends), `training`
  (engines and the PPO loops), `rewards` (scorers and reward sources), `agents` (agent programs
  through an OpenAI-compatible endpoint), `async_training` (policy versions, the staleness
  bound, weight publishing and the sample ledger on the ranks of an asynchronous job).

Nothing here imports the driver (`dagrl_worker.driver`); both read `dagrl_worker.shared`.
"""

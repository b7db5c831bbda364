"""Rewards on the worker: the frozen models reward nodes score with, and how a COMPUTE REWARD
node scores each source. The reward nodes' executors are `dagrl_worker.rank.executors`'
(`reward.py`, `reward_model.py`, `judge.py`): they use this package, never the reverse.

What lives where, and why:

- `dagrl.rewards` (the shared library, `libs/`): the pure scoring, with no torch model, rank
  or node in it: the built-in rule functions and `compute_score`, math-verify with its
  timeout, the remote reward client, `combine_scores` and which sources are upstream scores,
  DAPO's overlong penalty. The job config (`dagrl.config.reward`), the environments
  (`dagrl.envs`) and the data tasks import it too, none of which may depend on the worker.
- This package (the worker): what needs a rank, a model or a Batch.
  - `scorers.py`: the frozen models of MODEL_INFERENCE + REWARD nodes as `AgentModels` holds
    them: a reward model (`load_reward_model`) or an LLM judge; `builder.build_scorer` decides
    which node gets which.
  - `sources.py`: how a COMPUTE REWARD node scores, per source (`reward.sources`): rule and
    remote here, `rm`/`judge` read from the tensors their upstream nodes wrote.

A reward node's executor is built once, with its settings, by
`dagrl_worker.rank.executors.table.build_executor`.
"""

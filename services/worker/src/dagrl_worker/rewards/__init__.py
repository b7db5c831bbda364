"""Rewards on the worker: the reward nodes' executors and the frozen models they score with.

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
  - `reward_model.py`: the reward-model node, adds `rm_scores`.
  - `judge.py`: the LLM-judge node, adds `judge_scores`.
  - `sources.py`: how a COMPUTE REWARD node scores, per source (`reward.sources`): rule and
    remote here, `rm`/`judge` read from the tensors their upstream nodes wrote.
  - `combine.py`: the COMPUTE REWARD node itself, which weighs the sources (plus the overlong
    penalty) into `token_level_scores`.

A reward node's executor is built once, with its settings, by
`dagrl_worker.executors.table.build_executor`.
"""

"""The node executors: one plain object per workflow node, `run(batch, ctx) -> Batch`.

`table.py` says which executor each node (type, role) gets and builds it once with the
settings it uses; `base.py` holds the protocol, the step context and the rank's models. The
rest, by the phase of a step they run:

- `rollout.py`: generation (single-turn); `multiturn.py` with an env, `agent.py` with an
  agent program, `chain.py` for the next agent of a chain.
- the reward nodes: `reward_model.py` (adds `rm_scores`), `judge.py` (an LLM judge, adds
  `judge_scores`) and `reward.py`, the COMPUTE REWARD node, which weighs every source (plus the
  overlong penalty) into `token_level_scores`; the scorers and sources they use are
  `dagrl_worker.rank.rewards`'.
- `log_probs.py`: the old log-probs (and when the update computes them instead) and the
  reference's.
- `models.py`: the critic's values, the actor and critic updates.
- `compute.py`: dynamic sampling, advantage, custom functions, data load, barriers.
"""

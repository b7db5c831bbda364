"""`dagrl run`'s progress bar figures."""

from __future__ import annotations

from dagrl.cli.run_cmd import progress_fields


def test_single_agent_figures_keep_their_short_names() -> None:
    shown = progress_fields({"critic/score/mean": 0.51234, "actor/pg_loss": -0.2,
                             "perf/throughput": 1234.5, "timing_s/rollout": 3.0})
    assert shown == {"score": "0.512", "pg_loss": "-0.2", "tok/s": "1.23e+03"}


def test_each_agent_of_a_multi_agent_job_gets_its_own_figures() -> None:
    shown = progress_fields({"agent0/critic/score/mean": 0.25, "agent1/critic/score/mean": 0.5,
                             "agent1/actor/pg_loss": 0.1, "agentx/actor/pg_loss": 9.0,
                             "perf/throughput": 10.0})
    assert shown == {"a0.score": "0.25", "a1.score": "0.5", "a1.pg_loss": "0.1",
                     "tok/s": "10"}

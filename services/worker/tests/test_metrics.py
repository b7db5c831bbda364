"""MetricSink: reducers, per-agent scopes, and the driver's merge over ranks."""

from dagrl_worker.shared.metrics import COMPUTE_SECONDS, MetricSink, Reduce, merge


def test_agent_scopes_keep_agents_apart_and_job_totals_shared() -> None:
    sink = MetricSink()
    for agent, loss, tokens in ((0, 1.0, 10.0), (1, 3.0, 30.0)):
        scope = sink.scoped(f"agent{agent}/")
        scope.add("actor/pg_loss", loss, Reduce.MEAN, weight=2)
        scope.add("tokens/generated", tokens, Reduce.SUM)
        scope.add(COMPUTE_SECONDS, 0.5, Reduce.SUM)
        assert scope.value("actor/pg_loss") == loss
    summary = sink.summary()
    assert summary["agent0/actor/pg_loss"][1] == 1.0
    assert summary["agent1/actor/pg_loss"][1] == 3.0
    assert "actor/pg_loss" not in summary
    assert sink.value("tokens/generated") == 40.0  # throughput counts every agent's tokens
    assert sink.value(COMPUTE_SECONDS) == 1.0


def test_merge_folds_ranks_with_each_metrics_reducer() -> None:
    ranks = []
    for loss, length in ((1.0, 4.0), (2.0, 6.0)):
        sink = MetricSink()
        scope = sink.scoped("agent1/")
        scope.add("actor/pg_loss", loss, Reduce.MEAN, weight=1)
        scope.add("response_length/max", length, Reduce.MAX)
        ranks.append(sink)
    merged = merge(r.summary() for r in ranks)
    assert merged == {"agent1/actor/pg_loss": 1.5, "agent1/response_length/max": 6.0}


def test_single_agent_names_are_plain() -> None:
    sink = MetricSink()
    sink.add("actor/pg_loss", 0.25, Reduce.MEAN)
    assert set(sink.summary()) == {"actor/pg_loss"}

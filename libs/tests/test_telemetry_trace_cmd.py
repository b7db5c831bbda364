"""`dagrl trace`: the table layout from a StepSummary, and the parser wiring (no network)."""

from __future__ import annotations

import argparse

import pytest

from dagrl.cli import trace_cmd
from dagrl.cli.main import main
from dagrl.errors import InvalidInputError
from dagrl.rpc.gen.metrics.v1 import metrics_pb2


def summary(num_ranks: int = 2) -> metrics_pb2.StepSummary:
    result = metrics_pb2.StepSummary(
        job_id="j", step=4, wall_time_s=1.25, complete=True, num_ranks=num_ranks, tokens=512,
        tokens_per_s=409.6, time_per_token_ms=2.44, critical_path=["rollout", "train"],
        critical_path_s=1.1, trace_id="ab" * 16, metrics={"critic/score/mean": 0.5})
    for node, phase, base, start in (("rollout", "rollout", 0.6, 0), ("train", "update", 0.4, 10)):
        timing = result.nodes.add(node_id=node, max_s=base + 0.1 * (num_ranks - 1), mean_s=base,
                                  straggler_rank=num_ranks - 1, straggler_lag_s=0.05,
                                  on_critical_path=True, step_phase=phase)
        for rank in range(num_ranks):
            timing.ranks.add(rank=rank, duration_s=base + 0.1 * rank,
                             start_unix_ns=start - rank, phases=[
                metrics_pb2.PhaseTiming(name="rollout.generate", duration_s=base / 2)])
    return result


def test_table_has_header_rows_and_rank_columns() -> None:
    text = trace_cmd.format_step_table(summary())
    lines = text.splitlines()
    assert lines[0].startswith("job j  step 4  (complete)  wall 1.250 s")
    assert "critical path 1.100 s: rollout -> train" in lines[1]
    assert "MFU -" in lines[2]  # not reported
    header = next(line for line in lines if line.startswith("node"))
    assert "rank 0" in header and "rank 1" in header and "straggler" in header
    assert "phase" in header
    rollout = next(line for line in lines if line.startswith("rollout *"))
    assert rollout.split()[2:5] == ["rollout", "0.600", "0.700"]
    train = next(line for line in lines if line.startswith("train *"))
    assert train.split()[2:5] == ["update", "0.400", "0.500"]
    assert "critic/score/mean = 0.5" in text
    assert "rollout.generate" not in text
    assert "  rollout.generate" in trace_cmd.format_step_table(summary(), phases=True)


def test_each_rank_lists_the_nodes_it_ran_in_the_order_it_started_them() -> None:
    step = summary()
    step.nodes[0].ranks[1].start_unix_ns = 20  # rank 1 trained first (not in DAG order)
    lines = trace_cmd.format_step_table(step).splitlines()
    assert "rank 0: rollout (rollout) 0.600 > train (update) 0.400" in lines
    assert "rank 1: train (update) 0.500 > rollout (rollout) 0.700" in lines


def test_a_node_without_a_step_phase_shows_a_dash() -> None:
    step = summary()
    step.nodes[1].step_phase = ""
    lines = trace_cmd.format_step_table(step).splitlines()
    assert next(line for line in lines if line.startswith("train *")).split()[2] == "-"
    assert "rank 0: rollout (rollout) 0.600 > train 0.400" in lines


def test_many_ranks_drop_the_per_rank_columns() -> None:
    text = trace_cmd.format_step_table(summary(num_ranks=16))
    assert "rank 0" not in text.splitlines()[4]
    assert "rank 15" in text  # as the straggler


def test_mfu_shown_when_known() -> None:
    with_mfu = summary()
    with_mfu.mfu = 0.375
    assert "MFU 37.5%" in trace_cmd.format_step_table(with_mfu)


def test_parser_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(trace_cmd.ADDRESS_ENV, "metrics:1234")
    parser = argparse.ArgumentParser()
    trace_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["trace", "job-7"])
    assert (args.job, args.step, args.metrics_address) == ("job-7", None, "metrics:1234")
    assert args.run is trace_cmd.run
    args = parser.parse_args(["trace", "job-7", "--step", "3", "--metrics-address", "h:1"])
    assert (args.step, args.metrics_address) == (3, "h:1")


@pytest.mark.parametrize("step", [2**63, -(2**63) - 1, 10**30])
def test_a_step_out_of_int64_range_is_a_clear_error(step: int,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidInputError, match=rf"--step {step} is out of range"):
        trace_cmd.fetch_step_summary("127.0.0.1:1", "job-7", step)
    assert main(["trace", "job-7", "--step", str(step), "--metrics-address", "127.0.0.1:1"]) == 2
    assert "is out of range: a step number is a 64-bit integer" in capsys.readouterr().err

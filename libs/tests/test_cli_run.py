"""The dagrl CLI's own behaviour: argument handling, early checks, progress bar figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagrl.cli.client import build_job_spec, cluster_from_args
from dagrl.cli.main import build_parser, main, parse
from dagrl.cli.run_cmd import progress_fields
from dagrl.rpc.jobspec import validate_job


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


EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "two_agent_math.yaml")


def test_overrides_may_follow_the_flags() -> None:
    args = parse(build_parser(), ["plan", EXAMPLE, "a.b=1", "--nodes", "2", "c.d=2"])
    assert args.overrides == ["a.b=1", "c.d=2"] and args.nodes == 2
    with pytest.raises(SystemExit):
        parse(build_parser(), ["plan", EXAMPLE, "--bogus"])
    with pytest.raises(SystemExit):
        parse(build_parser(), ["status", "--scheduler", "h:1", "x.y=1", "z=2"])


def test_cluster_counts_must_be_positive_and_a_missing_one_is_the_jobs(
        capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            parse(build_parser(), ["plan", EXAMPLE, "--nodes", bad])
    assert "--nodes" in capsys.readouterr().err
    args = parse(build_parser(), ["plan", EXAMPLE, "--nodes", "3"])
    spec = build_job_spec(EXAMPLE, ["trainer.n_ranks_per_node=4"])
    cluster = cluster_from_args(args, spec)
    assert [n.device_count for n in cluster.nodes] == [4, 4, 4]


def test_a_device_flag_alone_describes_the_cluster_with_the_jobs_counts() -> None:
    """--device-kind and --device-memory-gib used to be dropped unless a count flag was given."""
    spec = build_job_spec(EXAMPLE, ["trainer.nnodes=2", "trainer.n_ranks_per_node=4"])
    for flags, kind, memory in ((["--device-kind", "H100"], "H100", 0.0),
                                (["--device-memory-gib", "80"], "cpu", 80.0),
                                (["--device-kind", "H100", "--device-memory-gib", "80"],
                                 "H100", 80.0)):
        cluster = cluster_from_args(parse(build_parser(), ["plan", EXAMPLE, *flags]), spec)
        assert [(n.device_count, n.device_kind, n.device_memory_gib)
                for n in cluster.nodes] == [(4, kind, memory)] * 2
    assert not cluster_from_args(parse(build_parser(), ["plan", EXAMPLE]), spec).nodes
    run_args = parse(build_parser(), ["run", EXAMPLE])  # `dagrl run` has no cluster flags
    assert not cluster_from_args(run_args, spec).nodes


def test_job_mistakes_are_reported_before_any_service_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", EXAMPLE, "workflow.agent_placement=bogus"]) == 2
    err = capsys.readouterr().err
    assert "and its command-line overrides" in err and "'bogus' is not one of" in err
    (tmp_path / "job.yaml").write_text("workflow: {source: nosuchflow}\n")
    assert main(["config", str(tmp_path / "job.yaml")]) == 2
    assert "nosuchflow" in capsys.readouterr().err
    assert main(["status", "--scheduler", "garbage"]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err


def test_workflow_checks_agent_options_like_the_scheduler(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("dag_id: f\nnodes:\n"
                    "  - {node_id: r, node_type: MODEL_INFERENCE, node_role: ROLLOUT,\n"
                    "     agent_options: {chain_templat: x}}\n")
    assert main(["workflow", str(flow)]) == 2
    assert "chain_templat: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("example", sorted(
    p.name for p in (Path(EXAMPLE).parent).glob("*.yaml") if not p.stem.endswith("_workflow")))
def test_every_example_passes_the_schedulers_checks(example: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(EXAMPLE).parents[1])  # examples name their workflows from the root
    validate_job(build_job_spec(f"examples/{example}", []))


def test_data_problems_are_reported_before_any_service_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file, a file without the prompt column, too few prompts for one batch: each
    used to surface inside a rank, after Ray had started (issue 27, item 6)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "ground_truth": "2",
             "data_source": "arith"}] * 4
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "four.parquet")
    pq.write_table(pa.Table.from_pylist([{"question": "1+1="}]), tmp_path / "bare.parquet")
    (tmp_path / "model").mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(f"actor_rollout_ref: {{model: {{path: {tmp_path / 'model'}}}}}\n"
                   f"data: {{train_files: [{tmp_path / 'four.parquet'}, {tmp_path / 'gone'}],\n"
                   f"       val_files: [{tmp_path / 'bare.parquet'}]}}\n")
    assert main(["run", str(job)]) == 2
    err = capsys.readouterr().err
    assert f"data.train_files: dataset file {tmp_path / 'gone'} does not exist" in err
    assert "data.val_files: dataset file" in err and "lacks required column(s)" in err
    job.write_text(f"actor_rollout_ref: {{model: {{path: {tmp_path / 'model'}}}}}\n"
                   f"data: {{train_files: [{tmp_path / 'four.parquet'}], train_batch_size: 16}}\n")
    assert main(["run", str(job)]) == 2
    assert "hold 4 prompts, fewer than data.train_batch_size=16" in capsys.readouterr().err

"""Multi-agent chains: a later agent's scores reach the earlier agent's samples by lineage."""

import pytest
import torch

from dagrl.batch import Batch
from dagrl.errors import BatchError
from dagrl_worker.dataflow import join_by_uid


def agent0_batch() -> Batch:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # [B, R]
    return Batch(tensors={"response_mask": mask},
                 columns={"uid": ["p:0/0", "p:0/1"], "group_id": ["p:0", "p:0"]})


def agent1_scored(parents: list[str], scores: list[float]) -> Batch:
    token_scores = torch.zeros((len(scores), 4))
    token_scores[:, 1] = torch.tensor(scores)
    uids = [f"{p}|a1/{i}" for i, p in enumerate(parents)]
    return Batch(tensors={"token_level_scores": token_scores},
                 columns={"uid": uids, "group_id": [u[:-2] for u in uids],
                          "parent_uid": parents})


def test_each_sample_gets_the_mean_score_of_its_answers_on_its_last_token() -> None:
    children = agent1_scored(["p:0/1", "p:0/0", "p:0/0", "p:0/1"], [1.0, 0.0, 1.0, 0.0])
    joined = join_by_uid([agent0_batch(), children])
    assert joined.uids == ["p:0/0", "p:0/1"]
    assert "parent_uid" not in joined
    assert torch.equal(joined.tensors["token_level_scores"],
                       torch.tensor([[0.0, 0.5, 0.0], [0.5, 0.0, 0.0]]))


def test_a_sample_nobody_answered_is_an_error() -> None:
    with pytest.raises(BatchError, match="p:0/1"):
        join_by_uid([agent0_batch(), agent1_scored(["p:0/0"], [1.0])])

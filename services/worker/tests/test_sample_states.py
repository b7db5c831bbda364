"""Samples in progress passed between ranks (`SampleStates.to_handoff` / `from_handoff`,
`assign`, `rows_of`): what a rank hands a peer through the Batch codec comes back as the
same samples, and progress is written back only onto the same samples."""

from __future__ import annotations

import pytest
import torch

from dagrl.batch import schema as fields
from dagrl.batch.codec import decode, encode
from dagrl.errors import InvalidInputError
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout.samples import ROW_TENSORS, SampleStates


def _states() -> SampleStates:
    rows = {fields.PROMPT_IDS: [[4, 5], [6], [7, 8, 9]], "index": [0, 1, 2],
            "extra_info": [{"max_response_length": 3}, {}, {"note": "é"}]}
    states = SampleStates.fresh(prompts_to_batch(rows, 0, "s1").repeat_interleave(2), 4, 0)
    states.record(0, [11, 12], [-0.5, -0.25], version=2, ended=False)
    states.record(3, [13], [-1.0], version=1, ended=True)
    return states


def test_samples_in_progress_round_trip_through_the_codec() -> None:
    states = _states()
    back = SampleStates.from_handoff(decode(encode(states.to_handoff())))
    assert back.prompts.uids == states.prompts.uids
    assert back.prompts.columns["extra_info"] == states.prompts.columns["extra_info"]
    for name in ROW_TENSORS:
        assert torch.equal(getattr(back, name), getattr(states, name)), name
    assert back.limits.tolist() == [3, 3, 4, 4, 4, 4]  # the prompt's own budget travels


def test_progress_goes_back_onto_the_same_samples_only() -> None:
    states = _states()
    rows = states.rows_of(["s1:1"])
    assert rows == [2, 3]
    part = states.select(rows)
    part.record(0, [21, 22, 23], [-0.1, -0.2, -0.3], version=3, ended=True)
    states.assign(rows, part)
    assert states.tokens[2, :3].tolist() == [21, 22, 23] and bool(states.finished[2])
    assert states.lengths.tolist() == [2, 0, 3, 1, 0, 0]
    with pytest.raises(InvalidInputError, match="uids differ"):
        states.assign([0, 1], part)


def test_a_batch_that_is_not_samples_in_progress_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="not samples in progress"):
        SampleStates.from_handoff(_states().prompts)

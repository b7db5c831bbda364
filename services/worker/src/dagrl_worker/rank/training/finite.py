"""A training update gone non-finite stops the job: the error and the check.

A nan or inf loss used to be trained on: the step's metrics said `actor/pg_loss=nan`, the engine
skipped the optimizer step (`TrainEngine.optimizer_step`: no step on a non-finite grad norm),
and the job went on until sampling from the nan policy died in torch ("probability tensor
contains either inf, nan or element < 0"), a step later and far from the cause. Now the update
raises `NonFiniteLossError`, naming the step, the value and the likely causes. It is a rank's
own error, so the restart policy fails the job at once (`restart_policy`): a restart from the
last checkpoint would run into it again.

The check reads the mini-batch's grad norm, all-reduced and so the same on every dp rank: all
ranks raise together, and none waits in a collective for a rank that stopped. A nan loss on any
rank makes that norm nan (backward carries it into the gradients).
"""

from __future__ import annotations

import math

from dagrl.errors import DagrlError

LIKELY_CAUSES = ("float16 weights on CPU (actor_rollout_ref.model.dtype: use bfloat16 or "
                 "float32), a learning rate too high (optim.lr), or a nan in the data or "
                 "rewards")


class NonFiniteLossError(DagrlError):
    """A policy or value update produced a nan or inf loss or gradient."""


def check_finite(update: str, step: int | None, loss: float, grad_norm: float) -> None:
    """NonFiniteLossError when the mini-batch's grad norm is nan or inf. Only the grad norm
    decides (module docstring: every rank sees the same one); `loss`, this rank's loss so far
    this step, is named when it is the non-finite one. `update`: "actor" or "critic"; `step`:
    the training step, None when the caller does not know it."""
    if math.isfinite(grad_norm):
        return
    where = f"step {step}: " if step is not None else ""
    what = (f"non-finite loss ({loss:g})" if not math.isfinite(loss)
            else f"non-finite loss gradient (grad norm {grad_norm:g})")
    raise NonFiniteLossError(
        f"{where}{what} in {update} update; the job stops rather than train on it (the "
        f"optimizer step was skipped); likely cause: {LIKELY_CAUSES}")

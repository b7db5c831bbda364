"""Per-node settings: the `config:` mapping of a workflow node, typed.

A node's `config` overrides the job config for that node where a node may differ (its
checkpoint, a reward node's reward_fn) and tells the scheduler what the node needs
(`model_params`, parallel sizes, device kind and memory). Unknown keys are errors,
like everywhere else in the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import re2

from dagrl.config.job import AdvEstimator
from dagrl.config.reward import reward_fn_problem
from dagrl.config.typed import build, option
from dagrl.errors import RefResolutionError
from dagrl.refs import parse_ref

# A reward model or judge node's default parser: the first number in the verdict.
DEFAULT_JUDGE_PARSER = r"([-+]?\d+(?:\.\d+)?)"
JUDGE_FIELDS = ("{prompt}", "{response}", "{ground_truth}")


@dataclass(frozen=True)
class NodeConfig:
    model_params: str | float | None = option(
        None, "model size for scheduling, e.g. 7B, 500M, 7000000000")
    flops: float | None = option(None, "FLOPs per step for scheduling (overrides model_params)")
    dp_size: int | None = option(None, "data-parallel size (default: the node's ranks)")
    tp_size: int = option(1, "tensor-parallel size")
    pp_size: int = option(1, "pipeline-parallel size")
    device_kind: str | None = option(None, "required device kind, e.g. H100 (None: any)")
    min_device_memory_gib: float | None = option(None, "required device memory per rank")
    model_path: str | None = option(
        None, "checkpoint of this node's agent's policy (ACTOR/ROLLOUT/REFERENCE nodes) or "
        "critic (CRITIC nodes); default: the job's. MODEL_INFERENCE + REWARD: the reward "
        "model (required) or the judge (default: the policy's initial checkpoint)")
    adv_estimator: AdvEstimator | None = option(
        None, "ADVANTAGE: the estimator this workflow is built for; the job's "
        "algorithm.adv_estimator (the one place it is chosen) must be the same")
    reward_fn: str | None = option(
        None, "COMPUTE REWARD: this node's rule scorer (overrides reward.reward_fn): "
        "math_verify, `module:function` or `path/to/file.py:function`")
    # MODEL_INFERENCE + REWARD: a reward model, or an LLM judge when judge_template is set
    micro_batch_size: int = option(
        32, "MODEL_INFERENCE + REWARD: samples per reward-model forward or judge generate call")
    dtype: Literal["float32", "bfloat16", "float16"] | None = option(
        None, "MODEL_INFERENCE + REWARD: weights dtype (None: actor_rollout_ref.model.dtype)")
    judge_template: str | None = option(
        None, "makes a MODEL_INFERENCE + REWARD node an LLM judge: the user message it is "
        "given, with {prompt}, {response} and optionally {ground_truth}")
    judge_parser: str = option(
        DEFAULT_JUDGE_PARSER, "judge: verdict -> score, a regex whose one capture group is "
        "the number, or `module:function` (verdict text -> float, or None when unparseable)")
    judge_default_score: float = option(
        0.0, "judge: the score of a verdict the parser cannot read (counted in "
        "judge/unparseable)")
    judge_max_new_tokens: int = option(16, "judge: verdict tokens at most")
    judge_temperature: float = option(0.0, "judge: sampling temperature (0: greedy)")

    def check(self) -> list[str]:
        problems = []
        for name in ("dp_size", "tp_size", "pp_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        problem = reward_fn_problem(self.reward_fn)
        if problem:
            problems.append(problem)
        for name in ("micro_batch_size", "judge_max_new_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.judge_temperature < 0:
            problems.append(f"judge_temperature must be >= 0 (0: greedy), got "
                            f"{self.judge_temperature}")
        return problems + judge_problems(self.judge_template, self.judge_parser)


def node_config(node_id: str, config: Mapping[str, Any], source: str | None = None) -> NodeConfig:
    """The typed config of one node; ConfigError naming the node on any problem."""
    where = f"{source}: node {node_id!r}" if source else f"node {node_id!r}"
    return build(NodeConfig, dict(config), source=where)


def is_judge_parser_ref(parser: str) -> bool:
    """A `module:function` (or `file.py:function`) parser, not a regex. A regex parser needs a
    capture group, which no reference has, so the two forms never overlap."""
    if "(" in parser:
        return False
    try:
        parse_ref(parser)
    except RefResolutionError:
        return False
    return True


def judge_problems(template: str | None, parser: str) -> list[str]:
    """What is wrong with a judge's template and parser, by form only (nothing imported)."""
    problems = []
    if template is not None:
        if "{prompt}" not in template and "{response}" not in template:
            problems.append(f"judge_template {template!r:.80} names neither {{prompt}} nor "
                            "{response}: the judge would not see what it scores")
        try:
            template.format(prompt="", response="", ground_truth="")
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"judge_template {template!r:.80} cannot be filled ({exc!r}); it "
                            f"may name {', '.join(JUDGE_FIELDS)}; write other braces as {{{{ }}}}")
    if is_judge_parser_ref(parser):
        return problems
    try:
        groups = compile_judge_parser(parser).groups
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args else str(exc)
        return [*problems, f"judge_parser {parser!r:.80} is neither `module:function` nor a "
                           f"regex RE2 accepts ({reason}); judge parsers run on RE2, which "
                           "matches in linear time and so has no lookaround or backreferences: "
                           "rewrite it without them, or name a `module:function`"]
    if groups != 1:
        problems.append(f"judge_parser {parser!r:.80} has {groups} capture groups; give exactly "
                        "one around the number, e.g. 'Score: (\\d+)', or name a "
                        "`module:function`")
    return problems


def compile_judge_parser(parser: str) -> Any:
    """`parser` compiled by RE2 (google-re2): matching takes time linear in the verdict, so no
    pattern from a config can backtrack for minutes, and no nesting depth overflows Python's
    stack (`re` raised RecursionError on 1000 nested groups). re2.error when RE2 refuses it."""
    options = re2.Options()
    options.log_errors = False  # the caller reports the error; RE2 would also print it
    return re2.compile(parser, options=options)

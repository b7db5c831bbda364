"""`agent_options` of a ROLLOUT node, typed: which environment, how many turns, templates.

A ROLLOUT node with `agent_options.env` runs multi-turn episodes; one with `chain_template`
is the next agent of a chain (it prompts with its parent ROLLOUT node's samples); both may be
set. Unknown keys and bad values are one ConfigError naming the node and every problem. The
default templates are ChatML (Qwen2.5, the tiny char model): after each response the
`post_chat_template` text, then before the next turn the `pre_chat_template` with
`${observation}` as a user message.

A ROLLOUT node with `agent_options.agent` (`module:function` or `path/file.py:function`)
runs a user's agent program against an OpenAI-compatible endpoint instead of an env
(`dagrl_worker.rank.agents`); `agent` excludes `env` and `chain_template`, and only it reads the
`AGENT_KEYS` options.

`check_agent_nodes` is the workflow-level check, shared by the scheduler (at PlanJob/SubmitJob)
and the worker (per node, `agent_node_problems`): agent_options only on ROLLOUT nodes, typed;
a chained rollout has a ROLLOUT parent; no ENV_INTERACT nodes. It imports no code a workflow
names: `env`, `pre_process` and `post_process` references are checked by form only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagrl.config.typed import build, option
from dagrl.envs.naming import env_ref_problem
from dagrl.errors import ConfigError, RefResolutionError
from dagrl.refs import parse_ref
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph

CHATML_PRE_TEMPLATE = "${prompt}<|im_start|>user\n${observation}<|im_end|>\n<|im_start|>assistant\n"
CHATML_POST_TEMPLATE = "\n"
PROMPT_PLACEHOLDER = "${prompt}"
CHAIN_PREFIX = "${prompt}${response}"
# Options that only a multi-turn rollout (env set) reads.
MULTI_TURN_KEYS = frozenset({"max_assistant_turns", "max_response_tokens_per_turn",
                             "pre_chat_template", "post_chat_template", "pre_process",
                             "post_process"})
# Options that only an agent-program rollout (agent set) reads.
AGENT_KEYS = frozenset({"episode_timeout_s", "max_concurrent_episodes", "max_tokens_per_call",
                        "max_prompt_tokens", "max_choices", "served_model_name",
                        "batch_window_s"})


@dataclass(frozen=True)
class AgentOptions:
    env: str | None = option(None, "'math', 'calculator', 'module:Class' or "
                                   "'path/to/file.py:Class'; set: multi-turn rollout")
    max_assistant_turns: int = option(3, "assistant turns per episode at most")
    max_response_tokens_per_turn: int | None = option(
        None, "tokens one turn may generate (default: data.max_response_length)")
    pre_chat_template: str = option(CHATML_PRE_TEMPLATE, "appended before each next turn; "
                                    "starts with ${prompt} (the context so far), may use "
                                    "${observation}")
    post_chat_template: str = option(CHATML_POST_TEMPLATE, "text appended after each response")
    pre_process: str | None = option(None, "`module:function` replacing pre_chat_template: "
                                           "(tokenizer, prompt_ids, observation, **options) "
                                           "-> prompt_ids")
    post_process: str | None = option(None, "`module:function` replacing post_chat_template: "
                                            "(tokenizer, prompt_ids, response_ids, **options) "
                                            "-> prompt_ids")
    chain_template: str | None = option(
        None, "set: this rollout reads its parent ROLLOUT node's samples (multi-agent chain) "
              "and prompts with each one: starts with ${prompt}${response} (that sample's "
              "prompt and response tokens, kept as they are), then text to append")
    agent: str | None = option(
        None, "'module:function' or 'path/to/file.py:function': an `async def agent(client, "
              "sample) -> float | None` run against the rollout's OpenAI-compatible endpoint")
    episode_timeout_s: float = option(120.0, "an agent episode running longer is cancelled, "
                                             "counted in agent/timeouts and left out of the loss")
    max_concurrent_episodes: int = option(256, "agent episodes running at once on a rank")
    max_tokens_per_call: int | None = option(
        None, "largest max_tokens one endpoint call may ask for (default: "
              "data.max_response_length)")
    max_prompt_tokens: int | None = option(
        None, "longest first prompt of a training sequence (default: data.max_prompt_length "
              "+ data.max_response_length)")
    max_choices: int = option(1, "largest `n` one endpoint call may ask for")
    served_model_name: str = option("policy", "the model name the endpoint answers to")
    batch_window_s: float = option(0.005, "how long the endpoint waits for more calls to "
                                          "batch into one generation")

    def check(self) -> list[str]:
        problems = []
        if self.env is not None and (problem := env_ref_problem(self.env)):
            problems.append(problem)
        for name, ref in (("pre_process", self.pre_process), ("post_process", self.post_process)):
            if ref is not None and (problem := _ref_form_problem(ref)):
                problems.append(f"{name}: {problem}")
        if self.max_assistant_turns < 1:
            problems.append(f"max_assistant_turns must be >= 1, got {self.max_assistant_turns}")
        per_turn = self.max_response_tokens_per_turn
        if per_turn is not None and per_turn < 1:
            problems.append(f"max_response_tokens_per_turn must be >= 1, got {per_turn}")
        if self.pre_process is None and not self.pre_chat_template.startswith(
                PROMPT_PLACEHOLDER):
            problems.append(f"pre_chat_template must start with {PROMPT_PLACEHOLDER} (the "
                            "context so far is kept token for token and the template appends "
                            f"to it), got {self.pre_chat_template!r}")
        if self.chain_template is not None and not self.chain_template.startswith(CHAIN_PREFIX):
            problems.append(f"chain_template must start with {CHAIN_PREFIX} (the parent "
                            "sample's tokens are kept as they are and the template appends "
                            f"to them), got {self.chain_template!r}")
        return problems + self._agent_problems()

    def _agent_problems(self) -> list[str]:
        if self.agent is None:
            return []
        problems = []
        if (problem := _ref_form_problem(self.agent)) is not None:
            problems.append(f"agent: {problem}")
        for name in ("env", "chain_template"):
            if getattr(self, name) is not None:
                problems.append(f"agent and {name} are both set: an agent program replaces the "
                                f"env loop and reads the dataset's prompts; remove {name}")
        if self.episode_timeout_s <= 0:
            problems.append(f"episode_timeout_s must be > 0, got {self.episode_timeout_s}")
        for name in ("max_concurrent_episodes", "max_choices", "max_tokens_per_call",
                     "max_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        if not 0 <= self.batch_window_s <= 1:
            problems.append(f"batch_window_s must be in [0, 1] seconds, got {self.batch_window_s}")
        return problems


def _ref_form_problem(ref: str) -> str | None:
    try:
        parse_ref(ref)
    except RefResolutionError as exc:
        return str(exc)
    return None


def agent_options(node_id: str, options: Mapping[str, Any]) -> AgentOptions:
    """The typed agent_options of one node; ConfigError naming the node and every problem."""
    where = f"node {node_id!r} agent_options"
    problems = []
    needs_env = sorted(set(options) & MULTI_TURN_KEYS)
    if needs_env and options.get("env") is None:
        problems.append(f"{', '.join(needs_env)}: only multi-turn rollouts read "
                        f"{'this' if len(needs_env) == 1 else 'these'}, and env is not set; "
                        "add env (e.g. 'math'), or remove them")
    needs_agent = sorted(set(options) & AGENT_KEYS)
    if needs_agent and options.get("agent") is None:
        problems.append(f"{', '.join(needs_agent)}: only agent-program rollouts read "
                        f"{'this' if len(needs_agent) == 1 else 'these'}, and agent is not set; "
                        "add agent ('module:function'), or remove them")
    try:
        typed = build(AgentOptions, dict(options))
    except ConfigError as exc:
        raise ConfigError(exc.problems + problems, source=where) from None
    if problems:
        raise ConfigError(problems, source=where)
    return typed


def is_rollout_node(node: Node) -> bool:
    return node.node_type == NodeType.MODEL_INFERENCE and node.node_role == NodeRole.ROLLOUT


def is_chain_rollout(node: Node) -> bool:
    """A ROLLOUT node that prompts with the previous agent's samples (`chain_template`): each
    of its input rows becomes n samples."""
    return is_rollout_node(node) and node.agent_options.get("chain_template") is not None


def row_origin(graph: TaskGraph, node_id: str) -> str:
    """The node whose rows `node_id` carries. A node's rows are its first dependency's (a
    fan-in joins the other parents onto them), back to an entry node or to a ROLLOUT node,
    which makes rows of its own (n samples per input row)."""
    while graph[node_id].dependencies and not is_rollout_node(graph[node_id]):
        node_id = graph[node_id].dependencies[0]
    return node_id


def chain_depth(graph: TaskGraph, node_id: str) -> int:
    """How many chained ROLLOUT nodes the rows of `node_id` come through (0: the first
    agent's samples, 1: answers to them, ...)."""
    depth, origin = 0, row_origin(graph, node_id)
    while is_chain_rollout(graph[origin]):
        depth += 1
        origin = row_origin(graph, graph[origin].dependencies[0])
    return depth


def agent_node_problems(node: Node) -> list[str]:
    """What is wrong with one node, agent-wise: it is ENV_INTERACT, or it carries
    agent_options without being a ROLLOUT node, or its agent_options do not build."""
    where = f"node {node.node_id!r}"
    if node.node_type == NodeType.ENV_INTERACT:
        return [f"{where} is ENV_INTERACT: environments are stepped inside the rollout (each "
                "sample's turns run concurrently there); remove this node and set "
                "agent_options.env (e.g. 'math', 'calculator' or 'module:Class') on the "
                "ROLLOUT node"]
    if not node.agent_options:
        return []
    if not is_rollout_node(node):
        return [f"{where} ({node.node_type.name}, role {node.node_role.name}) has "
                "agent_options, which only a ROLLOUT node (MODEL_INFERENCE) reads; move them to "
                "the rollout node"]
    try:
        agent_options(node.node_id, node.agent_options)
    except ConfigError as exc:
        return [f"{where}: agent_options.{problem}" for problem in exc.problems]
    return []


def check_agent_nodes(graph: TaskGraph, source: str | None = None) -> None:
    """ConfigError (INVALID_ARGUMENT) listing every node's `agent_node_problems`, and each
    chained rollout (chain_template) whose first dependency does not carry a ROLLOUT node's
    samples (`row_origin`); `source` names the workflow in the message."""
    problems = [problem for node in graph.nodes for problem in agent_node_problems(node)]
    for node in graph.nodes:
        first = node.dependencies[0] if node.dependencies else None
        if is_chain_rollout(node) and (
                first is None or not is_rollout_node(graph[row_origin(graph, first)])):
            problems.append(
                f"node {node.node_id!r}: agent_options.chain_template is set but its first "
                f"dependency ({first or 'none'}) does not carry a ROLLOUT node's samples: a "
                "chained agent prompts with the previous agent's samples; list that agent's "
                "ROLLOUT node (or a node after it) first in its dependencies, or remove "
                "chain_template")
    if problems:
        raise ConfigError(problems, source=source or f"workflow {graph.dag_id!r}")

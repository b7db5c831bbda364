"""Rules that span a job's config and its workflow, checked before anything starts.

The config's sections check themselves (`dagrl.config.job`) and a workflow checks its own
shape (`dagrl.workflow`); what needs both lives here, so the scheduler (PlanJob, SubmitJob),
`dagrl run` and the worker refuse the same jobs in the same words (`dagrl.rpc.jobspec` calls
`check_job`). Checks read names and flags, no code is imported, and one file only: a
policy checkpoint's config.json, for vLLM's length limit, where this process can read it.

Owns the batch-field rule (a node reads only built-in fields some node upstream of it writes,
`dagrl.batch.schema`, by the executor kind `dagrl.node_kinds.executor_kind` gives each node).
Which checkpoint an agent's policy or critic starts from is `dagrl.checkpoint_paths.model_path`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from dagrl.batch import schema as fields
from dagrl.batch.schema import ExecutorKind
from dagrl.checkpoint_paths import model_path
from dagrl.config import JobConfig, node_config
from dagrl.errors import ConfigError
from dagrl.node_kinds import executor_kind
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph

# The nodes that add each built-in tensor after the prompts, in words (`dagrl.batch.schema`);
# the job check names them, and the worker when a custom node's function reads one its input
# lacks (`executors.compute.CustomExecutor`).
PRODUCED_BY = {name: fields.producer_nodes(name) for name, spec in fields.FIELDS.items()
               if not spec.is_column and ExecutorKind.DATA_LOAD not in spec.produced_by}


def check_job(config: JobConfig, graph: TaskGraph, source: str | None = None) -> None:
    """Raise one ConfigError listing every problem `job_problems` finds."""
    problems = job_problems(config, graph)
    if problems:
        raise ConfigError(problems, source=source)


def job_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """Every way `config` and `graph` do not fit together, each naming the key to change."""
    node_problems = _node_config_problems(graph)
    if node_problems:  # the other rules read the nodes' configs
        return node_problems
    return [*_checkpoint_problems(config, graph), *_old_log_prob_problems(config, graph),
            *batch_field_problems(config, graph), *estimator_problems(config, graph),
            *_model_reward_problems(graph), *_over_sample_problems(config, graph),
            *_engine_length_problems(config), *_model_length_problems(config, graph),
            *engine_device_problems(config, {config.trainer.device})]


def _over_sample_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """`rollout.over_sample` keeps a pool of samples across steps and `rollout.stream` hands a
    step's groups over in parts; DAPO's redraw rounds (a rerun of the rollout within the
    step, on the whole batch) fit neither."""
    rollout = config.actor_rollout_ref.rollout
    redraws = [n.node_id for n in graph.nodes if n.node_role == NodeRole.DYNAMIC_SAMPLING]
    if not redraws:
        return []
    problems = []
    if rollout.over_sample:
        problems.append(
            f"actor_rollout_ref.rollout.over_sample carries samples across steps, and node "
            f"{redraws[0]!r} (DYNAMIC_SAMPLING) redraws prompts within a step: use one or the "
            "other (over_sample: 0, or remove the DYNAMIC_SAMPLING node)")
    if rollout.stream:
        problems.append(
            f"actor_rollout_ref.rollout.stream hands a step's groups over in mini-batches, and "
            f"node {redraws[0]!r} (DYNAMIC_SAMPLING) filters and redraws the whole batch: use "
            "one or the other (stream: false, or remove the DYNAMIC_SAMPLING node)")
    return problems


def engine_device_problems(config: JobConfig, device_kinds: set[str]) -> list[str]:
    """vLLM settings the job's devices cannot run: `device_kinds` are the kinds of the machines
    the ranks get ("cpu" for none; the scheduler passes its cluster's, the config check
    `trainer.device`). Checked before any rank starts: vLLM refused tensor parallelism on CPU
    only after its process groups existed (leaving shared memory behind)."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm" or "cpu" not in {kind.strip().lower() for kind in device_kinds}:
        return []
    problems = []
    if rollout.tensor_model_parallel_size > 1:
        problems.append(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size is "
            f"{rollout.tensor_model_parallel_size}, but the job's ranks run on CPU, and vLLM's "
            "tensor parallelism needs GPUs: set it to 1 (each rollout rank runs its own engine)"
            ", or run on GPU machines")
    tokens, length = rollout.max_num_batched_tokens, rollout.max_model_len
    if tokens is not None and length is not None and tokens < length:
        # on CPU dagrl prefills each prompt in one engine step (vllm_engine: no chunked prefill)
        problems.append(
            f"actor_rollout_ref.rollout.max_num_batched_tokens ({tokens}) is smaller than "
            f"max_model_len ({length}); on CPU a sequence is prefilled in one engine step, so "
            "raise max_num_batched_tokens to at least max_model_len (or unset it)")
    return problems


def _engine_length_problems(config: JobConfig) -> list[str]:
    """vLLM cuts a sequence at max_model_len silently: the response loses its EOS and reads as
    complete (response_length/clip_ratio 0). A prompt and its response must fit."""
    rollout, data = config.actor_rollout_ref.rollout, config.data
    longest = data.max_prompt_length + data.max_response_length
    if rollout.name != "vllm" or rollout.max_model_len is None or rollout.max_model_len >= longest:
        return []
    return [f"actor_rollout_ref.rollout.max_model_len ({rollout.max_model_len}) is shorter than "
            f"data.max_prompt_length + data.max_response_length ({data.max_prompt_length} + "
            f"{data.max_response_length} = {longest}): vLLM would cut responses without telling; "
            f"raise max_model_len to at least {longest} (or leave it unset for the model's own "
            "limit), or lower the data lengths"]


def _model_length_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """vLLM without `max_model_len` takes the checkpoint's length (`max_position_embeddings`
    or a key like it) as its limit and cuts there without telling, as above: a prompt and its
    response must fit that too. Read from each policy's config.json where this process can
    read it (a scheduler on another host may not: the ranks' own check has the same rule)."""
    rollout, data = config.actor_rollout_ref.rollout, config.data
    longest = data.max_prompt_length + data.max_response_length
    if rollout.name != "vllm" or rollout.max_model_len is not None:
        return []
    problems: list[str] = []
    for agent in graph.agent_groups():
        try:
            path = model_path(graph, agent, NodeRole.ACTOR, config)
        except ConfigError:
            continue  # `_checkpoint_problems` names it
        positions = model_positions(path)
        if positions is not None and positions < longest:
            problems.append(
                f"data.max_prompt_length + data.max_response_length ({data.max_prompt_length} "
                f"+ {data.max_response_length} = {longest}) is longer than the model's "
                f"length ({positions} tokens, {path}/config.json), vLLM's limit when "
                "actor_rollout_ref.rollout.max_model_len is unset: it would cut responses "
                "without telling; lower the data lengths")
    return problems


# The config keys vLLM reads a model's length from (it takes the smallest one present).
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "max_sequence_length", "max_seq_length", "seq_len")


def model_positions(path: str) -> int | None:
    """The length vLLM derives from the checkpoint folder `path`'s config.json when no
    max_model_len is given: the smallest of its length keys (its text model's, for a
    multimodal config). None where the folder or the keys are not there to read, or where
    RoPE scaling changes the limit (vLLM's rule differs by scaling type: left to it)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for section in (config, config.get("text_config")):
        if not isinstance(section, dict):
            continue
        lengths = [v for key in _LENGTH_KEYS if isinstance(v := section.get(key), int)
                   and not isinstance(v, bool) and v > 0]
        if lengths:
            return None if _rope_scaled(section) else min(lengths)
    return None


def _rope_scaled(section: dict) -> bool:
    """Whether a model config scales its RoPE (any type but transformers' "default")."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = section.get(key)
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")
                                       or "default") != "default":
            return True
    return False


def _node_config_problems(graph: TaskGraph) -> list[str]:
    """Each node's `config:` (unknown keys, bad values, a reward_fn of the wrong form)."""
    problems: list[str] = []
    for node in graph.nodes:
        try:
            node_config(node.node_id, node.config)
        except ConfigError as exc:
            problems.extend(f"node {node.node_id!r}: config.{p}" for p in exc.problems)
    return problems


def _checkpoint_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """Every agent needs a policy checkpoint: its tokenizer tokenizes the prompts, and its
    rollout, actor and reference start from it (an empty path used to fail at launch, inside
    transformers, with a message about hub repo ids)."""
    problems: list[str] = []
    for agent in graph.agent_groups():
        try:
            path = model_path(graph, agent, NodeRole.ACTOR, config)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if not path.strip():
            whose = (f" and no node of agent {agent} sets config.model_path"
                     if len(graph.agent_groups()) > 1 else "")
            problems.append(
                f"actor_rollout_ref.model.path is empty{whose}: set it to the policy's "
                "checkpoint folder (config.json, weights and tokenizer files; `make demo` "
                "builds one in outputs/arith/model)")
    return problems


def _old_log_prob_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """A policy update compares the new log-probs with the ones its samples were drawn with
    (`old_log_probs`): a forward-only ACTOR node of the same agent must add them upstream,
    unless the rollout engine's log-probs stand in for them (`use_rollout_log_probs`)."""
    if config.actor_rollout_ref.actor.use_rollout_log_probs:
        return []
    problems: list[str] = []
    for node in graph.nodes:
        if not _is_actor_update(node):
            continue
        upstream = [graph[a] for a in graph.ancestors(node.node_id)]
        if not any(_is_actor_forward(u) and u.agent_group == node.agent_group for u in upstream):
            problems.append(
                f"node {node.node_id!r} (ACTOR, MODEL_TRAIN) updates agent {node.agent_group}'s "
                "policy against the log-probs its samples were drawn with (old_log_probs), but "
                f"no node upstream of it adds them: add {PRODUCED_BY['old_log_probs']} of "
                f"agent_group {node.agent_group} before it (as the built-in grpo workflow's "
                "old_log_prob node), or set actor_rollout_ref.actor.use_rollout_log_probs: true "
                "to train on the rollout engine's log-probs")
    return problems


def read_options(config: JobConfig) -> fields.ReadOptions:
    """The job options that decide what the built-in executors read."""
    return fields.ReadOptions(
        adv_estimator=config.algorithm.adv_estimator,
        use_kl_loss=config.actor_rollout_ref.actor.use_kl_loss,
        rollout_correction=config.algorithm.rollout_correction.mode != "off")


def batch_field_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """Each built-in field a node reads (`dagrl.batch.schema`) that no node upstream of it
    writes, naming the node, the field and the nodes that would write it. Fields only custom
    code reads are free, and so is everything downstream of a custom node (it may add any
    field)."""
    options = read_options(config)
    problems: list[str] = []
    for node in graph.nodes:
        kind = executor_kind(node)
        if kind is None:
            continue
        upstream = {executor_kind(graph[a]) for a in graph.ancestors(node.node_id)}
        if ExecutorKind.CUSTOM in upstream or None in upstream:
            continue
        available = set(fields.STEP_INPUTS).union(
            *(fields.EXECUTOR_WRITES[k] for k in upstream if k is not None))
        for field in fields.reads(kind, options):
            if field not in available:
                problems.append(
                    f"node {node.node_id!r} ({fields.KIND_NODES[kind]}) reads {field}, but no "
                    f"node upstream of it writes it: add {fields.producer_nodes(field)} before "
                    f"it{fields.read_because(kind, field)}")
    return problems


def estimator_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    """The advantage estimator has one home, `algorithm.adv_estimator`: an ADVANTAGE node's
    `config.adv_estimator` only states what its workflow is built for, and must agree (it
    used to win silently)."""
    chosen = config.algorithm.adv_estimator
    problems: list[str] = []
    for node in graph.nodes:
        stated = node_config(node.node_id, node.config).adv_estimator
        if stated is not None and stated != chosen:
            problems.append(
                f"node {node.node_id!r} sets config.adv_estimator: {stated}, but "
                f"algorithm.adv_estimator is {chosen}; the estimator is chosen in one place, "
                f"algorithm.adv_estimator: set it to {stated} (what this workflow is built "
                "for), or remove the node's config.adv_estimator to run it with another")
    return problems


def _is_actor_update(node: Node) -> bool:
    return (node.node_role == NodeRole.ACTOR and node.node_type == NodeType.MODEL_TRAIN
            and not node.only_forward_compute)


def _is_actor_forward(node: Node) -> bool:
    return (node.node_role == NodeRole.ACTOR and node.node_type == NodeType.MODEL_TRAIN
            and node.only_forward_compute)


def reward_model_path_problem(node_id: str) -> str:
    return (f"node {node_id!r} (MODEL_INFERENCE + REWARD) is a reward model without a "
            "checkpoint: set its config.model_path to a sequence-classification checkpoint "
            "(`python -m dagrl.models.reward_model outputs/arith` builds the demo's), or set "
            "config.judge_template to make it an LLM judge")


def _model_reward_problems(graph: TaskGraph) -> list[str]:
    """A reward model needs its checkpoint; a reward-model or judge node adds a score column
    (rm_scores, judge_scores) that only a COMPUTE REWARD node after it turns into rewards."""
    problems: list[str] = []
    for node in graph.nodes:
        if node.node_type != NodeType.MODEL_INFERENCE or node.node_role != NodeRole.REWARD:
            continue
        options = node_config(node.node_id, node.config)
        if options.judge_template is None and not options.model_path:
            problems.append(reward_model_path_problem(node.node_id))
        if not any(graph[d].node_type == NodeType.COMPUTE and graph[d].node_role == NodeRole.REWARD
                   for d in graph.descendants(node.node_id)):
            what = (fields.JUDGE_SCORES if options.judge_template is not None
                    else fields.RM_SCORES)
            problems.append(
                f"node {node.node_id!r} (MODEL_INFERENCE + REWARD) adds {what}, but no COMPUTE "
                "REWARD node after it turns them into rewards: add one that depends on it, "
                "e.g. {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: "
                f"[{node.node_id}]}}, with reward.sources naming it")
    return problems


# Rules that need the job's plan. The scheduler checks each plan it makes; the worker the plan it
# was given (a Driver also runs plans the scheduler never made) with `check_planned_job`.


class PlannedLayout(Protocol):
    """A node's place in a plan (`dagrl_worker.shared.plan_view.NodeLayout`, or the Plan
    proto's)."""

    @property
    def ranks(self) -> Sequence[int]: ...

    @property
    def tp_size(self) -> int: ...

    @property
    def pp_size(self) -> int: ...


def check_planned_job(config: JobConfig, graph: TaskGraph, layouts: Mapping[str, PlannedLayout],
                      nodes: Iterable[str], *, on_gpu: bool) -> None:
    """`check_job` with the plan's rules, for a rank that runs `nodes` on a GPU or not: one
    ConfigError listing every problem."""
    problems = [*job_problems(config, graph), *redraw_problems(graph, layouts),
                *model_parallel_problems(layouts, nodes, on_gpu=on_gpu),
                *advantage_parallel_problems(graph, layouts),
                *engine_tensor_parallel_problems(config, graph, layouts),
                *engine_memory_problems(config, graph, layouts, on_gpu=on_gpu)]
    if problems:
        raise ConfigError(problems)


def redraw_problems(graph: TaskGraph, layouts: Mapping[str, PlannedLayout]) -> list[str]:
    """A DYNAMIC_SAMPLING node redraws prompts by rerunning its ancestors on its own ranks
    (`dagrl_worker.rank.graph_runner.GraphRunner.regenerate`): they must all run there."""
    problems = []
    for node in graph.nodes:
        if node.node_role != NodeRole.DYNAMIC_SAMPLING or node.node_id not in layouts:
            continue
        ranks = list(layouts[node.node_id].ranks)
        elsewhere = [a for a in graph.ancestors(node.node_id)
                     if a in layouts and list(layouts[a].ranks) != ranks]
        if elsewhere:
            problems.append(
                f"node {node.node_id!r} (DYNAMIC_SAMPLING) reruns its upstream nodes on its own "
                f"ranks {ranks} to redraw prompts, but the plan puts "
                f"{', '.join(repr(a) for a in elsewhere)} on other ranks; keep them together "
                "(workflow.agent_placement=colocate for a multi-agent workflow)")
    return problems


def engine_tensor_parallel_problems(config: JobConfig, graph: TaskGraph,
                                    layouts: Mapping[str, PlannedLayout]) -> list[str]:
    """vLLM's tensor-parallel engines over the ranks' world: vLLM groups the world's ranks in
    consecutive blocks of `tensor_model_parallel_size` from rank 0 (the world's size a multiple
    of it), and the ranks of one block serve one engine, so they must all be one rollout
    node's ranks and draw the same prompts: the node's `tp_size` in the plan is the engine's."""
    tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
    if config.actor_rollout_ref.rollout.name != "vllm" or tp == 1 or not layouts:
        return []
    key = f"actor_rollout_ref.rollout.tensor_model_parallel_size is {tp}"
    world = 1 + max(rank for layout in layouts.values() for rank in layout.ranks)
    problems = []
    if world % tp:
        problems.append(f"{key}, but the plan's {world} ranks are not a multiple of it: vLLM "
                        "groups every rank of the job in blocks of that size")
    for node in graph.nodes:
        if node.node_role != NodeRole.ROLLOUT or node.node_id not in layouts:
            continue
        layout = layouts[node.node_id]
        if layout.tp_size != tp:
            problems.append(f"{key}, but the plan gives rollout node {node.node_id!r} tp_size "
                            f"{layout.tp_size}: the ranks of one engine must draw the same "
                            f"prompts; set the node's tp_size to {tp} in its config")
        ranks = sorted(layout.ranks)
        blocks = {rank // tp for rank in ranks}
        if ranks != [rank for block in sorted(blocks) for rank in range(block * tp,
                                                                         (block + 1) * tp)]:
            problems.append(f"{key}, but the plan puts rollout node {node.node_id!r} on ranks "
                            f"{ranks}, which are not whole blocks of vLLM's (ranks {tp}k to "
                            f"{tp}k+{tp - 1}): an engine would span ranks of other nodes; give "
                            f"the rollout side a multiple of {tp} ranks starting at such a block")
    return problems


def engine_memory_problems(config: JobConfig, graph: TaskGraph,
                           layouts: Mapping[str, PlannedLayout], *, on_gpu: bool) -> list[str]:
    """On a GPU each vLLM engine asks for `gpu_memory_utilization` of the whole device at its
    start and refuses to start when less is free: the engines of the agents whose rollout a
    rank runs (one each, built one after another, all awake) must ask for less than all of it
    together, with the models trained beside them still to fit."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm" or not on_gpu:
        return []
    agents_on: dict[int, set[int]] = {}
    for node in graph.nodes:
        if node.node_role == NodeRole.ROLLOUT and node.node_id in layouts:
            for rank in layouts[node.node_id].ranks:
                agents_on.setdefault(rank, set()).add(node.agent_group)
    crowded = sorted(rank for rank, agents in agents_on.items()
                     if len(agents) > 1 and len(agents) * rollout.gpu_memory_utilization >= 1)
    if not crowded:
        return []
    engines = max(len(agents_on[rank]) for rank in crowded)
    return [f"actor_rollout_ref.rollout.gpu_memory_utilization is "
            f"{rollout.gpu_memory_utilization:g}, but rank(s) {crowded} run the vLLM engines of "
            f"{engines} agents, each asking for that share of the GPU when it starts: set it "
            f"below {1 / engines:.2g} (leaving room for the models trained there), or place the "
            "agents apart (workflow.agent_placement: spread)"]


def advantage_parallel_problems(graph: TaskGraph,
                                layouts: Mapping[str, PlannedLayout]) -> list[str]:
    """An ADVANTAGE node holds no model, and its statistics (whitening, the adaptive KL
    controller's KL) sum each rank's share once: tp_size x pp_size > 1 would count a share on
    each of its ranks."""
    split = sorted(n.node_id for n in graph.nodes if n.node_id in layouts
                   and executor_kind(n) == ExecutorKind.ADVANTAGE
                   and layouts[n.node_id].tp_size * layouts[n.node_id].pp_size > 1)
    return [f"the plan gives advantage node {node_id!r} tp_size x pp_size > 1; it holds no "
            "model to shard and sums its statistics over its ranks, each holding a share "
            "once: remove tp_size/pp_size from its config" for node_id in split]


def model_parallel_problems(layouts: Mapping[str, PlannedLayout], nodes: Iterable[str], *,
                            on_gpu: bool) -> list[str]:
    """Tensor or pipeline parallel layouts shard one model over several GPUs."""
    sharded = sorted(n for n in nodes if layouts[n].tp_size * layouts[n].pp_size > 1)
    if not sharded or on_gpu:
        return []
    return [f"the plan gives {', '.join(repr(n) for n in sharded)} tp_size x pp_size > 1, which "
            "shards a model across GPUs; on CPU every node runs with tp_size = pp_size = 1 "
            "(remove tp_size/pp_size from the nodes' config)"]

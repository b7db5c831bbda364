"""The demo's tiny reward model: a sequence classifier that tells right sums from wrong ones.

`prepare_reward_model(folder, recipe)` writes `folder/reward_model/`, a Hugging Face
sequence-classification checkpoint (`AutoModelForSequenceClassification`, one logit: higher
is more likely right) with the policy's tokenizer, and skips the work when a previous call
with the same recipe (and the same demo assets) left it there. The demo assets
(`dagrl.models.demo.prepare_assets`) must be in `folder` first: the RM starts from the
warm-started policy's backbone with a fresh score head (a from-scratch classifier this small
does not learn to check sums in a minute; the warm-started backbone already half knows them)
and is fine-tuned with binary cross-entropy, at the last token and, for the prefix so far, at
every answer token, on two kinds of answers: (prompt, its sum) = 1 against (prompt, a
plausible wrong sum) = 0 (a digit off by a little, two digits swapped, a digit dropped or
added, an operand repeated, an empty answer), and, for a quarter of each batch, the policy's
own samples (temperature 1) on some training prompts, labelled by the rule, half right and
half wrong: the mistakes GRPO will show it.

`measure_reward_model` (also run by `prepare_reward_model`, and by `--measure`) scores the
saved RM on the validation prompts: the accuracy on one right and one synthetic wrong answer
each (logit > 0 means right) and, on `samples_per_prompt` samples of the policy per prompt, the
pairwise accuracy (how often a right sample outscores a wrong one of the same prompt, what
GRPO's group-relative advantages use) and the best-of-n accuracy (how often the best-scored
sample is right, over all prompts), beside the policy's greedy accuracy (what validation
measures), sampled accuracy and pass@n. RL on this RM alone can only gain where best-of-n
beats greedy. Measured with the demo's recipe (2 cores): greedy 51.5 %, sampled 22 %, pass@8
77.5 %; the RM 98 % on right vs synthetic wrong, 99 % pairwise, best-of-8 74.5 %. The
earlier recipe (200 steps at a constant 5e-4, synthetic answers only) reached 87.8 %, 84 %
and 41.5 %, below greedy, and GRPO on it gamed it (validation 51.5 % -> 30 %).

Scored input: the chat-formatted prompt, the answer, then eos, right-padded, the way the
worker's reward-model node builds it from a rollout's tokens. Not a general RM trainer: one
process, no checkpoints along the way. Used by `examples/grpo_arith_rm.yaml` and the e2e tests:

    python -m dagrl.models.reward_model outputs/arith [--measure]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedTokenizerBase,
)

from dagrl.data import read_parquet
from dagrl.models.demo import RECIPE_FILE, DemoRecipe, prepare_assets
from dagrl.models.warm_start import optimizer_step
from dagrl.tokenizing import encode_chat_prompt, load_tokenizer

FOLDER = "reward_model"  # under the demo's assets folder


@dataclass(frozen=True)
class RewardModelRecipe:
    """How the tiny RM is trained; with the demo's recipe it decides the checkpoint."""

    # measured best-of-8 on the held-out prompts (policy greedy: 51.5 %): 200 steps at a
    # constant 5e-4 reached 41.5 %; with warm-up and linear decay, 300 steps at 1e-3 68.5 %,
    # 600 steps 74.5 % (~90 s on 2 quiet cores); a peak of 2e-3 diverged (25-30 %)
    steps: int = 600
    lr: float = 1e-3  # the peak, after `warmup_steps`, decayed linearly to 0 at `steps`
    warmup_steps: int = 20
    batch_size: int = 128
    # the share of each batch drawn from the policy's own samples (half right, half wrong):
    # 0.25 lifted best-of-8 from 68.5 % to 74.5 % at 600 steps; 0.5 and 1.0 (at 200 steps,
    # constant 5e-4) did worse than none: the synthetic wrong sums carry the lesson
    policy_share: float = 0.25
    policy_prompts: int = 512  # training prompts the policy samples for that share
    samples_per_prompt: int = 8  # the rollout's n, for the pool and the held-out figures
    max_new_tokens: int = 4  # the demo's max_response_length
    seed: int = 0


@dataclass(frozen=True)
class Scored:
    """One answer the RM learns from: its tokens and what it should say about them."""

    tokens: list[int]  # chat prompt, answer, eos (when the answer ended)
    answer_positions: list[int]  # where the answer's tokens are in `tokens`
    prefix_labels: list[float]  # per answer token: 1.0 while the answer so far starts the sum
    label: float  # 1.0 when the answer is the sum


def prepare_reward_model(folder: str | Path, recipe: RewardModelRecipe) -> dict[str, float]:
    """Build (or reuse) `folder/reward_model` from the demo assets in `folder`; returns
    timings and `measure_reward_model`'s figures (`reused` when nothing was done)."""
    root = Path(folder)
    policy_recipe = root / RECIPE_FILE
    if not policy_recipe.is_file():
        raise FileNotFoundError(
            f"{root} has no demo assets ({RECIPE_FILE} missing); build them first with "
            f"`python -m dagrl.models.demo {root}` (or run this module's command, which does)")
    target = root / FOLDER
    marker = target / RECIPE_FILE
    wanted = json.dumps({"policy": json.loads(policy_recipe.read_text()),
                         "reward_model": dataclasses.asdict(recipe)}, sort_keys=True)
    if marker.is_file() and marker.read_text() == wanted:
        return {"reused": 1.0}
    started = time.perf_counter()
    tokenizer = load_tokenizer(root / "model")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)  # the policy's samples, the fresh head, the batches
        train = _examples(root / "data" / "train.parquet")
        pool = _policy_pool(root / "model", tokenizer, train, recipe)
        model = AutoModelForSequenceClassification.from_pretrained(
            str(root / "model"), num_labels=1, local_files_only=True)
        model.config.pad_token_id = tokenizer.pad_token_id  # where the classifier reads
        losses = _train(model, tokenizer, train, pool, recipe)
        figures = measure_reward_model(root, model, tokenizer, recipe)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    marker.write_text(wanted)
    return {"rm_loss_first": losses[0], "rm_loss_last": losses[-1], **figures,
            "rm_prepare_seconds": time.perf_counter() - started}


def measure_reward_model(root: Path, model: Any, tokenizer: PreTrainedTokenizerBase,
                         recipe: RewardModelRecipe) -> dict[str, float]:
    """The RM's held-out figures on `root`'s validation prompts, beside the policy's own (see
    the module docstring); the samples are drawn from the current torch seed."""
    heldout = _examples(root / "data" / "val.parquet")
    groups = policy_samples(root / "model", tokenizer, heldout, recipe)
    pairwise, best_of_n = sample_accuracy(model, tokenizer, groups)
    n = len(groups[0]) if groups else 0
    return {"rm_heldout_accuracy": heldout_accuracy(model, tokenizer, heldout, recipe.seed),
            "rm_heldout_pairwise_accuracy": pairwise,
            f"rm_heldout_best_of_{n}_accuracy": best_of_n,
            "policy_greedy_accuracy": greedy_accuracy(root / "model", tokenizer, heldout,
                                                      recipe.max_new_tokens),
            "policy_sampled_accuracy": _mean([label for g in groups for _, label in g]),
            f"policy_pass_at_{n}": _mean([float(any(label for _, label in g)) for g in groups])}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _examples(path: Path) -> list[tuple[Any, str]]:
    return [(row["prompt"], str(row["ground_truth"])) for row in read_parquet(path)]


def wrong_answer(answer: str, prompt_text: str, rng: random.Random) -> str:
    """A plausible wrong answer to a sum: the mistakes a half-trained policy makes."""
    digits = list(answer)
    kind = rng.randrange(7)
    if kind <= 2:  # one digit off by 1-3 (the most common mistake)
        i = rng.randrange(len(digits))
        digits[i] = str((int(digits[i]) + rng.choice((-3, -2, -1, 1, 2, 3))) % 10)
    elif kind == 3 and len(digits) > 1 and digits[0] != digits[1]:
        digits[0], digits[1] = digits[1], digits[0]
    elif kind == 4:
        digits.insert(rng.randrange(len(digits) + 1), str(rng.randrange(10)))
    elif kind == 5 and len(digits) > 1:
        del digits[rng.randrange(len(digits))]
    else:  # an operand, or nothing at all
        operands = prompt_text.rstrip("=").split("+")
        digits = list(rng.choice([*operands, ""]))
    wrong = "".join(digits)
    return wrong if wrong != answer else wrong_answer(answer, prompt_text, rng)


def encode_scored(tokenizer: PreTrainedTokenizerBase, prompt: Any, answer: str) -> list[int]:
    """The tokens the RM scores: chat prompt (with the assistant header), answer, eos."""
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    return [*_chat_prompt(tokenizer, prompt), *answer_ids, int(tokenizer.eos_token_id)]


def scored(tokenizer: PreTrainedTokenizerBase, prompt: Any, truth: str,
           tokens: list[int]) -> Scored:
    """`tokens` (the chat prompt, then an answer) with its labels against the sum `truth`."""
    start = len(_chat_prompt(tokenizer, prompt))
    eos = int(tokenizer.eos_token_id)
    positions = [start + k for k, token in enumerate(tokens[start:]) if token != eos]
    prefix, text = [], ""
    for position in positions:
        text += str(tokenizer.decode([tokens[position]]))
        prefix.append(float(truth.startswith(text)))
    return Scored(tokens, positions, prefix, float(text == truth))


def _chat_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Any) -> list[int]:
    """The prompt as the policy sees it: chat template, ending with the assistant header."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return encode_chat_prompt(tokenizer, messages)


def _question(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else str(list(prompt)[-1]["content"])


def _labelled(tokenizer: PreTrainedTokenizerBase, examples: list[tuple[Any, str]],
              rng: random.Random) -> list[Scored]:
    """One right and one synthetic wrong answer per example."""
    answers = []
    for prompt, truth in examples:
        for answer in (truth, wrong_answer(truth, _question(prompt), rng)):
            answers.append(scored(tokenizer, prompt, truth,
                                  encode_scored(tokenizer, prompt, answer)))
    return answers


def _collate(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(sequences), width), dtype=torch.long)  # [B, T]
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)] = torch.tensor(sequence)
        mask[row, :len(sequence)] = 1
    return ids, mask


Labelled = tuple[list[int], float]  # the tokens the RM scores, 1.0 right or 0.0 wrong


@torch.no_grad()
def policy_samples(policy_dir: Path, tokenizer: PreTrainedTokenizerBase,
                   examples: list[tuple[Any, str]],
                   recipe: RewardModelRecipe) -> list[list[Labelled]]:
    """`recipe.samples_per_prompt` answers of the policy to each example's prompt, sampled at
    temperature 1 (the rollout's), each labelled right when its text is the sum; one list per
    prompt."""
    groups: list[list[Labelled]] = []
    for chunk, responses in _generate(policy_dir, tokenizer, examples, recipe.max_new_tokens,
                                      recipe.samples_per_prompt):
        n = recipe.samples_per_prompt
        for k, (tokens, text) in enumerate(responses):
            if k % n == 0:
                groups.append([])
            groups[-1].append((tokens, float(text == chunk[k // n][1])))
    return groups


@torch.no_grad()
def greedy_accuracy(policy_dir: Path, tokenizer: PreTrainedTokenizerBase,
                    examples: list[tuple[Any, str]], max_new_tokens: int) -> float:
    """The policy's greedy accuracy on `examples`: what validation measures."""
    right = [float(text == chunk[k][1])
             for chunk, responses in _generate(policy_dir, tokenizer, examples, max_new_tokens)
             for k, (_, text) in enumerate(responses)]
    return _mean(right)


def _generate(policy_dir: Path, tokenizer: PreTrainedTokenizerBase,
              examples: list[tuple[Any, str]], max_new_tokens: int,
              samples: int = 0) -> Iterator[tuple[list[tuple[Any, str]],
                                                   list[tuple[list[int], str]]]]:
    """Per chunk of examples, the policy's (prompt + response tokens, response text) for each
    prompt: `samples` sampled at temperature 1 in a row, or one greedy (`samples` 0)."""
    policy = AutoModelForCausalLM.from_pretrained(str(policy_dir), local_files_only=True).eval()
    pad, eos = int(tokenizer.pad_token_id), int(tokenizer.eos_token_id)
    per_prompt = max(1, samples)
    for start in range(0, len(examples), 256):
        chunk = examples[start:start + 256]
        prompts = [_chat_prompt(tokenizer, prompt) for prompt, _ in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # [b, P]
        out = policy.generate(input_ids=ids, attention_mask=(ids != pad).long(),
                              do_sample=samples > 0, max_new_tokens=max_new_tokens,
                              num_return_sequences=per_prompt, pad_token_id=pad,
                              eos_token_id=eos)  # [b * per_prompt, P + R]
        responses = []
        for k, row in enumerate(out[:, width:].tolist()):
            response = row[:row.index(eos) + 1] if eos in row else row
            responses.append(([*prompts[k // per_prompt], *response],
                              str(tokenizer.decode(response, skip_special_tokens=True))))
        yield chunk, responses


def _policy_pool(policy_dir: Path, tokenizer: PreTrainedTokenizerBase,
                 examples: list[tuple[Any, str]],
                 recipe: RewardModelRecipe) -> tuple[list[Scored], list[Scored]]:
    """(right, wrong) policy samples on `recipe.policy_prompts` training prompts."""
    if recipe.policy_share <= 0:
        return [], []
    chosen = random.Random(recipe.seed).sample(examples,
                                               min(recipe.policy_prompts, len(examples)))
    pool: tuple[list[Scored], list[Scored]] = ([], [])
    for (prompt, truth), group in zip(chosen, policy_samples(policy_dir, tokenizer, chosen,
                                                             recipe), strict=True):
        for tokens, _ in group:
            answer = scored(tokenizer, prompt, truth, tokens)
            pool[0 if answer.label else 1].append(answer)
    return pool


def _train(model: Any, tokenizer: PreTrainedTokenizerBase, examples: list[tuple[Any, str]],
           pool: tuple[list[Scored], list[Scored]], recipe: RewardModelRecipe) -> list[float]:
    """AdamW (linear warm-up, then linear decay) on binary cross-entropy at the last token,
    plus the same at every answer token for the prefix so far (the per-digit signal of a
    process reward model: it lifted the best-scored sample's accuracy from ~54 % to ~64 % in
    the earlier recipe). Each step draws fresh synthetic wrong answers and, for
    `policy_share` of the batch, policy samples from `pool`, half right and half wrong."""
    rng = random.Random(recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        1.0, (step + 1) / max(1, recipe.warmup_steps), 1.0 - step / recipe.steps))
    from_pool = int(recipe.batch_size * recipe.policy_share) if all(pool) else 0
    losses = []
    model.train()
    for _ in range(recipe.steps):
        batch = _labelled(tokenizer, rng.sample(
            examples, max(1, (recipe.batch_size - from_pool) // 2)), rng)
        batch += rng.sample(pool[0], min(len(pool[0]), from_pool // 2))
        batch += rng.sample(pool[1], min(len(pool[1]), from_pool - from_pool // 2))
        losses.append(optimizer_step(model, optimizer, _loss(model, batch,
                                                             int(tokenizer.pad_token_id))))
        schedule.step()
    model.eval()
    return losses


def _loss(model: Any, batch: list[Scored], pad_id: int) -> torch.Tensor:
    ids, mask = _collate([answer.tokens for answer in batch], pad_id)
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    scores = model.score(hidden)[..., 0]  # [B, T]
    last = scores[torch.arange(len(batch)), mask.sum(dim=1) - 1]  # [B]
    rows = [row for row, answer in enumerate(batch) for _ in answer.answer_positions]
    positions = [p for answer in batch for p in answer.answer_positions]
    prefix = [label for answer in batch for label in answer.prefix_labels]
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    loss = bce(last, torch.tensor([answer.label for answer in batch]))
    if rows:
        loss = loss + bce(scores[rows, positions], torch.tensor(prefix))
    return loss


@torch.no_grad()
def heldout_accuracy(model: Any, tokenizer: PreTrainedTokenizerBase,
                     examples: list[tuple[Any, str]], seed: int) -> float:
    """Share of right answers scored > 0 and wrong answers scored < 0 (one of each per
    example, wrong answers drawn with `seed` + 1: none seen in training)."""
    answers = _labelled(tokenizer, examples, random.Random(seed + 1))
    ids, mask = _collate([answer.tokens for answer in answers], int(tokenizer.pad_token_id))
    logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]  # [B]
    right = (logits > 0).float() == torch.tensor([answer.label for answer in answers])
    return float(right.float().mean())


@torch.no_grad()
def sample_accuracy(model: Any, tokenizer: PreTrainedTokenizerBase,
                    groups: list[list[Labelled]]) -> tuple[float, float]:
    """(pairwise, best-of-n): the share of (right, wrong) sample pairs of one prompt where the
    right one scores higher, and of prompts whose best-scored sample is right."""
    pairs = wins = best_right = 0
    for group in groups:
        ids, mask = _collate([sequence for sequence, _ in group], int(tokenizer.pad_token_id))
        scores = model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist()  # [n]
        right = [s for s, (_, label) in zip(scores, group, strict=True) if label]
        wrong = [s for s, (_, label) in zip(scores, group, strict=True) if not label]
        pairs += len(right) * len(wrong)
        wins += sum(r > w for r in right for w in wrong)
        best_right += int(group[scores.index(max(scores))][1] == 1.0)
    nan = float("nan")
    return (wins / pairs if pairs else nan), (best_right / len(groups) if groups else nan)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="train the demo's tiny reward model into FOLDER/reward_model (builds the "
                    "demo's policy and data in FOLDER first when missing)")
    parser.add_argument("folder", help="the demo assets' folder (examples read outputs/arith)")
    parser.add_argument("--small", action="store_true", help="the e2e tests' demo recipe")
    parser.add_argument("--measure", action="store_true",
                        help="measure the saved reward model against the policy (best-of-n "
                             "vs greedy, see the module docstring) instead of building it")
    args = parser.parse_args()
    torch.set_num_threads(2)
    recipe = RewardModelRecipe()
    if args.measure:
        root = Path(args.folder)
        tokenizer = load_tokenizer(root / FOLDER)
        model = AutoModelForSequenceClassification.from_pretrained(
            str(root / FOLDER), local_files_only=True).eval()
        torch.manual_seed(recipe.seed)
        figures = measure_reward_model(root, model, tokenizer, recipe)
    else:
        prepare_assets(args.folder, DemoRecipe.for_tests() if args.small else DemoRecipe())
        figures = prepare_reward_model(args.folder, recipe)
    for key, value in figures.items():
        print(f"{key}: {value:.4g}")


if __name__ == "__main__":
    main()

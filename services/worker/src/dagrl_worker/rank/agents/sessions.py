"""Agent sessions: every endpoint call of one episode as exact tokens, stitched into sequences.

Owns the record of what the engine saw and did (`Sampled`: the ids it sampled, their
log-probs, the policy version; a sequence's prompt ids are what it was given), the per-session
keys, and how calls become training sequences. It parses no HTTP and renders no template
(`protocol.py`), and it does not generate (`batcher.py`).

Stitching. A session holds sequences; each remembers the transcript of its last call (for chat:
the messages and the reply; for completions: the prompt text and the reply), an opaque
`Transcript` that `protocol.py` compares. A call whose request repeats a sequence's last
transcript and adds to it *extends* that sequence: the engine is given the sequence's own
tokens (the first prompt, then every token since, sampled or inserted — never re-tokenized)
plus the tokens of the new text only, and the sequence grows by the new text (loss mask 0:
template, tool results, user turns) and the sampled reply (loss mask 1). Any other call
starts a new sequence (a program that rewrote, summarized or dropped its history): one
training sample per call that does not extend. Choices 2..n of a call each start a
sequence of their own whose prompt is what the engine was given, so no sampled token is
trained twice; so does a call that lost a race (another call of its session extended the same
sequence while it generated).

Budgets. Such a *branch*'s prompt holds its parent's tokens after the first prompt: its
`offset` counts them, and what it samples after counts against the same response budget as
its parent's (`Sequence.used`), so a branch never restarts the budget its episode spent.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Transcript = Any  # what protocol.py compares to detect an extension (messages, text, ...)


@dataclass(frozen=True)
class Sampled:
    """One choice the engine sampled for one prompt."""

    ids: list[int]  # sampled token ids, EOS included when it stopped there
    log_probs: list[float]  # each sampled token's log-prob under the sampling distribution
    version: int  # the policy version (updates) of the weights that sampled it
    finished: bool  # True: stopped at EOS (or a stop string); False: ran out of tokens


@dataclass
class Sequence:
    """One training sample in the making: its first prompt, then every token after it."""

    prompt_ids: list[int]
    # a branch's tokens of its prompt after the episode's first prompt (its parent's response
    # and the text inserted after it): spent of the response budget before it began
    offset: int = 0
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 on sampled tokens
    log_probs: list[float] = field(default_factory=list)  # sampled tokens' (0 on the others)
    calls: int = 0
    version: int = -1  # the oldest policy version among its calls
    tail: Transcript = None  # the transcript of its last call, reply included

    def tokens(self) -> list[int]:
        """What the engine would be given to continue this sequence."""
        return self.prompt_ids + self.response_ids

    @property
    def used(self) -> int:
        """The response budget it has spent: every token after its episode's first prompt."""
        return self.offset + len(self.response_ids)

    def append(self, inserted: list[int], sampled: Sampled, tail: Transcript) -> None:
        self.response_ids += inserted + sampled.ids
        self.response_mask += [0] * len(inserted) + [1] * len(sampled.ids)
        self.log_probs += [0.0] * len(inserted) + list(sampled.log_probs)
        self.calls += 1
        self.version = sampled.version if self.version < 0 else min(self.version,
                                                                     sampled.version)
        self.tail = tail

    @property
    def sampled_tokens(self) -> int:
        return sum(self.response_mask)


@dataclass
class Session:
    """One episode's calls. `key` is its bearer token on the endpoint; `name` (the episode's
    sample uid) names its calls' draws (`draw_names`)."""

    key: str
    name: str = ""
    sequences: list[Sequence] = field(default_factory=list)
    calls: int = 0
    requests: int = 0  # calls asked for so far, answered or not (`draw_names` counts them)
    generate_s: float = 0.0  # time its calls spent waiting for the endpoint's answer

    def extended(self, inserted_after: Callable[[Sequence], list[int] | None]
                 ) -> tuple[Sequence | None, list[int]]:
        """The most recent sequence this call extends and the tokens it inserts after it
        (`inserted_after(sequence)`: None when the call does not extend that sequence), or
        (None, [])."""
        for sequence in reversed(self.sequences):
            inserted = inserted_after(sequence)
            if inserted is not None:
                return sequence, inserted
        return None, []

    def record(self, parent: Sequence | None, prompt_ids: list[int], inserted: list[int],
               choices: list[tuple[Sampled, Transcript]]) -> None:
        """Record one call: `prompt_ids` as given to the engine (`parent.tokens() + inserted`
        when it extends `parent`, as it was when the call began), and each choice with the
        transcript it leaves. Without `parent` every choice starts a sequence; with it, the
        first choice extends it unless another call extended it first (`prompt_ids` is no
        longer its tokens), and the other choices branch off it (`offset`)."""
        self.calls += 1
        extends = parent is not None and prompt_ids == parent.tokens() + inserted
        offset = 0 if parent is None else parent.offset + len(prompt_ids) - len(
            parent.prompt_ids)
        for index, (sampled, tail) in enumerate(choices):
            if parent is not None and extends and index == 0:
                parent.append(inserted, sampled, tail)
                continue
            sequence = Sequence(prompt_ids=list(prompt_ids), offset=offset)
            sequence.append([], sampled, tail)
            self.sequences.append(sequence)

    @property
    def sampled_tokens(self) -> int:
        return sum(s.sampled_tokens for s in self.sequences)

    def draw_names(self, n: int) -> tuple[str, ...]:
        """The names that seed the `n` choices of the session's next call: the same in every
        run of the same episode, whatever the other episodes do."""
        self.requests += 1
        return tuple(f"{self.name}/call{self.requests}/{choice}" for choice in range(n))


class SessionRegistry:
    """The live sessions of one endpoint, by key. Keys are random, 256 bits, per session."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def open(self, name: str | None = None) -> Session:
        """A new session; `name` seeds its draws (None: its random key, so they do not repeat
        from run to run)."""
        key = f"dagrl-{secrets.token_urlsafe(32)}"
        session = Session(key=key, name=key if name is None else name)
        self._sessions[session.key] = session
        return session

    def get(self, key: str) -> Session | None:
        for known, session in self._sessions.items():
            if secrets.compare_digest(known, key):
                return session
        return None

    def __len__(self) -> int:
        return len(self._sessions)

    def close(self, session: Session) -> None:
        """Its key answers nothing any more; the recorded calls stay with `session`."""
        self._sessions.pop(session.key, None)

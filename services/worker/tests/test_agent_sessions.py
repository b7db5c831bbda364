"""Agent sessions without HTTP: prompts of extending and rewriting calls, the sequences and
masks they stitch into, the rows they become, and what a request may say."""

from __future__ import annotations

import pytest
import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.envs import agent_options
from dagrl.errors import ConfigError
from dagrl.models import build_char_tokenizer
from dagrl_worker.rank.agents.episodes import EpisodeOutcome, episodes_to_batch
from dagrl_worker.rank.agents.protocol import GatewayError, GatewayLimits, parse_chat
from dagrl_worker.rank.agents.rendering import ChatTail, CompletionTail, Renderer
from dagrl_worker.rank.agents.sessions import Sampled, Session, SessionRegistry
from dagrl_worker.rank.prompts import prompts_to_batch

TOKENIZER = build_char_tokenizer()
RENDERER = Renderer(TOKENIZER)
EOS = int(TOKENIZER.eos_token_id)
QUESTION = [{"role": "user", "content": "12+34="}]


def ids(text: str) -> list[int]:
    return list(TOKENIZER(text, add_special_tokens=False)["input_ids"])


def sampled(text: str, *, eos: bool = True, version: int = 3) -> Sampled:
    tokens = ids(text) + ([EOS] if eos else [])
    return Sampled(tokens, [-0.01 * (i + 1) for i in range(len(tokens))], version, eos)


def chat_call(session: Session, messages: list[dict], answer: Sampled) -> str:
    """What the gateway does for one chat call: the prompt, then the recorded reply."""
    prompt = RENDERER.chat_prompt(session, messages, None)
    reply = RENDERER.reply(answer.ids, answer.log_probs, ())
    session.record(prompt.parent, prompt.ids, prompt.inserted,
                   [(answer, ChatTail(messages, None, prompt.text, reply.text))])
    return reply.text


def tool_episode(session: Session, first: Sampled, second: Sampled) -> list[dict]:
    call = chat_call(session, QUESTION, first)
    messages = [*QUESTION, {"role": "assistant", "content": call},
                {"role": "user", "content": "<result>46</result>"}]
    chat_call(session, messages, second)
    return messages


def test_calls_that_extend_each_other_become_one_sequence_of_the_sampled_tokens() -> None:
    session = Session(key="k")
    first, second = sampled("<tool>12+34</tool>"), sampled("46")
    messages = tool_episode(session, first, second)
    assert len(session.sequences) == 1
    sequence = session.sequences[0]
    assert sequence.prompt_ids == ids(RENDERER.chat_text(QUESTION, None))
    inserted = ids("\n<|im_start|>user\n<result>46</result><|im_end|>\n<|im_start|>assistant\n")
    assert sequence.response_ids == first.ids + inserted + second.ids
    assert sequence.response_mask == [1] * len(first.ids) + [0] * len(inserted) + [1] * len(
        second.ids)
    assert sequence.log_probs == first.log_probs + [0.0] * len(inserted) + second.log_probs
    assert sequence.calls == 2 and sequence.version == 3
    # the stitched tokens are what the template renders for the whole conversation
    whole = [*messages, {"role": "assistant", "content": "46"}]
    assert TOKENIZER.decode(sequence.tokens()) + "\n" == RENDERER.chat_text(whole, None, False)


def test_a_rewritten_history_starts_a_new_sequence_per_call() -> None:
    session = Session(key="k")
    first = sampled("<tool>12+34</tool>")
    chat_call(session, QUESTION, first)
    summary = [{"role": "user", "content": "12+34= (the tool said 46)"}]
    second = sampled("46")
    chat_call(session, summary, second)
    assert [s.prompt_ids for s in session.sequences] == [
        ids(RENDERER.chat_text(QUESTION, None)), ids(RENDERER.chat_text(summary, None))]
    assert [s.response_ids for s in session.sequences] == [first.ids, second.ids]
    assert all(s.response_mask == [1] * len(s.response_ids) for s in session.sequences)


def test_an_edited_reply_does_not_extend() -> None:
    session = Session(key="k")
    chat_call(session, QUESTION, sampled("<tool>12+34</tool>"))
    edited = [*QUESTION, {"role": "assistant", "content": "<tool>12 + 34</tool>"},
              {"role": "user", "content": "<result>46</result>"}]
    prompt = RENDERER.chat_prompt(session, edited, None)
    assert prompt.parent is None and prompt.ids == ids(RENDERER.chat_text(edited, None))


def test_a_reply_cut_by_length_gets_the_template_closing_inserted() -> None:
    session = Session(key="k")
    first = sampled("<tool>12+3", eos=False)
    call = chat_call(session, QUESTION, first)
    assert call == "<tool>12+3"
    messages = [*QUESTION, {"role": "assistant", "content": call},
                {"role": "user", "content": "go on"}]
    prompt = RENDERER.chat_prompt(session, messages, None)
    assert prompt.parent is session.sequences[0]
    assert prompt.inserted == ids("<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n"
                                  "<|im_start|>assistant\n")


def test_stop_strings_cut_the_reply_before_the_stop_in_text_and_tokens() -> None:
    answer = sampled("<tool>1+2</tool> and more")
    reply = RENDERER.reply(answer.ids, answer.log_probs, ("</tool>",))
    assert reply.text == "<tool>1+2" and reply.finished
    assert reply.ids == ids("<tool>1+2")  # the stop string's tokens are not kept
    assert reply.log_probs == answer.log_probs[:len(reply.ids)]


def test_a_react_program_that_appends_the_stop_text_gets_it_once() -> None:
    """A completions program stops at "Observation:" and appends it with the tool's answer,
    as a ReAct loop does: the engine is given exactly the text the program sent."""
    session = Session(key="k")
    first = RENDERER.completion_prompt(session, "Q: 12+34?\n")
    answer = sampled("Action: calc 12+34\nObservation: 99\n", eos=False)
    reply = RENDERER.reply(answer.ids, answer.log_probs, ("Observation:",))
    assert reply.text == "Action: calc 12+34\n"
    session.record(first.parent, first.ids, first.inserted,
                   [(Sampled(reply.ids, reply.log_probs, 3, reply.finished),
                     CompletionTail(first.text + reply.text))])
    sent = "Q: 12+34?\n" + reply.text + "Observation: 46\n"
    second = RENDERER.completion_prompt(session, sent)
    assert second.parent is session.sequences[0]
    assert TOKENIZER.decode(second.ids) == sent
    assert session.sequences[0].response_ids == ids("Action: calc 12+34\n")


def test_a_stop_string_inside_a_token_keeps_only_whole_tokens_before_it() -> None:
    tokenizer = BigramTokenizer()
    renderer = Renderer(tokenizer)
    answer = tokenizer.encode_pairs("ab|cd|e>|xy")  # the stop ">" starts inside "e>"
    reply = renderer.reply(answer, [-0.1] * len(answer), (">",))
    assert reply.ids == answer[:2] and reply.text == "abcd"
    assert reply.log_probs == [-0.1, -0.1] and reply.finished


def test_the_stop_scan_of_a_long_reply_costs_a_few_decodes() -> None:
    tokenizer = CountingTokenizer()
    renderer = Renderer(tokenizer)
    text = "The quick brown fox jumps over the lazy dog. " * 100
    long = ids(text)  # 4500 tokens
    tokenizer.decodes = 0
    reply = renderer.reply(long, [0.0] * len(long), ("</tool>",))
    assert reply.text == text and tokenizer.decodes == 1  # no stop: one decode
    found = ids(text + "</tool> more")
    tokenizer.decodes = 0
    reply = renderer.reply(found, [0.0] * len(found), ("</tool>",))
    assert reply.text == text and reply.ids == long
    assert tokenizer.decodes < 40, tokenizer.decodes  # a search, not one decode per token


class CountingTokenizer:
    """The char tokenizer, counting its decodes."""

    def __init__(self) -> None:
        self.inner = build_char_tokenizer()
        self.eos_token_id = self.inner.eos_token_id
        self.decodes = 0

    def __len__(self) -> int:
        return len(self.inner)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        self.decodes += 1
        return str(self.inner.decode(token_ids, skip_special_tokens=skip_special_tokens))


class BigramTokenizer:
    """Tokens of two characters each (the pairs a test names), so a stop string can start
    inside a token, as with BPE merges; id 0 is EOS."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.vocab: list[str] = ["<eos>"]

    def __len__(self) -> int:
        return len(self.vocab)

    def encode_pairs(self, pairs: str) -> list[int]:
        for pair in pairs.split("|"):
            if pair not in self.vocab:
                self.vocab.append(pair)
        return [self.vocab.index(pair) for pair in pairs.split("|")]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.vocab[i] for i in token_ids
                       if not (skip_special_tokens and i == self.eos_token_id))


def test_other_choices_of_an_extending_call_start_sequences_of_their_own() -> None:
    session = Session(key="k")
    first = sampled("<tool>1+2</tool>")
    call = chat_call(session, QUESTION, first)
    messages = [*QUESTION, {"role": "assistant", "content": call},
                {"role": "user", "content": "<result>3</result>"}]
    prompt = RENDERER.chat_prompt(session, messages, None)
    choices = [sampled("3"), sampled("4")]
    session.record(prompt.parent, prompt.ids, prompt.inserted,
                   [(c, ChatTail(messages, None, prompt.text, "x")) for c in choices])
    assert len(session.sequences) == 2
    assert session.sequences[0].response_ids[-len(choices[0].ids):] == choices[0].ids
    assert session.sequences[1].prompt_ids == prompt.ids
    assert session.sequences[1].response_mask == [1] * len(choices[1].ids)


def test_completions_extend_by_text_and_by_token_ids() -> None:
    session = Session(key="k")
    first = sampled("ab", eos=False)
    prompt = RENDERER.completion_prompt(session, "Q:")
    session.record(None, prompt.ids, [], [(first, CompletionTail("Q:ab"))])
    by_text = RENDERER.completion_prompt(session, "Q:ab\nR:")
    assert by_text.parent is session.sequences[0] and by_text.inserted == ids("\nR:")
    by_ids = RENDERER.completion_prompt(session, ids("Q:ab") + ids("!"))
    assert by_ids.parent is session.sequences[0] and by_ids.inserted == ids("!")
    assert RENDERER.completion_prompt(session, "Q:xy").parent is None


def test_session_keys_are_distinct_and_closed_keys_answer_nothing() -> None:
    registry = SessionRegistry()
    first, second = registry.open(), registry.open()
    assert first.key != second.key and len(first.key) > 40
    assert registry.get(first.key) is first and registry.get("dagrl-guess") is None
    registry.close(first)
    assert registry.get(first.key) is None and registry.get(second.key) is second


def samples_batch(count: int) -> Batch:
    rows = {"prompt_ids": [ids("q")] * count, "index": list(range(count)),
            "data_source": ["arith"] * count}
    return prompts_to_batch(rows, int(TOKENIZER.pad_token_id), "train")


def test_rows_carry_the_sampled_tokens_and_leave_failed_episodes_out() -> None:
    done, rewritten, failed = Session(key="a"), Session(key="b"), Session(key="c")
    tool_episode(done, sampled("<tool>1+2</tool>"), sampled("3"))
    chat_call(rewritten, QUESTION, sampled("7"))
    chat_call(rewritten, [{"role": "user", "content": "again"}], sampled("8", version=2))
    chat_call(failed, QUESTION, sampled("9"))
    outcomes = [EpisodeOutcome(done, reward=1.0), EpisodeOutcome(rewritten, reward=0.0),
                EpisodeOutcome(failed, error="ValueError: boom")]
    out = episodes_to_batch(samples_batch(3), outcomes, int(TOKENIZER.pad_token_id), 72)
    assert out.columns["uid"] == ["train:0", "train:1", "train:1#1"]
    assert out.columns["num_turns"] == [2, 1, 1]
    assert out.tensors[fields.ROLLOUT_VERSION].tolist() == [3, 3, 2]
    sequences = [done.sequences[0], *rewritten.sequences]
    for row, sequence in enumerate(sequences):
        length = len(sequence.response_ids)
        assert out.tensors["responses"][row, :length].tolist() == sequence.response_ids
        mask = out.tensors["response_mask"][row]
        assert mask[:length].tolist() == sequence.response_mask and not mask[length:].any()
        kept = out.tensors["rollout_log_probs"][row][mask.bool()]
        assert torch.allclose(kept, torch.tensor([lp for lp, m in zip(
            sequence.log_probs, sequence.response_mask, strict=True) if m]))
        prompt = out.tensors["prompts"][row][out.tensors["attention_mask"][row, :out.tensors[
            "prompts"].shape[1]].bool()]
        assert prompt.tolist() == sequence.prompt_ids
    scores = out.tensors["token_level_scores"]
    assert scores.sum(dim=1).tolist() == [1.0, 0.0, 0.0]
    last = int(out.tensors["response_mask"][0].nonzero()[-1])
    assert scores[0, last] == 1.0


def test_without_rewards_the_reward_node_scores_the_rows() -> None:
    session = Session(key="a")
    chat_call(session, QUESTION, sampled("46"))
    out = episodes_to_batch(samples_batch(1), [EpisodeOutcome(session)],
                            int(TOKENIZER.pad_token_id), 72)
    assert "token_level_scores" not in out and len(out) == 1


LIMITS = GatewayLimits("policy", max_tokens_per_call=24, max_prompt_tokens=64,
                       max_response_tokens=72)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "gpt-4o", "messages": QUESTION}, 404, "model"),
    ({"model": "policy", "messages": QUESTION, "n": 2}, 400, "n"),
    ({"model": "policy", "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0]"),
    ({"model": "policy", "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
    ({"model": "policy", "messages": []}, 400, "messages"),
    ({"model": "policy", "messages": QUESTION, "max_tokens": 25}, 400, "max_tokens"),
    ({"model": "policy", "messages": QUESTION, "temperature": 3}, 400, "temperature"),
    ({"model": "policy", "messages": QUESTION, "stream": True}, 400, "stream"),
])
def test_bad_requests_are_refused_with_what_to_change(body: dict, status: int,
                                                      param: str) -> None:
    with pytest.raises(GatewayError) as refused:
        parse_chat(body, LIMITS)
    assert refused.value.status == status and refused.value.body()["error"]["param"] == param


def test_agent_options_are_typed_and_checked() -> None:
    options = agent_options("rollout", {"agent": "pkg.mod:agent", "episode_timeout_s": 5})
    assert options.agent == "pkg.mod:agent" and options.episode_timeout_s == 5.0
    with pytest.raises(ConfigError) as bad:
        agent_options("rollout", {"agent": "no-colon", "env": "math", "max_choices": 0})
    text = str(bad.value)
    assert "agent:" in text and "env" in text and "max_choices" in text
    with pytest.raises(ConfigError, match="agent is not set"):
        agent_options("rollout", {"episode_timeout_s": 5})

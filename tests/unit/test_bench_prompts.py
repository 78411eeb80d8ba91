"""revive bench's prompt sets (module_utils/revive_bench/prompts.py, data/bench/prompts.jsonl): the bundled set, the
approximate token budget, the budget counted by a real tokenizer (a tokenizer.json the tokenizers package trains here),
conversations as completions text, errors that name the line."""
from __future__ import annotations

import json
import sys

import pytest

from ansible.module_utils.revive_bench import prompts
from revive_cli.bench import DEFAULT_PROMPTS, redacted


def test_the_bundled_set_is_realistic_in_size_shape_and_length():
    loaded = prompts.load(str(DEFAULT_PROMPTS), 256)
    items = loaded["prompts"]
    assert loaded["count"] == len(items) >= 150 and loaded["trimmed"] == 0
    assert len({p.id for p in items}) == len(items)
    conversations = [p for p in items if len(p.messages) > 1]
    assert len(conversations) >= 30 and all(p.messages[-1]["role"] == "user" for p in conversations)
    lengths = sorted(p.approx_tokens() for p in items)
    assert lengths[0] < 10 and lengths[len(lengths) // 2] < 60 and lengths[-1] > 120


def test_the_budget_drops_old_turns_first_then_keeps_the_question_at_the_end():
    messages = [{"role": "user", "content": "a" * 400}, {"role": "assistant", "content": "b" * 40},
                {"role": "user", "content": "c" * 40}]
    assert prompts.trim(messages, 30) == messages[1:]          # 10 + 10 tokens after dropping the first
    single = [{"role": "user", "content": "x" * 100 + " the question?"}]
    kept = prompts.trim(single, 5)
    assert kept[0]["content"].endswith("the question?") and len(kept[0]["content"]) <= 20


def test_operator_files_with_conversations_and_their_errors(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [{"id": "a", "prompt": "How do I log in?"},
             {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                           {"role": "user", "content": "Reset my token"}]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    loaded = prompts.load(str(path), 256)
    first, second = loaded["prompts"]
    assert (first.id, second.id) == ("a", "line2")
    assert first.payload("completions") == "How do I log in?"
    assert second.payload("completions") == "User: Hi\nAssistant: Hello\nUser: Reset my token\nAssistant:"
    assert second.payload("chat")[-1] == {"role": "user", "content": "Reset my token"}
    assert loaded["approximation"] == "no tokenizer: 4 characters per token" and len(loaded["sha256"]) == 64
    path.write_text('{"prompt": "ok"}\n{"messages": [{"role": "user", "content": "q"}, '
                    '{"role": "assistant", "content": "a"}]}\n')
    with pytest.raises(prompts.PromptError, match=r"mine.jsonl:2: the last message must be the user's"):
        prompts.load(str(path))
    path.write_text("not json\n")
    with pytest.raises(prompts.PromptError, match=r"mine.jsonl:1: not JSON"):
        prompts.load(str(path))


def test_the_order_is_one_seeded_permutation():
    assert prompts.order(20, 5) == prompts.order(20, 5) != prompts.order(20, 6)
    assert sorted(prompts.order(20, 5)) == list(range(20))


def test_the_api_key_never_reaches_the_recorded_command():
    assert redacted(["--url", "u", "--api-key", "s3cret", "--api-key=s3cret"]) == \
        ["--url", "u", "--api-key", "***", "--api-key=***"]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A real tokenizer.json: a word-level vocabulary trained on the bundled prompts (one token per word or
    punctuation mark, so the counts below can be checked by hand)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = [m["content"] for p in prompts.load(str(DEFAULT_PROMPTS))["prompts"] for m in p.messages]
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def test_a_tokenizer_counts_and_cuts_at_token_boundaries(tokenizer_json):
    counter = prompts.tokenizer_counter(tokenizer_json)
    assert counter.count("How do I reset my VPN password?") == 8      # 7 words and the question mark
    text = "ab " * 300 + "How do I reset my VPN password?"
    assert counter.tail(text, 8) == "How do I reset my VPN password?"
    assert counter.tail(text, 9) == "ab How do I reset my VPN password?"
    single = [{"role": "user", "content": text}]
    kept = prompts.trim(single, 20, counter)
    assert counter.tokens(kept) == 20 and kept[0]["content"].endswith("my VPN password?")
    # the 4-characters rule keeps the last 80 characters: 24 tokens of this text by its tokenizer
    assert counter.count(prompts.trim(single, 20)[0]["content"]) == 24
    conversation = [{"role": "user", "content": "Hello there " * 20}, {"role": "assistant", "content": "Hi"},
                    {"role": "user", "content": "Reset my token"}]
    assert prompts.trim(conversation, 10, counter) == conversation[1:]       # 1 + 3 tokens once the first goes


def test_a_prompt_set_loaded_with_a_tokenizer_says_so_and_keeps_every_prompt_in_budget(tokenizer_json, tmp_path):
    counter = prompts.tokenizer_counter(tokenizer_json)
    loaded = prompts.load(str(DEFAULT_PROMPTS), 30, counter)
    assert loaded["approximation"].startswith(f"tokenizer {tokenizer_json} (sha256 ")
    assert loaded["trimmed"] > 0
    assert max(counter.tokens(p.messages) for p in loaded["prompts"]) <= 30
    approximate = prompts.load(str(DEFAULT_PROMPTS), 30)
    assert approximate["approximation"] == "no tokenizer: 4 characters per token"


def test_a_tokenizer_that_cannot_be_used_is_named(tokenizer_json, tmp_path, monkeypatch):
    with pytest.raises(prompts.PromptError, match=r"--tokenizer /nonexistent.json: No such file or directory"):
        prompts.tokenizer_counter("/nonexistent.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(prompts.PromptError, match=r"not a tokenizer.json the tokenizers package can read"):
        prompts.tokenizer_counter(str(bad))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(prompts.PromptError, match=r"the tokenizers package is not installed here .*approximate"):
        prompts.tokenizer_counter(tokenizer_json)

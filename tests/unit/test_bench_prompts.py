"""revive bench's prompt sets (module_utils/revive_bench/prompts.py, data/bench/prompts.jsonl): the bundled set, the
approximate token budget, conversations as completions text, errors that name the line."""
from __future__ import annotations

import json

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

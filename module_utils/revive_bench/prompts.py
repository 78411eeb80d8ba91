"""The prompt set: JSONL of user questions, trimmed to a token budget, in one seeded order for every level.

A line is `{"id": "...", "prompt": "text"}` or `{"id": "...", "messages": [{"role": ..., "content": ...}, ...]}`
(a conversation whose last message is the user's). The bundled set is data/bench/prompts.jsonl.

Tokens are counted by a Counter: with the model's tokenizer.json and the `tokenizers` package (`revive bench
--tokenizer FILE`, on a host that has both), exactly as that tokenizer encodes each message's content (no special
tokens, no chat template: the template's few tokens per turn are not in the budget); otherwise - the bench host
of playbooks/benchmark.yml has neither - approximately, CHARS_PER_TOKEN characters per token, the usual rule of
thumb for English text with BPE tokenizers. A conversation over budget loses its oldest turns first; a single
message still over budget keeps its end (the question is usually last), cut at a token boundary with a tokenizer.
The summary says which count was used.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

CHARS_PER_TOKEN = 4
APPROXIMATION = f"no tokenizer: {CHARS_PER_TOKEN} characters per token"


class PromptError(ValueError):
    """A prompt file that cannot be used; the message names the file and line."""


@dataclass
class Prompt:
    id: str
    messages: List[Dict[str, str]]
    trimmed: bool = False

    def approx_tokens(self) -> int:
        return approx_tokens(self.messages)

    def as_text(self) -> str:
        """The conversation as one completions prompt (the last turn left open for the assistant)."""
        if len(self.messages) == 1 and self.messages[0]["role"] == "user":
            return self.messages[0]["content"]
        lines = [f"{message['role'].capitalize()}: {message['content']}" for message in self.messages]
        return "\n".join(lines) + "\nAssistant:"

    def payload(self, kind: str) -> Any:
        return self.messages if kind == "chat" else self.as_text()


def approx_tokens(messages: List[Dict[str, str]]) -> int:
    return sum(-(-len(message["content"]) // CHARS_PER_TOKEN) for message in messages)


@dataclass(frozen=True)
class Counter:
    """How a text is measured in tokens, and how its end that fits n tokens is cut."""
    description: str
    count: Callable[[str], int]
    tail: Callable[[str, int], str]

    def tokens(self, messages: List[Dict[str, str]]) -> int:
        return sum(self.count(message["content"]) for message in messages)


APPROXIMATE = Counter(APPROXIMATION, lambda text: -(-len(text) // CHARS_PER_TOKEN),
                      lambda text, n: text[max(0, len(text) - n * CHARS_PER_TOKEN):].lstrip())


def tokenizer_counter(path: str) -> Counter:
    """A Counter from a tokenizer.json (the model directory's), through the `tokenizers` package."""
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]
    except ImportError:
        raise PromptError(f"--tokenizer {path}: the tokenizers package is not installed here (pip install "
                          "tokenizers); without --tokenizer the budget is approximate "
                          f"({CHARS_PER_TOKEN} characters per token)") from None
    try:
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        tokenizer = Tokenizer.from_file(path)
    except OSError as exc:
        raise PromptError(f"--tokenizer {path}: {exc.strerror}") from None
    except Exception as exc:  # noqa: BLE001 - the tokenizers package raises its own Exception subclass
        raise PromptError(f"--tokenizer {path}: not a tokenizer.json the tokenizers package can read ({exc})") from None

    def encode(text: str) -> Any:
        return tokenizer.encode(text, add_special_tokens=False)

    def tail(text: str, n: int) -> str:
        encoding = encode(text)
        if len(encoding.ids) <= n:
            return text
        return text[encoding.offsets[len(encoding.ids) - n][0]:].lstrip() if n > 0 else ""

    return Counter(f"tokenizer {path} (sha256 {digest[:12]}; message contents, no chat template)",
                   lambda text: len(encode(text).ids), tail)


def trim(messages: List[Dict[str, str]], budget: int, counter: Counter = APPROXIMATE) -> List[Dict[str, str]]:
    kept = list(messages)
    while len(kept) > 1 and counter.tokens(kept) > budget:
        kept.pop(0)
    if counter.tokens(kept) > budget:
        kept[-1] = {**kept[-1], "content": counter.tail(kept[-1]["content"], budget)}
    return kept


def _messages(entry: Any, where: str) -> List[Dict[str, str]]:
    if not isinstance(entry, dict):
        raise PromptError(f"{where}: not a JSON object")
    if isinstance(entry.get("prompt"), str) and entry["prompt"].strip():
        return [{"role": "user", "content": entry["prompt"]}]
    messages = entry.get("messages")
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                       for m in messages)):
        raise PromptError(f"{where}: needs \"prompt\" (text) or \"messages\" (a list of {{role, content}})")
    if messages[-1]["role"] != "user":
        raise PromptError(f"{where}: the last message must be the user's")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def load(path: str, budget: int = 256, counter: Optional[Counter] = None) -> Dict[str, Any]:
    """{"prompts": [Prompt], "sha256": digest of the file's bytes, "path", "budget", "approximation" (how tokens
    were counted), "trimmed"}."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise PromptError(f"--prompts {path}: {exc.strerror}") from exc
    return parse(raw, path, budget, counter)


def parse(raw: bytes, path: str, budget: int = 256, counter: Optional[Counter] = None) -> Dict[str, Any]:
    """load() of a prompt file's bytes, read elsewhere (the SLO gate gets them from the controller); `path` names
    them in errors and in the provenance."""
    prompts: List[Prompt] = []
    for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"{where}: not JSON ({exc})") from exc
        messages = _messages(entry, where)
        kept = trim(messages, budget, counter or APPROXIMATE)
        prompts.append(Prompt(str(entry.get("id") or f"line{number}"), kept, kept != messages))
    if not prompts:
        raise PromptError(f"--prompts {path}: no prompts in it")
    return {"prompts": prompts, "sha256": hashlib.sha256(raw).hexdigest(), "path": path, "budget": budget,
            "approximation": (counter or APPROXIMATE).description, "count": len(prompts), "trimmed": sum(p.trimmed for p in prompts)}


def order(count: int, seed: int) -> List[int]:
    """The prompt order of every level: one seeded permutation, cycled."""
    indices = list(range(count))
    random.Random(seed).shuffle(indices)
    return indices

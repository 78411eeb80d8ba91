"""The prompt set: JSONL of user questions, trimmed to a token budget, in one seeded order for every level.

A line is `{"id": "...", "prompt": "text"}` or `{"id": "...", "messages": [{"role": ..., "content": ...}, ...]}`
(a conversation whose last message is the user's). The bundled set is data/bench/prompts.jsonl.

No tokenizer is available on the bench host (the `tokenizers` package is not installed there), so the budget is
approximate: CHARS_PER_TOKEN characters per token, the usual rule of thumb for English text with BPE tokenizers.
A conversation over budget loses its oldest turns first; a single message still over budget keeps its end (the
question is usually last). The summary states the approximation.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any, Dict, List

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


def trim(messages: List[Dict[str, str]], budget: int) -> List[Dict[str, str]]:
    kept = list(messages)
    while len(kept) > 1 and approx_tokens(kept) > budget:
        kept.pop(0)
    if approx_tokens(kept) > budget:
        content = kept[-1]["content"]
        kept[-1] = {**kept[-1], "content": content[len(content) - budget * CHARS_PER_TOKEN:].lstrip()}
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


def load(path: str, budget: int = 256) -> Dict[str, Any]:
    """{"prompts": [Prompt], "sha256": digest of the file's bytes, "path", "budget", "approximation", "trimmed"}."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise PromptError(f"--prompts {path}: {exc.strerror}") from exc
    return parse(raw, path, budget)


def parse(raw: bytes, path: str, budget: int = 256) -> Dict[str, Any]:
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
        kept = trim(messages, budget)
        prompts.append(Prompt(str(entry.get("id") or f"line{number}"), kept, kept != messages))
    if not prompts:
        raise PromptError(f"--prompts {path}: no prompts in it")
    return {"prompts": prompts, "sha256": hashlib.sha256(raw).hexdigest(), "path": path, "budget": budget,
            "approximation": APPROXIMATION, "count": len(prompts), "trimmed": sum(p.trimmed for p in prompts)}


def order(count: int, seed: int) -> List[int]:
    """The prompt order of every level: one seeded permutation, cycled."""
    indices = list(range(count))
    random.Random(seed).shuffle(indices)
    return indices

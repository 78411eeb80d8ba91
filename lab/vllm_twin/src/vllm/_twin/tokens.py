"""Tokenisation and text generation of the twin.

APPROXIMATION: the twin has no real tokenizer and no model. Token counts of a prompt are estimated from
its text with a BPE-like rule (a short word is one token, long words more, one token per digit, per CJK
character and per punctuation mark), and a chat template adds a fixed number of tokens per message like
Llama-3's. Generated text is drawn deterministically (seeded) from a small English vocabulary, one word
(or punctuation mark) per token, so every streamed chunk carries exactly one token and token counts in
chunks and in `usage` always agree. Answer lengths follow a log-normal distribution ending in EOS unless
`ignore_eos` is set.
"""
from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
FIRST_WORD_ID = 1000

# Llama-3-style chat template: <|begin_of_text|> once, then per message
# <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>, then the assistant header.
CHAT_BOS_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_GENERATION_PROMPT_TOKENS = 4

# Answer lengths of the chat model: log-normal, median 700 tokens, sigma 0.4 (95 % between 320 and
# 1530). An assumption fitted to the field notes: their TTFT grows linearly with concurrency, which
# happens when the closed-loop clients stay in step, i.e. when (nearly) every answer runs to their
# max_tokens=200 and ends together; about 1 in 1000 answers ends before 200 tokens.
ANSWER_LENGTH_MEDIAN = 700.0
ANSWER_LENGTH_SIGMA = 0.4

_VOCABULARY = (
    "the of and to in is that for it as with was on be by this are from or at an have not but which "
    "can one all their more has will would there been if when so what about other into only some time "
    "could these two may then first any like new such than also after most over very where through "
    "system model memory server request token cache batch queue latency throughput engine kernel "
    "device node cluster network service client stream prompt answer question value result data "
    "first next each every many few several large small fast slow high low long short early late "
    "process thread worker core socket card link path route limit level state status health check "
    "start stop load save read write send receive open close begin end keep hold move change make "
    "use run build test measure compare report show find give take see know think need want help "
    "work plan design choose decide update install configure deploy monitor scale balance drain "
    "because while before during without within between under above across against along around "
    "good better best simple clear stable common useful important possible available different "
    "people user operator engineer team company customer question problem reason example method "
    "way part case point fact number group order line side hand place week day year hour minute "
    "second moment period step stage phase round cycle version release change issue note rule"
).split()

_PIECE = re.compile(r"[A-Za-z]+|[0-9]|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|\S")


def count_text_tokens(text: str) -> int:
    """Approximate BPE token count of `text` (see the module docstring)."""
    total = 0
    for piece in _PIECE.findall(text):
        if piece[0].isascii() and piece[0].isalpha():
            total += 1 + (len(piece) - 1) // 6
        else:
            total += 1
    return total


def text_token_ids(text: str) -> List[int]:
    """Stable pseudo token ids for `text`, as many as count_text_tokens(text)."""
    ids: List[int] = []
    for piece in _PIECE.findall(text):
        pieces = 1 + (len(piece) - 1) // 6 if (piece[0].isascii() and piece[0].isalpha()) else 1
        for k in range(pieces):
            ids.append(FIRST_WORD_ID + zlib.crc32(f"{piece}/{k}".encode()) % 30000)
    return ids


def chat_prompt_token_count(messages: Sequence[Tuple[str, str]], add_generation_prompt: bool) -> int:
    """Token count of a chat rendered with the Llama-3-like template above; messages are (role, text)."""
    total = CHAT_BOS_TOKENS
    for role, content in messages:
        total += CHAT_TOKENS_PER_MESSAGE + count_text_tokens(role) + count_text_tokens(content)
    if add_generation_prompt:
        total += CHAT_GENERATION_PROMPT_TOKENS
    return total


def render_chat(messages: Sequence[Tuple[str, str]], add_generation_prompt: bool) -> str:
    """The prompt text the template renders (for request logs and /tokenize)."""
    parts = ["<|begin_of_text|>"]
    for role, content in messages:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def decode_ids(token_ids: Sequence[int]) -> str:
    """Text for token ids (for /detokenize): words of the vocabulary, special tokens dropped."""
    out = []
    for tid in token_ids:
        if tid < FIRST_WORD_ID:
            continue
        out.append(" " + _VOCABULARY[(tid - FIRST_WORD_ID) % len(_VOCABULARY)])
    return "".join(out)


def sequence_seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


@dataclass
class TokenSource:
    """The deterministic token stream of one sequence.

    `answer_length` is where the model would emit EOS (counting the EOS token itself), drawn from the
    log-normal above with the sequence's own generator.
    """

    rng: random.Random
    answer_length: int
    since_punctuation: int = 0

    @classmethod
    def create(cls, seed: int, median: float = ANSWER_LENGTH_MEDIAN,
               sigma: float = ANSWER_LENGTH_SIGMA) -> "TokenSource":
        rng = random.Random(seed)
        length = max(1, int(round(math.exp(math.log(median) + sigma * rng.gauss(0.0, 1.0)))))
        return cls(rng=rng, answer_length=length)

    def next_token(self, position: int, eos_allowed: bool) -> Tuple[int, str]:
        """Token id and its text at output position `position` (1-based)."""
        if eos_allowed and position >= self.answer_length:
            return EOS_TOKEN_ID, ""
        rng = self.rng
        self.since_punctuation += 1
        if self.since_punctuation > 6 and rng.random() < 0.12:
            self.since_punctuation = 0
            mark = "." if rng.random() < 0.6 else ","
            return FIRST_WORD_ID + len(_VOCABULARY) + (0 if mark == "." else 1), mark
        index = int(rng.random() * len(_VOCABULARY))
        word = _VOCABULARY[index]
        return FIRST_WORD_ID + index, (word.capitalize() if position == 1 else " " + word)


def stop_string_hit(text: str, new_piece_len: int, stops: Optional[Sequence[str]]) -> Optional[Tuple[str, int]]:
    """The first stop string that now ends inside the last piece, and where it starts in `text`."""
    if not stops:
        return None
    for stop in stops:
        if not stop:
            continue
        window_start = max(0, len(text) - new_piece_len - len(stop) + 1)
        index = text.find(stop, window_start)
        if index != -1:
            return stop, index
    return None

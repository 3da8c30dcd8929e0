"""Text between two vocabularies: a draft model of another family (another tokenizer) reads the committed text in
its own tokens and drafts text, which the target verifies as its own tokens for that text (drafting/foreign.py
drives this; nothing here decodes).

Everything is compared in bytes (`piece`), never ids across vocabularies, and a tokenizer's output is trusted only
as far as its pieces spell the text it was given (`spelled`): byte-level BPE reads invalid UTF-8 as U+FFFD,
SentencePiece may add a space before a text (its dummy prefix), and neither may spell what it was given. The
draft reads only whole characters (`readable`): a character the target has half written waits for the round
that completes it (unless it spells bytes as they are: byte tokens). What the target verifies is only the text the draft fixed (`proposal`): the target token
that reaches the end of the draft's text may be cut short there (" wor" of " world"), and is left to the
target, whose own token there is the round's bonus when every other was accepted.

The proposal is a function of the draft's greedy text alone, so the target accepts it as it accepts lookup's
(engine/acceptance.py, q = None): with its own probability of each token, exactly its distribution.
"""

from __future__ import annotations

import bisect
import codecs
from typing import Protocol, Sequence

LOOKBEHIND = 8  # draft tokens behind the text's end tokenized again each round: a word the last round cut shows whole
ANCHOR = b"\n"  # text before a text a SentencePiece vocabulary with a dummy prefix tokenizes (bridge.spelled)
INVALID = b"a\xff\xfe"  # bytes no UTF-8 text holds: does a vocabulary spell them?
REACH = 64  # how far behind that a round looks for a clean place to start tokenizing again (a space, a new line)


class Vocab(Protocol):
    """What the bridge reads of a model's vocabulary (backend/native.Model)."""

    space_prefix: bool

    def piece(self, token: int) -> bytes: ...
    def render(self, tokens: list[int]) -> bytes: ...
    def tokenize_bytes(self, raw: bytes, *, add_special: bool, parse_special: bool) -> list[int]: ...
    def is_eog(self, token: int) -> bool: ...
    def is_control(self, token: int) -> bool: ...
    def end_of_turn(self) -> int: ...
    def bos(self) -> int: ...


def complete(data: bytes) -> int:
    """How many of `data`'s bytes are whole characters (or bytes no character can continue): all but an
    unfinished character at the end."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data, final=False)
    return len(data) - len(decoder.getstate()[0])


def readable(data: bytes) -> bytes:
    """`data`'s whole characters as valid UTF-8 (what a tokenizer reads alike in every vocabulary): an invalid
    byte is U+FFFD. The readable text of a longer text begins with that of a shorter one."""
    return data[: complete(data)].decode("utf-8", "replace").encode()


def spelled(vocab: Vocab, data: bytes) -> tuple[list[int], list[int]]:
    """The vocabulary's tokens for `data` as text that continues other text (no BOS, no control tokens), and
    where each ends in `data`: as many as spell a prefix of it. A SentencePiece vocabulary that adds a space before a
    text (its dummy prefix: Llama 2's) reads it after ANCHOR, whose tokens, the space's with them, are left out."""
    lead = ANCHOR if vocab.space_prefix else b""
    tokens = vocab.tokenize_bytes(lead + data, add_special=False, parse_special=False)
    if lead:
        lead, at, n = b" " + lead, 0, 0  # (the space it adds)
        while n < len(tokens) and at < len(lead):
            at, n = at + len(vocab.piece(tokens[n])), n + 1
        if at == len(lead):  # a token boundary right after it: the rest is data's
            tokens = tokens[n:]
        else:  # it merged into data's first token: data as it is, its first token's space not counted
            tokens, lead = vocab.tokenize_bytes(data, add_special=False, parse_special=False), b" "
    ends, at = [], -len(lead) if lead == b" " else 0
    for t in tokens:
        p = vocab.piece(t)
        if at < 0:  # the space it added
            if not p.startswith(b" "):
                break
            p, at = p[1:], 0
        if data[at : at + len(p)] != p:
            break
        at += len(p)
        ends.append(at)
    return tokens[: len(ends)], ends


def _restart(text: bytes, ends: list[int], lookbehind: int) -> int:
    """Where to tokenize the draft's text again from: a token at least `lookbehind` back, preferably one that starts a
    word or a line (where tokenizers split alike whatever came before), else one that starts a character."""
    last = len(ends) - lookbehind
    if last <= 0 or not lookbehind:
        return max(last, 0)
    for j in range(last, max(last - REACH, 0), -1):
        at = ends[j - 1]
        if text[at : at + 1] == b" " or text[at - 1 : at] == b"\n":
            return j
    # (where a character starts: not at a UTF-8 continuation byte)
    return next((j for j in range(last, 0, -1) if (at := ends[j - 1]) >= len(text) or text[at] & 0xC0 != 0x80), 0)


class Bridge:
    """One run's text between the target's tokens and the draft's. The draft reads `head` (its tokens for the
    prompt) and then its tokens for the generated text (`tokens`, each ending at `ends` in it); the target's
    generated text is `text`, each of its tokens ending at `target_ends`."""

    def __init__(self, target: Vocab, draft: Vocab):
        self.target, self.draft = target, draft
        self.lookbehind = LOOKBEHIND  # (0: a recurrent draft, whose cells a rollback into would clear)
        # Whether the draft spells invalid UTF-8 as it is (byte tokens: SentencePiece's byte fallback); else it reads
        # U+FFFD for it, as byte-level BPE in llama.cpp does (`readable`).
        self.raw = spelled(draft, INVALID)[1][-1:] == [len(INVALID)]
        self.clean = (lambda data: data) if self.raw else readable
        self._prompt: tuple[tuple[int, ...], list[int]] = ((), [])
        self.begin([])

    def prompt(self, tokens: Sequence[int]) -> list[int]:
        """The draft's tokens for a target prompt: its text, control tokens by their texts (a chat template's markers
        are the draft's own where it shares them: ChatML), without the target's BOS, with the draft's."""
        key = tuple(tokens)
        if self._prompt[0] != key:
            body = [t for t in tokens if t != self.target.bos()]
            text = self.target.render(body)
            self._prompt = (key, self.draft.tokenize_bytes(text, add_special=True, parse_special=True))
        return list(self._prompt[1])

    def begin(self, prompt: list[int]) -> None:
        self.prompt_len = len(prompt)
        self.head = self.prompt(prompt) if prompt else []
        self.text, self.target_ends = b"", []  # the target's generated text
        self.tokens: list[int] = []  # the draft's tokens for its readable part
        self.ends: list[int] = []

    def follow(self, committed: list[int]) -> bytes:
        """The generated text of `committed`, read on from where the last call left off."""
        for t in committed[self.prompt_len + len(self.target_ends) :]:
            self.text += self.target.piece(t)
            self.target_ends.append(len(self.text))
        return self.text

    def kept_text(self, n: int) -> bytes:
        """The generated text of the committed text's first n tokens as the draft reads it (`follow` has read them)."""
        i = n - self.prompt_len
        return self.clean(self.text[: self.target_ends[i - 1]] if i > 0 else b"")

    def sync(self, committed: list[int]) -> list[int] | None:
        """The draft's tokens for `committed` (head and text), the text's last ones tokenized again; None where the
        draft cannot read to its end (a character the target has half written, text its tokens do not spell)."""
        text = self.follow(committed)
        readable_text = self.clean(text)
        j = _restart(readable_text, self.ends, self.lookbehind)
        start = self.ends[j - 1] if j else 0
        tokens, ends = spelled(self.draft, readable_text[start:])
        self.tokens = self.tokens[:j] + tokens
        self.ends = self.ends[:j] + [start + e for e in ends]
        # (An invalid byte it reads as U+FFFD: it drafts on from there all the same, a guess like any other.)
        if (self.ends[-1] if self.ends else 0) != len(readable_text) or not self.raw and complete(text) < len(text):
            return None
        return self.head + self.tokens

    def proposal(self, drafted: list[int], confidence: Sequence[float], k: int) -> tuple[list[int], list[float]]:
        """The target's tokens for the text the draft drafted after the committed text, and the draft's confidence
        in each (the least of the draft tokens it overlaps): up to k, cut where the draft wrote a control token
        (its end token ends its text: the target's end-of-turn may follow), without the last one unless the text ends
        there (the fixed-text rule above)."""
        cut = next((i for i, t in enumerate(drafted) if self.draft.is_control(t)), len(drafted))
        ended = cut < len(drafted) and self.draft.is_eog(drafted[cut])
        pieces = [self.draft.piece(t) for t in drafted[:cut]]
        data = b"".join(pieces)
        tokens, ends = spelled(self.target, data)  # (byte-level BPE stops at a character cut short: U+FFFD)
        while tokens and ends[0] == 0:  # a dummy space alone spells nothing of the draft's text
            tokens, ends = tokens[1:], ends[1:]
        fixed = ended and (ends[-1] if ends else 0) == len(data)
        if not fixed:
            tokens, ends = tokens[:-1], ends[:-1]
        draft_ends = [0]
        for p in pieces:
            draft_ends.append(draft_ends[-1] + len(p))
        conf, start = [], 0
        for end in ends:
            lo = bisect.bisect_right(draft_ends, start) - 1
            hi = bisect.bisect_left(draft_ends, end)
            conf.append(min(confidence[lo:hi], default=1.0))
            start = end
        end_token = self.target.end_of_turn()
        if fixed and end_token >= 0:
            tokens, conf = [*tokens, end_token], [*conf, confidence[cut] if cut < len(confidence) else 1.0]
        return tokens[:k], conf[:k]

    def spelled_by(self, held: list[int], text: bytes) -> list[int]:
        """Where each of the longest run of `held` (the draft's tokens for generated text: the synced ones, then those
        it drafted) that spells a prefix of `text` ends in it."""
        m = 0
        while m < min(len(held), len(self.tokens)) and held[m] == self.tokens[m]:
            m += 1
        ends = self.ends[: bisect.bisect_right(self.ends[:m], len(text))]
        if len(ends) == m:
            at = ends[-1] if ends else 0
            for t in held[m:]:
                p = self.draft.piece(t)
                if not p or text[at : at + len(p)] != p:
                    break
                at += len(p)
                ends.append(at)
        return ends

    def kept(self, held: list[int], n: int) -> int:
        """How many of `held` spell a prefix of the committed text's first n tokens: those stay, and are the draft's
        tokens for the text from now on."""
        ends = self.spelled_by(held, self.kept_text(n))
        self.tokens, self.ends = held[: len(ends)], ends
        return len(ends)

"""The round loop over a fake context, in milliseconds: the exact origins a scripted draft must give
(mlx-lm's generate tests check `from_draft` the same way). The fake target counts: after t comes t+1."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from specdec_cli.engine.context import ALONE
from specdec_cli.engine.drafter import Draft, Drafter
from specdec_cli.engine.events import Round, Stopped, Token
from specdec_cli.engine.kv import Sequence
from specdec_cli.engine.speculative import Settings, generate
from specdec_cli.engine.stats import collect
from specdec_cli.engine.shapes import Tree
from specdec_cli.text import with_text

VOCAB = 64
EOS = 63  # the target counts up to it: after 62 the text ends
LETTER = {"draft": "D", "correction": "C", "bonus": "B", "plain": "P"}


class FakeModel:
    name = "fake.gguf"

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def piece(self, token: int) -> bytes:
        return f"{token} ".encode()


class FakeContext:
    """A KV cache that is a list of token ids per sequence; logits that make t+1 the argmax after t."""

    n_ctx, n_batch, n_vocab, n_seq = 256, 64, VOCAB, 4
    max_rollback = None  # cells: any tail can go (backend.context.Context)
    can_shift = True  # and cells can move (a draft's window)
    model = FakeModel()
    last_step = ALONE  # (alone: no other request's rows)

    def __init__(self) -> None:
        self.cells: dict[int, list[int]] = {s: [] for s in range(self.n_seq)}

    def _rows(self, tokens: list[int]) -> np.ndarray:
        rows = np.zeros((len(tokens), VOCAB), dtype=np.float32)
        rows[np.arange(len(tokens)), (np.asarray(tokens) + 1) % VOCAB] = 10.0
        return rows

    def decode(self, tokens: list[int], pos0: int, seq_id: int, outputs: str | int) -> np.ndarray:
        first = {"all": 0, "last": len(tokens) - 1}.get(outputs, outputs)
        return self.decode_tree(tokens, list(range(pos0, pos0 + len(tokens))), [(seq_id,)] * len(tokens), first)

    def decode_tree(
        self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int = 0
    ) -> np.ndarray:
        for t, p, ss in zip(tokens, pos, seqs):
            for s in ss:
                assert len(self.cells[s]) == p, "a token decoded at the wrong position"
                self.cells[s].append(t)
        return self._rows(tokens)[first_out:]

    @contextmanager
    def prompt_kernels(self):
        yield

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        del self.cells[seq][max(p0, 0) : None if p1 < 0 else p1]
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.cells[dst] = list(self.cells[src])

    def seq_keep(self, seq: int) -> None:
        for s in self.cells:
            if s != seq:
                self.cells[s] = []

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        pass  # a list of ids has no positions to move: removing the middle (seq_rm) already renumbered it

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        n = len(self.cells[seq])
        return (0, n - 1) if n else (-1, -1)

    def seq_state(self, seq: int) -> list[int]:
        return list(self.cells[seq])

    def set_seq_state(self, state: list[int], seq: int) -> int:
        self.cells[seq] = list(state)
        return len(state)


class Script(Drafter):
    """Proposes its drafts in turn (a chain cut to the k the engine allows, or a whole Draft), then nothing."""

    name = "script"

    def __init__(self, *drafts: list[int] | Draft):
        self.drafts = list(drafts)

    def propose(self, committed, k, sampler, rng) -> Draft:
        d = self.drafts.pop(0) if self.drafts else []
        return d if isinstance(d, Draft) else Draft(d[:k], None, source="lookup", k=k)


def rounds(prompt: list[int], drafter: Drafter, **settings) -> tuple[list[str], list[Round], list]:
    """Run the loop; per round, its tokens as origin letter + id ('D4': an accepted draft token 4)."""
    ctx = FakeContext()
    events = list(
        with_text(generate(Sequence(ctx), drafter, prompt, Settings(debug=True, **settings)), ctx.model.piece)
    )
    out, current = [], []
    for e in events:
        if isinstance(e, Token):
            current.append(f"{LETTER[e.origin.value]}{e.id}")
        elif isinstance(e, Round):
            out.append(" ".join(current))
            current = []
    return out, [e for e in events if isinstance(e, Round)], events


def test_origins_follow_the_draft_exactly():
    drafter = Script([4, 5, 6], [8, 0], [], [0, 12])
    pattern, rs, events = rounds([1, 2, 3], drafter, draft_tokens=3, max_tokens=10)
    assert pattern == [
        "D4 D5 D6 B7",  # the whole draft accepted, then the target's bonus
        "D8 C9",  # rejected at 0: the target's correction
        "P10",  # nothing drafted: plain decoding
        "C11",  # the budget cut the draft to 2 tokens; the first one is wrong
        "P12",
        "P13",  # one token left in the budget: no room to draft
    ]
    assert [(r.drafted, r.accepted, r.emitted, r.rejected) for r in rs] == [
        (3, 3, 4, False), (2, 1, 2, True), (0, 0, 1, False), (2, 0, 1, True), (0, 0, 1, False), (0, 0, 1, False),
    ]  # fmt: skip
    result = collect(events)
    assert result.tokens == list(range(4, 14)) and result.stats.stop_reason == "max_tokens"
    assert result.text == " ".join(map(str, range(4, 14))) + " "


def test_an_accepted_end_of_generation_draft_token_ends_the_text_and_counts():
    pattern, rs, events = rounds([59, 60], Script([61, 62, EOS, 5]), draft_tokens=4, max_tokens=10)
    assert pattern == ["D61 D62"]  # the end-of-generation token is never output
    assert (rs[0].drafted, rs[0].accepted, rs[0].emitted) == (4, 3, 3)
    assert isinstance(events[-1], Stopped) and events[-1].reason == "eos"


def test_a_tree_round_keeps_the_winning_branch():
    # Branch 0 drafts 9 (wrong); branch 1 drafts 4 5 6, all right: it wins, and its cache becomes the main one.
    tree = Draft([9, 4, 5, 6], None, source="model", k=3, shape=Tree((-1, -1, 1, 2), ((0,), (1,), (1,), (1,))))
    pattern, rs, _ = rounds([1, 2, 3], Script(tree, [9]), draft_tokens=3, max_tokens=6)
    assert pattern == ["D4 D5 D6 B7", "C8", "P9"]
    assert (rs[0].branches, rs[0].winner, rs[0].drafted, rs[0].accepted) == (2, 1, 4, 3)
    assert (rs[1].branches, rs[1].winner) == (1, 0)


def test_the_llama_cpp_context_and_the_fake_both_satisfy_the_engines_protocol(models):
    """The engine is typed against engine/context.py alone: the real context and this file's fake must both
    have every member it names, methods with the same parameters (a renamed one would break one of them)."""
    import inspect

    from specdec_cli.backend.context import Context as LlamaContext
    from specdec_cli.backend.native import Model
    from specdec_cli.engine import context

    members = [n for n in dir(context.Context) if not n.startswith("_")] + list(context.Context.__annotations__)
    with Model(models["target"]) as m, LlamaContext(m, n_ctx=64, n_threads=1) as real:
        for ctx in (real, FakeContext()):
            assert isinstance(ctx, context.Context) and isinstance(ctx.model, context.Model), type(ctx)
            for name in members:
                want = getattr(context.Context, name, None)
                if callable(want):
                    have = list(inspect.signature(getattr(ctx, name)).parameters)
                    assert have == list(inspect.signature(want).parameters)[1:], (type(ctx), name, have)

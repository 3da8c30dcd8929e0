"""Which local models can draft for a target, best first, and the one `--draft auto` takes.

A draft must be smaller than its target and speak its vocabulary by llama.cpp's rule (backend/vocab.py), or another
whose tokens spell text (it drafts through text: drafting/foreign.py; ranked after every one of the target's own),
checked here on what the headers say (facts.Vocab), so that ranking hundreds of files loads none: the chosen
draft is checked again by llama.cpp's own rule when the run reads its vocabulary. Among those that can, the
rank is the cost model's expected speed-up (drafting/cost.py, as auto computes it) where a cost curve measured
for the target on this machine is kept: its verify times, and a draft's time per token taken as the target's
scaled by their file sizes (decoding reads every weight once; the default pair's 0.44 size ratio against 0.44-0.57
measured); the acceptance is a prior by kinship (same family and tuning, same family, same architecture).
Without a curve, the same order by kinship, then size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..backend import draft_files
from .. import identity
from ..drafting import curves
from ..drafting.auto import FOREIGN_PRIOR, MODEL_PRIOR
from ..drafting.cost import Costs, best_length
from ..backend.gguf_file import Malformed
from .facts import FIRST_CHECKED_ID, MAX_SIZE_DIFFERENCE, Facts, Index, Vocab
from .layouts import model_bytes
from .stores import Entry, scan

# The chance a draft token is accepted, before any is seen, by kinship with the target. A draft trained on the
# target's own hidden states (EAGLE-3, DFlash) reads what the target computed: published ones are accepted about
# as often as a same-family draft (EAGLE-3's papers: 3-4.5 tokens per verification at 6-7 drafted).
KIN_PRIORS = {"trained on it": MODEL_PRIOR, "family and tuning": MODEL_PRIOR, "family": 0.6, "architecture": 0.5}
KIN_PRIORS |= {"vocabulary": 0.4}
KIN_PRIORS |= {"tokenizer": FOREIGN_PRIOR}  # another family's tokenizer: it drafts through text (drafting/foreign.py)
RANK_K = 8  # draft lengths the expected speed-up considers (auto's longest drafts rarely pay more on a model)


@dataclass(frozen=True)
class Option:
    entry: Entry
    problem: str | None  # why it cannot draft for the target (None: it can)
    kin: str = ""  # what it shares with the target (a KIN_PRIORS key)
    speedup: float | None = None  # expected by the cost model, where a curve for the target is kept
    draft_tokens: int = 0  # the draft length that speed-up is for (0: auto would not draft with it)

    @property
    def ok(self) -> bool:
        return self.problem is None


def vocab_problem(t: Vocab | None, d: Vocab | None) -> str | None:
    """llama.cpp's pairing rule on two headers' vocabularies: None where they agree, else what differs."""
    if t is None or d is None:
        return "no vocabulary in its header"
    if t.type != d.type:
        return f"vocabulary types differ: target {t.type or '?'}, draft {d.type or '?'}"
    if abs(t.size - d.size) > MAX_SIZE_DIFFERENCE:
        return f"vocabulary sizes differ by more than {MAX_SIZE_DIFFERENCE}: target {t.size:,}, draft {d.size:,}"
    for what in ("add_bos", "add_eos"):  # (unwritten ones default by type: llama.cpp's check at load has those)
        tv, dv = getattr(t, what), getattr(d, what)
        if tv is not None and dv is not None and tv != dv:
            return f"{what.replace('_', '-')} flags differ: target {tv}, draft {dv}"
    if _adds(t, "add_bos") and t.bos != d.bos:
        return f"BOS ids differ: target {t.bos}, draft {d.bos}"
    if _adds(t, "add_eos") and t.eos != d.eos:
        return f"EOS ids differ: target {t.eos}, draft {d.eos}"
    m = min(t.size, d.size)
    if m > FIRST_CHECKED_ID and t.digest_at(m) != d.digest_at(m):
        return "token texts differ: another vocabulary"
    return None


def _spells(v: Vocab | None) -> bool:
    """Whether a header's vocabulary may spell text (the run checks that it does: vocab.no_text)."""
    return v is not None and v.size > 0 and (v.type or "none") not in ("none", "no_vocab")


def _adds(v: Vocab, what: str) -> bool:
    value = getattr(v, what)
    return bool(value) if value is not None else (what == "add_bos" and v.type == "llama")  # SentencePiece adds BOS


def kin_words(kin: str) -> str:
    """What a draft shares with its target, in words."""
    if kin == "tokenizer":
        return "another tokenizer: it drafts through text"
    return "trained on its hidden states" if kin == "trained on it" else f"same {kin}"


def kinship(t: Facts, d: Facts) -> str:
    if t.basename and t.basename.lower() == d.basename.lower():
        return "family and tuning" if t.finetune.lower() == d.finetune.lower() else "family"
    return "architecture" if t.arch == d.arch else "vocabulary"


def options(target: Path, facts: Facts, entries: list[Entry], costs: Costs | None = None) -> list[Option]:
    """Every other local model as a draft for the target: those that can first, best first (those of another
    tokenizer after those of its own); then the rest, each with why it cannot."""
    real = Path(target).resolve()
    out = []
    for e in entries:
        if e.path.resolve() == real:
            continue
        problem = vocab_problem(facts.vocab, e.facts.vocab)
        draft = draft_files.DraftFile(path=e.path, **e.facts.draft) if e.facts.draft else None
        # A model of another vocabulary drafts through text (not a draft of the target's hidden states).
        foreign = problem is not None and draft is None and _spells(facts.vocab) and _spells(e.facts.vocab)
        problem = None if foreign else problem
        if problem is None and draft is not None:
            problem = draft_files.problem(draft, Path(target).name, facts.arch, facts.width, facts.layers)
        elif problem is None and e.facts.params >= facts.params:
            problem = f"not smaller than the target ({_b(e.facts.params)} parameters, the target {_b(facts.params)})"
        if problem is not None:
            out.append(Option(e, problem))
            continue
        kin = "trained on it" if draft is not None else "tokenizer" if foreign else kinship(facts, e.facts)
        # A draft that borrows the target's head reads it every token too (EAGLE-3, DFlash without their own).
        reads = e.size + (facts.head_bytes if draft is not None and not draft.own_head else 0)
        block = draft is not None and draft.arch == "dflash"
        speedup, k = expected(costs, KIN_PRIORS[kin], reads / max(_size(target), 1), block) if costs else (None, 0)
        out.append(Option(e, None, kin, speedup, k))
    order = list(KIN_PRIORS)
    return sorted(
        out,
        key=lambda o: (
            not o.ok,
            o.kin == "tokenizer",  # through text: where no model of the target's vocabulary can draft
            -(o.speedup or 0.0),
            order.index(o.kin) if o.ok else 0,
            o.entry.size,
            o.entry.name,
        ),
    )


def expected(costs: Costs, accept: float, size_ratio: float, block: bool = False) -> tuple[float, int]:
    """(speed-up over plain decoding, draft length) of a draft whose decode costs `size_ratio` of the target's
    plain decode and is accepted with chance `accept`, by the curve `costs`; `block`: one decode drafts them all
    (DFlash), else one a token."""
    per_decode = costs.verify(1) * size_ratio
    spend = [per_decode] * RANK_K if block else per_decode
    k, rate, _ = best_length([accept] * RANK_K, costs, spend)
    return rate * costs.verify(1), k


def kept_costs(target: Path) -> Costs | None:
    """The newest cost curve kept for this target on this machine (any draft, any threads), or None."""
    kept = curves.kept_for(identity.file_identity(target))
    return Costs(kept["verify"], plain=kept.get("plain")) if kept else None


def choose(target: Path, facts: Facts, entries: list[Entry]) -> tuple[Option | None, str]:
    """The draft `--draft auto` takes (None: no local model can draft for the target), and why, in words."""
    ranked = options(target, facts, entries, kept_costs(target))
    usable = [o for o in ranked if o.ok]
    if not usable:
        return None, f"no local model can draft for {Path(target).name} (`specdec models pair` says why)"
    best, n = usable[0], len(usable)
    which = "the only local model" if n == 1 else f"the best of {n} local models"
    why = f"{best.entry.name} ({best.entry.source}), {which} that can draft for {Path(target).name}: {kin_words(best.kin)}, "
    why += f"{_size(target) / max(best.entry.size, 1):.1f}x smaller"
    if best.speedup is not None:
        why += f", {best.speedup:.2f}x expected on this machine"
    return best, why


def for_target(target: Path, model_dirs: tuple[str, ...] = ()) -> tuple[Entry | None, str]:
    """`--draft auto`: the local model that drafts for `target` (None where none can, or where the target
    cannot be read: loading it says why), and why it was chosen."""
    index = Index()
    try:
        real = Path(os.path.realpath(target))
        facts = index.facts(real, os.stat(real))
    except (OSError, Malformed):
        return None, "the target's header could not be read"
    option, why = choose(target, facts, scan(model_dirs, index).entries)
    return (option.entry if option else None), why


def _size(path: Path) -> int:
    return model_bytes(Path(path))


def _b(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"

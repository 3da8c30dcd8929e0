"""Fill-in-the-middle completions as an editor asks for them: held-out code (real files, a few lines removed: the
middle), `--drafter auto` against target-only, and the keystroke case (an edit at the prefix's end, the prompt
cached from the request before).

    python scripts/fim_bench.py --cases 12 --runs 2 -n 128 -t 2 [--exact] [--files 'GLOB']

Cases: from files the models never saw here (default: this Python's standard library, which the script does not
ship), a seeded choice of file and line, 1..6 lines removed; the prefix is up to the 1,536 tokens llama-server
keeps, the suffix what follows. The prompt is laid out as /infill lays it out (chat/fim.py), no other files.

Completion: both variants run on one session (models loaded once), each case alternating the order (ABBA). Each
run starts with the prompt cached but its last line (an editor's request after a keystroke re-evaluates only what
changed), and times the rest: that prefill, the first token, the whole answer. No lookup cache: a timed run must
not draft from its own earlier answer. Greedy: `same` counts cases whose two answers are identical.

Keystroke: a cold request for the prefix, then the same prefix with 20 characters typed at its end; prompt tokens
evaluated and time to first token of each, target-only (what the cache saves is the prompt's, whatever drafts).
"""

from __future__ import annotations

import argparse
import glob
import random
import statistics
import sys
import sysconfig
from pathlib import Path

from specdec_cli.chat import fim
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.stats import Fold, collect
from specdec_cli.models import store
from specdec_cli.models.catalog import QWEN_DRAFT, QWEN_TARGET
from specdec_cli.options import RunConfig
from specdec_cli.session import open_session

VARIANTS = ("none", "auto")


def cases(pattern: str, n: int, seed: int) -> list[tuple[str, str, str, str]]:
    """(name, prefix, middle, suffix): a file's line chosen by the seed, 1..6 lines from it removed."""
    rng = random.Random(seed)
    files = sorted(f for f in glob.glob(pattern, recursive=True) if Path(f).stat().st_size > 4000)
    out = []
    while len(out) < n:
        path = rng.choice(files)
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        at, size = rng.randrange(40, max(41, len(lines) - 40)), rng.randint(1, 6)
        middle = "".join(lines[at : at + size])
        if len(middle.strip()) < 20:  # blank or trivial lines: nothing to complete
            continue
        prefix, suffix = "".join(lines[:at]), "".join(lines[at + size :])
        prefix = prefix[-12000:]  # (the layout keeps the last 1,536 tokens; tokenizing all of a file is waste)
        out.append((f"{Path(path).name}:{at + 1}", prefix, middle, suffix[:6000]))
    return out


def timed(session, tokens: list[int], drafter: str, n: int):
    """One run, the prompt cached up to the prefix's last few tokens: what an editor's next request after a keystroke
    finds (those tokens, the suffix after them and the middle marker are evaluated)."""
    cut = max(tokens.index(session.target.fim_tokens()["suf"]) - 10, 1)  # the prefix's end: what was typed
    collect(session.generate(tokens[:cut], Inputs(reuse=True, corpus=None), drafter="none", max_tokens=1))
    return collect(session.generate(tokens, Inputs(reuse=True, corpus=None), drafter=drafter, max_tokens=n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--files", default=str(Path(sysconfig.get_paths()["stdlib"]) / "**" / "*.py"))
    args = ap.parse_args()
    target, draft = store.model_path(QWEN_TARGET), store.model_path(QWEN_DRAFT)
    cfg = RunConfig(
        target=target, draft=draft, threads=args.threads, ctx_size=8192, exact=args.exact, lookup_cache=False
    )
    with open_session(cfg) as s:
        rows, same = [], 0
        for i, (name, prefix, _middle, suffix) in enumerate(cases(args.files, args.cases, args.seed)):
            tokens = s.infill_tokens(prefix, suffix)
            got = {v: [] for v in VARIANTS}
            texts = {}
            for r in range(args.runs):
                order = VARIANTS if (i + r) % 2 == 0 else VARIANTS[::-1]
                for v in order:
                    res = timed(s, tokens, v, args.n)
                    got[v].append(res.stats)
                    texts.setdefault(v, res.text)
            same += texts["none"] == texts["auto"]
            wall = {v: statistics.median(st.wall_seconds for st in got[v]) for v in VARIANTS}
            ttft = {v: statistics.median(st.ttft_seconds for st in got[v]) for v in VARIANTS}
            gen = {v: statistics.median(st.tokens_per_second for st in got[v]) for v in VARIANTS}
            rows.append((wall["none"] / wall["auto"], ttft["none"] / ttft["auto"], gen["auto"] / gen["none"]))
            a = got["auto"][0]
            print(
                f"{name:28} {len(tokens):5} prompt {a.generated_tokens:4} tok  wall {wall['none']:6.2f}/{wall['auto']:6.2f}"
                f" s = {rows[-1][0]:.2f}x  ttft {rows[-1][1]:.2f}x  gen {rows[-1][2]:.2f}x  acc {a.accepted}/{a.drafted}"
                f"  {'same' if texts['none'] == texts['auto'] else 'DIFFERENT'}",
                flush=True,
            )
        if not rows:  # --cases 0: the keystroke case alone
            keystroke(s, args.files, args.seed, args.n)
            return 0
        geo = [statistics.geometric_mean(col) for col in zip(*rows)]
        med = [statistics.median(col) for col in zip(*rows)]
        print(
            f"auto vs target-only over {len(rows)} cases: wall {med[0]:.3f}x median, {geo[0]:.3f}x geomean; "
            f"first token {med[1]:.3f}x; generation {med[2]:.3f}x; identical text {same}/{len(rows)}"
        )
        keystroke(s, args.files, args.seed, args.n)
    return 0


def keystroke(s, files: str, seed: int, n: int) -> None:
    """llama.vim's request after a keystroke: a prefix of about 1,500 tokens, the next 64 lines as the suffix (its
    n_suffix), 20 characters typed at the prefix's end. Cold, then warm: prompt tokens
    evaluated and time to first token, target-only; then the same with four other files (llama.vim's ring buffer of
    chunks, sent as input_extra), which a warm request does not evaluate again."""
    rng = random.Random(seed)
    while True:
        lines = Path(rng.choice(sorted(glob.glob(files, recursive=True)))).read_text(errors="replace").splitlines(True)
        if len(lines) > 600:
            break
    at = rng.randrange(300, len(lines) - 100)
    suffix = "".join(lines[at : at + 64])
    # A prefix of about 1,500 tokens (under the 1,536 the layout keeps: a longer one slides at every keystroke, and
    # all of it is evaluated again, in llama-server too, unless its --cache-reuse shifts the cached cells)
    start = at
    while start > 0 and len(s.target.tokenize("".join(lines[start - 1 : at]), special=False)) < 1500:
        start -= 1
    prefix = "".join(lines[start:at])
    others = [f for f in sorted(glob.glob(files, recursive=True)) if Path(f).stat().st_size > 8000]
    extra = [fim.Extra(Path(f).name, Path(f).read_text(errors="replace")[:6000]) for f in rng.sample(others, 4)]
    for label, chunks in (("no other files", []), ("4 other files", extra)):
        cold = s.infill_tokens(prefix, suffix, chunks)
        first = collect(s.generate(cold, Inputs(reuse=False, corpus=None), drafter="none", max_tokens=n))
        fold = Fold()
        for event in s.generate(
            s.infill_tokens(prefix + "result = compute(val", suffix, chunks),
            reuse=True,
            drafter="none",
            max_tokens=n,
            corpus=None,
        ):
            fold.add(event)
        second = fold.result()
        print(
            f"keystroke, {label}: cold {len(cold)} prompt tokens, first token {first.stats.ttft_seconds:.2f} s; after "
            f"typing 20 characters {second.stats.prompt_tokens - fold.cached} evaluated ({fold.cached} cached), first "
            f"token {second.stats.ttft_seconds:.2f} s = {second.stats.ttft_seconds / first.stats.ttft_seconds:.3f}x",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())

"""The prefix cache (prefixes/): long prompts' KV cells on disk, read back by a server that restarted.
A restored run says what a cold run says; a file that does not check out is one warning and a prefill."""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time
from pathlib import Path

import pytest

from specdec_cli.engine.events import Prefilled
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.stats import Fold
from specdec_cli import prefixes
from specdec_cli.prefixes import BLOCK
from specdec_cli.serve.service import Service
from specdec_cli.session import RunConfig, open_session

WORDS = "the cache keeps a prompt so that a server restarted later reads it back instead of prefilling".split()


@pytest.fixture(autouse=True)
def prefix_cache(tmp_path, monkeypatch) -> Path:
    """Every test its own prefix cache (and the servers it starts)."""
    folder = tmp_path / "prefix-cache"
    monkeypatch.setenv("SPECDEC_PREFIX_CACHE", str(folder))
    return folder


def text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out = ""
    while len(out) < n:
        out += rng.choice(WORDS) + " "
    return out[:n]


SYSTEM = text(1300, seed=1)  # the fixtures' byte vocabulary (a space is 3 bytes): 1,775 tokens, 3 whole blocks


class Server:
    """A session as `specdec serve` holds it: a prefix store attached, each prompt kept after its answer."""

    def __init__(self, cfg: RunConfig, max_bytes: int = prefixes.MAX_BYTES):
        self.warnings: list[str] = []
        self._cm = open_session(cfg)
        self.session = self._cm.__enter__()
        assert self.session.keep_prefixes(max_bytes, self.warnings.append) is None
        self.service = Service(self.session, "m", {"m"}, 1)

    def ask(self, prompt: str, keep: bool = True, **changes) -> tuple[list[int], int]:
        """(answer's token ids, prompt tokens the caches held before the prefill)."""
        fold = Fold()
        for event in self.session.generate(self.session.prompt_tokens(prompt), Inputs(reuse=True), **changes):
            fold.add(event)
            assert not isinstance(event, Prefilled) or event.cached == fold.cached
        if keep:
            self.service._keep_prompt()  # what the server's work loop does once the answer is out
        return fold.tokens, fold.cached

    def close(self) -> None:
        self._cm.__exit__(None, None, None)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pair(models, **kw) -> RunConfig:
    base = dict(target=models["target"], draft=models["draft"], drafter="model", draft_tokens=3, threads=2)
    return RunConfig(**(base | dict(ctx_size=2048, max_tokens=24, debug=True, lookup_cache=False) | kw))


def cold(cfg: RunConfig, prompt: str) -> list[int]:
    with open_session(cfg) as s:  # no store: the whole prompt prefilled
        fold = Fold()
        for event in s.generate(s.prompt_tokens(prompt), Inputs(reuse=True)):
            fold.add(event)
        return fold.tokens


def blocks(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*/*{prefixes.SUFFIX}"))


def start(path: Path) -> int:
    """A block file's first position (its header's)."""
    return prefixes.HEADER.unpack_from(path.read_bytes())[3]


@pytest.mark.parametrize("exact", [False, True])
def test_a_restarted_server_restores_the_shared_prefix_and_answers_as_a_cold_run(models, prefix_cache, exact):
    cfg = pair(models, exact=exact)
    with Server(cfg) as first:
        _, cached = first.ask(SYSTEM + "Question one: what is kept?")
        shared = len(first.session.prompt_tokens(SYSTEM)) // BLOCK
    assert cached == 0 and shared == 3 and len(blocks(prefix_cache)) == shared
    second = SYSTEM + "Another question, of another length."
    with Server(cfg) as restarted:
        answer, cached = restarted.ask(second)
    assert cached == shared * BLOCK and not restarted.warnings
    assert answer == cold(cfg, second)


def assert_restart_answers_alike(cfg: RunConfig, prompt: str) -> None:
    """A server that restored most of `prompt` from disk answers what a cold server answered."""
    with Server(cfg) as first:
        expected, _ = first.ask(prompt)
    with Server(cfg) as restarted:
        answer, cached = restarted.ask(prompt)
    assert cached >= 2 * BLOCK and answer == expected


def test_a_restored_run_says_what_a_cold_run_says_on_a_quantized_model_in_exact_mode(smollm2, prefix_cache):
    """SmolLM2 (Q4_1): batched and lone rows differ in the last bits, unless exact mode's kernels."""
    cfg = RunConfig(target=smollm2, threads=2, ctx_size=2048, max_tokens=24, exact=True, lookup_cache=False)
    assert_restart_answers_alike(cfg, text(5000, seed=3) + "\nSummarise the text above in one sentence.")


def test_the_server_in_exact_mode_keeps_no_cells_decoded_without_reuse(models, prefix_cache):
    """Exact mode decodes a prompt without reuse through the fast kernels: its cells are not a reusing run's."""
    with Server(pair(models, exact=True)) as s:
        s.ask(SYSTEM + "a", keep=False)  # a prompt to keep, not kept yet (a batch's request)
        list(s.session.generate(s.session.prompt_tokens(SYSTEM + "b"), Inputs(reuse=False)))
        s.service._keep_prompt()
        assert s.session.kept.held(s.session.target_ctx) is None and not blocks(prefix_cache)


def test_a_short_prompt_is_not_kept(models, prefix_cache):
    with Server(pair(models)) as s:
        s.ask(SYSTEM[:700])
        assert BLOCK < len(s.session.prompt_tokens(SYSTEM[:700])) <= prefixes.MIN_PROMPT  # a whole block, too few
    assert not blocks(prefix_cache)


def _damage(kind: str, path: Path, models, prefix_cache: Path) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif kind == "one flipped byte":
        pos = len(data) - 100
        path.write_bytes(data[:pos] + bytes([data[pos] ^ 1]) + data[pos + 1 :])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge":  # (sparse) far larger than a block of this model: never read
        with open(path, "r+b") as f:
            f.truncate(1 << 40)
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "another model":  # the same shape (the draft: the target's weights plus noise), another key
        with Server(pair(models, target=models["draft"], draft=None, drafter="none")) as other:
            other.ask(SYSTEM + "x")
        theirs = [p for p in blocks(prefix_cache) if p.parent != path.parent and start(p) == BLOCK]
        path.write_bytes(theirs[0].read_bytes())
    elif kind == "another prefix":  # a block of another prompt of this model, under this name
        with Server(pair(models)) as other:
            other.ask(text(1300, seed=9))
        theirs = [p for p in blocks(prefix_cache) if p.parent == path.parent and p != path and start(p) == BLOCK]
        path.write_bytes(theirs[0].read_bytes())
    elif kind == "wrong token count":  # the header says 511 tokens (with a valid HMAC: it still fails)
        header = prefixes.HEADER.unpack_from(data)
        secret = prefixes.secret(prefix_cache)
        parts = prefixes.encode(
            secret, header[1].decode(), header[2].decode(), header[3], 511, data[prefixes.HEADER.size :]
        )
        path.write_bytes(b"".join(parts))


DAMAGE = ["truncated", "garbage", "one flipped byte", "empty", "huge", "fifo", "another model", "another prefix"]


@pytest.mark.parametrize("kind", DAMAGE + ["wrong token count"])
def test_a_damaged_block_is_one_warning_and_a_prefill_from_it(models, prefix_cache, kind):
    cfg = pair(models)
    with Server(cfg) as first:
        first.ask(SYSTEM + "First.")
        chain = first.session.prefixes.chain(first.session.prompt_tokens(SYSTEM))
    second_block = next(p for p in blocks(prefix_cache) if p.stem == chain[1])
    _damage(kind, second_block, models, prefix_cache)
    prompt = SYSTEM + "Second."
    with Server(cfg) as restarted:
        answer, cached = restarted.ask(prompt, keep=False)
    assert cached == BLOCK  # the first block still served
    assert len(restarted.warnings) == 1 and "damaged prefix cache file" in restarted.warnings[0], restarted.warnings
    assert not second_block.exists()  # removed: the next save writes it again
    assert answer == cold(cfg, prompt)


def test_the_bound_evicts_the_least_recently_used_prompt_and_a_prompts_tail_first(models, prefix_cache):
    cfg = pair(models, draft=None, drafter="none")
    with Server(cfg) as s:
        s.ask(SYSTEM + "a")
        size = blocks(prefix_cache)[0].stat().st_size  # each block's file
        s.session.prefixes.max_bytes = 6 * size  # room for two prompts' three blocks each
        others = [text(1300, seed=10 + i) for i in range(2)]
        s.ask(others[0])
        time.sleep(0.01)
        s.ask(SYSTEM + "b")  # SYSTEM's blocks used again: now others[0]'s are the oldest
        s.ask(others[1])  # nine blocks: others[0]'s three go
        names = {p.stem for p in blocks(prefix_cache)}
        chains = [s.session.prefixes.chain(s.session.prompt_tokens(t)) for t in (SYSTEM, *others)]
    assert set(chains[0]) <= names and set(chains[2]) <= names and not set(chains[1]) & names
    with Server(cfg, max_bytes=2 * size) as s:  # two blocks: of the newest prompt's three, its tail goes
        s.ask(text(1300, seed=20))
        chain = s.session.prefixes.chain(s.session.prompt_tokens(text(1300, seed=20)))
    assert {p.stem for p in blocks(prefix_cache)} == set(chain[:2])


def _write_many(folder: str, key: str, digest: str, seed: int, n: int) -> None:
    rng = random.Random(seed)
    store = prefixes.Store(Path(folder), key)
    for _ in range(n):
        state = bytes([rng.randrange(256)]) * rng.randrange(1, 1 << 20)  # another size every time
        store._write(digest, prefixes.encode(store.secret, key, digest, BLOCK, BLOCK, state))


def test_two_servers_writing_the_same_block_at_once_leave_a_whole_file(tmp_path):
    folder, key, digest = tmp_path / "k", "k" * 24, "d" * 32
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_write_many, args=(str(folder), key, digest, seed, 40)) for seed in (1, 2)]
    seen, stop = [], threading.Event()

    def read() -> None:  # all the while: the file is absent or whole, never half of one
        while not stop.is_set():
            try:
                data = prefixes.read(folder / (digest + prefixes.SUFFIX), 1 << 30)
            except FileNotFoundError:
                continue
            prefixes.check(bytes(32), data, key, digest, BLOCK, BLOCK)
            seen.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    stop.set()
    reader.join()
    assert all(w.exitcode == 0 for w in writers) and seen
    assert [p.name for p in folder.iterdir()] == [digest + prefixes.SUFFIX]  # no temporary file left


def test_a_cache_that_cannot_be_written_is_one_warning(models, prefix_cache):
    with Server(pair(models)) as s:
        folder = s.session.prefixes.folder  # (the secret is made when the store is attached: the folder later)
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.write_text("a file where the folder goes")
        answer, _ = s.ask(SYSTEM + "q")
        s.ask(SYSTEM + "r")
    assert answer and len(s.warnings) == 1 and "cannot write the prefix cache" in s.warnings[0]


def test_a_cache_folder_that_cannot_be_made_turns_the_cache_off(models, prefix_cache):
    prefix_cache.parent.mkdir(parents=True, exist_ok=True)
    prefix_cache.write_text("a file where the folder goes")
    with open_session(pair(models)) as s:
        why = s.keep_prefixes(prefixes.MAX_BYTES, print)
    assert why.startswith("cannot write the prefix cache") and s.prefixes is None


@pytest.mark.parametrize("size", ["0", "-1", "nan"])
def test_prefix_cache_size_must_be_positive(capsys, size):
    from specdec_cli.cli.main import main

    assert main(["serve", "--target", "x.gguf", "--prefix-cache-size", size]) == 2  # (in-process: handlers restored)
    assert "--prefix-cache-size must be a positive number of GiB" in capsys.readouterr().err


def test_a_restarted_serve_process_reads_the_prompt_back(models, prefix_cache):
    """`specdec serve` end to end: the blocks are written once the answer is out, and read by the next process."""
    from test_serve import Served

    def ask(server, question: str):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return server.client().chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)

    args = ("--target", models["chat"], "--draft", models["draft"], "--drafter", "model", "-k", "3", "--debug")
    s = Served(*args)
    try:
        assert ask(s, "First question?").usage.model_extra["prompt_tokens_cached"] == 0
        deadline = time.time() + 60
        while len(blocks(prefix_cache)) < 3 and time.time() < deadline:
            time.sleep(0.1)
    finally:
        assert s.stop() == 0, s.stderr
    assert len(blocks(prefix_cache)) == 3
    answers = []
    for extra in ((), ("--no-prefix-cache",)):
        s = Served(*args, *extra)
        try:
            answers.append(ask(s, "Another question, then?"))
        finally:
            assert s.stop() == 0, s.stderr
        assert "warning" not in s.stderr
    restored, cold = answers
    assert restored.usage.model_extra["prompt_tokens_cached"] == 3 * BLOCK
    assert cold.usage.model_extra["prompt_tokens_cached"] == 0
    assert restored.choices[0].message.content == cold.choices[0].message.content


def test_a_restored_run_of_the_default_pair_says_what_a_cold_run_says_in_exact_mode(default_pair, prefix_cache):
    """The real pair (Q4_K_M), greedy, exact mode: the restored prompt's cells are the cold prefill's, bit for bit."""
    target, draft = default_pair
    cfg = RunConfig(target=target, draft=draft, threads=2, ctx_size=2048, max_tokens=16, exact=True, lookup_cache=False)
    assert_restart_answers_alike(cfg, text(5000, seed=4) + "\nSummarise the text above in one sentence.")

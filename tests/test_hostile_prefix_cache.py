"""The prefix cache under hostile clients and users (issue 47, findings 5, 6, 7 and 10's prompt_tokens_cached; the
graceful stop of finding 11): what one client asked stays its own, on disk and in memory, and the store touches
and trusts only the files it wrote."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from specdec_cli import signals
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.events import Prefilled
from specdec_cli.engine.stats import Fold
from specdec_cli import prefixes
from specdec_cli.serve import api, llama, messages, responses
from specdec_cli.prefixes import BLOCK
from specdec_cli.serve.service import Service
from specdec_cli.session import open_session
from test_prefix_store import SYSTEM, blocks, cold, pair, start

SECRET_TEXT = " The deploy password is hunter2-correct-horse-battery. "


class Server:
    """A session as `specdec serve` holds it, with a prefix store for `api_key` (the key's namespace)."""

    def __init__(self, cfg, api_key: str | None = None, max_bytes: int = prefixes.MAX_BYTES, **kw):
        self.warnings: list[str] = []
        self._cm = open_session(cfg)
        self.session = self._cm.__enter__()
        kw |= {"api_key": api_key} if api_key else {}  # (only where given: the tests run on version 1 too)
        assert self.session.keep_prefixes(max_bytes, self.warnings.append, **kw) is None
        self.service = Service(self.session, "m", {"m"}, 1)

    def ask(self, prompt: str, salt: str | None = None, keep: bool = True) -> tuple[list[int], int]:
        """(answer's token ids, prompt tokens the caches held before the prefill: prompt_tokens_cached)."""
        fold = Fold()
        for event in self.session.generate(self.session.prompt_tokens(prompt), Inputs(reuse=True, salt=salt)):
            fold.add(event)
        if keep:
            self.service._keep_prompt()  # what the server's work loop does once the answer is out
        return fold.tokens, fold.cached

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self._cm.__exit__(None, None, None)


def every_path(folder: Path) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(folder) for n in dirs + files]


# --- finding 5: files readable by every user, the prompt's tokens in them ---------------------------------


def test_cache_files_are_0600_in_0700_folders_whatever_the_umask(models, own_prefix_cache):
    """Without the fix: 0644 files in 0755 folders (umask 022), 0666 in 0777 with umask 0."""
    old = os.umask(0)
    try:
        with Server(pair(models)) as s:
            s.ask(SYSTEM + "Question?")
    finally:
        os.umask(old)
    paths = every_path(own_prefix_cache) + [own_prefix_cache]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in paths}
    assert modes == {p.name: 0o700 if p.is_dir() else 0o600 for p in paths}
    assert len(blocks(own_prefix_cache)) == 3 and (own_prefix_cache / prefixes.SECRET).exists()


def test_a_folder_left_0755_by_an_older_version_is_made_0700(models, own_prefix_cache):
    with Server(pair(models)) as s:
        s.ask(SYSTEM + "Question?")
        folder = s.session.prefixes.folder
    folder.chmod(0o755)
    own_prefix_cache.chmod(0o755)
    with Server(pair(models)):
        pass
    assert stat.S_IMODE(folder.stat().st_mode) == stat.S_IMODE(own_prefix_cache.stat().st_mode) == 0o700


def test_a_secret_pasted_in_a_prompt_is_not_in_the_cache_files(models, own_prefix_cache):
    """Without the fix each file held its block's tokens as int32: the secret read back with a tokenizer."""
    prompt = SYSTEM[:400] + SECRET_TEXT + SYSTEM[400:]
    with Server(pair(models)) as s:
        s.ask(prompt + "Question?")
        secret = s.session.prompt_tokens(SECRET_TEXT.strip())[4:-4]  # (its middle: no merge with the text around)
    needle = np.asarray(secret, dtype="<i4").tobytes()
    files = blocks(own_prefix_cache)
    assert len(files) == 3 and not any(needle in p.read_bytes() for p in files)


def test_a_secret_file_readable_by_others_turns_the_cache_off(models, own_prefix_cache):
    with Server(pair(models)):
        pass
    (own_prefix_cache / prefixes.SECRET).chmod(0o644)
    with open_session(pair(models)) as s:
        why = s.keep_prefixes(prefixes.MAX_BYTES, print)
    assert "is not private to this user (mode 0644" in why and s.prefixes is None


def test_blocks_are_restored_only_in_the_namespace_of_their_api_key_and_cache_salt(models, own_prefix_cache):
    """Without the fix a server restarted with another key, or a client with another salt, got the blocks
    (prompt_tokens_cached: 3 blocks), and so learnt that someone had sent that prompt."""
    cfg = pair(models, draft=None, drafter="none")
    prompt = SYSTEM + "Question?"
    with Server(cfg, api_key="key-one") as s:
        assert s.ask(prompt)[1] == 0
        assert s.ask(prompt, salt="alice")[1] == 0  # (memory: another namespace's cells are not reused)
    names = "\n".join(p.name for p in every_path(own_prefix_cache))
    assert "key-one" not in names and not any(b"key-one" in p.read_bytes() for p in blocks(own_prefix_cache))
    with Server(cfg, api_key="key-two") as s:  # another key: nothing of key-one's
        assert s.ask(prompt, keep=False)[1] == 0
    with Server(cfg, api_key="key-one") as s:  # its own key and salt: its blocks
        assert s.ask(prompt, salt="bob", keep=False)[1] == 0
        assert s.ask(prompt, salt="alice", keep=False)[1] == 3 * BLOCK
        assert s.ask(prompt, keep=False)[1] == 3 * BLOCK
        assert not s.warnings


def test_the_cells_kept_in_memory_serve_only_the_same_namespace(models, own_prefix_cache):
    """Finding 10: the cells a request left in the context are not another namespace's prompt_tokens_cached.
    Without the fix the second request reported most of the first one's prompt as cached."""
    cfg = pair(models)
    with open_session(cfg) as s:  # no prefix store: memory alone
        short = s.prompt_tokens(SYSTEM[:300])  # (too short to be kept on disk anyway)

        def cached(salt):
            events = list(s.generate(short, Inputs(reuse=True, salt=salt)))
            return next(e.cached for e in events if isinstance(e, Prefilled))

        assert cached("alice") == 0
        assert cached("mallory") == 0
        assert cached(None) == 0
        assert cached(None) == len(short) - 1  # its own namespace: reused
        assert cached("alice") == 0


@pytest.mark.parametrize(
    "parse, kind, body",
    [
        (api.parse, "chat", {"messages": [{"role": "user", "content": "hi"}]}),
        (api.parse, "completion", {"prompt": "hi"}),
        (responses.parse, "chat", {"input": "hi"}),
        (messages.parse, "messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        (messages.parse, "count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
        (llama.parse, "llama", {"prompt": "hi"}),
        (llama.parse, "infill", {"input_prefix": "a", "input_suffix": "b"}),
    ],
)
def test_every_api_takes_a_cache_salt_and_refuses_a_bad_one(parse, kind, body):
    assert parse(kind, {**body, "cache_salt": "s" * 43}).cache_salt == "s" * 43
    assert parse(kind, body).cache_salt is None
    for bad in ("", 7, "s" * (api.MAX_SALT + 1)):
        with pytest.raises(api.ApiError) as e:
            parse(kind, {**body, "cache_salt": bad})
        assert e.value.status == 400 and "cache_salt" in e.value.message


def test_a_served_client_of_another_key_or_cache_salt_gets_nothing_cached(models, own_prefix_cache):
    """End to end (`specdec serve` with an API key): prompt_tokens_cached is 0 under another key (after a
    restart) and for another salt (in memory, and after a restart); the owner of a salt gets its blocks back.
    Without the fix the server restarted with another key reported the first key's prompt as cached."""
    from test_serve import Served

    def ask(server, key, salt=None, question="A question?"):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        r = server.client(api_key=key).chat.completions.create(
            model="m", messages=messages, max_tokens=4, temperature=0, extra_body=salt and {"cache_salt": salt}
        )
        return r.usage.model_extra["prompt_tokens_cached"]

    def served(key: str) -> Served:
        return Served("--target", models["chat"], "--drafter", "none", "--debug", env={"SPECDEC_API_KEY": key})

    s = served("key-one")
    try:
        assert ask(s, "key-one") == 0
    finally:
        assert s.stop() == 0, s.stderr
    s = served("key-two")
    try:
        assert ask(s, "key-two", question="Another?") == 0  # the same prompt, another key: nothing
        assert ask(s, "key-two", "alice") == 0
        assert ask(s, "key-two", "mallory") == 0  # what alice's request left in the context is not mallory's
    finally:
        assert s.stop() == 0, s.stderr
    s = served("key-two")
    try:
        assert ask(s, "key-two", "mallory", "Another?") == 3 * BLOCK  # its own blocks
        assert ask(s, "key-two", "eve", "Another?") == 0
        assert ask(s, "key-two", "alice", "Another?") == 3 * BLOCK
    finally:
        assert s.stop() == 0, s.stderr


# --- finding 6: eviction deletes files it never wrote ----------------------------------------------------


def plant_foreign_files(root: Path) -> list[Path]:
    """Files under the cache folder that the store never wrote, some named as its own, all of them old."""
    root.mkdir(parents=True, exist_ok=True)
    key, digest = "a" * 24, "b" * 32
    paths = [
        root / "notes" / "data.kv",
        root / "notes" / ".draft.tmp",
        root / key / f"{digest}.kv",  # a block's name and folder, not a block of ours
        root / key / f".{digest}.kv.1234.0123abcd.tmp",  # a temporary file's name, not ours
        root / ("c" * 24) / f"{digest}.kv",
    ]
    for p in paths:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"precious data " * 1000)
    head = struct.pack(
        "<8s24s32sIIQ32s32s", b"SPDKV2\0\0", b"c" * 24, digest.encode(), 0, BLOCK, 10, bytes(32), bytes(32)
    )
    paths[-1].write_bytes(head + bytes(10))  # our magic and a header's shape, a made-up HMAC
    old = time.time() - 30 * 24 * 3600
    for p in paths:
        os.utime(p, (old, old))
    return paths


def test_eviction_and_expiry_remove_only_files_the_store_wrote(models, own_prefix_cache):
    """Without the fix eviction removed any */*.kv and any old */.*.tmp under the cache folder."""
    foreign = plant_foreign_files(own_prefix_cache)
    before = {p: p.read_bytes() for p in foreign}
    with Server(pair(models), max_bytes=1) as s:  # a bound nothing fits in: every block of ours goes
        s.ask(SYSTEM + "Question?")
    assert set(blocks(own_prefix_cache)) == {p for p in foreign if p.suffix == ".kv"}  # ours went, over the bound
    assert {p: p.read_bytes() for p in foreign} == before


def test_a_block_unused_past_the_lifetime_is_removed_and_not_restored(models, own_prefix_cache):
    """Without the fix blocks stayed for ever: the restarted server restored a prompt of days ago."""
    cfg = pair(models, draft=None, drafter="none")
    with Server(cfg) as s:
        s.ask(SYSTEM + "Question?")
    files = blocks(own_prefix_cache)
    assert len(files) == 3
    old = time.time() - 2 * 24 * 3600  # (the default lifetime: a day)
    for p in files:
        os.utime(p, (old, old))
    with Server(cfg) as s:  # the start removes them
        assert not blocks(own_prefix_cache)
        assert s.ask(SYSTEM + "Again?", keep=False)[1] == 0
    with Server(cfg) as s:
        s.ask(SYSTEM + "Question?")
    with Server(cfg, lifetime=0.5) as s:  # unused for longer than its lifetime while a server runs
        time.sleep(1)
        assert s.ask(SYSTEM + "Again?", keep=False)[1] == 0


def test_an_older_versions_files_with_the_prompts_tokens_are_removed(models, own_prefix_cache):
    with Server(pair(models)) as s:
        folder = s.session.prefixes.folder
    folder.mkdir(mode=0o755)
    v1 = folder / ("d" * 32 + prefixes.SUFFIX)
    v1.write_bytes(struct.pack("<8s24s32sIII", prefixes.OLD_MAGIC, folder.name.encode(), b"d" * 32, 0, 1, 0) + b"tokn")
    with Server(pair(models)):
        pass
    assert not v1.exists() and stat.S_IMODE(folder.stat().st_mode) == 0o700


# --- finding 7: a CRC is no defence against an edit ------------------------------------------------------


def forge(path: Path) -> None:
    """Change a bit of the KV cells and recompute every checksum that needs no secret: version 1's CRC-32,
    version 2's SHA-256 of the cells."""
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    if data[:8] == b"SPDKV1\0\0":
        head = struct.Struct("<8s24s32sIII")
        fields = head.unpack_from(data)
        end = head.size + 4 * fields[4]
        head.pack_into(data, 0, *fields[:5], zlib.crc32(data[end:], zlib.crc32(data[head.size : end])))
    else:
        fields = list(prefixes.HEADER.unpack_from(data))
        fields[6] = hashlib.sha256(data[prefixes.HEADER.size :]).digest()
        prefixes.HEADER.pack_into(data, 0, *fields)
    path.write_bytes(bytes(data))


def test_an_edited_block_with_its_checksum_recomputed_is_refused(models, own_prefix_cache):
    """Without the fix the edited block loaded silently (3 blocks cached, no warning), its cells changed."""
    cfg = pair(models)
    with Server(cfg) as s:
        s.ask(SYSTEM + "Question?")
    forge(next(p for p in blocks(own_prefix_cache) if start(p) == BLOCK))  # the second block
    prompt = SYSTEM + "Another question?"
    with Server(cfg) as s:
        answer, cached = s.ask(prompt, keep=False)
    assert cached == BLOCK and len(s.warnings) == 1 and "HMAC" in s.warnings[0], s.warnings
    assert answer == cold(cfg, prompt)


def test_a_block_written_by_another_install_is_refused(models, own_prefix_cache, tmp_path, monkeypatch):
    """The same model, prompt and name, written with another secret: a file planted from elsewhere."""
    cfg = pair(models, draft=None, drafter="none")
    with Server(cfg) as s:
        s.ask(SYSTEM + "Question?")
        chain = s.session.prefixes.chain(s.session.prompt_tokens(SYSTEM))
        folder, key = s.session.prefixes.folder, s.session.prefixes.key
    first = folder / (chain[0] + prefixes.SUFFIX)
    state = first.read_bytes()[prefixes.HEADER.size :]
    first.write_bytes(b"".join(prefixes.encode(os.urandom(32), key, chain[0], 0, BLOCK, state)))
    with Server(cfg) as s:
        assert s.ask(SYSTEM + "Again?", keep=False)[1] == 0 and "HMAC" in s.warnings[0]


# --- the graceful stop (finding 11) -----------------------------------------------------------------------


def test_a_stopping_server_writes_the_last_prompts_blocks_in_one_line(models, own_prefix_cache, capsys):
    with Server(pair(models)) as s:
        s.ask(SYSTEM + "Question?", keep=False)  # answered; a signal came before the work loop kept it
        s.service.keep_before_stopping()
        assert len(blocks(own_prefix_cache)) == 3 and s.session.prefixes.pending is None
        s.service.keep_before_stopping()  # nothing left: nothing said
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "writing 3 block(s)" in lines[0] and "second signal" in lines[0]


def test_a_stop_writes_no_block_past_its_deadline(models, own_prefix_cache):
    with Server(pair(models)) as s:
        s.ask(SYSTEM + "Question?", keep=False)
        s.service._keep_prompt(deadline=time.monotonic() - 1)
    assert not blocks(own_prefix_cache)


def test_a_second_signal_interrupts_the_stop(monkeypatch):
    """The first signal raises; later ones are ignored, except within second_stops (the cache being written)."""
    restore = signals.install()
    try:
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: a teardown goes on
        time.sleep(0.1)
        with signals.second_stops(), pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    finally:
        restore()


def test_sigterm_right_after_the_answer_still_keeps_the_prompt(models, own_prefix_cache):
    """Issue 11: a script that starts the server, asks and stops it gets the cache."""
    from test_serve import Served

    args = ("--target", models["chat"], "--drafter", "none")
    s = Served(*args)
    try:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question?"}]
        s.client().chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0)
        s.proc.send_signal(signal.SIGTERM)
    finally:
        code = s.stop()
    assert code == 0, s.stderr
    assert len(blocks(own_prefix_cache)) == 3


# --- the fourth hostile pass: a local user's links and folders ----------------------------------------------------


def test_a_model_folder_replaced_by_a_link_is_neither_chmodded_nor_written_through(models, own_prefix_cache, tmp_path):
    """Found by the fourth pass: another user swapped a model's folder for a link to a folder of the server's user;
    the next long prompt made it 0700 and wrote five blocks into it (and eviction never counted them)."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    victim.chmod(0o755)
    with Server(pair(models)) as s:
        folder = s.session.prefixes.folder
        if folder.exists():
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.symlink_to(victim)
        s.ask(SYSTEM + "Question?")
    assert list(victim.iterdir()) == [] and stat.S_IMODE(victim.stat().st_mode) == 0o755
    assert any("not a folder of this user's" in w for w in s.warnings), s.warnings


def test_a_cache_folder_of_another_user_turns_the_cache_off(models, own_prefix_cache):
    """Found by the fourth pass: a root another user made first (so owns, and can fill with links) was used."""
    if os.getuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    own_prefix_cache.mkdir(parents=True, exist_ok=True)
    os.chown(own_prefix_cache, 65534, 65534)
    with open_session(pair(models)) as session:
        why = session.keep_prefixes(prefixes.MAX_BYTES, lambda m: None)
    assert why is not None and "not a folder of this user's" in why and session.prefixes is None
    assert not (own_prefix_cache / prefixes.SECRET).exists()

"""Long prompts' KV cells kept on disk, so that a server does not prefill again a prompt it has seen (store.py says
how; blocks.py is a block's file). The session owns a server's store (Session.keep_prefixes)."""

from .blocks import BLOCK, HEADER, OLD_MAGIC, SECRET, SUFFIX, Damaged, check, encode, read, root, secret
from .store import LIFETIME, MAX_BYTES, MIN_PROMPT, STOP_SECONDS, Store, Warn, key_hash, model_key, opened

__all__ = [
    "BLOCK", "HEADER", "LIFETIME", "MAX_BYTES", "MIN_PROMPT", "OLD_MAGIC", "SECRET", "STOP_SECONDS", "SUFFIX",
    "Damaged", "Store", "Warn", "check", "encode", "key_hash", "model_key", "opened", "read", "root", "secret",
]  # fmt: skip

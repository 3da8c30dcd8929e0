"""What a run reads besides its prompt's tokens and its settings: one typed record, so that nothing of a request
rides in the settings dict (RunConfig.override checks settings; these are not settings)."""

from __future__ import annotations

from dataclasses import dataclass

from .backend.grammar import Trigger
from .drafting.corpus import Corpus

UNCONSTRAINED = ""  # Inputs.grammar for an answer with no grammar, whatever the settings' (OpenAI's response_format
# "text" under a server's --json-schema); None: the settings'
CACHED = Corpus([])  # Inputs.corpus's default: the lookup cache of the run's namespace (a marker, never searched)


@dataclass(frozen=True)
class Inputs:
    """instruction: the user's prompt as text (lookup drafts from the names it mentions: where the answer edits).
    corpus: earlier answers lookup drafts from; CACHED: the lookup cache (the bench brings its own; None: none).
    reuse: keep what both caches hold of this prompt from the run before (a server's chat turns); Prefilled.cached
    says how much. grammar: GBNF the answer follows, over the settings' (--json-schema, --grammar): a request's
    response_format, its tools' calls (UNCONSTRAINED: none). trigger: the grammar applies from this text on (a tool call's opening
    marker, with tool_choice "auto"; backend/grammar.LazyState). prediction: text the answer is expected to repeat
    (OpenAI's predicted outputs; None: the --prediction file's), lookup's first source, counted in Stats. salt: a
    request's cache_salt: a run reuses only cells of runs with the same salt (in memory and on disk), so that a
    client cannot learn from Prefilled.cached, or from the time, what another namespace asked."""

    instruction: str = ""
    corpus: Corpus | None = CACHED
    reuse: bool = False
    grammar: str | None = None
    trigger: Trigger | None = None
    prediction: str | None = None
    salt: str | None = None

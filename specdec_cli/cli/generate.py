"""`specdec generate`: one prompt, its answer streamed live (or one JSON object), then the statistics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from .. import inputs, options, signals, ui
from ..ui import placement
from ..engine.events import Notice, Stopped, Token
from ..engine.stats import Result, collect
from ..declaration import PROMPT
from ..errors import UsageError
from ..run_inputs import Inputs
from ..session import Session
from .common import CONFIG, PAIR, opened, resolve


@options.with_options(*options.BY_KEY)  # every run option
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' or nothing reads standard input."),
    pair: Optional[str] = PAIR,
    config_path: Optional[Path] = CONFIG,
    prompt_option: Optional[str] = typer.Option(
        None, "-p", "--prompt", help="The prompt, as PROMPT (llama.cpp's name for it).", rich_help_panel=PROMPT
    ),
    suffix: Optional[str] = typer.Option(
        None,
        "--suffix",
        help="Fill in the middle: the text after the gap (TEXT, or @FILE), PROMPT the text before it; in the "
        "model's FIM tokens, as llama-server's /infill lays them out. Needs a model trained for it (Qwen2.5-Coder).",
        rich_help_panel=PROMPT,
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the live stream."),
    debug: bool = typer.Option(False, "--debug", help="Check the KV caches after every round; show tracebacks."),
    **given: Any,
) -> None:
    """Generate text from PROMPT with speculative decoding."""
    if given.get("system") is not None:
        given["system"] = _text(given["system"], "--system")
    if prompt is not None and prompt_option is not None:
        raise UsageError("the prompt is given twice, as PROMPT and as -p/--prompt: give it once")
    cfg = resolve(given, pair, config_path, debug=debug)
    if cfg.logprobs is not None and not json_out:  # asked for, and the text stream would show them nowhere
        raise UsageError(
            "--logprobs goes into --json's output; the text stream has no place for it",
            hint="add --json (each token's log probability and its N best alternatives), or drop --logprobs",
        )
    prompt_text = _read_prompt(prompt if prompt_option is None else prompt_option)
    suffix_text = _suffix(suffix)
    if suffix_text is not None and cfg.system:
        raise UsageError("--suffix fills in the middle without the chat template: --system has no place in it")
    with opened(cfg, lazy_draft=True) as session:  # the draft model is loaded if and when it drafts
        if suffix_text is None:
            tokens = session.prompt_tokens(prompt_text)
        else:
            tokens = session.infill_tokens(prompt_text, suffix_text)
        live = not json_out and ui.live_terminal()
        stream = None if json_out else ui.TokenStream(live, session.drafter)
        if stream:
            stream.start()
        scored: list[Token] = []
        result = _consume(session.generate(tokens, Inputs(instruction=prompt_text)), stream, scored)
        if result.stats.complete is False and not result.interrupted:
            ui.warning(
                f"the answer stopped ({result.stats.stop_reason}) before its grammar was complete: it does "
                "not follow the schema or grammar; raise -n/--max-tokens"
            )
        if not result.interrupted and result.stats.stop_reason in ("eos", "max_tokens"):
            session.remember(result.tokens)  # the lookup cache: a later run may draft from this answer
        with signals.held():  # what the run produced is printed whole
            if stream:
                stream.end()
            if json_out:
                ui.print_json(_json(session, result, scored))
            else:
                ui.show_stats(result.stats, _title(session), live, _asked(session))
    if result.interrupted:
        raise typer.Exit(signals.exit_code())


def _json(session: Session, result: Result, scored: list[Token]) -> dict:
    config = {
        **session.cfg.as_dict(),
        "drafter": session.drafter,  # as the session took it: `model` with an EAGLE-3 draft is eagle3
        "ctx_size": session.target_ctx.n_ctx,  # as fitted to the models when -c was not given
        "pair": session.cfg.pair,
        "chat": session.uses_chat,
        "target_on": session.where,
        "draft_loaded": session.draft is not None,  # false where auto never drafted with it: never loaded
        # per model, per device: its layers and its model, KV and compute buffers, as llama.cpp's log said them
        "placement": session.placement,
    }
    # cost_curve: where auto's costs came from, "measured" now or "cached" by an earlier run (None: unused)
    stats = {
        **result.stats.as_dict(),
        "load_seconds": round(session.load_seconds, 4),
        "cost_curve": session.curve.source,
    }
    # valid: a constrained answer (--json-schema, --grammar) that is whole; null when unconstrained
    out = {
        "text": result.text,
        "tokens": result.tokens,
        "stop_reason": result.stats.stop_reason,
        "valid": result.stats.complete,
        "stats": stats,
        "config": config,
    }
    if session.cfg.logprobs is not None:  # each token's, and its --logprobs best alternatives
        text = session.target.piece

        def one(t: int, lp: float) -> dict:
            return {"id": t, "token": text(t).decode("utf-8", "replace"), "logprob": lp}

        # (alternatives a grammar rules out have probability 0: -inf, which JSON cannot say; left out)
        top = [[one(*alt) for alt in t.top if alt[1] != float("-inf")] for t in scored]
        out["logprobs"] = [{**one(t.id, t.logprob), "top": alts} for t, alts in zip(scored, top)]
    return out


def _asked(session: Session) -> ui.Asked:
    cfg, costs = session.cfg, session.curve.costs  # (None: nothing needed the cost curve, e.g. a fixed -k)
    plain = costs.plain if costs is not None else None
    return ui.Asked(session.drafter, cfg.draft_tokens, cfg.branches, cfg.exact, plain)


def _title(session: Session) -> str:
    cfg = session.cfg  # the drafter is the session's: none where the target cannot roll back (auto said so)
    title = "specdec · " + ui.label(session.drafter, cfg.draft_tokens, cfg.branches, k_for_auto=True, exact=cfg.exact)
    offloaded = placement.where(session.placement["target"])  # (None: every layer on the CPU)
    return title + (f" · target on {session.where}" if cfg.rpc else "") + (f" · {offloaded}" if offloaded else "")


def _consume(events, stream: ui.TokenStream | None, tokens: list[Token]) -> Result:
    """Fold the engine's events into statistics, token ids and text, streaming them if asked, the Token events
    kept in `tokens`. Ctrl-C ends it early; the statistics so far stand (the engine rolled its caches back)."""

    def show(event) -> None:
        if isinstance(event, Token):
            tokens.append(event)
        if isinstance(event, Notice):
            ui.warning(event.message)
        elif stream is None:
            return
        elif isinstance(event, Token):
            stream.token(event)
        elif isinstance(event, Stopped):
            stream.text(event.tail)

    return collect(events, show, signals.INTERRUPTS)


def _read_prompt(prompt: str | None) -> str:
    if prompt is not None and prompt != "-":
        return _text(prompt, "the PROMPT argument")
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError(
            "no prompt given", hint="pass PROMPT as an argument, or pipe it: echo 'hi' | specdec generate -"
        )
    text = inputs.read_text(sys.stdin.buffer, "standard input")
    if not text.strip():
        raise UsageError("the prompt read from standard input is empty")
    return text


def _suffix(value: str | None) -> str | None:
    """--suffix TEXT, or @FILE: the file's text (@@TEXT: text that starts with @)."""
    if value is None:
        return None
    if value.startswith("@@"):
        return _text(value[1:], "--suffix")
    if value == "@":
        raise UsageError(
            "--suffix @FILE needs a file's path after the @", hint="--suffix @after.py, or the text itself"
        )
    if value.startswith("@"):
        return inputs.read_file(value[1:], "--suffix")
    return _text(value, "--suffix")


def _text(value: str, what: str) -> str:
    """A command-line string as UTF-8 text: Python hands over undecodable argument bytes as surrogates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{what} is not valid UTF-8", hint="pass UTF-8 text, or pipe a file: specdec generate - < FILE"
        ) from None
    return value

"""The README and docs/ stay true to the tree: every relative link lands on a file and a heading, every
documented `specdec` command names a real subcommand and real options, the README stays a front door, and its
test command is the one CI runs.

Markdown is read as GitHub reads it: fenced blocks by CommonMark's rules (a longer fence holds shorter ones),
heading anchors by GitHub's slugs. The options come from the command line's own `--help`, so a renamed or
removed option fails here, not in a reader's shell.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 320  # the "about 300", with a little room

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "shell-session", "zsh"}
OPTION = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_-]*")
SHELL_OPERATORS = set("();<>|&")


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# ---- Markdown as GitHub reads it


@dataclass(frozen=True)
class Block:
    """A run of lines: prose (info None) or one fenced block (info: its info string, "" when unlabelled)."""

    info: str | None
    lines: tuple[tuple[int, str], ...]  # (1-based line number, text)


def blocks(text: str) -> list[Block]:
    """Prose and fenced blocks in order. A fence closes only on the same character, at least as long, with no
    info string; a backtick fence's info string holds no backtick (so "```` ```json ```` block" is prose)."""
    out: list[Block] = []
    current: list[tuple[int, str]] = []
    fence: str | None = None
    info: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        m = FENCE.match(line)
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                out.append(Block(None, tuple(current)))
                current, fence, info = [], m.group(1), m.group(2).strip()
            else:
                current.append((number, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            out.append(Block(info, tuple(current)))
            current, fence, info = [], None, None
        else:
            current.append((number, line))
    out.append(Block(info if fence else None, tuple(current)))
    return [b for b in out if b.lines]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links by their text, code without backticks), lowercase,
    every character but letters, digits, '_', '-' and spaces dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(line number, heading text) of every ATX heading outside fenced blocks."""
    found = []
    for block in blocks(text):
        if block.info is None:
            for number, line in block.lines:
                if m := HEADING.match(line):
                    found.append((number, m.group(2)))
    return found


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    result = set()
    for _, heading in headings(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline and reference link in prose, code spans left out."""
    found = []
    for block in blocks(text):
        if block.info is not None:
            continue
        for number, line in block.lines:
            prose = INLINE_CODE.sub("", line)
            found += [(number, m.group(1)) for m in LINK.finditer(prose)]
            if m := REFERENCE.match(prose):
                found.append((number, m.group(1)))
    return found


def link_problems(files: list[Path]) -> list[str]:
    """One line per relative link that names a missing file, or a heading its file does not have."""
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for number, target in links(text):
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # absolute: http(s), mailto
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.name}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no file {dest}")
            elif anchor:
                if dest.suffix != ".md":
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest.read_text(encoding="utf-8")):
                    problems.append(f"{where}: {dest.name} has no heading with anchor #{anchor}")
    return problems


# ---- the command line's own help


@dataclass(frozen=True)
class Help:
    options: frozenset[str]
    commands: frozenset[str]


@functools.cache
def cli_help(path: tuple[str, ...]) -> Help:
    """The flags and subcommands `specdec PATH... --help` lists (rich's panels, COLUMNS=200 so nothing wraps)."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "specdec_cli", *path, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"specdec {' '.join(path)} --help: {result.stderr}"
    options, commands, panel = set(), set(), None
    for raw in result.stdout.splitlines():
        if raw.lstrip().startswith("╭"):
            panel = "commands" if "Commands" in raw else "other"
            continue
        line = raw.strip().strip("│").rstrip()
        # an entry's line starts near the border; a wrapped description is indented far past it
        if not (m := re.match(r"^ {0,4}(?:\* +)?(\S.*)$", line)):
            continue
        entry = m.group(1)
        if panel == "commands":
            commands.add(entry.split()[0])
        elif entry.startswith("-"):
            for token in entry.replace(",", " ").split():  # (a flag and its aliases: "--target,--model  -m")
                if not OPTION.fullmatch(token):
                    break
                options.add(token)
    assert "--help" in options, f"no options parsed from `specdec {' '.join(path)} --help`:\n{result.stdout}"
    return Help(frozenset(options), frozenset(commands))


# ---- documented commands


def documented_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) for every `specdec ...` command in a shell or unlabelled fenced block.

    An unlabelled or `console` block, and any block with a line starting "$ ", is a transcript: only its "$ "
    lines are commands, the rest is output (`specdec bench: ...`, `specdec     25.76 tokens/s`). In a script
    (bash, sh, ...) without prompts a command is a line starting "specdec ". A trailing backslash continues a
    command on the next line, and so does a quoted argument left open (a prompt over several lines)."""
    found = []
    for block in blocks(text):
        language = None if block.info is None else (block.info.split() or [""])[0].lower()
        if language not in SHELL_LANGUAGES:
            continue  # prose, or JSON, Python, TOML
        lines = block.lines
        transcript = language in ("", "console", "shell-session") or any(line.startswith("$ ") for _, line in lines)
        i = 0
        while i < len(lines):
            number, line = lines[i]
            i += 1
            if transcript:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.startswith("specdec "):
                continue
            command = line
            while i < len(lines) and (command.endswith("\\") or not _parses(command)):
                if command.endswith("\\"):
                    command = command[:-1] + " " + lines[i][1].lstrip()
                else:
                    command += "\n" + lines[i][1]
                i += 1
            found.append((number, command))
    return found


def _parses(command: str) -> bool:
    try:
        _tokens(command)
    except ValueError:
        return False
    return True


def _tokens(command: str) -> list[str]:
    """The command's words up to its first shell operator (a pipe, a redirection, `;`, `&&`), comments dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    for token in lexer:
        if token and set(token) <= SHELL_OPERATORS:
            break
        words.append(token)
    return words


def command_problems(files: list[Path]) -> list[str]:
    """One line per documented command that names no subcommand, or an option its subcommand's --help lacks."""
    problems = []
    for path in files:
        for number, command in documented_commands(path.read_text(encoding="utf-8")):
            where = f"{path.name}:{number}: {command.splitlines()[0]}"
            try:
                words = _tokens(command)[1:]  # after "specdec"
            except ValueError as e:
                problems.append(f"{where}: cannot be read as a shell command ({e})")
                continue
            sub: tuple[str, ...] = ()  # the subcommand path: ("models", "info")
            while words and cli_help(sub).commands and not words[0].startswith("-"):
                if words[0] not in cli_help(sub).commands:
                    break
                sub, words = (*sub, words[0]), words[1:]
            if words and cli_help(sub).commands and not words[0].startswith("-"):
                problems.append(f"{where}: `specdec {' '.join(sub)}` has no subcommand {words[0]!r}")
                continue
            if "--" in words:
                words = words[: words.index("--")]  # what follows is passed on, not specdec's
            for word in words:
                flag = word.split("=", 1)[0]
                if OPTION.fullmatch(flag) and flag not in cli_help(sub).options:
                    problems.append(f"{where}: `specdec {' '.join(sub)}` has no option {flag}")
    return problems


# ---- the tests


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_lands_on_a_file_and_heading(path):
    assert link_problems([path]) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documented_commands_name_real_subcommands_and_options(path):
    assert command_problems([path]) == []


def test_every_docs_page_is_listed_and_links_back_to_the_readme():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = {target.partition("#")[0] for _, target in links(index)}
    for page in pages:
        if page.name != "README.md":
            assert page.name in listed, f"docs/README.md does not list {page.name}"
        text = page.read_text(encoding="utf-8")
        first = text.split("\n", 1)[0]
        assert first.startswith("# "), f"{page.name} does not start with a one-line title"
        assert any(t.partition("#")[0] == "../README.md" for _, t in links(text)), f"{page.name}: no link back"


def test_readme_is_a_front_door_of_at_most_320_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}"


def test_exact_modes_cost_is_one_figure_the_measurement_gives():
    """Exact mode's cost on the default pair is said one way wherever it is said: generation at the ratio of
    exact.md's measured target-only rows (exact tok/s over fast tok/s), never as another percentage."""
    exact = (ROOT / "docs" / "exact.md").read_text(encoding="utf-8")
    row = re.search(r"^\| none \(target-only\) \| ([\d.]+) \|[^|]*\|[^|]*\| ([\d.]+) \|", exact, re.M)
    figure = f"{float(row[2]) / float(row[1]):.2f}x"  # 20.9 / 27.9
    assert f"generates at {figure} the fast kernels' speed" in " ".join(exact.split())
    for name in ("README.md", "docs/generate.md", "docs/models.md"):
        flat = " ".join((ROOT / name).read_text(encoding="utf-8").split())
        assert f"{figure} the fast kernels' speed on the default pair" in flat or f"target's at {figure}" in flat, name
    for name in ("docs/exact.md", "docs/models.md"):  # the two wordings that disagreed with it and each other
        flat = " ".join((ROOT / name).read_text(encoding="utf-8").split())
        assert "costs 17% of plain decoding" not in flat and "about half the fast" not in flat, name


def test_readme_explains_every_statistic_the_panel_prints():
    """The statistics table stays in the README: every line the panel prints (a run with every feature on) has
    its row there, and so do the statistics the drafter rows name."""
    from specdec_cli.engine.stats import DrafterStats, Stats
    from specdec_cli.ui import Asked, stat_rows

    model = DrafterStats(rounds=2, drafted=4, accepted=3, emitted=5, chosen_k=4, predicted=5.0, predicted_rounds=2)
    model.emitted_predicted, model.entropy, model.entropy_rounds, model.draft_seconds = 5, 0.5, 1, 0.01
    stats = Stats(prompt_tokens=3, generated_tokens=5, rounds=2, drafted=4, accepted=3, emitted=5, branches=3)
    stats.tree_rounds, stats.branch_wins, stats.accepted_at, stats.stop_reason = 1, [0, 1], [2, 1], "eos"
    stats.by_drafter = {"model": model, "none": DrafterStats(rounds=1, emitted=1)}
    stats.prefill_seconds, stats.ttft_seconds, stats.generation_seconds = 0.1, 0.2, 0.5
    stats.measure_seconds = 2.0  # auto's first run measured the machine (the `cost curve` row)
    stats.prediction_tokens, stats.prediction_accepted, stats.prediction_rejected = 10, 2, 1
    rows = stat_rows(stats, Asked("auto", None, plain_seconds=0.02))
    labels = [label for label, _ in rows if not label.startswith(" ")]  # indented: one drafter's line
    assert {"asked", "vs target alone", "prediction", "branches", "drafters", "predicted / realised"} <= set(labels)
    printed = " ".join(text for _, text in rows)
    labels += [phrase for phrase in ("first token", "draft entropy") if phrase in printed]

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = next(n for n, h in headings(readme) if h == "The statistics")
    after = readme.splitlines()[start:]
    first = next(i for i, line in enumerate(after) if line.startswith("|"))
    table = [line.split("|")[1] for line in itertools.takewhile(lambda x: x.startswith("|"), after[first:])]
    for label in labels:
        parts = label.split(" / ")
        assert any(all(re.search(rf"\b{re.escape(p)}\b", cell) for p in parts) for cell in table), label


def _logical_lines(text: str) -> list[str]:
    """A shell script's commands: continuation lines joined, comments and blank lines dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command:
            out.append(command)
    return out


def _normalised(command: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """(its environment assignments, its words without --quiet): pip's quiet flag only trims CI's log."""
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, tuple(w for w in words if w not in ("--quiet", "-q"))


def readme_test_command(readme: str) -> str:
    """The first shell block under a "Run the tests" heading (README's, or a docs page's that repeats it)."""
    start = next(n for n, h in headings(readme) if h == "Run the tests")
    return next(
        block.lines[0][1]
        for block in blocks(readme)
        if block.info is not None and block.lines[0][0] > start and block.info in SHELL_LANGUAGES
    )


def test_readme_test_command_is_the_one_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = [_normalised(c) for c in _logical_lines((ROOT / ".ci" / "run").read_text(encoding="utf-8"))]
    steps = [_normalised(c) for c in readme_test_command(readme).split("&&")]
    assert any("pip" in words and "install" in words for _, words in steps), "no pip install in README's command"
    assert any("pytest" in words for _, words in steps), "no pytest in README's command"
    for env, words in steps:
        matches = [e for e, w in ci if w == words]
        assert matches, f"README's `{' '.join(words)}` is not in .ci/run"
        assert any(env.items() <= e.items() for e in matches), f"README's environment {env} differs in .ci/run"
    # and the other way: CI installs the package and runs pytest exactly as README says
    for _env, words in ci:
        if ("pip" in words and "-e" in words) or "pytest" in words:
            assert words in [w for _, w in steps], f".ci/run's `{' '.join(words)}` is not README's"
    # a docs page that repeats the command (docs/testing.md) repeats it exactly
    for page in doc_files()[1:]:
        text = page.read_text(encoding="utf-8")
        if any(h == "Run the tests" for _, h in headings(text)):
            assert readme_test_command(text) == readme_test_command(readme), page.name


# ---- the checks catch what they are for (on copies: the tree is never touched)


def _copy_docs(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for entry in ROOT.iterdir():  # link targets outside the docs: scripts/, models.example.toml, ...
        if entry.name not in ("README.md", "docs"):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def test_slugs_follow_githubs_rules():
    assert slug("Bigger than your machine: `--rpc`") == "bigger-than-your-machine---rpc"
    assert slug("`specdec generate [PROMPT]`") == "specdec-generate-prompt"
    assert slug("The model's own draft heads: `--drafter mtp`") == "the-models-own-draft-heads---drafter-mtp"
    assert anchors("## Measured\ntext\n### Measured\n```\n# not a heading\n```\n") == {"measured", "measured-1"}


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    root = _copy_docs(tmp_path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    anchored = next(t for _, t in links(text) if t.startswith("docs/") and "#" in t)
    to_file = next(t for _, t in links(text) if t.startswith("docs/") and t != anchored)
    text = text.replace(f"]({anchored})", f"]({anchored}-gone)", 1).replace(f"]({to_file})", "](docs/gone.md)", 1)
    readme.write_text(text, encoding="utf-8")
    problems = link_problems(doc_files(root))
    assert any(f"{anchored}-gone" in p and "no heading" in p for p in problems), problems
    assert any("docs/gone.md" in p and "no file" in p for p in problems), problems
    assert link_problems(doc_files(ROOT)) == []


def test_a_renamed_option_or_unknown_subcommand_is_caught(tmp_path):
    root = _copy_docs(tmp_path)
    page = root / "docs" / "generate.md"
    text = page.read_text(encoding="utf-8")
    number, command = next((n, c) for n, c in documented_commands(text) if "--json-schema" in c)
    lines = text.split("\n")
    lines[number - 1] = lines[number - 1].replace("--json-schema", "--json-schemas", 1)
    lines.append("\n```bash\nspecdec frobnicate --fast\n```")
    page.write_text("\n".join(lines), encoding="utf-8")
    problems = command_problems([page])
    assert any("has no option --json-schemas" in p for p in problems), problems
    assert any("has no subcommand 'frobnicate'" in p for p in problems), problems


def test_output_comments_and_continuations_are_read_as_a_shell_would():
    text = "\n".join(
        [
            "```",
            "$ specdec models list  # a comment: --not-an-option",
            "specdec bench: this line is output, not a command",
            "```",
            "```bash",
            "specdec generate -n 8 \\",
            '    --no-chat "two',
            'lines --not-an-option" | head -1 --also-not',
            "```",
            "```json",
            '{"specdec generate --json": 1}',
            "```",
        ]
    )
    commands = documented_commands(text)
    assert [n for n, _ in commands] == [2, 6]
    assert _tokens(commands[0][1]) == ["specdec", "models", "list"]
    assert _tokens(commands[1][1]) == ["specdec", "generate", "-n", "8", "--no-chat", "two\nlines --not-an-option"]

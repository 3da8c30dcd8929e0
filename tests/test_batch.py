"""`specdec batch`: a file of requests answered by one loaded pair, with the texts `generate` and `serve`
give; results appended as they finish, so that any stop loses at most the request in progress and the
same command resumes; bad lines are their own error results with serve's messages; the output never
destroys an input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import config
from test_cli import one_line_error
from test_serve import Served

from specdec_cli.batch import requests as batch_requests
from specdec_cli.batch.results import Results, result
from specdec_cli.batch.runner import Tally, run
from specdec_cli.cli.common import model_names
from specdec_cli.errors import UsageError
from specdec_cli.serve.service import Service
from specdec_cli.session import open_session


def specdec(*args, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_DEBUG"}
    return subprocess.run([sys.executable, "-m", "specdec_cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300, **kw)  # fmt: skip


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def text_of(r: dict) -> str:
    choice = r["response"]["body"]["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def chat_line(cid: str, content: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **body}}  # fmt: skip


def completion_line(cid: str, prompt: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "gpt-4o-mini", "prompt": prompt, **body}}  # fmt: skip


def pair_args(models) -> list:
    return ["--target", models["chat"], "--draft", models["draft"], "--drafter", "model", "-k", "3", "-t", "2"]


def test_chat_completion_and_hand_written_lines_give_the_texts_of_generate_and_serve(models, tmp_path):
    lines = [
        chat_line("chat", "hello there", max_tokens=24),
        completion_line("completion", "once upon a time", max_tokens=24),
        {"custom_id": "prompt", "prompt": "hello there", "max_tokens": 24, "category": "greeting"},
        {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 24},
    ]
    requests, out = write_lines(tmp_path / "requests.jsonl", lines), tmp_path / "results.jsonl"
    r = specdec("batch", requests, "-o", out, *pair_args(models))
    assert r.returncode == 0, r.stderr
    got = {x["custom_id"]: x for x in read_results(out)}
    assert list(got) == ["chat", "completion", "prompt", "line-4"]  # in order; a line without custom_id: line-N
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in got.values())
    assert all(x["id"].startswith("batch_req_") for x in got.values())

    def generate(*args) -> dict:
        g = specdec("generate", "--json", "-n", "24", *pair_args(models), *args)
        assert g.returncode == 0, g.stderr
        return json.loads(g.stdout)

    chat, raw = generate("hello there"), generate("--no-chat", "once upon a time")
    assert text_of(got["chat"]) == text_of(got["prompt"]) == text_of(got["line-4"]) == chat["text"]
    assert text_of(got["completion"]) == raw["text"]
    body = got["chat"]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == "chat"  # the loaded model answers any name
    assert body["usage"]["completion_tokens"] == len(chat["tokens"])
    assert set(body["speculative"]) == set(chat["stats"]) - {"load_seconds", "cost_curve"}
    assert got["prompt"]["response"]["body"]["object"] == "text_completion"

    server = Served(*pair_args(models)[:-2])
    try:
        for cid, path in (("chat", "/v1/chat/completions"), ("completion", "/v1/completions")):
            status, _, served = server.post(path, lines[0 if cid == "chat" else 1]["body"])
            assert status == 200 and text_of({"response": {"body": served}}) == text_of(got[cid])
    finally:
        assert server.stop() == 0, server.stderr


def test_bad_lines_get_the_errors_serve_gives_and_the_batch_goes_on(models, tmp_path):
    bad_bodies = {
        "unknown-field": {"messages": [{"role": "user", "content": "hi"}], "temprature": 0.5},
        "out-of-range": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
        "wrong-type": {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
        "too-long": {"messages": [{"role": "user", "content": "word " * 400}]},
        "no-draft": {"messages": [{"role": "user", "content": "hi"}], "drafter": "model"},
    }
    lines = [
        "{this is not json",
        chat_line("good-1", "hi", max_tokens=4),
        *(
            {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": b}
            for cid, b in bad_bodies.items()
        ),
        {"custom_id": "embeddings", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {"custom_id": "envelope", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}, "extra": 1},
        {"custom_id": 7, "prompt": "x"},
        [1, 2],
        chat_line("good-2", "bye", max_tokens=4),
    ]
    requests, out = write_lines(tmp_path / "requests.jsonl", lines), tmp_path / "results.jsonl"
    args = ["--target", models["chat"], "-c", "256", "-t", "2"]
    r = specdec("batch", requests, "-o", out, *args)
    assert r.returncode == 3, r.stderr  # ran to its end, some failed
    assert f"error: 10 of 12 requests failed: their results in {out} carry the error" in r.stderr
    got = {x["custom_id"]: x["response"] for x in read_results(out)}
    assert len(got) == 12 and got["good-1"]["status_code"] == got["good-2"]["status_code"] == 200
    assert got["line-1"]["status_code"] == 400 and "not valid JSON" in got["line-1"]["body"]["error"]["message"]
    assert got["embeddings"]["status_code"] == 404 and got["envelope"]["body"]["error"]["param"] == "extra"
    assert got["line-10"]["body"]["error"]["param"] == "custom_id" and got["line-11"]["status_code"] == 400
    server = Served(*args[:-2])  # serve's own answers to the same bodies
    try:
        for cid, body in bad_bodies.items():
            status, _, served = server.post("/v1/chat/completions", body)
            assert (got[cid]["status_code"], got[cid]["body"]) == (status, served), cid
        assert got["too-long"]["body"]["error"]["code"] == "context_length_exceeded"
    finally:
        assert server.stop() == 0, server.stderr
    assert "line 1" in r.stderr and "temprature" in r.stderr  # the summary names the failures


def test_duplicate_custom_ids_are_refused_before_any_model_loads(tmp_path):
    requests = write_lines(tmp_path / "r.jsonl", [{"custom_id": "a", "prompt": "x"}, {"prompt": "y"},
                                                  {"custom_id": "a", "prompt": "z"}])  # fmt: skip
    r = specdec("batch", requests, "-o", tmp_path / "out.jsonl", "--target", tmp_path / "no-such-model.gguf")
    assert r.returncode == 2
    assert one_line_error(r.stderr) == f"error: {requests}:3: custom_id 'a' is used again (first on line 1)"
    assert not (tmp_path / "out.jsonl").exists()
    write_lines(requests, [{"custom_id": "line-2", "prompt": "x"}, {"prompt": "y"}])  # a given id and a default one
    assert (
        "custom_id 'line-2' is used again"
        in specdec("batch", requests, "-o", tmp_path / "o", "--target", "x.gguf").stderr
    )


def test_an_output_that_is_an_input_or_not_a_results_file_is_refused_untouched(models, tmp_path):
    requests = write_lines(tmp_path / "r.jsonl", [{"prompt": "x"}])
    notes = tmp_path / "notes.txt"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        requests: "is the same file as REQUESTS",
        models["chat"]: "is the same file as the target model",
        tmp_path: "is a directory, not a regular file",
        fifo: "is a FIFO, not a regular file",
        notes: "line 1 is not a batch result",
    }
    for text in ("my notes\n", "my notes"):  # with its newline or without: never taken for a cut result
        notes.write_text(text)
        before = {p: p.read_bytes() for p in (requests, models["chat"], notes)}
        for path, why in cases.items():
            r = specdec("batch", requests, "-o", path, "--target", models["chat"])
            assert r.returncode == 2 and why in one_line_error(r.stderr), (path, r.stderr)
        assert {p: p.read_bytes() for p in before} == before


def test_a_second_batch_on_the_same_results_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    with Results(out, "out.jsonl"):
        with pytest.raises(UsageError, match="being written by another specdec batch"):
            Results(out, "out.jsonl")
    with Results(out, "out.jsonl") as again:  # the lock goes with the first
        assert again.done == {}


def test_a_cut_last_line_is_dropped_and_a_whole_one_kept(tmp_path):
    out = tmp_path / "out.jsonl"
    whole = json.dumps(result("a", 200, {}))
    out.write_text(whole + "\n" + json.dumps(result("b", 400, {}))[:30])  # killed while writing b
    with Results(out, "out.jsonl") as results:
        assert results.done == {"a": 200} and results.dropped
    assert out.read_text() == whole + "\n"
    out.write_text(whole)  # only its newline lost
    with Results(out, "out.jsonl") as results:
        assert results.done == {"a": 200} and not results.dropped
    assert out.read_text() == whole + "\n"


def slow_batch(models, tmp_path: Path, n: int = 40) -> tuple[Path, Path, list]:
    """n requests of a few hundred tokens each on the tiny fixtures: a batch that runs for seconds."""
    requests = write_lines(tmp_path / "requests.jsonl", [completion_line(f"r{i}", f"{i} once upon a time",
                                                                        max_tokens=300) for i in range(n)])  # fmt: skip
    args = ["--target", models["target"], "--draft", models["draft"], "--drafter", "model", "-k", "3", "-t", "2",
            "-c", "512"]  # fmt: skip
    return requests, tmp_path / "results.jsonl", args


def start_batch(requests: Path, out: Path, args: list, results: int) -> subprocess.Popen:
    """A batch process, once its results file holds at least `results` lines."""
    proc = subprocess.Popen([sys.executable, "-m", "specdec_cli", "batch", requests, "-o", out, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= results:
            return proc
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"the batch never wrote {results} results: {proc.communicate()}")


def test_resume_after_sigkill_keeps_every_finished_result_once(models, tmp_path):
    requests, out, args = slow_batch(models, tmp_path)
    reference = tmp_path / "reference.jsonl"
    assert specdec("batch", requests, "-o", reference, *args).returncode == 0
    proc = start_batch(requests, out, args, results=3)
    proc.kill()  # SIGKILL: no handler runs
    proc.communicate()
    kept = read_results(out)
    assert 3 <= len(kept) < 40
    with out.open("a") as f:  # as if killed in the middle of writing the next one
        f.write(json.dumps(result("r39", 200, {}))[:25])
    r = specdec("batch", requests, "-o", out, *args)
    assert r.returncode == 0, r.stderr
    assert f"resuming: {len(kept)} of 40 requests have results" in r.stderr and "dropped a cut last line" in r.stderr
    after = read_results(out)
    assert [x["custom_id"] for x in after] == [f"r{i}" for i in range(40)]  # each once, in order
    assert after[: len(kept)] == kept  # untouched
    assert [text_of(x) for x in after] == [text_of(x) for x in read_results(reference)]
    again = specdec("batch", requests, "-o", out, *args)  # all done: nothing runs, nothing is written
    assert again.returncode == 0 and read_results(out) == after and "0 answered now, 40 earlier" in again.stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_keep_every_finished_result(models, tmp_path, sig, code):
    requests, out, args = slow_batch(models, tmp_path)
    proc = start_batch(requests, out, args, results=2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    kept = read_results(out)  # every line whole
    assert 2 <= len(kept) < 40 and [x["custom_id"] for x in kept] == [f"r{i}" for i in range(len(kept))]
    assert "interrupted" in err and "Traceback" not in err


def test_the_lookup_cache_learns_inside_the_batch(models, own_lookup_cache, frozen_costs, tmp_path):
    """The same request twice: the second drafts from the first's answer, kept in the lookup cache."""
    lines = [batch_requests.parse_line(i, json.dumps(completion_line(f"r{i}", "once upon a time", max_tokens=48)))
             for i in (1, 2)]  # fmt: skip
    cfg = config(models, None, drafter="lookup", draft_tokens=None, max_tokens=48, debug=False)
    with open_session(cfg) as session, Results(tmp_path / "out.jsonl", "out.jsonl") as results:
        service = Service(session, *model_names(cfg), 0)
        run(lines, results, service, lambda *a: None, tally := Tally(2))
    first, second = (x["response"]["body"] for x in read_results(tmp_path / "out.jsonl"))
    assert first["choices"][0]["text"] == second["choices"][0]["text"] and tally.done == 2
    assert second["speculative"]["rounds"] < first["speculative"]["rounds"]
    assert second["speculative"]["by_drafter"]["lookup"]["accepted"] > 0


def test_a_line_is_read_as_serve_reads_its_body():
    line = batch_requests.parse_line(3, json.dumps({"prompt": "hi", "category": "x"}))
    assert line.custom_id == "line-3" and line.request.template is None  # as generate reads a prompt
    assert line.request.cache_prompt is False  # an answer that does not depend on the request before it
    line = batch_requests.parse_line(4, json.dumps(chat_line("c", "hi", cache_prompt=True, stream=True)))
    assert line.request.kind == "chat" and line.request.cache_prompt is True
    for bad, message in [
        ({"prompt": "x", "messages": []}, 'needs "messages" or "prompt"'),
        ({"custom_id": "x"}, 'needs "messages" or "prompt"'),
        ({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {}}, "method must be POST"),
        ({"custom_id": "", "prompt": "x"}, "custom_id must be a non-empty string"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens must be a number"),
    ]:
        line = batch_requests.parse_line(1, json.dumps(bad))
        assert line.request is None and message in line.error.message, bad


def test_json_schema_on_the_command_line_constrains_every_request_but_its_own_response_format(models, tmp_path):
    """`specdec batch --json-schema S`: S is every request's default, as in generate; a body's own
    response_format wins ("text": unconstrained). Without the option the first request comes back
    unconstrained (another text)."""
    mood = {"type": "object", "properties": {"mood": {"enum": ["calm", "busy"]}}, "required": ["mood"]}
    answer = {"enum": ["yes", "no"]}
    own = {"type": "json_schema", "json_schema": {"name": "answer", "schema": answer}}
    lines = [
        chat_line("default", "hello there", max_tokens=40),
        chat_line("own", "hello there", max_tokens=40, response_format=own),
        chat_line("text", "hello there", max_tokens=40, response_format={"type": "text"}),  # unconstrained
    ]
    requests, out = write_lines(tmp_path / "requests.jsonl", lines), tmp_path / "results.jsonl"
    r = specdec("batch", requests, "-o", out, "--json-schema", json.dumps(mood), *pair_args(models))
    assert r.returncode == 0, r.stderr
    got = {x["custom_id"]: text_of(x) for x in read_results(out)}

    def generate(schema: dict | None) -> str:
        g = specdec("generate", "--json", "-n", "40", *pair_args(models), "hello there",
                    *(["--json-schema", json.dumps(schema)] if schema else []))  # fmt: skip
        assert g.returncode == 0, g.stderr
        return json.loads(g.stdout)["text"]

    assert got == {"default": generate(mood), "own": generate(answer), "text": generate(None)}
    assert got["default"].lstrip().startswith("{") and got["own"].lstrip().startswith('"')
    free = tmp_path / "free.jsonl"
    assert specdec("batch", requests, "-o", free, *pair_args(models)).returncode == 0
    assert text_of(read_results(free)[0]) == generate(None) != got["default"]

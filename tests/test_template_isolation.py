"""A model's chat template renders in a child process (chat/isolation.py, chat/sandbox.py): whatever it runs, in
jinja2's own Python or in one long C call, it ends at the deadline or the child's memory bound as a TemplateError,
the server's memory untouched; a stopping server ends it within 2 s; a child that died is replaced; a real template
renders as it did in-process, lone surrogates and all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_hostile_requests import control_model
from test_serve import Served
from tiny_models import CHATML

from specdec_cli.chat import Message, Template, TemplateError, Tool, ToolCall, Tools, isolation, limits

HOSTILE = {  # each ran on in-process, past the 1 s deadline or into gigabytes (measured without the child)
    "join": "{% for i in range(12) %}{% set s = ((range(100000)|list) * 100)|join(',') %}{% endfor %}",  # 15 s
    "sort": "{{ ((range(100000)|list) * 160)|sort|join|length }}",  # 30 s, 1.6 GB
    "double": "{% set s = 'x' * 2**24 %}" + "{% set s = s ~ s %}" * 7 + "{{ s|length }}",  # 5.6 s, 3 GB
    "many": "{% set ns = namespace(l=[]) %}{% set s = 'x' * 2**24 %}{% for i in range(300) %}"
    "{% set ns.l = ns.l + [s ~ i] %}{% endfor %}{{ ns.l|length }}",  # 1.2 s, 2.4 GB
}
JOINED = "{% set s = 'x' * 2**24 %}{{ ([s] * 200)|join|length }}"  # one 3.2 GB string, asked for at once
ECHO = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
QWEN25 = (  # Qwen2.5-Instruct's chat template (tools, calls and results), as its GGUF carries it
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are '
    'provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n            {{- tool_call.name }}\n'
    '            {{- \'", "arguments": \' }}\n            {{- tool_call.arguments | tojson }}\n'
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)
WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
AGENT = [
    Message("user", "Weather in Paris? \u00e9\U0001f600"),
    Message("assistant", "", (ToolCall("c1", "get_weather", '{"city": "Paris"}'),)),
    Message("tool", '{"temp": 20}', tool_call_id="c1"),
]
HI = [Message("user", "hi")]
LINUX = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads processes and memory in /proc")


def failing(source: str) -> Template:
    """A template with no built-in renderer to fall back on: its failure is the TemplateError itself."""
    return Template(source, lambda pairs: None)


def watched(seconds: float, fn, *args):
    """fn(*args) on a thread: (its result or exception, wall seconds, how much this process's RSS grew meanwhile
    at most, in MB); a failure if it runs past `seconds` (a bound's test must not hang where the bound is missing)."""
    box: list = []

    def run():
        try:
            box.append(fn(*args))
        except BaseException as e:
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    base = peak = rss_mb()
    t0 = time.monotonic()
    thread.start()
    while thread.is_alive() and time.monotonic() - t0 < seconds:
        peak = max(peak, rss_mb())
        time.sleep(0.005)
    assert box, f"still running after {seconds} s"
    return box[0], time.monotonic() - t0, peak - base


def rss_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@LINUX
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_ends_as_a_template_error_within_the_deadline_and_the_parents_memory(name):
    """Without the child: join and sort ran 15 and 30 s in jinja2's own Python (no line of the template to count),
    the doubling (`~`, unchecked) 5.6 s and 3 GB, the many 16 MB strings 2.4 GB of the server's memory."""
    isolation.prestart()
    pid = isolation.child_pid()
    got, seconds, grown = watched(5, failing(HOSTILE[name]).render, HI)
    assert isinstance(got, TemplateError), got
    assert "renders for more than 1 s" in str(got) or "MemoryError" in str(got), got
    assert seconds < 5 and grown < 200, (seconds, grown)
    assert alive(pid) == (isolation.child_pid() == pid)  # a child past its deadline is killed, not left running


@LINUX
def test_past_the_memory_bound_is_a_memory_error_and_the_child_goes_on():
    """Without the child the 3.2 GB join was made in the server's own memory."""
    assert failing(ECHO).render(HI) == "[user]hi"
    pid = isolation.child_pid()
    got, seconds, grown = watched(5, failing(JOINED).render, HI)
    assert isinstance(got, TemplateError) and "MemoryError: it takes more than the renderer's 2 GiB" in str(got), got
    assert seconds < 5 and grown < 200, (seconds, grown)
    assert failing(ECHO).render(HI) == "[user]hi" and isolation.child_pid() == pid


@LINUX
def test_a_killed_child_is_a_template_error_for_its_render_and_replaced_at_the_next():
    template = failing(ECHO)
    assert template.render(HI) == "[user]hi"
    first = isolation.child_pid()
    os.kill(first, signal.SIGKILL)  # as the kernel's OOM killer would
    while alive(first):
        time.sleep(0.01)
    assert template.render(HI) == "[user]hi"  # died while idle: replaced before the render
    second = isolation.child_pid()
    assert second not in (None, first)
    threading.Timer(0.2, os.kill, (second, signal.SIGKILL)).start()
    got, seconds, _ = watched(5, failing(HOSTILE["join"]).render, HI)
    assert isinstance(got, TemplateError) and "ended before it answered" in str(got) and seconds < 5, got
    assert template.render(HI) == "[user]hi" and isolation.child_pid() not in (None, second)


@LINUX
def test_a_stopping_server_ends_a_render_in_one_long_c_call_within_2_s():
    """Without the child the stop was looked at between the template's lines only: the sort ran its 30 s."""
    stop = threading.Event()

    def stopped():
        with limits.stopping(stop.is_set):  # (a context variable: set on the thread that renders)
            return failing(HOSTILE["sort"]).render(HI)

    isolation.prestart()
    pid = isolation.child_pid()
    threading.Timer(0.3, stop.set).start()
    got, seconds, _ = watched(5, stopped)
    assert isinstance(got, limits.Cancelled) and seconds < 0.3 + 2, (got, seconds)
    assert not alive(pid) and isolation.child_pid() is None  # killed: the next render starts a new one
    assert failing(ECHO).render(HI) == "[user]hi"


def test_qwen25s_template_with_tools_renders_as_it_did_in_process():
    text = Template(QWEN25, lambda pairs: None).render(AGENT, Tools((WEATHER,)))
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
        "signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": '
        '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris? \u00e9\U0001f600<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    )


def test_a_lone_surrogate_in_a_message_survives_the_child():
    messages = [Message("user", "a\ud800b"), Message("tool", "\udfff", tool_call_id="c\udc00")]
    assert failing(ECHO).render(messages) == "[user]a\ud800b[tool]\udfff"


@LINUX
def test_the_child_never_outlives_its_parent():
    """A parent killed mid-render (no atexit runs) leaves a child rendering a template that runs for seconds: it
    ends itself (its alarm, a request's seconds plus one); a parent that exits kills it."""
    script = (
        "import sys\nfrom specdec_cli.chat import Message, Template, isolation\n"
        "isolation.prestart()\nprint(isolation.child_pid(), flush=True)\n"
        "Template(sys.argv[1], lambda pairs: None).render([Message('user', 'hi')])\n"
    )
    for source, kill in ((HOSTILE["join"], True), (ECHO, False)):
        parent = subprocess.Popen([sys.executable, "-c", script, source], stdout=subprocess.PIPE, text=True)
        child = int(parent.stdout.readline())
        if kill:
            time.sleep(0.3)  # (mid-render)
            parent.kill()
        parent.wait(10)
        t0 = time.monotonic()
        while alive(child) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert not alive(child), f"the child ran on {time.monotonic() - t0:.1f} s after its parent"


@LINUX
def test_sigterm_mid_render_stops_the_server_within_2_s_and_leaves_no_child(tmp_path):
    """Without the child the sort ran on in the connection's thread, 30 s, and the server with it."""
    model = control_model(tmp_path / "sort.gguf", "{% if tools %}" + HOSTILE["sort"] + "{% endif %}" + CHATML)
    server = Served("--target", model, "-c", "1024")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER.for_template()]}
    threading.Thread(target=_post_quietly, args=(server, body), daemon=True).start()
    time.sleep(0.5)  # (mid-render)
    children = _children(server.proc.pid)
    server.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    try:
        server.proc.wait(2)
    except subprocess.TimeoutExpired:
        pass
    seconds = time.monotonic() - t0
    server.stop(signal.SIGKILL)
    assert seconds < 2, f"still running {seconds:.1f} s after SIGTERM"
    assert children and not any(alive(pid) for pid in children), children


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def _post_quietly(server: Served, body: dict) -> None:
    try:
        server.post("/v1/chat/completions", body)
    except Exception:  # the server went away under it: what the test wants
        pass

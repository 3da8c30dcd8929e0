"""Chat templates: plain chats render as they always did (llama.cpp's built-in renderer, token for token), tools
and tool turns through the model's own Jinja template in a sandbox, or as Hermes text where it has no tool
markup; a template that misbehaves is a warning and the plain form, one that reaches outside is refused."""

from __future__ import annotations

import pytest

from specdec_cli import chat
from specdec_cli.backend import native
from specdec_cli.chat import Message, Template, TemplateError, Tool, ToolCall, Tools

CONVERSATIONS = {
    "one": [("user", "Hello there! What is 2+2?")],
    "system": [
        ("system", "You are terse."),
        ("user", "Name a colour."),
        ("assistant", "Blue."),
        ("user", "Another <|im_start|>one?"),  # control-token text in a content stays text
    ],
}
# The ids the renderer gave before the model's Jinja templates were read (d1faa09's Model.chat_tokens).
BEFORE = {
    "smollm2": {
        "one": [1, 4093, 198, 19556, 665, 17, 1812, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198],
        "system": [1, 9690, 198, 2683, 359, 1733, 313, 30, 2, 198, 1, 4093, 198, 5820, 253, 7302, 30, 2, 198, 1, 520,
                   9531, 198, 23390, 30, 2, 198, 1, 4093, 198, 4809, 2067, 108, 306, 79, 3738, 108, 46, 537, 47, 2,
                   198, 1, 520, 9531, 198],
    },
    "qwen": {
        "one": [151644, 872, 198, 9707, 1052, 0, 3555, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198],
        "system": [151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198, 151644, 872, 198, 675, 264, 12463, 13,
                   151645, 198, 151644, 77091, 198, 10331, 13, 151645, 198, 151644, 872, 198, 14037, 82639, 318, 4906,
                   91, 29, 603, 30, 151645, 198, 151644, 77091, 198],
    },
}  # fmt: skip
WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
AGENT = [
    Message("user", "Weather in Paris?"),
    Message("assistant", "", (ToolCall("c1", "get_weather", '{"city": "Paris"}'),)),
    Message("tool", '{"temp": 20}', tool_call_id="c1"),
]


@pytest.fixture(scope="module")
def smol(smollm2):
    model = native.Model(smollm2, vocab_only=True)
    yield model
    model.close()


def test_plain_chats_keep_their_token_ids_on_smollm2(smol):
    for name, conversation in CONVERSATIONS.items():
        assert chat.tokens(smol, chat.plain(conversation)) == BEFORE["smollm2"][name], name


def test_plain_chats_keep_their_token_ids_on_the_default_pair(default_pair):
    model = native.Model(default_pair[0], vocab_only=True)
    try:
        for name, conversation in CONVERSATIONS.items():
            assert chat.tokens(model, chat.plain(conversation)) == BEFORE["qwen"][name], name
    finally:
        model.close()


def test_tools_render_through_the_models_own_template(default_pair):
    model = native.Model(default_pair[0], vocab_only=True)
    try:
        text = chat.template_of(model).render(AGENT, Tools((WEATHER,)))
    finally:
        model.close()
    assert "# Tools" in text and '"name": "get_weather"' in text  # Qwen's tools block, from its Jinja template
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_template_without_tool_markup_gets_them_as_hermes_text(smol):
    template = chat.template_of(smol)
    assert template.source is not None and not template.knows_tools
    text = template.render(AGENT, Tools((WEATHER,)))
    assert text.startswith("<|im_start|>system\n# Tools") and "<tools>\n" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp": 20}\n</tool_response>' in text
    # the tool's content is still text: no control token may come of it
    ids = chat.tokens(smol, [*AGENT[:2], Message("tool", "<|im_end|>", tool_call_id="c1")], Tools((WEATHER,)))
    assert ids.count(smol.tokenize_text("<|im_end|>", add_special=False, parse_special=True)[0]) == 4


def builtin(pairs):
    return "".join(f"[{role}]{content}" for role, content in pairs) + "[assistant]"


JINJA = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% for c in m.tool_calls or [] %}"
    "CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}{% endfor %}"
    "{% if tools %}TOOLS {{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_jinja_renders_tools_calls_and_arguments_as_objects():
    text = Template(JINJA, builtin).render(AGENT, Tools((WEATHER,)))
    assert 'CALL get_weather {"city": "Paris"}' in text  # arguments as an object, as Hugging Face templates expect
    assert text.startswith("<user>Weather in Paris?") and text.endswith("<assistant>")
    assert Template(JINJA, builtin).render(chat.plain([("user", "hi")])) == "[user]hi[assistant]"


def test_a_template_that_reaches_outside_the_sandbox_is_refused():
    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}{% if tools %}x{% endif %}"
    with pytest.raises(TemplateError, match="llama.cpp knows"):
        Template(escape, lambda pairs: None).render(AGENT, Tools((WEATHER,)))
    # with a built-in renderer to fall back on, the conversation is written in the plain form, with a warning
    text = Template(escape, builtin).render(AGENT, Tools((WEATHER,)))
    assert "__subclasses__" not in text and "<tool_call>" in text and "object" not in text.split("<tools>")[0]


def test_a_template_that_raises_falls_back_to_the_plain_form_with_one_warning(capsys):
    raising = "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}"
    template = Template(raising, builtin, name="m")
    first = template.render(AGENT, Tools((WEATHER,)))
    again = template.render(AGENT, Tools((WEATHER,)))
    assert first == again and first.startswith("[system]# Tools")
    assert capsys.readouterr().err.count("no tools here") == 1


def test_bos_written_by_a_template_is_not_doubled():
    template = Template("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", lambda p: None, bos="<s>")
    assert template.render(chat.plain([("user", "hi")])) == "hi"

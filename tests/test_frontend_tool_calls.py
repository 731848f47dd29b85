"""Parsing Qwen3.5 XML tool calls, including malformed output, and the streaming hold-back."""

import json
import random

import pytest

from inferno.frontend.chat_template import ChatTemplate
from inferno.frontend.tool_calls import ToolCall, ToolCallStream, parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "temp": {"type": "number"},
                    "opts": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "note": {"type": ["string", "null"]},
                    "level": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                },
            },
        },
    },
    {"name": "search", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
]


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_well_formed_calls_are_typed_by_schema():
    text = "Let me check.\n\n" + call(
        "get_weather",
        city="Paris",
        days="3",
        metric="True",
        temp="-2.5",
        opts='{"a": [1, 2]}',
        tags="['x', 'y']",
        note="null",
        level="7",
    ) + "\n" + call("search", q="42")
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "Let me check."
    assert calls == [
        ToolCall(
            "get_weather",
            {
                "city": "Paris",
                "days": 3,
                "metric": True,
                "temp": -2.5,
                "opts": {"a": [1, 2]},
                "tags": ["x", "y"],
                "note": None,
                "level": 7,
            },
        ),
        ToolCall("search", {"q": "42"}),  # a string parameter stays a string
    ]
    assert json.loads(calls[0].arguments_json())["opts"] == {"a": [1, 2]}


def test_multiline_values_keep_inner_newlines():
    code = "def f():\n    return 1\n"
    _, calls = parse_tool_calls(call("search", q=code), TOOLS)
    assert calls[0].arguments == {"q": code}


def test_without_tools_any_name_is_accepted_and_values_stay_strings():
    content, calls = parse_tool_calls(call("anything", n="5"))
    assert content == "" and calls == [ToolCall("anything", {"n": "5"})]


def test_roundtrip_through_the_chat_template():
    """What the template writes for an assistant tool call parses back to the same call."""
    arguments = {"city": "Oslo", "days": 2, "opts": {"unit": "C"}, "tags": ["a"], "metric": False}
    prompt = ChatTemplate.builtin().render(
        [
            {"role": "user", "content": "?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": arguments}}],
            },
        ],
        add_generation_prompt=False,
    )
    reply = prompt.split("</think>\n\n")[-1].removesuffix("<|im_end|>\n")
    assert parse_tool_calls(reply, TOOLS) == ("", [ToolCall("get_weather", arguments)])


# Malformed output: (text, expected content or SAME for the whole text, expected calls).
SAME = None
OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
MALFORMED = [
    # unknown function: left as text
    (call("launch_missiles", n="1"), SAME, []),
    # unterminated call (output cut off): the parameters so far
    (OPEN + "<function=get_weather>\n<parameter=city>\nParis", "", [ToolCall("get_weather", {"city": "Paris"})]),
    # missing </parameter> and </function>, but </tool_call> present
    (OPEN + "<function=search>\n<parameter=q>\nabc" + CLOSE, "", [ToolCall("search", {"q": "abc"})]),
    # a doubled opening tag
    (OPEN + call("search", q="x"), "", [ToolCall("search", {"q": "x"})]),
    # garbage inside the call
    ("hi <tool_call> blah </tool_call> end", SAME, []),
    # a bare <function=...> block without the <tool_call> wrapper
    ("<function=search>\n<parameter=q>\nbare\n</parameter>\n</function>", "", [ToolCall("search", {"q": "bare"})]),
    # only an opening tag
    ("<tool_call>", SAME, []),
    # values that do not fit their schema stay strings
    (
        call("get_weather", days="many", metric="maybe", opts="{broken"),
        "",
        [ToolCall("get_weather", {"days": "many", "metric": "maybe", "opts": "{broken"})],
    ),
    # empty function name
    (OPEN + "<function=>\n</function>" + CLOSE, SAME, []),
    # text after the call is kept as content
    (call("search", q="1") + "\nDone.", "Done.", [ToolCall("search", {"q": "1"})]),
    # the older JSON form inside <tool_call>
    (OPEN + '{"name": "search", "arguments": {"q": "json"}}' + CLOSE, "", [ToolCall("search", {"q": "json"})]),
    # JSON that is not a call
    ("<tool_call>[1, 2]</tool_call>", SAME, []),
    # one good call and one broken call: the broken one stays text
    (
        call("search", q="ok") + "\n" + OPEN + "nonsense" + CLOSE,
        OPEN + "nonsense" + CLOSE,
        [ToolCall("search", {"q": "ok"})],
    ),
    # stray closing tags only
    ("</parameter></function></tool_call>", SAME, []),
    # parameter tag without a name
    (OPEN + "<function=search>\n<parameter=>\nx\n</parameter>\n</function>" + CLOSE, SAME, []),
    # text between <tool_call> and <function=...>
    (OPEN + "sure!\n<function=search>\n</function>" + CLOSE, SAME, []),
    # no calls at all
    ("plain answer", SAME, []),
    # a call with no parameters
    (OPEN + "<function=search>\n</function>" + CLOSE, "", [ToolCall("search", {})]),
]


@pytest.mark.parametrize("text, content, calls", MALFORMED)
def test_malformed_output(text, content, calls):
    assert parse_tool_calls(text, TOOLS) == (text if content is SAME else content, calls)


def test_random_garbage_never_raises():
    rng = random.Random(0)
    atoms = ["<tool_call>", "</tool_call>", "<function=", "search>", "</function>", "<parameter="]
    atoms += ["q>", "</parameter>", "\n", "x", "{", "}", "<", ">", "get_weather>", "days>", "3"]
    for _ in range(500):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 30)))
        content, calls = parse_tool_calls(text, TOOLS)
        assert isinstance(content, str) and all(isinstance(c, ToolCall) for c in calls)
        if not calls:
            assert content == text


def _stream(text: str, cuts: list[int], tools=TOOLS) -> tuple[str, str, list[ToolCall]]:
    s = ToolCallStream(tools)
    shown, last = "", 0
    for cut in [*cuts, len(text)]:
        shown += s.push(text[last:cut])
        last = cut
    rest, calls = s.finish()
    return shown, rest, calls


def test_stream_holds_back_from_the_first_tag():
    text = "Checking the weather.\n\n" + call("get_weather", city="Rome")
    shown, rest, calls = _stream(text, list(range(1, len(text))))
    assert shown == "Checking the weather." and rest == ""
    assert calls == [ToolCall("get_weather", {"city": "Rome"})]
    assert "<" not in shown


def test_stream_partial_tag_is_released_when_not_a_call():
    s = ToolCallStream(TOOLS)
    assert s.push("a <tool") == "a"
    assert not s.started
    assert s.push("box> b") == " <toolbox> b"
    assert s.finish() == ("", [])


def test_stream_without_a_call_shows_everything():
    text = "No tools needed.\n\nJust text <b>bold</b>.\n"
    for cuts in ([], list(range(1, len(text))), [3, 10, 20]):
        shown, rest, calls = _stream(text, cuts)
        assert shown + rest == text and calls == []


def test_stream_false_alarm_returns_the_held_text():
    shown, rest, calls = _stream("Say <tool_call> literally.", [6, 9, 15])
    assert calls == [] and shown + rest == "Say <tool_call> literally."

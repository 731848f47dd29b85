"""Inferno's Qwen3.5 chat template and the ChatTemplate renderer."""

import json
import re

import pytest

from inferno.errors import InfernoError
from inferno.frontend.chat_template import ChatTemplate, ChatTemplateError, builtin_template_source
from inferno.frontend.tokenizer import Tokenizer
from inferno.frontend.tokenizer_build import build_tiny_tokenizer, build_tokenizer_config

TOOLS_HEADER = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>"
)
TOOLS_INSTRUCTIONS = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <now> & 'soon' in a city — météo",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def tpl() -> ChatTemplate:
    return ChatTemplate.builtin()


def test_single_user_thinking_on(tpl):
    out = tpl.render([{"role": "user", "content": "Hi"}])
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_thinking_off_and_system(tpl):
    out = tpl.render(
        [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi\n"}],
        enable_thinking=False,
    )
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_no_generation_prompt(tpl):
    out = tpl.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert out == "<|im_start|>user\nHi<|im_end|>\n"


MULTI_TURN = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nA1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "A2", "reasoning_content": "\nnew thoughts\n"},
]


def test_reasoning_dropped_before_last_query(tpl):
    out = tpl.render(MULTI_TURN, add_generation_prompt=False)
    assert out == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\nA2<|im_end|>\n"
    )


def test_preserve_thinking_keeps_all_reasoning(tpl):
    out = tpl.render(MULTI_TURN, add_generation_prompt=False, preserve_thinking=True)
    assert out == (
        "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nold thoughts\n</think>\n\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\nA2<|im_end|>\n"
    )


def test_assistant_after_last_query_without_reasoning_gets_empty_think(tpl):
    out = tpl.render(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
        add_generation_prompt=False,
    )
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n")


def test_tools_tool_calls_and_merged_tool_responses(tpl):
    messages = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "days": 2}',
                    },
                },
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome", "x": {"a": [1, "é"]}}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "content": [{"type": "text", "text": "rain"}]},
    ]
    out = tpl.render(messages, tools=[WEATHER])
    tool_json = json.dumps(WEATHER, ensure_ascii=False)
    assert "<now> & 'soon'" in tool_json and "météo" in tool_json
    assert out == (
        TOOLS_HEADER + "\n" + tool_json + TOOLS_INSTRUCTIONS
        + "\n\nYou are a weather bot.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\nLet me check.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        '<parameter=x>\n{"a": [1, "é"]}\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_tools_without_system_and_call_without_content(tpl):
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "content": "done"},
        {"role": "user", "content": "<tool_response>\nlate\n</tool_response>"},
    ]
    out = tpl.render(messages, tools=[WEATHER], enable_thinking=False)
    assert out.startswith(TOOLS_HEADER)
    assert TOOLS_INSTRUCTIONS + "<|im_end|>\n<|im_start|>user\nGo<|im_end|>\n" in out
    # The assistant turn comes after the last real query (tool-response turns don't count).
    assert (
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=f>\n"
        "</function>\n</tool_call><|im_end|>\n" in out
    )
    assert out.endswith(
        "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nlate\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_images_and_videos(tpl):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "Compare "},
                {"type": "image", "image": "a.png"},
                {"type": "text", "text": " with "},
                {"type": "video", "video": "b.mp4"},
            ],
        }
    ]
    vis = "<|vision_start|><|image_pad|><|vision_end|>"
    vid = "<|vision_start|><|video_pad|><|vision_end|>"
    out = tpl.render(messages, add_generation_prompt=False)
    assert out == f"<|im_start|>user\n{vis}Compare {vis} with {vid}<|im_end|>\n"
    numbered = tpl.render(messages, add_generation_prompt=False, add_vision_id=True)
    assert numbered == (
        f"<|im_start|>user\nPicture 1: {vis}Compare Picture 2: {vis} with "
        f"Video 1: {vid}<|im_end|>\n"
    )


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "No messages"),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "beginning"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], 'role "robot"'),
        ([{"role": "system", "content": "only"}], "No user query"),
        (
            [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "a"}],
            "cannot contain images",
        ),
        ([{"role": "user", "content": [{"type": "audio"}]}], 'type "audio"'),
        ([{"role": "user", "content": 42}], "string or a list"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]},
            ],
            "not a JSON object",
        ),
        ([{"content": "no role"}], "role"),
        ("not a list", "list"),
    ],
)
def test_refused_conversations(tpl, messages, match):
    with pytest.raises(ChatTemplateError, match=match) as info:
        tpl.render(messages)
    assert isinstance(info.value, InfernoError)
    assert "\n" not in str(info.value)


def test_tools_must_be_a_list(tpl):
    with pytest.raises(ChatTemplateError, match="tools must be a list"):
        tpl.render([{"role": "user", "content": "x"}], tools={"name": "f"})


def test_template_syntax_error_is_reported():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% if %}")


def test_sandbox_blocks_unsafe_attribute_access():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        t.render([{"role": "user", "content": "x"}])


def test_tojson_matches_hf_and_loop_controls_work():
    t = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m | tojson }}{% endfor %}|{{ tools | tojson(indent=1) }}"
    )
    messages = [{"role": "user", "content": "<é>"}, {"role": "user", "content": "x"}]
    out = t.render(messages, tools=[{"b": 1, "a": 2}])
    assert out == '{"role": "user", "content": "<é>"}|[\n {\n  "b": 1,\n  "a": 2\n }\n]'


def test_from_resources_prefers_checkpoint_template():
    assert ChatTemplate.from_resources({}).source == builtin_template_source()
    cfg = json.dumps({"chat_template": "CFG"}).encode()
    assert ChatTemplate.from_resources({"tokenizer_config.json": cfg}).source == "CFG"
    named = json.dumps({"chat_template": [{"name": "default", "template": "NAMED"}]}).encode()
    assert ChatTemplate.from_resources({"tokenizer_config.json": named}).source == "NAMED"
    both = {"tokenizer_config.json": cfg, "chat_template.jinja": b"FILE"}
    assert ChatTemplate.from_resources(both).source == "FILE"


def test_rendered_prompt_token_count():
    tok = Tokenizer.from_resources(
        {
            "tokenizer.json": build_tiny_tokenizer(1024).encode(),
            "tokenizer_config.json": json.dumps(build_tokenizer_config(1024)).encode(),
        }
    )
    prompt = ChatTemplate.builtin().render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
        enable_thinking=False,
    )
    ids = tok.encode(prompt)
    assert tok.count(prompt) == len(ids)
    # Added tokens are single ids; the text between them is encoded on its own.
    expected = []
    for piece in re.split(r"(<\|im_start\|>|<\|im_end\|>|</?think>)", prompt):
        if piece:
            special = tok.token_to_id(piece) if piece.startswith("<") else None
            expected += [special] if special is not None else tok.encode(piece)
    assert ids == expected
    assert ids.count(tok.im_start_id) == 3 and ids.count(tok.im_end_id) == 2
    assert ids.count(tok.think_id) == 1 and ids.count(tok.think_end_id) == 1
    assert tok.decode(ids) == prompt

"""TextPipeline over a scripted toy executor with the tiny Qwen-layout tokenizer."""

import threading

import pytest

from fake_executor import FakeConfig, FakeExecutor
from inferno.engine import ContextLengthError, Engine, SamplingParams
from inferno.errors import NotBuiltError
from inferno.frontend.chat_template import ChatTemplate
from inferno.frontend.pipeline import Completion, TextDelta, TextPipeline, collect
from inferno.frontend.tokenizer import Tokenizer
from inferno.frontend.tokenizer_build import build_tiny_tokenizer, build_tokenizer_config

VOCAB = 2048
USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(build_tiny_tokenizer(VOCAB), build_tokenizer_config(VOCAB))


@pytest.fixture
def make(tok):
    engines = []

    def make(script_text, identity=None, executor_kw=None, **engine_kw):
        script = tok.encode(script_text)
        config = FakeConfig(vocab=VOCAB, eos_token_ids=(tok.endoftext_id,))
        ex = FakeExecutor(config, script=script, **(executor_kw or {}))
        engine = Engine(ex, **engine_kw)
        engines.append(engine)
        pipe = TextPipeline(engine, tok, ChatTemplate.builtin(), identity=identity, greedy=True)
        return pipe, ex, script

    yield make
    for e in engines:
        e.close()


def split(events):
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert isinstance(events[-1], Completion) and sum(isinstance(e, Completion) for e in events) == 1
    return deltas, events[-1]


def joined(deltas, channel):
    return "".join(d.text for d in deltas if d.channel == channel)


def test_thinking_reply_splits_reasoning_and_content(make, tok):
    pipe, ex, script = make("Let me think.\n</think>\n\nHello world!<|im_end|>")
    deltas, done = split(list(pipe.chat(USER, max_new_tokens=64)))
    assert joined(deltas, "reasoning") == done.reasoning == "Let me think."
    assert joined(deltas, "content") == done.content == "Hello world!"
    channels = [d.channel for d in deltas]
    assert channels == sorted(channels, key=lambda c: c == "content")  # reasoning first
    assert done.finish_reason == "stop" and done.tool_calls == []
    prompt = pipe.render(USER)
    assert done.usage.prompt_tokens == len(tok.encode(prompt))
    assert done.usage.completion_tokens == len(script)
    assert done.usage.reasoning_tokens == script.index(tok.think_end_id) + 1
    assert done.usage.total_tokens == done.usage.prompt_tokens + len(script)
    assert done.stats.completion_tokens == len(script)
    assert ex.all_released()


def test_chat_takes_an_already_rendered_prompt_as_is(make, tok, monkeypatch):
    pipe, ex, _ = make("Let me think.\n</think>\n\nHi!<|im_end|>")
    prompt = pipe.chat_prompt(USER)
    assert prompt.text == pipe.render(USER) and prompt.ids == tok.encode(prompt.text)
    monkeypatch.setattr(pipe.template, "render", lambda *a, **k: pytest.fail("the prompt was rendered again"))
    stream = pipe.chat(USER, max_new_tokens=64, prompt=prompt)
    assert stream.prompt_ids == prompt.ids
    assert stream.started.wait(5)
    done = collect(stream)
    assert (done.reasoning, done.content) == ("Let me think.", "Hi!")  # reasoning state from prompt.text
    state = ex.states[-1]
    assert state.tokens[: state.n_prompt] == prompt.ids


def test_non_thinking_reply_is_all_content(make):
    pipe, _, _ = make("Hello there.<|im_end|>")
    done = collect(pipe.chat(USER, max_new_tokens=64, thinking=False))
    assert (done.reasoning, done.content) == ("", "Hello there.")
    assert done.usage.reasoning_tokens == 0


def test_stop_string_truncates_and_cancels(make, tok):
    pipe, ex, script = make("abc STOP def ghi jkl<|im_end|>")
    events = list(pipe.chat(USER, max_new_tokens=64, thinking=False, stop=["STOP"]))
    deltas, done = split(events)
    assert done.content == joined(deltas, "content") == "abc "
    assert (done.finish_reason, done.stop_string) == ("stop", "STOP")
    assert done.usage.completion_tokens < len(script)
    assert ex.all_released()


def test_stop_string_across_tokens_is_never_shown(make):
    pipe, _, _ = make("Hello world and more<|im_end|>")
    deltas, done = split(list(pipe.chat(USER, max_new_tokens=64, thinking=False, stop=["xyz", "lo wor"])))
    assert done.content == "Hel"
    assert all("lo" not in d.text for d in deltas)


def test_partial_stop_string_is_released_at_the_end(make):
    pipe, _, _ = make("Hello world!<|im_end|>")
    done = collect(pipe.chat(USER, max_new_tokens=64, thinking=False, stop=["world!!"]))
    assert (done.content, done.finish_reason, done.stop_string) == ("Hello world!", "stop", None)


def test_stop_strings_do_not_apply_to_reasoning(make):
    pipe, _, _ = make("STOP here\n</think>\n\nanswer STOP tail<|im_end|>")
    done = collect(pipe.chat(USER, max_new_tokens=64, stop=["STOP"]))
    assert done.reasoning == "STOP here"
    assert done.content == "answer "


def test_length_limit(make):
    pipe, _, script = make("one two three four five six<|im_end|>")
    done = collect(pipe.chat(USER, max_new_tokens=3, thinking=False))
    assert done.finish_reason == "length" and done.usage.completion_tokens == 3


def test_tool_call_is_held_back_and_parsed(make):
    text = (
        "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    pipe, _, _ = make(text)
    deltas, done = split(list(pipe.chat(USER, max_new_tokens=128, tools=[WEATHER], thinking=False)))
    assert joined(deltas, "content") == done.content == "I'll check."
    assert done.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]


def test_tool_markup_without_tools_stays_text(make):
    text = "<tool_call>\n<function=get_weather>\n</function>\n</tool_call><|im_end|>"
    pipe, _, _ = make(text)
    done = collect(pipe.chat(USER, max_new_tokens=128, thinking=False))
    assert done.finish_reason == "stop" and done.tool_calls == []
    assert "<function=get_weather>" in done.content


def test_raw_prompt_has_no_template_and_no_split(make, tok):
    pipe, ex, script = make("x\n</think>\n\ny")
    done = collect(pipe.complete("Once upon a time", max_new_tokens=64))
    assert done.content == "x\n</think>\n\ny" and done.reasoning == ""
    assert done.finish_reason == "stop"  # the config EOS after the script
    assert done.usage.prompt_tokens == len(tok.encode("Once upon a time"))
    assert done.usage.completion_tokens == len(script) + 1
    assert ex.states[0].tokens[: done.usage.prompt_tokens] == tok.encode("Once upon a time")


def test_raw_prompt_ids_with_reasoning_split(make, tok):
    pipe, _, _ = make("x\n</think>\n\ny")
    ids = tok.encode("<|im_start|>assistant\n<think>\n")
    done = collect(pipe.complete(ids, max_new_tokens=64, split_reasoning=True))
    assert (done.reasoning, done.content) == ("x", "y")


def test_multibyte_text_round_trips(make):
    pipe, _, _ = make("héllo wörld 😀 日本<|im_end|>")
    deltas, done = split(list(pipe.chat(USER, max_new_tokens=128, thinking=False)))
    assert done.content == "héllo wörld 😀 日本"
    assert all("\ufffd" not in d.text for d in deltas)


def test_errors_raise_at_the_call(make):
    pipe, ex, _ = make("x", max_context=32)
    with pytest.raises(ContextLengthError):
        pipe.chat(USER, max_new_tokens=30)
    assert ex.states == []


def test_media_input_is_refused_until_vision_exists(make):
    pipe, ex, _ = make("x")
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(NotBuiltError, match="image_url input is not built yet"):
        pipe.chat(msg, max_new_tokens=4)
    with pytest.raises(NotBuiltError, match="image_url input is not built yet"):
        pipe.chat_prompt(msg)
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert collect(pipe.chat(text_parts, max_new_tokens=4, thinking=False)).content == "x"
    assert len(ex.states) == 1


def test_cancel_event_and_close(make):
    gate = threading.Event()  # holds the executor's first step until the cancel is set
    pipe, ex, _ = make("a b c d e f g h i j k l m n o p<|im_end|>", executor_kw={"gate": gate})
    cancel = threading.Event()
    stream = pipe.chat(USER, max_new_tokens=64, thinking=False, cancel=cancel)
    first = next(stream)
    assert isinstance(first, TextDelta)
    cancel.set()
    gate.set()
    done = collect(stream)
    assert done.finish_reason == "cancelled"
    assert done.usage.completion_tokens == 1
    stream2 = pipe.chat(USER, max_new_tokens=64, thinking=False)
    next(stream2)
    stream2.close()
    with pytest.raises(StopIteration):
        next(stream2)
    pipe.engine.close()
    assert ex.all_released()


def test_sampling_resolution_layers(make):
    pipe, _, _ = make("x", identity="qwen3.6-35b-a3b/groupwise-int")
    pipe.greedy = False
    think = pipe.sampling(True)
    assert (think.temperature, think.top_p, think.top_k, think.presence_penalty) == (1.0, 0.95, 20, 1.5)
    plain = pipe.sampling(False, {"top_p": 0.5, "top_k": None})
    assert (plain.temperature, plain.top_p, plain.top_k, plain.presence_penalty) == (0.7, 0.5, 20, 1.5)
    pipe.sampling_defaults = {"temperature": 0.3}
    assert pipe.sampling(True).temperature == 0.3
    assert pipe.sampling(True, {"temperature": 0.9}).temperature == 0.9
    pipe.greedy = True
    assert pipe.sampling(True, {"temperature": 0.9}).temperature == 0.0
    explicit = SamplingParams(temperature=0.1)
    assert pipe.sampling(True, explicit) is explicit


def test_count_tokens_matches_prompt(make, tok):
    pipe, _, _ = make("x")
    assert pipe.count_tokens(USER, thinking=False) == len(tok.encode(pipe.render(USER, thinking=False)))

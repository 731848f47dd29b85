"""Reasoning / content split of model output, one-shot and streamed in every chunking."""

import random

import pytest

from inferno.frontend.reasoning import ReasoningSplitter, partial_suffix_len, split_reasoning

# (output text, prompt opened the think block, expected reasoning, expected content)
CASES = [
    # well-formed thinking-on output
    ("Let me add.\n</think>\n\nThe answer is 4.", True, "Let me add.", "The answer is 4."),
    # the model re-opens <think> although the prompt did
    ("<think>\nhm\n</think>\n\nX", True, "hm", "X"),
    # thinking off, the model thinks anyway at the start
    ("<think>\nhm\n</think>\n\nX", False, "hm", "X"),
    # thinking off, plain answer
    ("Hello there.", False, "", "Hello there."),
    # thinking on, cut off before </think> (length limit): all reasoning
    ("Still thinking...\n\n", True, "Still thinking...", ""),
    # empty reasoning
    ("\n\n</think>\n\nA", True, "", "A"),
    # nothing after </think>
    ("abc</think>", True, "abc", ""),
    # a partial closing tag at the very end stays reasoning text
    ("abc</thi", True, "abc</thi", ""),
    # leading whitespace before <think> with thinking off
    ("  <think>x</think>y", False, "x", "y"),
    # thinking off, output is only the start of a tag
    ("<thin", False, "", "<thin"),
    # thinking off, unterminated think block
    ("<think>unterminated\n\n", False, "unterminated", ""),
    # a second </think> belongs to the content
    ("a</think>b</think>c", True, "a", "b</think>c"),
    # content that merely mentions <think> later is content
    ("Use the <think> tag.", False, "", "Use the <think> tag."),
    # reasoning with inner blank lines and a tag-like string
    ("step 1\n\nstep 2 </th> no tag\n</think>\n\nok", True, "step 1\n\nstep 2 </th> no tag", "ok"),
    # thinking off, leading newlines before content are kept
    ("\n\nHello", False, "", "\n\nHello"),
    # empty output
    ("", True, "", ""),
    ("", False, "", ""),
    # only newlines after </think>
    ("r</think>\n\n\n", True, "r", ""),
    # multibyte text around the tags
    ("思考中😀\n</think>\n\n答案", True, "思考中😀", "答案"),
    # content keeps its trailing newline
    ("r</think>\n\nline\n", True, "r", "line\n"),
]


@pytest.mark.parametrize("text, in_reasoning, reasoning, content", CASES)
def test_split_one_shot(text, in_reasoning, reasoning, content):
    assert split_reasoning(text, in_reasoning) == (reasoning, content)


def _stream(text: str, in_reasoning: bool, cuts: list[int]) -> tuple[str, str]:
    splitter = ReasoningSplitter(in_reasoning)
    reasoning, content = "", ""
    last = 0
    for cut in [*cuts, len(text)]:
        r, c = splitter.push(text[last:cut])
        reasoning, content, last = reasoning + r, content + c, cut
    r, c = splitter.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("text, in_reasoning, reasoning, content", CASES)
def test_split_streamed_char_by_char_and_random_chunks(text, in_reasoning, reasoning, content):
    assert _stream(text, in_reasoning, list(range(1, len(text)))) == (reasoning, content)
    rng = random.Random(len(text))
    for _ in range(20):
        n_cuts = min(max(len(text) - 1, 0), rng.randint(0, 5))
        cuts = sorted(rng.sample(range(1, len(text)), n_cuts)) if n_cuts else []
        assert _stream(text, in_reasoning, cuts) == (reasoning, content)


def test_streaming_releases_text_early_and_holds_tag_prefixes():
    s = ReasoningSplitter(in_reasoning=True)
    assert s.in_reasoning
    assert s.push("Thinking about it") == ("Thinking about it", "")
    assert s.push("\n</th") == ("", "")  # could be the closing tag: held
    assert s.push("ink>") == ("", "")
    assert not s.in_reasoning and s.saw_reasoning
    assert s.push("\n\n") == ("", "")  # newlines after the tag are dropped
    assert s.push("Answer") == ("", "Answer")
    assert s.push(" more\n") == ("", " more\n")
    assert s.finish() == ("", "")


def test_held_partial_tag_is_released_when_it_is_not_a_tag():
    s = ReasoningSplitter(in_reasoning=True)
    assert s.push("a </") == ("a ", "")
    assert s.push("b>") == ("</b>", "")


def test_thinking_off_waits_only_while_a_think_tag_is_possible():
    s = ReasoningSplitter(in_reasoning=False)
    assert s.push("<") == ("", "")
    assert s.push("b>bold") == ("", "<b>bold")
    assert not s.saw_reasoning


def test_partial_suffix_len():
    assert partial_suffix_len("abc</thi", ("</think>",)) == 5
    assert partial_suffix_len("abc<", ("</think>", "<tool_call>")) == 1
    assert partial_suffix_len("abc", ("</think>",)) == 0
    assert partial_suffix_len("</think>", ("</think>",)) == 0  # a whole tag is not partial

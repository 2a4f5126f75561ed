"""examples/embed's input rules: they need neither the model nor the ``embed`` extra."""

from __future__ import annotations

from typing import Any

import pytest

from examples.embed.model import text_of


@pytest.mark.parametrize("body", ["A man is eating food.", {"text": "A man is eating food."}])
def test_a_sentence_is_a_string_or_an_object_with_text(body: Any) -> None:
    assert text_of(body) == "A man is eating food."


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (7, "got int"),
        (None, "got null"),
        (["a", "b"], "one sentence per request"),
        ({"texts": "a"}, "got an object with keys ['texts']"),
        ({"text": 3}, '"text" must be a string, got int'),
        ("   ", "the sentence is empty"),
    ],
)
def test_bad_bodies_are_refused_before_the_model_runs(body: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        text_of(body)
    assert message in str(info.value)

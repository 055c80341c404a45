"""The scaling rule behind `ctl scale`, the API and the console's Scale form (pure)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llmgw.catalog.model import Scaling
from llmgw.cli import main
from llmgw.errors import DefinitionError
from llmgw.modelsvc import rescaled


def test_a_new_min_keeps_the_max_that_was_set() -> None:
    """1..4 asked for min 2 is 2..4; asked for min 0, 0..4 (on demand, up to 4)."""
    assert rescaled("m", Scaling(min=1, max=4), 2, None) == Scaling(min=2, max=4)
    assert rescaled("m", Scaling(min=1, max=4), 0, None) == Scaling(min=0, max=4)


def test_a_max_never_set_follows_the_min() -> None:
    """A model run at a fixed count stays fixed at the new one."""
    assert rescaled("m", Scaling(min=1), 3, None) == Scaling(min=3)


def test_a_given_max_is_taken() -> None:
    assert rescaled("m", Scaling(min=1, max=4), 2, 8) == Scaling(min=2, max=8)


@pytest.mark.parametrize(("current", "min_", "max_", "field", "words"), [
    (Scaling(min=1, max=4), 6, None, "min", "min 6 is above its max 4 in force"),
    (Scaling(min=1, max=4), 6, 5, "max", "max 5 is below min 6"),
])
def test_a_min_above_the_max_is_refused_with_both_numbers(
        current: Scaling, min_: int, max_: int | None, field: str, words: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        rescaled("trial", current, min_, max_)
    assert words in caught.value.message
    assert caught.value.field == field


def test_the_scale_help_says_what_min_and_max_do() -> None:
    """The help no longer claims nothing scales a model up under load."""
    result = CliRunner().invoke(main, ["ctl", "scale", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "nothing scales it up" not in text
    assert "gateway's scaler may run under load" in text
    assert "the max in force is kept" in text

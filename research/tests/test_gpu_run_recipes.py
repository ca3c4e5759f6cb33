"""research/ocria_tiny/studies/gpu_run.sh's recipes: each one's curriculum and settings load as a training config and give the
page settings of its stages, so a typo fails here and not on the rented GPU; a misspelt or missing stage key fails
when the config loads."""
import re

import pytest

from conftest import ROOT, TRAIN_CONFIG

from research.ocria_tiny.train_config import curriculum_stage, load_config, mixed_in, synth_config

SCRIPT = (ROOT / "research" / "ocria_tiny" / "studies" / "gpu_run.sh").read_text()
RECIPE = re.compile(r"^  (\w+)\) CURR='(data\.curriculum=.*?)'(.*?);;", re.S | re.M)


def recipes() -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name, curr, rest in RECIPE.findall(SCRIPT):
        sets = re.findall(r'--set "?([\w.]+=[^"\s]+)"?', rest)
        out[name] = (" ".join(curr.split()), sets)
    return out


def test_every_recipe_the_script_names_is_found():
    named = re.search(r'RECIPE must be ([^"]+)"', SCRIPT).group(1).replace(" or ", ", ").split(", ")
    assert sorted(recipes()) == sorted(named)


@pytest.mark.parametrize("name", sorted(recipes()))
def test_recipe_loads_as_a_curriculum(name):
    curr, sets = recipes()[name]
    cfg = load_config(TRAIN_CONFIG, [*sets, curr])
    stages = cfg["data"]["curriculum"]
    assert stages and all("until_page" in s for s in stages)
    for i, stage in enumerate(stages):
        first = stages[i - 1]["until_page"] if i else 0
        assert curriculum_stage(cfg, first) == stage
        page = synth_config(cfg, first)
        assert page.font_px == tuple(stage["font_px"]) and page.max_chars == tuple(stage["max_chars"])
        for key in ("made_up_words", "path_lists", "two_columns"):
            if key in stage:
                assert getattr(page, key) == stage[key]
        if "glyph_px" in stage:
            assert page.glyph_px == tuple(stage["glyph_px"])


@pytest.mark.parametrize("stage, message", [
    ("{until_page: 9, font_px: [20, 36], max_chars: [150, 1300], made_up_wrds: 0.5}",
     "unknown key(s) ['made_up_wrds']"),
    ("{until_page: 9, font_px: [20, 36], max_chars: [150, 1300], mix: {share: 0.2, font_px: [20, 36], "
     "max_chars: [8, 80], cropp: true}}", "stage 0's mix: unknown key(s) ['cropp']"),
    ("{font_px: [20, 36], max_chars: [150, 1300]}", "needs until_page, font_px and max_chars"),
    ("{until_page: 9, font_px: [20, 36], max_chars: [150, 1300], mix: {font_px: [20, 36], max_chars: [8, 80]}}",
     "mix: needs share"),
])
def test_a_misspelt_or_missing_stage_key_fails_when_the_config_loads(stage, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(TRAIN_CONFIG, [f"data.curriculum=[{stage}]"])


def test_a_list_of_mixes_takes_its_shares_in_turn():
    """Recipe F2UGB mixes line pages (0.2) and short cropped pages at the glyph size (0.3) into its full pages: each
    page index picks one, in those shares; the line pages are the ones a single line mix of 0.2 would pick."""
    curr, sets = recipes()["F2UGB"]
    cfg = load_config(TRAIN_CONFIG, [*sets, curr])
    kinds = []
    for i in range(4000):
        page = synth_config(cfg, i, mix=True)
        kinds.append("line" if page.strict_chars else "block" if page.crop else "full")
        assert kinds[-1] != "line" or mixed_in(i, 0.2)
        assert (page.glyph_px is None) == (kinds[-1] == "line")
    shares = {k: kinds.count(k) / len(kinds) for k in ("line", "block", "full")}
    assert shares == pytest.approx({"line": 0.2, "block": 0.3, "full": 0.5}, abs=0.03)
    assert synth_config(cfg, 7).crop is False  # held-out and check pages: the stage's own


@pytest.mark.parametrize("mix, message", [
    ("[{share: 0.2, font_px: [20, 36], max_chars: [8, 80]}, {share: 0.3, font_px: [20, 36], max_chars: [8, 80], "
     "glyph: [29, 35]}]", "stage 0's mix 1: unknown key(s) ['glyph']"),
    ("[{share: 0.6, font_px: [20, 36], max_chars: [8, 80]}, {share: 0.5, font_px: [20, 36], max_chars: [8, 80]}]",
     "add up to more than 1"),
])
def test_a_bad_mix_in_a_list_fails_when_the_config_loads(mix, message):
    stage = f"{{until_page: 9, font_px: [20, 36], max_chars: [150, 1300], mix: {mix}}}"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(TRAIN_CONFIG, [f"data.curriculum=[{stage}]"])

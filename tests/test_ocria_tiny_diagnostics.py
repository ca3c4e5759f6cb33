"""The ocria-tiny diagnostics in bench/: the error profile (page classes by output length, line matching, error
shares, on hand-written pages; stop probabilities of the shipped model) and the text-line head's reading of
held-out pages (one page, end to end)."""
import json
from pathlib import Path

import pytest

from conftest import load_bench, shipped_pages_config, write_synth

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def profile():
    return load_bench("ocria_tiny_error_profile")


def test_page_class_bounds(profile):
    assert profile.page_class(0.17) == "stopped_early"
    assert profile.page_class(0.79) == "stopped_early"
    assert profile.page_class(0.8) == "read_to_end"
    assert profile.page_class(1.15) == "read_to_end"
    assert profile.page_class(1.48) == "ran_on"


def test_line_profile_scores_each_reference_line_against_its_closest_output_line(profile):
    ref = "# Heading line\n\n| alpha | beta |\n|---|---|\n| 12 | 34 |\n\nA line that the model never wrote out."
    hyp = "| 12 | 34 |\n\n# Heading lime\n\n| alpha | beta |\n\n| 12 | 34 |"
    got = profile.line_profile(hyp, ref)
    # reference lines: "Heading line" (1 edit in 12: read), "alpha beta", "12 34", the unread sentence (missed)
    assert got["ref_lines"] == 4 and got["out_lines"] == 4
    assert got["chars_in_lines_read"] == round((12 + 10 + 5) / (12 + 10 + 5 + 38), 3)
    assert got["chars_in_lines_missed"] == round(38 / (12 + 10 + 5 + 38), 3)
    assert got["repeated_out_lines"] == 1


def test_summary_splits_edits_by_class(profile):
    rows = [{"class": "stopped_early", "char_edits": 90, "ref_chars": 100},
            {"class": "ran_on", "char_edits": 60, "ref_chars": 200},
            {"class": "read_to_end", "char_edits": 50, "ref_chars": 500},
            {"class": "read_to_end", "char_edits": 0, "ref_chars": 200}]
    s = profile.summarize(rows)
    assert s["pages"] == 4 and s["cer"] == 0.2
    assert s["stopped_early"] == {"pages": 1, "share_of_char_edits": 0.45, "cer": 0.9}
    assert s["ran_on"] == {"pages": 1, "share_of_char_edits": 0.3, "cer": 0.3}
    assert s["read_to_end"] == {"pages": 2, "share_of_char_edits": 0.25, "cer": 0.0714}


def test_stop_summary_counts_pages_that_would_stop_inside(profile):
    rows = [{"class": "stopped_early", "p_stop_at_end": 0.9, "positions_inside_p_stop_over_half": 2},
            {"class": "ran_on", "p_stop_at_end": 0.1, "positions_inside_p_stop_over_half": 0},
            {"class": "read_to_end", "p_stop_at_end": 0.99, "positions_inside_p_stop_over_half": 0},
            {"class": "read_to_end", "p_stop_at_end": 0.7, "positions_inside_p_stop_over_half": 1},
            {"class": "read_to_end", "p_stop_at_end": None, "positions_inside_p_stop_over_half": 0}]
    s = profile.stop_summary(rows)
    assert s["stopped_early"] == {"pages": 1, "median_p_stop_at_end": 0.9, "pages_with_p_stop_inside_over_half": 1}
    assert s["ran_on"] == {"pages": 1, "median_p_stop_at_end": 0.1, "pages_with_p_stop_inside_over_half": 0}
    assert s["read_to_end"] == {"pages": 3, "median_p_stop_at_end": 0.99, "pages_with_p_stop_inside_over_half": 1}


def test_stop_probabilities_of_the_shipped_model_on_a_short_page(profile, licence_prose):
    """Fed a page's own markdown, the shipped model's stop-token probabilities: one at the page's end, the highest
    inside it with the reference text it follows."""
    from dataclasses import replace

    from conftest import SHIPPED_PAGES

    from jobs.eval_ocr import HFPageReader
    from jobs.train_tiny import load_config, synth_config
    from pipeline.synthetic import TextPool, make_page

    cfg = load_config(ROOT / "configs" / "train_tiny.yaml", SHIPPED_PAGES)
    page = make_page(cfg["data"]["heldout_seed"] + 200, TextPool(prose=licence_prose, code=[]),
                     replace(synth_config(cfg), max_chars=(150, 300)))
    reader = HFPageReader(ROOT / "models" / "ocria-tiny")
    got = profile.stop_probabilities(reader, page.image, page.markdown, 1024)
    assert 0 <= got["max_p_stop_inside"] <= 1 and 0 <= got["p_stop_at_end"] <= 1
    assert got["max_p_stop_inside_after"].strip() in page.markdown
    # a page cut before its end has no stop token to score
    assert profile.stop_probabilities(reader, page.image, page.markdown, 8)["p_stop_at_end"] is None


def test_line_head_reading_of_a_held_out_page(licence_prose, tmp_path):
    """bench/ocria_tiny_line_head_reading.py on one page with the shipped model and an untrained head: every line is
    placed and read, and the decoder's CER comes from the eval file given."""
    import torch

    from jobs.text_line_ctc import CTC_CLASSES, LINE_BUCKETS
    from pipeline.synthetic import TextPool

    write_synth(tmp_path, heldout=TextPool(prose=licence_prose, code=[]))
    config = shipped_pages_config(tmp_path)
    torch.save(torch.nn.Linear(2 * 256, LINE_BUCKETS * 8 * CTC_CLASSES).state_dict(), tmp_path / "head.pt")
    eval_file = tmp_path / "eval.json"
    eval_file.write_text(json.dumps({"heldout_synthetic": {"per_page": [
        {"page": "heldout_0000", "model_text": {"cer": 0.25, "ref_chars": 400}}]}}))
    out = tmp_path / "reading.json"
    assert load_bench("ocria_tiny_line_head_reading").main([
        "--model", str(ROOT / "models" / "ocria-tiny"), "--head", str(tmp_path / "head.pt"), "--heldout", "1",
        "--config", str(config), "--synth", str(tmp_path), "--decoder-eval", str(eval_file), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    row = res["per_page"][0]
    assert row["lines"] > 0 and 0 < row["line_chars_read_by_head"] <= row["line_chars"]
    assert row["head_cer"] > 0.5  # an untrained head does not read
    assert res["summary"]["decoder_cer"] == 0.25 and res["summary"]["head_cer"] == row["head_cer"]


@pytest.fixture(scope="module")
def teacher_forced():
    return load_bench("ocria_tiny_teacher_forced")


def test_tokens_take_the_seen_or_unseen_class_of_their_word(teacher_forced):
    text = "The | (License:) zq_v7 foo"
    vocabulary = {"The", "License", "foo"}
    # tokens by offsets: "The", " |", " (Lic", "ense:)", " zq", "_v7", " foo", and a trailing-space token
    offsets = [(0, 3), (3, 5), (5, 10), (10, 16), (16, 19), (19, 22), (22, 26), (26, 26)]
    assert teacher_forced.token_seen(offsets, text, vocabulary) == [True, True, True, True, False, False, True, True]
    assert teacher_forced.word_core("(License:)") == "License" and teacher_forced.word_core("|") == ""
    assert teacher_forced.token_inside_word(offsets, text) == [False, False, False, True, False, True, False, False]
    # a line's first word, after a newline and indentation as tokens of their own
    text, offsets = "a\n  75", [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6)]
    assert teacher_forced.token_inside_word(offsets, text) == [False, False, False, False, True]
    # leading punctuation as a token of its own: the word's first letter is in the token after it
    text, offsets = "x (Lic)", [(0, 1), (1, 2), (2, 3), (3, 6), (6, 7)]
    assert teacher_forced.token_inside_word(offsets, text) == [False, False, False, False, True]


def test_teacher_forced_score_of_the_shipped_model_on_a_short_page(teacher_forced, licence_prose):
    """One page fed its own markdown: every answer token is counted once, split into seen and unseen words with the
    stop token in `all` only; the sums make the summary's per-token numbers."""
    from dataclasses import replace

    from conftest import SHIPPED_PAGES

    from jobs.eval_ocr import HFPageReader
    from jobs.train_tiny import load_config, synth_config
    from pipeline.synthetic import TextPool, make_page

    cfg = load_config(ROOT / "configs" / "train_tiny.yaml", SHIPPED_PAGES)
    page = make_page(cfg["data"]["heldout_seed"] + 201, TextPool(prose=licence_prose, code=[["x = 1", "y = x"]]),
                     replace(synth_config(cfg), max_chars=(150, 300)))
    reader = HFPageReader(ROOT / "models" / "ocria-tiny")
    vocabulary = {teacher_forced.word_core(w) for w in page.markdown.split()[::2]}
    row = teacher_forced.score_page(reader, page.image, page.markdown, vocabulary, 1024)
    n = len(reader.builder.tok.encode(page.markdown, add_special_tokens=False).ids)
    assert row["tokens"] == n + 1 and row["seen"]["tokens"] + row["unseen"]["tokens"] == n
    assert row["seen"]["tokens"] > 0 and row["unseen"]["tokens"] > 0
    assert 0 <= row["right"] <= row["tokens"] and row["nll"] > 0
    # only the stop token is outside the two classes
    assert row["right"] - row["seen"]["right"] - row["unseen"]["right"] in (0, 1)
    # an unseen word's tokens after the one holding its first letter: at least that one token of every unseen word
    # is not inside
    unseen_words = [w for w in page.markdown.split()
                    if teacher_forced.word_core(w) and teacher_forced.word_core(w) not in vocabulary]
    assert 0 < row["unseen_inside"]["tokens"] <= row["unseen"]["tokens"] - len(unseen_words)
    # and the answer's tenths: the text tokens again, each counted once
    assert [p["tokens"] for p in row["by_tenth"]] == [(n * (t + 1) + 9) // 10 - (n * t + 9) // 10 for t in range(10)]
    assert sum(p["right"] for p in row["by_tenth"]) == row["seen"]["right"] + row["unseen"]["right"]
    # the real tokenizer's offsets: every word known -> nothing unseen; nothing known -> only markup is seen
    every = {teacher_forced.word_core(w) for w in page.markdown.split()}
    assert teacher_forced.score_page(reader, page.image, page.markdown, every, 1024)["unseen"]["tokens"] == 0
    none = teacher_forced.score_page(reader, page.image, page.markdown, set(), 1024)
    enc = reader.builder.tok.encode(page.markdown, add_special_tokens=False)
    markup = teacher_forced.token_seen(enc.offsets, page.markdown, set())
    assert none["seen"]["tokens"] == sum(markup) < n / 4
    cut = teacher_forced.score_page(reader, page.image, page.markdown, vocabulary, 8)  # no stop token to score
    assert cut["tokens"] == 8 == cut["seen"]["tokens"] + cut["unseen"]["tokens"]
    s = teacher_forced.totals([row, row])
    assert s["all"]["tokens"] == 2 * row["tokens"]
    assert s["all"]["top1_accuracy"] == round(row["right"] / row["tokens"], 4)
    assert s["unseen"]["token_share"] == round(row["unseen"]["tokens"] / n, 4)
    assert s["top1_by_tenth"] == [round(p["right"] / p["tokens"], 4) for p in row["by_tenth"]]
    assert s["unseen_inside"]["tokens"] == 2 * row["unseen_inside"]["tokens"]
    # buckets of 128 answer tokens: the text tokens once more
    assert len(row["by_position"]) == (n + 127) // 128
    assert [b["tokens"] for b in row["by_position"]] == [min(128, n - 128 * b) for b in range((n + 127) // 128)]
    assert sum(b["right"] for b in row["by_position"]) == sum(p["right"] for p in row["by_tenth"])
    assert s["top1_by_position"]["0-127"]["tokens"] == 2 * row["by_position"][0]["tokens"]
    # tenths apart on one- and two-column pages: each group's own pages
    two = dict(row, columns=2, by_tenth=[dict(p, right=0) for p in row["by_tenth"]])
    by_columns = teacher_forced.totals([dict(row, columns=1), two])["top1_by_tenth_by_columns"]
    assert by_columns["1"] == {"pages": 1, "top1": s["top1_by_tenth"]} and by_columns["2"]["top1"] == [0.0] * 10
    # tenths by class: every text token in one cell, each tenth's shares summing to one
    cells = row["by_tenth_class"]
    assert [sum(c["tokens"][t] for c in cells.values()) for t in range(10)] == [p["tokens"] for p in row["by_tenth"]]
    assert [sum(c["right"][t] for c in cells.values()) for t in range(10)] == [p["right"] for p in row["by_tenth"]]
    for t in range(10):
        assert abs(sum(sh[t] or 0 for sh in s["token_share_by_tenth"].values()) - 1) < 1e-3


def test_line_kinds_and_the_tenths_expected_from_the_class_mix(teacher_forced):
    md = "# Title\n\nSome prose.\n\n- item\n2. item\n\n```\n| not a table\n```\n\n| a | b |\n|---|---|"
    # a token at each line's start, one inside the prose, the heading's newline and the empty line after it
    starts = [0, 7, 8, 9, 14, 22, 29, 38, 42, 56, 61, 71]
    assert [md[i] for i in starts] == ["#", "\n", "\n", "S", "p", "-", "2", "`", "|", "`", "|", "|"]
    kinds = teacher_forced.token_line_kinds([(i, i + 1) for i in starts], md)
    assert kinds == ["heading", "heading", "heading", "paragraph", "paragraph", "list", "list", "code", "code", "code",
                     "table", "table"]

    def row(tokens, right):  # one page: class "paragraph_seen" in tenth 0, "code_unseen" in tenth 9
        cells = {c: {"tokens": [0] * 10, "right": [0] * 10} for c in ("paragraph_seen", "code_unseen")}
        cells["paragraph_seen"]["tokens"][0], cells["paragraph_seen"]["right"][0] = tokens[0], right[0]
        cells["code_unseen"]["tokens"][9], cells["code_unseen"]["right"][9] = tokens[1], right[1]
        return {"by_tenth_class": cells}

    # the late tenth is all code, which reads at 0.5 wherever it is: the mix explains its dip entirely
    out = teacher_forced.tenths_by_class([row((10, 10), (9, 9)), row((10, 10), (9, 1))])
    assert out["top1_by_tenth_expected"][0] == 0.9 and out["top1_by_tenth_expected"][9] == 0.5
    assert out["top1_by_tenth_class"]["code_unseen"][9] == 0.5 and out["top1_by_tenth_expected"][4] is None
    assert out["token_share_by_tenth"]["paragraph_seen"] == [1.0] + [None] * 8 + [0.0]
    assert out["top1_by_tenth_kind"]["code"][9] == 0.5 and out["top1_by_tenth_kind"]["table"] == [None] * 10


def test_answer_length_quantiles_count_each_share_over_its_cap():
    q = load_bench("ocria_tiny_answer_lengths").quantiles([100, 700, 300, 900, 500], [447, 640])
    assert q == {"pages": 5, "mean": 500.0, "p50": 500, "p90": 900, "p99": 900, "max": 900,
                 "share_over_447": 0.6, "share_over_640": 0.4}


@pytest.mark.parametrize("rule", ["teacher_forced", "free_cer"])
def test_arm_pick_stages_the_arm_that_reads_better(licence_prose, tmp_path, rule):
    """bench/ocria_tiny_arm_pick.py on one held-out page, by either rule: of the shipped model and a copy with noise in
    its weights (named first, so a tie or a reversed comparison would stage it), the shipped one is staged with its
    recipe, and the stage holds that checkpoint's own files (a stale merged model.safetensors of the model folder is
    not used); a reference model is scored like an arm and never staged."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.synthetic import TextPool

    pick = load_bench("ocria_tiny_arm_pick")
    synth = write_synth(tmp_path / "synth", heldout=TextPool(prose=licence_prose, code=[]),
                        train=TextPool(prose=licence_prose[::2], code=[]))
    config = shipped_pages_config(tmp_path)
    shipped = ROOT / "models" / "ocria-tiny"
    noisy = tmp_path / "noisy_ckpt"
    noisy.mkdir()
    shutil.copy(shipped / "config.json", noisy / "config.json")
    g = torch.Generator().manual_seed(7)
    weights = {k: v.float() + 0.5 * v.float().std().nan_to_num() * torch.randn(v.shape, generator=g)
               for k, v in load_file(shipped / "model.safetensors").items()}
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, noisy / "model.safetensors")
    (noisy / "train_state.json").write_text("{}")
    out = tmp_path / "pick.json"
    # a reference is scored by the same code as the arms: one rule checks it (a free-running read costs ~10 s here)
    reference = ["--reference", f"AGAIN={shipped}"] if rule == "teacher_forced" else []
    assert pick.main(["--model-dir", str(shipped), "--arm", f"NOISY={noisy}", "--arm", f"SHIPPED={shipped}",
                      *reference, "--by", rule, "--max-new-tokens", "160",
                      "--config", str(config), "--synth", str(synth), "--heldout", "1", "--heldout-from", "2",
                      "--device", "cpu", "--stage", str(tmp_path / "stage"), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    better = (lambda a, b: a > b) if rule == "teacher_forced" else (lambda a, b: a < b)
    assert res["winner"] == "SHIPPED" and better(res[rule]["SHIPPED"], res[rule]["NOISY"])
    assert res["pages"] == [2, 2] and set(res[rule]) == {"NOISY", "SHIPPED"} | ({"AGAIN"} if reference else set())
    if reference:
        assert res[rule]["AGAIN"] == res[rule]["SHIPPED"]
    assert (tmp_path / "stage" / "recipe").read_text().strip() == "SHIPPED"
    staged = tmp_path / "stage" / "ckpt"
    assert (staged / "model.safetensors").read_bytes() == (shipped / "model.safetensors").read_bytes()
    # each arm was scored with its own weights and the model folder's tokenizer
    assert (tmp_path / "stage" / "score_NOISY" / "tokenizer.json").exists()
    assert (tmp_path / "stage" / "score_NOISY" / "model.safetensors").read_bytes() == \
        (noisy / "model.safetensors").read_bytes()
    assert not (tmp_path / "stage" / "score_NOISY" / "train_state.json").exists()


def test_arm_pick_stages_a_copy_and_keeps_an_arm_that_is_the_stage(tmp_path):
    pick = load_bench("ocria_tiny_arm_pick")
    arm, stage = tmp_path / "arm", tmp_path / "stage" / "ckpt"
    for d, text in ((arm, "arm"), (stage, "old")):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_text(text)
    assert pick.stage_checkpoint(arm, stage) == stage
    assert (stage / "model.safetensors").read_text() == "arm" and (arm / "model.safetensors").exists()
    (stage / "model.safetensors").write_text("trained in place")
    assert pick.stage_checkpoint(tmp_path / "stage" / ".." / "stage" / "ckpt", stage) == stage
    assert (stage / "model.safetensors").read_text() == "trained in place"


def test_pool_coverage_counts_word_occurrences_and_takes_docstrings_outside_numpy_and_tests(tmp_path):
    cov = load_bench("ocria_tiny_pool_coverage")
    assert cov.coverage(["deed", "grant", "deed"], {"deed"}) == pytest.approx(2 / 3)
    words = ["deed", "usr/share/doc", "a@b.org", "GPL-2.0", "1998", "Joyent", "grant", "numpy.linalg"]
    assert cov.unseen_kinds(words, {"deed"}) == {"path_or_identifier": 0.286, "has_digit": 0.286, "address": 0.143,
                                                 "capitalised": 0.143, "lower_case": 0.143}
    said = {name: f"{name} says this in six or more words." for name in ("pkg", "test", "numpy", "known", "f")}
    modules = {"pkg/mod.py": said["pkg"], "pkg/tests/test_mod.py": said["test"], "numpy/core.py": said["numpy"],
               "other.py": said["known"]}
    for rel, doc in modules.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f'"""{doc}"""\n\ndef f():\n    """{said["f"]}"""\n')
    found, chars = cov.site_docstrings(tmp_path, known={said["known"]})
    assert found == [said["f"], said["pkg"]]  # other.py's f first: sorted paths; f's docstring once
    assert set(chars) == {"pkg", "other.py"} and chars["pkg"] == len(said["pkg"] + said["f"])


def test_paired_cer_pools_edits_over_characters_and_bootstraps_the_pages_together(tmp_path):
    paired = load_bench("ocria_tiny_paired_cer")

    def eval_file(name, cers, chars, first=0):
        rows = [{"page": f"heldout_{first + i:04d}", "model_text": {"cer": c, "ref_chars": n},
                 "model_md": {"ref_chars": n + 10}, "model_output": "x" * int((n + 10) * (1 + c))}
                for i, (c, n) in enumerate(zip(cers, chars))]
        (tmp_path / name).write_text(json.dumps({"heldout_synthetic": {"per_page": rows}}))
        return tmp_path / name

    chars = [100, 300, 200, 400, 150, 250, 350]
    cers_a = [0.10, 0.20, 0.05, 0.10, 0.30, 0.10, 0.15]
    a = eval_file("a.json", cers_a, chars)
    b = eval_file("b.json", [0.05, 0.10, 0.04, 0.08, 0.20, 0.05, 0.90], chars)  # better on 6, one page runs on
    rows_a, rows_b = paired.read_pages([a]), paired.read_pages([b])
    res = paired.compare(paired.page_errors(rows_a), paired.page_errors(rows_b), draws=500, seed=3)
    assert res["pooled"]["a"] == pytest.approx(sum(c * n for c, n in zip(cers_a, chars)) / sum(chars), abs=1e-4)
    assert (res["pages_b_better"], res["pages_b_worse"]) == (6, 1)
    assert res["median_page"] == {"a": 0.1, "b": 0.08}
    assert res["largest_losses"][0] == "heldout_0006 0.150 -> 0.900"
    lo, hi = res["bootstrap_90pct"]
    assert lo <= res["difference_b_minus_a"] <= hi and lo < 0 < hi  # one run-on page makes the sign uncertain
    assert 0 < res["share_of_draws_b_better"] < 1
    assert paired.run_on_pages(rows_b) == {"ratio": 1.25, "pages": ["heldout_0006"],
                                           "share_of_edits": round(0.9 * 350 / (0.9 * 350 + 0.05 * 100 + 0.1 * 300 +
                                                                               0.04 * 200 + 0.08 * 400 + 0.2 * 150 +
                                                                               0.05 * 250), 3)}
    assert paired.run_on_pages(rows_a)["pages"] == ["heldout_0004"]  # 1.3x its reference
    # the same pages read from two files per side (two processes' halves) give the same errors
    halves = [eval_file("a0.json", cers_a[:4], chars[:4]), eval_file("a1.json", cers_a[4:], chars[4:], first=4)]
    assert paired.page_errors(paired.read_pages(halves)) == paired.page_errors(rows_a)
    # one range of a file that holds more: pages 4-6 are the second half's
    assert paired.page_errors(paired.read_pages([a], (4, 6))) == paired.page_errors(paired.read_pages(halves[1:]))
    with pytest.raises(ValueError, match="different pages"):
        paired.compare(paired.page_errors(rows_a), paired.page_errors(paired.read_pages(halves[:1])))
    # a page whose reference is another on one side (another PyMuPDF drew another document) is left out and listed
    other = eval_file("other.json", cers_a, [*chars[:2], 999, *chars[3:]])
    assert paired.references_differ(rows_a, paired.read_pages([other])) == ["heldout_0002"]
    out = tmp_path / "pair.json"
    paired.main(["--a", str(a), "--b", str(other), "--out", str(out), "--draws", "50"])
    res = json.loads(out.read_text())
    assert res["left_out_references_differ"] == ["heldout_0002"] and res["pages"] == 6


@pytest.fixture(scope="module")
def by_block():
    return load_bench("ocria_tiny_errors_by_block")


def test_charged_edits_add_up_to_the_edit_distance(by_block):
    import random

    from jobs.eval_ocr import levenshtein

    rng = random.Random()
    for _ in range(60):
        ref = "".join(rng.choice("ab c/") for _ in range(rng.randrange(1, 37)))
        hyp = "".join(rng.choice("ab c/x") for _ in range(rng.randrange(0, 41)))
        edits = by_block.edits_per_ref_char(hyp, ref)
        assert len(edits) == len(ref) and (edits >= 0).all()
        assert int(edits.sum()) == levenshtein(hyp, ref), (hyp, ref)


def test_edits_are_charged_to_the_kind_of_reference_text_they_fall_in(by_block):
    ref = ("# Title\n\nSome words here.\n\nlibs/a_b/c.hpp libs/d.cpp\n\n- see libs/x_y.h now\n\n| x | y |\n|---|---|"
           "\n\n```\nint x;\n```")
    hyp = ("# Title\n\nSome wards here.\n\nlibs/a_b/c.hpq libs/d.cpp\n\n- see libs/x_z.h now\n\n| x | yy |\n\n"
           "```\nint z; q\n```")
    got = by_block.page_by_kind(hyp, ref)
    # characters of each kind's text, each with the space after it; the list line's path is a path
    assert got == {"words": [17, 1], "paths": [26 + 11, 2], "list": [4 + 4, 0], "heading": [6, 0], "table": [4, 1],
                   "code": [6, 3]}
    assert [k for k, _ in by_block.line_kinds(ref)] == ["heading", "words", "words", "list", "table", "code"]
    assert by_block.page_by_kind("stray text", "```\n```")["words"] == [0, 10]
    assert [bool(by_block._PATHY.search(w)) for w in ("and/or", "libs/x.h", "a/b/c", "x_y", "2.5/3", "e.g.")] == [
        False, True, True, True, False, False]


def test_pool_path_share_counts_the_characters_of_path_like_words(by_block, tmp_path):
    from pipeline.synthetic import TextPool

    # words: "see" 3, "libs/a.h" 8, "and/or" 6, "x_y" 3, "now." 4 -> paths 11 of 24
    pool = TextPool(prose=["see libs/a.h and/or", "x_y  now."], code=[["libs/b_c.h"]])
    pool.to_json_gz(tmp_path / "pool.json.gz")
    assert by_block.pool_path_share(tmp_path / "pool.json.gz") == round(11 / 24, 4)


def test_path_share_grows_with_the_path_lists_share(licence_prose, tmp_path, monkeypatch):
    from pipeline.synthetic import TextPool

    synth = write_synth(tmp_path / "synth", train=TextPool(prose=licence_prose, code=[["x = 1", "y = 2"]]))
    out = tmp_path / "share.json"
    f2u = "data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25}]"
    monkeypatch.setattr("sys.argv", ["ocria_tiny_path_share.py", "--synth", str(synth), "--train-set", f2u,
                                     "--shares", "0", "1", "--pages", "3", "--out", str(out)])
    load_bench("ocria_tiny_path_share").main()
    share = json.loads(out.read_text())["paths_share_of_chars"]
    assert share["0.0"] < 0.2 < 0.5 < share["1.0"] <= 1.0, share


def test_errors_by_block_leaves_out_pages_drawn_otherwise_where_they_were_scored(by_block, licence_prose, tmp_path,
                                                                                   monkeypatch):
    """A saved answer whose page held another amount of text where it was scored (another PyMuPDF) is left out and
    listed, not aligned with this machine's page; the others are charged as usual."""
    from jobs.eval_ocr import heldout_pages
    from jobs.train_tiny import load_config
    from pipeline.synthetic import TextPool

    synth = write_synth(tmp_path / "synth", heldout=TextPool(prose=licence_prose, code=[]),
                        train=TextPool(prose=licence_prose[::2], code=[]))
    config = shipped_pages_config(tmp_path)
    pages = heldout_pages(2, load_config(config, []), synth, first=1)
    saved = [{"page": p.name, "model_output": p.reference_md, "model_text": {"ref_chars": len(p.reference_text)}}
             for p in pages]
    saved[1]["model_text"]["ref_chars"] += 7
    result = tmp_path / "eval.json"
    result.write_text(json.dumps({"heldout_synthetic": {"per_page": saved}}))
    out = tmp_path / "by_block.json"
    monkeypatch.setattr("sys.argv", ["ocria_tiny_errors_by_block.py", "--eval", f"{result}:1", "--config", str(config),
                                     "--synth", str(synth), "--out", str(out)])
    by_block.main()
    res = json.loads(out.read_text())
    assert res["pages_left_out"] == [{"page": pages[1].name, "ref_chars_scored": len(pages[1].reference_text) + 7,
                                      "ref_chars_here": len(pages[1].reference_text)}]
    assert [p["page"] for p in res["per_page"]] == [pages[0].name] and res["all"]["cer"] == 0.0


def test_cer_by_glyph_finds_each_pages_font_size_and_pools_by_range(licence_prose):
    """bench/ocria_tiny_cer_by_glyph.py: a held-out page's glyph size is the one make_page drew it at (its style from
    its seed), and a range's CER is pooled over its pages' characters, one and two columns apart."""
    from conftest import ROOT, SHIPPED_PAGES

    from jobs.train_tiny import load_config, synth_config
    from pipeline.synthetic import TextPool, font_families, make_page

    by_glyph = load_bench("ocria_tiny_cer_by_glyph")
    cfg = load_config(ROOT / "configs" / "train_tiny.yaml", SHIPPED_PAGES)
    pool = TextPool(prose=licence_prose, code=[["x = 1"]])
    for seed in (5, 17):
        style = make_page(seed, pool, synth_config(cfg)).style
        px, columns = by_glyph.page_glyph_px(seed, cfg, font_families(None))  # make_page's families without fonts/
        assert px == pytest.approx(style.font_pt * 1536 / style.height_pt) and columns == style.columns
        assert 20 <= px <= 36
    pages = [{"glyph_px": 21.0, "columns": 1, "cer": 0.5, "ref_chars": 100},
             {"glyph_px": 23.9, "columns": 1, "cer": 0.0, "ref_chars": 300},
             {"glyph_px": 22.0, "columns": 2, "cer": 0.2, "ref_chars": 50},
             {"glyph_px": 35.0, "columns": 1, "cer": 0.1, "ref_chars": 10}]
    rows = {(r["px"][0], r["columns"]): r for r in by_glyph.by_glyph(pages)}
    assert rows[(20.0, 1)]["pages"] == 2 and rows[(20.0, 1)]["pooled_cer"] == pytest.approx(50 / 400)
    assert rows[(20.0, 2)]["pooled_cer"] == pytest.approx(0.2) and rows[(32.0, 1)]["pages"] == 1
    assert (24.0, 1) not in rows


def test_hybrid_read_takes_the_block_read_where_lengths_disagree_on_the_same_page():
    hybrid = load_bench("ocria_tiny_hybrid_read")

    def row(page, output, ref_chars=100, cer=0.1):
        return {"page": page, "model_output": output, "model_text": {"cer": cer, "ref_chars": ref_chars}}

    whole = {"p0": row("p0", "a" * 100), "p1": row("p1", "a" * 300, cer=2.0), "p2": row("p2", "a" * 300)}
    blocks = {"p0": row("p0", "b" * 95), "p1": row("p1", "b" * 100, cer=0.2), "p2": row("p2", "b" * 100, 120)}
    rows, taken = hybrid.choose(whole, blocks, 0.1)
    assert taken == ["p1"]  # p0 agrees within 10 %; p2's block read is of another document (its reference differs)
    assert rows == [whole["p0"], blocks["p1"], whole["p2"]]
    assert hybrid.pooled(rows) == pytest.approx((10 + 20 + 10) / 300)

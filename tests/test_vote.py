"""The reads' character vote (pipeline.vote): alignments that rebuild the other read with the fewest edits, a majority
that outvotes a single misread anywhere, and the medoid's text where reads disagree three ways."""
import random

import pytest

from pipeline.text import levenshtein
from pipeline.vote import alignment, majority, medoid, vote

ALPHABET = "ab/._ Il1O0"


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_alignment_rebuilds_the_other_read_with_the_fewest_edits(seed):
    rng = random.Random(seed)  # a property of every pair: three fixed draws of 300, the same on every run
    for _ in range(300):
        pivot, other = _random_text(rng, rng.randint(0, 23)), _random_text(rng, rng.randint(0, 19))
        at, before = alignment(pivot, other)
        assert len(at) == len(pivot) and len(before) == len(pivot) + 1
        assert "".join(b + a for b, a in zip(before, at)) + before[-1] == other
        edits = sum(a != p for a, p in zip(at, pivot)) + sum(len(b) for b in before)
        assert edits == levenshtein(pivot, other), (pivot, other, at, before)


def _misread(rng: random.Random, text: str, place: int) -> str:
    """One edit at `place`: a character swapped, dropped, or one put in before it."""
    kind = rng.choice(["swap", "drop", "insert"])
    if kind == "swap":
        return text[:place] + rng.choice([c for c in ALPHABET if c != text[place]]) + text[place + 1:]
    if kind == "drop":
        return text[:place] + text[place + 1:]
    return text[:place] + rng.choice(ALPHABET) + text[place:]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("reads", [3, 5])
def test_a_misread_one_read_makes_is_outvoted(reads, seed):
    """Each read misreads once, at places at least 5 characters apart, so a majority reads every place right. Where
    a run of look-alike characters lets a least-edits alignment place an edit in several ways, a misread can survive
    (1 case of 4,593 on this alphabet, seed 1): at most 2 of 400 may. Seeded, so a run that fails fails again."""
    rng = random.Random(seed * 10 + reads)
    wrong = []
    for _ in range(400):
        truth = _random_text(rng, rng.randint(5 * reads + 4, 61))
        texts = [_misread(rng, truth, p) for p in rng.sample(range(2, len(truth) - 2, 5), reads)]
        if vote(texts) != truth:
            wrong.append(texts)
    assert len(wrong) <= 2, wrong


def test_known_votes():
    assert vote(["path/too/file.py", "pat/to/file.py", "path/to/fiIe.py"]) == "path/to/file.py"
    assert vote(["the cat sot", "tha cat sat", "the cot sat"]) == "the cat sat"
    assert vote(["same", "same", "other"]) == "same"  # a word-for-word majority stands as it is
    assert vote(["only"]) == "only"
    # three ways apart at one place: the medoid's character, which is the first read's among equals
    assert vote(["abXd", "abYd", "abZd"]) == "abXd"
    assert vote(["", "", "x"]) == "" and vote(["", "x", "y"]) == ""
    with pytest.raises(ValueError):
        vote([])


def test_the_medoid_and_the_majority():
    assert medoid(["abc", "abd", "xyz"]) == 0 and medoid(["xyz", "abc", "abc"]) == 1
    assert majority(["a", "a", "b"]) == "a" and majority(["a", "b", "c"]) is None
    assert majority(["a", "a"], voters=3) == "a" and majority(["a", "a"], voters=5) is None

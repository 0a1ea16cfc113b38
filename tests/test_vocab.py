"""Look-up policy: normalisation, multi-word means, subword preference, coverage errors."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from audit.backends.base import Lookup
from audit.backends.static import load_static
from audit.errors import CoverageError, DataError, ParameterError
from audit.suites import WordSet
from audit.vocab import ResolvedSet, candidates, normalise, resolve_sets, words_needed

pytestmark = pytest.mark.unit


class DictVectors:
    """A WordVectors over a plain dict (``subword``: words served as fastText OOV vectors)."""

    ref = "dict-model"
    backend = "test"
    revision = "none"

    def __init__(self, table: dict[str, list[float]], subword: set[str] = frozenset()) -> None:
        self.table = {w: np.asarray(v, dtype=np.float32) for w, v in table.items()}
        self.sub = set(subword)
        self.dim = len(next(iter(self.table.values())))
        self.calls: list[list[str]] = []

    def lookup(self, words):
        self.calls.append(list(words))
        return Lookup(vectors={w: self.table[w] for w in words if w in self.table},
                      subword={w for w in words if w in self.sub and w in self.table})


UNCASED = DictVectors({
    "emile": [1, 0, 0], "naive": [0, 1, 0], "new": [1, 2, 3], "york": [3, 2, 1], "paris": [0, 0, 1],
    "strasse": [2, 0, 1], "ice": [1, 1, 0], "cream": [0, 1, 1], "flower": [1, 3, 0], "rose": [2, 2, 2],
})


def test_normalise_and_candidates():
    nfd = unicodedata.normalize("NFD", "Émile")
    assert nfd != "Émile" and normalise(nfd) == "Émile"  # NFC always
    assert normalise("Émile", casefold=True, strip_accents=True) == "emile"
    assert normalise("Émile", strip_accents=True) == "Emile"
    assert normalise("Émile", casefold=True) == "émile"
    assert normalise("ﬁne", strip_accents=True) == "fine"  # NFKD compatibility mapping
    assert candidates("Straße", casefold=True) == ["Straße", "straße", "strasse"]
    assert candidates("Émile") == ["Émile"]
    with pytest.raises(DataError):
        normalise(3)


def test_coverage_missing_and_float64_vectors():
    sets = [WordSet("X", ("flower", "rose", "tulip", "new york")), WordSet("Y", ("paris", "ice cream"))]
    x, y = resolve_sets(UNCASED, sets, max_missing=0.25)
    assert isinstance(x, ResolvedSet)
    assert x.name == "X" and x.words == ["flower", "rose", "new york"] and x.missing == ["tulip"]
    assert x.coverage == 0.75 and y.coverage == 1.0 and x.subword == []
    assert x.vectors.dtype == np.float64 and x.vectors.shape == (3, 3)
    np.testing.assert_array_equal(x.vectors[0], [1, 3, 0])
    np.testing.assert_array_equal(x.vectors[2], [2, 2, 2])  # mean of new (1,2,3) and york (3,2,1)
    np.testing.assert_array_equal(y.vectors[1], [0.5, 1, 0.5])
    assert len(UNCASED.calls[-1]) == len(set(UNCASED.calls[-1]))  # one batched call, no repeats


def test_multiword_with_a_missing_part_is_missing():
    (r,) = resolve_sets(UNCASED, [WordSet("X", ("new york", "new zork", "rose", "paris", "flower"))])
    assert r.words == ["new york", "rose", "paris", "flower"] and r.missing == ["new zork"]
    assert r.coverage == 0.8


def test_threshold_is_strict_and_message_names_everything():
    s = [WordSet("flowers", ("flower", "rose", "tulip", "aster"))]  # 50% missing
    assert resolve_sets(UNCASED, s, max_missing=0.5)[0].coverage == 0.5
    with pytest.raises(CoverageError) as e:
        resolve_sets(UNCASED, s, max_missing=0.49, test_name="weat1")
    msg = str(e.value)
    for part in ("'weat1'", "'flowers'", "50%", "tulip", "aster", "2 of 4", "'dict-model'"):
        assert part in msg, part
    assert "rose" not in msg.split("flowers")[1]


def test_all_failing_sets_reported_and_entirely_missing_always_raises():
    sets = [WordSet("A", ("tulip", "aster")), WordSet("B", ("rose", "oak")), WordSet("C", ("paris",))]
    with pytest.raises(CoverageError) as e:
        resolve_sets(UNCASED, sets, max_missing=1.0)
    assert "'A' misses 2 of 2 entries (100%): tulip, aster" in str(e.value)
    assert "'B'" not in str(e.value)
    with pytest.raises(CoverageError) as e:
        resolve_sets(UNCASED, sets, max_missing=0.2)
    assert "'A'" in str(e.value) and "'B' misses 1 of 2 entries (50%): oak" in str(e.value)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.2", None])
def test_max_missing_validation(bad):
    with pytest.raises(ParameterError, match="max_missing"):
        resolve_sets(UNCASED, [WordSet("X", ("rose",))], max_missing=bad)


def test_casefold_and_strip_accents():
    s = [WordSet("names", ("Émile", "naïve", "Paris", "Straße"))]
    with pytest.raises(CoverageError):
        resolve_sets(UNCASED, s, max_missing=1.0)  # without normalisation nothing is found
    (r,) = resolve_sets(UNCASED, s, casefold=True, max_missing=0.5)
    assert r.words == ["Paris", "Straße"]  # "Straße" through full case folding "strasse"
    (r,) = resolve_sets(UNCASED, s, casefold=True, strip_accents=True)
    assert r.words == ["Émile", "naïve", "Paris", "Straße"] and r.coverage == 1.0
    np.testing.assert_array_equal(r.vectors[0], [1, 0, 0])
    assert words_needed(s, casefold=True, strip_accents=True) >= {"Émile", "emile", "naive", "paris", "strasse"}


def test_exact_spelling_first():
    m = DictVectors({"Paris": [1, 0], "paris": [0, 1]})
    (r,) = resolve_sets(m, [WordSet("X", ("Paris", "PARIS"))], casefold=True)
    np.testing.assert_array_equal(r.vectors, [[1, 0], [0, 1]])


def test_in_vocabulary_spelling_beats_subword():
    m = DictVectors({"Émile": [1, 1], "emile": [2, 0], "rosé": [0, 3]}, subword={"Émile", "rosé"})
    (r,) = resolve_sets(m, [WordSet("X", ("Émile", "rosé"))], casefold=True, strip_accents=True)
    np.testing.assert_array_equal(r.vectors, [[2, 0], [0, 3]])  # normalised in-vocab, then exact subword
    assert r.subword == ["rosé"]


def test_nan_and_zero_vectors_raise():
    m = DictVectors({"rose": [1, 2], "tulip": [np.nan, 1], "oak": [0, 0], "up": [1, 1], "down": [-1, -1]})
    with pytest.raises(DataError, match=r"'tulip'.*NaN"):
        resolve_sets(m, [WordSet("X", ("rose", "tulip"))])
    with pytest.raises(DataError, match=r"'oak'.*all zeros: cosine undefined"):
        resolve_sets(m, [WordSet("X", ("rose", "oak"))])
    with pytest.raises(DataError, match=r"'up down'.*all zeros"):
        resolve_sets(m, [WordSet("X", ("rose", "up down"))])


def test_bad_sets():
    with pytest.raises(DataError, match="'E' is empty"):
        resolve_sets(UNCASED, [WordSet("E", ())])
    with pytest.raises(DataError, match=r"'S': entry 1"):
        resolve_sets(UNCASED, [WordSet("S", ("rose", "  "))])
    with pytest.raises(ParameterError):
        resolve_sets(UNCASED, WordSet("S", ("rose",)))


def test_words_needed_feeds_a_filtered_loader(tmp_path):
    p = tmp_path / "v.txt"
    rows = {"emile": [1, 0, 0], "new": [1, 2, 3], "york": [3, 2, 1], "rose": [2, 2, 2], "other": [9, 9, 9]}
    p.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in rows.items()), encoding="utf-8")
    sets = [WordSet("X", ("Émile", "New York", "rose", "tulip"))]
    need = words_needed(sets, casefold=True, strip_accents=True)
    assert need == {"Émile", "emile", "New", "new", "York", "york", "rose", "tulip"}
    model = load_static(str(p), words=need)
    assert len(model) == 4  # "other" was not kept
    (r,) = resolve_sets(model, sets, casefold=True, strip_accents=True, max_missing=0.25)
    assert r.words == ["Émile", "New York", "rose"] and r.missing == ["tulip"]
    np.testing.assert_array_equal(r.vectors[1], [2, 2, 2])


def test_turkish_capital_i_is_lowered_the_turkish_way():
    """'İ'.lower() is 'i' + U+0307 in Python: uncased Turkish vocabularies hold 'istanbul', and
    'Irak' (Iraq) is 'ırak' with a dotless i."""
    model = DictVectors({"istanbul": [1, 0], "ırak": [0, 1], "isabel": [1, 1]})
    (r,) = resolve_sets(model, [WordSet("places", ("İstanbul", "Irak", "Isabel"))], casefold=True)
    assert r.words == ["İstanbul", "Irak", "Isabel"] and r.coverage == 1.0
    np.testing.assert_array_equal(r.vectors, [[1, 0], [0, 1], [1, 1]])
    assert "istanbul" in words_needed([WordSet("p", ("İstanbul",))], casefold=True)

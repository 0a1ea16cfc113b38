"""Iterative nullspace projection (INLP) on sentence representations.

Reference: Ravfogel, Elazar, Gonen, Twiton & Goldberg (2020), "Null It Out", ACL; implementation
as bias-bench (McGill-NLP/bias-bench at 291426a, ``bias_bench/debias/inlp/debias.py`` and
``context_nullspace_projection.py``), itself from shauli-ravfogel/nullspace_projection.

Algorithm (autoregressive, bias-bench's settings): for ``i = 1..n_classifiers`` train a linear
classifier (``LinearSVC(fit_intercept=False, class_weight=None, dual=False, random_state=0)``) to
predict the protected label from the current (projected) training vectors; its weight rows ``W_i``
span a rowspace with orthogonal projection ``P_R(W_i) = B B^T`` (``B = scipy.linalg.orth(W_i^T)``;
all-zero ``W``: zero); the projection onto the intersection of the nullspaces found so far is
``P = I - P_R(sum_j P_R(W_j))`` (Ben-Israel 2013); the training and dev vectors are re-projected
from the originals, ``X <- X P^T`` (``P`` is symmetric). The result is the final ``P``; a
representation ``x`` (row vector) is debiased as ``x P^T`` (bias-bench's hook: ``P @ x``).
Classifiers whose dev accuracy is below ``min_accuracy`` (bias-bench: 0) are skipped.

Data (bias-bench): gender uses three classes, male 1 / female 0 / neutral -1; other bias types two
(bias 1 / neutral 0). Features are the mean of the last hidden layer over all tokens of one
sentence, special tokens included, encoded one sentence at a time without padding
(:func:`mean_last_hidden`). The split is ``train_test_split(test_size=0.3, random_state=0)`` twice
(train+dev / test, then train / dev).

Documented difference: bias-bench fixes ``input_dim=768``; here it is the vectors' width.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from audit import schema
from audit.backends.batching import inference
from audit.backends.hf_scoring import model_device
from audit.errors import ParameterError

__all__ = ["rowspace_projection", "nullspace_intersection", "inlp_projection", "split_dataset",
           "labels_for", "mean_last_hidden", "apply_projection", "gender_sentences", "attribute_sentences"]


def rowspace_projection(W: np.ndarray) -> np.ndarray:
    """Orthogonal projection onto the row space of ``W`` (``k x d``): ``B B^T`` with ``B`` an
    orthonormal basis of ``W^T``'s columns (``scipy.linalg.orth``); zeros when ``W`` is (close to) 0."""
    W = np.asarray(W, dtype=np.float64)
    if np.allclose(W, 0):
        return np.zeros((W.shape[1], W.shape[1]))
    import scipy.linalg  # local: see audit/multitest.py

    B = scipy.linalg.orth(W.T)
    return B @ B.T


def nullspace_intersection(rowspace_projections: Sequence[np.ndarray], dim: int) -> np.ndarray:
    """Projection onto ``N(w_1) ∩ ... ∩ N(w_n) = N(sum_i P_R(w_i))`` (Ben-Israel 2013):
    ``I - P_R(sum_i P_R(w_i))``."""
    Q = np.sum(rowspace_projections, axis=0) if len(rowspace_projections) else np.zeros((dim, dim))
    return np.eye(dim) - rowspace_projection(Q)


def labels_for(n_per_class: Sequence[int], *, gender: bool) -> np.ndarray:
    """bias-bench's labels for stacked classes: gender ``(male, female, neutral)`` -> ``1, 0, -1``;
    otherwise ``(bias, neutral)`` -> ``1, 0``."""
    values = (1, 0, -1) if gender else (1, 0)
    if len(n_per_class) != len(values):
        raise ParameterError(f"INLP {'gender' if gender else 'binary'} data needs {len(values)} classes, "
                             f"got {len(n_per_class)}")
    return np.concatenate([np.full(n, v, dtype=int) for n, v in zip(n_per_class, values)])


def split_dataset(X: np.ndarray, y: np.ndarray, seed: int = 0):
    """``(X_train, X_dev, X_test, Y_train, Y_dev, Y_test)`` as bias-bench: 30 % test, then 30 % of
    the rest as dev, ``random_state=seed`` (bias-bench: 0)."""
    from sklearn.model_selection import train_test_split

    X_td, X_test, y_td, y_test = train_test_split(X, y, test_size=0.3, random_state=seed)
    X_train, X_dev, y_train, y_dev = train_test_split(X_td, y_td, test_size=0.3, random_state=seed)
    return X_train, X_dev, X_test, y_train, y_dev, y_test


def inlp_projection(X_train: np.ndarray, Y_train: np.ndarray, X_dev: np.ndarray, Y_dev: np.ndarray, *,
                    n_classifiers: int = 80, min_accuracy: float = 0.0, random_state: int = 0
                    ) -> tuple[np.ndarray, list[np.ndarray], list[float]]:
    """INLP's final projection ``P`` (``d x d``, float64), the classifiers' weights ``W_i`` and
    their dev accuracies (see the module docstring)."""
    from sklearn.svm import LinearSVC

    n_classifiers = schema.integer(n_classifiers, "n_classifiers", 1)
    X_train = np.asarray(X_train, dtype=np.float64)
    X_dev = np.asarray(X_dev, dtype=np.float64)
    if not (np.isfinite(X_train).all() and np.isfinite(X_dev).all()):
        raise ParameterError("INLP representations contain NaN or infinite values")
    if len(np.unique(Y_train)) < 2:
        raise ParameterError("INLP needs at least two classes in the training labels")
    dim = X_train.shape[1]
    Xt, Xd = X_train.copy(), X_dev.copy()
    rowspaces: list[np.ndarray] = []
    Ws: list[np.ndarray] = []
    accs: list[float] = []
    for _ in range(n_classifiers):
        clf = LinearSVC(fit_intercept=False, class_weight=None, dual=False, random_state=random_state)
        clf.fit(Xt, Y_train)
        acc = float(clf.score(Xd, Y_dev))
        accs.append(acc)
        if acc < min_accuracy:
            continue
        W = np.atleast_2d(clf.coef_)
        Ws.append(W)
        rowspaces.append(rowspace_projection(W))
        P = nullspace_intersection(rowspaces, dim)
        Xt = (P @ X_train.T).T
        Xd = (P @ X_dev.T).T
    return nullspace_intersection(rowspaces, dim), Ws, accs


def apply_projection(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Rows of ``X`` projected: ``x -> P x`` for every row (``X P^T``)."""
    return np.asarray(X) @ np.asarray(P).T


def mean_last_hidden(model: Any, tokenizer: Any, sentences: Sequence[str]) -> np.ndarray:
    """bias-bench's INLP features: per sentence (one at a time, special tokens added, no padding),
    the mean over all positions of the base model's last hidden state, in float32 on the model's
    device whatever its dtype. float32 ``(n, dim)``."""
    base = getattr(model, "base_model", model)
    dev = model_device(model)
    out = []
    with inference(no_grad=True):
        for s in sentences:
            enc = tokenizer(s, add_special_tokens=True, truncation=True, return_tensors="pt")
            inputs = {k: v.to(dev) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            h = base(**inputs)["last_hidden_state"]
            out.append(h.float().mean(dim=1).squeeze(0).cpu().numpy())
    return np.asarray(out, dtype=np.float32)


def gender_sentences(lines: Sequence[str], pairs: Sequence[Sequence[str]], *, n_sentences: int = 10000,
                     seed: int = 0) -> dict[str, list[str]]:
    """bias-bench's INLP training sentences (``bias_bench/dataset/inlp.py`` ``_load_gender_data``),
    from ``lines`` (one sentence per line: bias-bench splits Wikipedia paragraphs with
    ``nltk.sent_tokenize``, biasaudit reads the user's corpus one sentence per line).

    The lines are shuffled (``random.Random(seed)``, the same sequence as bias-bench's
    ``random.seed(seed)``); each sentence is split on single spaces and lower-cased; sentences of
    fewer than 5 tokens are skipped; a sentence with male words only (first elements of the pairs)
    is *male*, female only *female*, neither *neutral*, both skipped; a male/female sentence is
    clipped after a random token between the (last found) attribute word and the end
    (``tokens[:randint(idx, len) + 1]``), a neutral one to ``tokens[:randint(4, len)]``; duplicates of
    male/female sentences are skipped; at most ``n_sentences`` per class.
    The attribute words are lower-cased too (a no-op for bias-bench's all-lower-case English list;
    German nouns such as ``Mann`` would otherwise never match the lower-cased tokens).
    Returns ``{"male": [...], "female": [...], "neutral": [...]}``."""
    import random

    rng = random.Random(seed)
    male_set = {p[0].lower() for p in pairs}
    female_set = {p[1].lower() for p in pairs}
    lines = list(lines)
    rng.shuffle(lines)
    out: dict[str, list[str]] = {"male": [], "female": [], "neutral": []}
    seen: dict[str, set[str]] = {"male": set(), "female": set()}
    for sentence in lines:
        tokens = [t.lower() for t in sentence.split(" ")]
        if len(tokens) < 5:
            continue
        male = female = False
        idx = -1
        for token in tokens:
            if token in male_set:
                male, idx = True, tokens.index(token)
            if token in female_set:
                female, idx = True, tokens.index(token)
            if male and female:
                break
        if not male and not female:
            if len(out["neutral"]) < n_sentences:
                out["neutral"].append(" ".join(tokens[:rng.randint(4, len(tokens))]))
            continue
        if male and female:
            continue
        cls = "male" if male else "female"
        if len(out[cls]) < n_sentences and sentence not in seen[cls]:
            seen[cls].add(sentence)
            out[cls].append(" ".join(tokens[:rng.randint(idx, len(tokens)) + 1]))
        if all(len(v) == n_sentences for v in out.values()):
            break
    return out


def attribute_sentences(lines: Sequence[str], words: Sequence[str], *, n_sentences: int = 10000,
                        seed: int = 0) -> dict[str, list[str]]:
    """bias-bench's INLP training sentences for a bias type other than gender
    (``bias_bench/dataset/inlp.py`` ``_load_race_data`` / ``_load_religion_data``): two classes,
    *bias* (the sentence holds one of ``words``, every word of every tuple, flattened) and *neutral*.

    Conventions as :func:`gender_sentences` (shuffle with ``random.Random(seed)``, single-space split,
    lower-cased tokens and words, fewer than 5 tokens skipped), except: every token is checked and
    ``idx`` is the position of the last matching one (no early stop); a bias sentence is clipped to
    ``tokens[:randint(idx, len) + 1]``, a neutral one to ``tokens[:randint(4, len)]``; duplicate bias
    sentences are skipped; at most ``n_sentences`` per class, and the loop stops once both are full
    (bias-bench checks after each Wikipedia paragraph; here a line is one sentence).
    Returns ``{"bias": [...], "neutral": [...]}`` (labels 1 and 0: :func:`labels_for` ``gender=False``)."""
    import random

    rng = random.Random(seed)
    bias_set = {w.lower() for w in words}
    lines = list(lines)
    rng.shuffle(lines)
    out: dict[str, list[str]] = {"bias": [], "neutral": []}
    seen: set[str] = set()
    for sentence in lines:
        tokens = [t.lower() for t in sentence.split(" ")]
        if len(tokens) < 5:
            continue
        found, idx = False, -1
        for token in tokens:
            if token in bias_set:
                found, idx = True, tokens.index(token)
        if not found:
            if len(out["neutral"]) < n_sentences:
                out["neutral"].append(" ".join(tokens[:rng.randint(4, len(tokens))]))
        elif len(out["bias"]) < n_sentences and sentence not in seen:
            seen.add(sentence)
            out["bias"].append(" ".join(tokens[:rng.randint(idx, len(tokens)) + 1]))
        if all(len(v) == n_sentences for v in out.values()):
            break
    return out

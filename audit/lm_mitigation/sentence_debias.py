"""SentenceDebias: the bias subspace of counterfactual sentence pairs, projected out.

Reference: Liang, Li, Zheng, Lim, Salakhutdinov & Morency (2020), "Towards Debiasing Sentence
Representations", ACL (code pliang279/sent_debias); implementation as bias-bench
(McGill-NLP/bias-bench at 291426a: ``bias_bench/dataset/sentence_debias.py``
``_gender_augment_func``, ``bias_bench/debias/sentence_debias.py`` ``compute_gender_subspace``,
``bias_bench/model/models.py`` ``_SentenceDebiasModel``).

Conventions (bias-bench's):

* counterfactual pairs (:func:`counterfactual_pairs`): a sentence is lower-cased, stripped and
  split on single spaces; for each attribute pair ``(a, b)`` in order, if ``a`` is one of its
  words one example ``(sentence, sentence with every a -> b)`` is added, then if ``b`` is one of
  its words ``(sentence with every b -> a, sentence)``; each example is ``(side 0, side 1)`` where
  side 0 holds the pair's first word (the pairs are lower-cased like the sentences: a no-op for
  bias-bench's all-lower-case list, needed for German nouns; bias-bench's gender file lists male
  first, its code calls side 0 ``female_example`` after unpacking ``(female_word, male_word)``, a naming slip with no
  effect, the subspace being symmetric in the two sides); tuples of ``k > 2`` words (bias-bench's race
  and religion triples, ``_race_augment_func``): for each tuple and each position ``j`` whose word
  is in the sentence, one example of ``k`` sentences, side ``i`` the sentence with every word ``j``
  replaced by word ``i`` (side ``j`` the sentence itself) (:func:`counterfactual_examples`);
* embeddings (:func:`mean_pooled`): batches of ``batch_size`` (32), padded to ``max_length``
  (128) and truncated there, mean of the last hidden state over attended positions, then unit L2
  norm; **bias-bench drops the last incomplete batch** (``len(data) // batch_size`` batches):
  ``drop_last=True`` keeps that behaviour, the default ``False`` encodes every example;
* subspace (:func:`bias_direction`): each side minus the mean of its example (of the ``k`` sides:
  ``compute_race_subspace``), all sides stacked,
  ``sklearn.decomposition.PCA(n_components=k)``; bias-bench keeps the first component (``k=1``),
  whose sign is whatever sklearn's SVD sign convention gives (``svd_flip``);
* debiasing (:func:`project_out`): every token's last hidden state ``x`` becomes
  ``x - (x.v) v / (v.v)`` for each direction ``v``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from audit.backends.batching import inference
from audit.backends.hf_scoring import model_device
from audit.errors import ParameterError
from audit.lm_mitigation.pairs import AttributePairs

__all__ = ["counterfactual_pairs", "counterfactual_examples", "mean_pooled", "bias_direction", "project_out"]


def _replace(old: str, new: str, words: list[str]) -> str:
    return " ".join(new if w == old else w for w in words)


def counterfactual_pairs(sentences: Sequence[str], pairs: AttributePairs | Sequence[Sequence[str]]
                         ) -> list[tuple[str, str]]:
    """``(side 0, side 1)`` counterfactual examples of ``sentences`` (module docstring): for each
    pair ``(a, b)``, ``(text, text with a -> b)`` when ``a`` is in it and ``(text with b -> a,
    text)`` when ``b`` is; :func:`counterfactual_examples` for pairs."""
    rows = pairs.pairs if isinstance(pairs, AttributePairs) else pairs
    for row in rows:
        if len(row) != 2:
            raise ParameterError(f"SentenceDebias pairs need two words each, got {tuple(row)!r}")
    return counterfactual_examples(sentences, rows) if len(rows) else []


def counterfactual_examples(sentences: Sequence[str], pairs: AttributePairs | Sequence[Sequence[str]]
                            ) -> list[tuple[str, ...]]:
    """``(side 0, ..., side k-1)`` counterfactual examples of ``sentences`` for tuples of ``k >= 2``
    words, all of one length (module docstring)."""
    rows = [tuple(w.lower() for w in r) for r in (pairs.pairs if isinstance(pairs, AttributePairs) else pairs)]
    if not rows or len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
        raise ParameterError("SentenceDebias needs attribute tuples of one length, two words or more, got "
                             f"lengths {sorted({len(r) for r in rows})}")
    out: list[tuple[str, ...]] = []
    for s in sentences:
        text = s.lower().strip()
        words = text.split(" ")
        for row in rows:
            for j, w in enumerate(row):
                if w in words:
                    out.append(tuple(text if i == j else _replace(w, row[i], words) for i in range(len(row))))
    return out


def mean_pooled(model: Any, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 32,
                max_length: int = 128, drop_last: bool = False) -> np.ndarray:
    """Unit-norm attention-masked means of the last hidden state (in float32, on the model's device
    whatever its dtype), float32 ``(n, dim)``."""
    import torch

    base = getattr(model, "base_model", model)
    dev = model_device(model)
    n = len(texts) // batch_size * batch_size if drop_last else len(texts)
    out = []
    with inference(no_grad=True):
        for i in range(0, n, batch_size):
            enc = tokenizer(list(texts[i:i + batch_size]), return_tensors="pt", truncation=True,
                            padding="max_length", max_length=max_length)
            m = enc["attention_mask"].to(dev)
            h = base(input_ids=enc["input_ids"].to(dev), attention_mask=m)["last_hidden_state"].float()
            h = (h * m.unsqueeze(-1)).sum(dim=1) / m.sum(dim=1, keepdim=True)
            h = h / torch.norm(h, dim=-1, keepdim=True)
            out.append(h.cpu().numpy())
    if not out:
        raise ParameterError(f"SentenceDebias: no examples to encode ({len(texts)} texts, batch_size {batch_size}, "
                             f"drop_last={drop_last})")
    return np.concatenate(out, axis=0)


def bias_direction(*sides: np.ndarray, n_components: int = 1) -> np.ndarray:
    """PCA components (``k x dim``, float64) of the example-centred embeddings of two or more sides
    (module docstring; ``bias_direction(side0, side1)`` for pairs)."""
    from sklearn.decomposition import PCA

    arrs = [np.asarray(a, dtype=np.float64) for a in sides]
    if len(arrs) < 2 or len({a.shape for a in arrs}) != 1 or arrs[0].ndim != 2 or len(arrs[0]) < 1:
        raise ParameterError("SentenceDebias: the sides must be two or more equal-shape 2-D arrays, got "
                             f"{[a.shape for a in arrs]}")
    if not all(np.isfinite(a).all() for a in arrs):
        raise ParameterError("SentenceDebias embeddings contain NaN or infinite values")
    means = sum(arrs) / float(len(arrs))
    X = np.concatenate([a - means for a in arrs], axis=0)
    if not 1 <= n_components <= min(X.shape):
        raise ParameterError(f"n_components must be in 1..{min(X.shape)}, got {n_components}")
    return PCA(n_components=n_components).fit(X).components_


def project_out(X: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """``x - (x.v) v / (v.v)`` applied for each direction ``v`` (rows of ``directions``) to every
    row of ``X`` (any leading shape: the last axis is the hidden size)."""
    X = np.array(X, dtype=np.float64)
    for v in np.atleast_2d(np.asarray(directions, dtype=np.float64)):
        X = X - np.multiply.outer(X @ v, v) / (v @ v)
    return X

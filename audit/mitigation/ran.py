"""Repulsion-Attraction-Neutralization (Kumar et al. 2020)."""

from __future__ import annotations

from typing import Annotated, Any, Iterable

import numpy as np
from pydantic import BeforeValidator, Field

from audit.errors import ParameterError
from audit.mitigation.base import (
    Mitigation,
    bias_subspace,
    normalize_rows,
    resolve_sets,
    scope_mask,
)
from audit.schema import Int, Num, OneOf, Refused, Section
from audit.mitigation.definitions import BiasDefinitions
from audit.mitigation.matrix import EmbeddingMatrix, as_matrix

__all__ = ["RepulsionAttractionNeutralization", "indirect_bias"]


def _size_batches(sorted_counts: np.ndarray, max_words: int, max_slots: int) -> list[slice]:
    """Consecutive slices of words sorted by repulsion-set size: at most ``max_words`` words and
    at most ``max_slots`` padded neighbour slots (words x largest set) per slice."""
    out, start, n = [], 0, sorted_counts.size
    while start < n:
        stop = start + 1
        while (stop < n and stop - start < max_words
               and (stop + 1 - start) * max(1, int(sorted_counts[stop])) <= max_slots):
            stop += 1
        out.append(slice(start, stop))
        start = stop
    return out


def _unit_rows32(X: np.ndarray) -> np.ndarray:
    """float32 copy of ``X`` with unit rows (zero rows stay zero), as gensim normalises."""
    out = np.array(X, dtype=np.float32)
    for start in range(0, out.shape[0], 65536):
        block = out[start : start + 65536]
        n = np.linalg.norm(block, axis=1, keepdims=True)
        np.divide(block, n, out=block, where=n > 0)
    return out


def indirect_bias(w: np.ndarray, v: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Bolukbasi et al. (2016, Sec. 5) indirect bias of unit vectors ``w`` and ``v`` with respect
    to the unit direction ``g``: ``(w.v - cos(w_perp, v_perp)) / (w.v)``, where
    ``x_perp = x - (x.g) g``. Broadcasts over leading axes (``w`` and ``v`` of shape (..., dim))."""
    wv = np.sum(w * v, axis=-1)
    wp = w - (w @ g)[..., None] * g
    vp = v - (v @ g)[..., None] * g
    with np.errstate(divide="ignore", invalid="ignore"):  # w.v = 0 -> inf/NaN: never > theta
        cos_p = np.sum(wp * vp, axis=-1) / (np.linalg.norm(wp, axis=-1) * np.linalg.norm(vp, axis=-1))
        return (wv - cos_p) / wv


def _three(w: Any) -> Any:
    if isinstance(w, (str, bytes)) or not isinstance(w, (list, tuple)) or len(w) != 3:
        raise Refused(f"expected three numbers (repulsion, attraction, neutralization), got {w!r}")
    return w


class RepulsionAttractionNeutralization(Mitigation):
    """RAN-Debias: per-word optimisation that repels biased neighbours, attracts the original
    vector and neutralises the gender direction.

    Kumar, Bhotia, Kumar & Chakraborty (2020), "Nurse is Closer to Woman than Surgeon?
    Mitigating Gender-Biased Proximities in Word Embeddings", TACL 8 (arXiv:2006.01938;
    reference code github.com/TimeTraveller-San/RAN-Debias). For each word ``w`` to debias
    (unit vector), with ``g`` the gender direction (Hard Debias' ``fit``):

    - repulsion set ``S``: among the ``n_neighbours`` nearest words of ``w`` by cosine (the
      whole vocabulary, ``w`` itself excluded), those with indirect bias
      :func:`indirect_bias` ``beta(n, w) > theta``;
    - minimise ``F(w_d) = l1 * F_r + l2 * F_a + l3 * F_n`` from ``w_d = w``, with
      ``F_r = mean_{n in S} |cos(w_d, n)|`` (0 when ``S`` is empty),
      ``F_a = |cos(w_d, w) - 1| / 2`` and ``F_n = |cos(w_d, g)|`` (``neutralization="cosine"``,
      as written in the paper) or ``|w_d . g|`` (``"dot"``, as WEFE 1.0.1 computes it);
    - Adam (PyTorch, ``learning_rate``) for ``epochs`` steps; the result is ``w_d / |w_d|``.

    The words are independent, and Adam updates each coordinate from its own gradient
    history, so optimising a batch of words on the sum of their losses performs exactly the
    per-word optimisation of the reference code and WEFE, only vectorised.

    Difference from WEFE 1.0.1: its ``RAN`` builds ``RAN_Loss(self.w, self.w_b, ...)`` while the
    signature is ``RAN_Loss(w_b, w, ...)``, so it optimises a copy of the original vector and
    returns a second vector that is only attracted to that copy. With the two arguments in
    order, WEFE's per-word loop reproduces our vectors (``neutralization="dot"``, to 1e-5;
    tested).

    Parameters
    ----------
    weights : (float, float, float), default (0.33, 0.33, 0.33)
        ``(l1, l2, l3)``; WEFE's default (the reference code's own weights may differ).
    theta : float, default 0.05
        Indirect-bias threshold of the repulsion set.
    n_neighbours : int, default 100
        Neighbours examined per word.
    epochs : int, default 300
    learning_rate : float, default 0.01
    neutralization : {"cosine", "dot"}, default "cosine"
    n_components : int, default 10
        PCA components computed on the definitional pairs (only the first is ``g``).
    batch_size : int, default 2048
        Words per neighbour-search chunk and at most per optimisation batch; an optimisation
        batch holds at most ``8 * batch_size`` padded neighbour slots (words are grouped by
        repulsion-set size).
    n_threads : int, optional
        PyTorch intra-op threads during ``transform`` (restored afterwards); ``None`` keeps the
        current setting. On a loaded machine 1 thread was 6x faster for small batches.

    Cost: the neighbour search is ``O(n_debiased * n_words * dim)``; debiasing all 400k GloVe
    words means a 400k x 400k similarity product, so debias the words you need (``words=``):
    each word's result depends only on the original vectors, so it is the same as in a full run.

    Left untouched: the gender-specific words, and the words not listed in ``words`` when it
    is given, keep their direction; every output row is unit norm (as in WEFE, which
    normalises the whole model). Depends on the vocabulary: neighbours are searched in the
    model given to ``transform``.
    """

    name = "repulsion_attraction_neutralization"
    reference = "Kumar et al. (2020), TACL"

    class Params(Section):
        #: repulsion, attraction, neutralization
        weights: Annotated[tuple[Num(), Num(), Num()], BeforeValidator(_three), Field(strict=False)] = (0.33,) * 3
        theta: Num() = 0.05
        n_neighbours: Int(1) = 100
        epochs: Int(0) = 300
        learning_rate: Num(0.0, strict=True) = 0.01
        neutralization: OneOf("neutralization", ("cosine", "dot")) = "cosine"
        n_components: Int(1) = 10
        batch_size: Int(1) = 2048
        n_threads: Int(1) | None = None

    def __init__(
        self,
        *,
        weights: tuple[float, float, float] = (0.33, 0.33, 0.33),
        theta: float = 0.05,
        n_neighbours: int = 100,
        epochs: int = 300,
        learning_rate: float = 0.01,
        neutralization: str = "cosine",
        n_components: int = 10,
        batch_size: int = 2048,
        n_threads: int | None = None,
    ) -> None:
        self._init_params(weights=weights, theta=theta, n_neighbours=n_neighbours, epochs=epochs,
                          learning_rate=learning_rate, neutralization=neutralization, n_components=n_components,
                          batch_size=batch_size, n_threads=n_threads)


    def fit(self, model: Any, definitions: BiasDefinitions | str) -> RepulsionAttractionNeutralization:
        """Learn the gender direction (as Hard Debias: first PC of the centred unit pairs)."""
        m, d = self._start_fit(model, definitions)
        pairs, _ = resolve_sets(type(self).__name__, m, d.definitional_sets, "definitional sets", min_sets=2)
        groups = [normalize_rows(m.vectors[m.rows(p)]) for p in pairs]
        comps, evr = bias_subspace(groups, self.n_components)
        self.bias_direction_ = comps[0]
        self.explained_variance_ratio_ = evr
        self.definitional_sets_ = pairs
        self.protected_ = {w.lower() for w in d.specific_words}
        return self

    def transform(self, model: Any, words: Iterable[str] | None = None) -> EmbeddingMatrix:
        """Debias ``words`` (default: all but the gender-specific words); all rows come back unit norm."""
        import torch

        self._check_fitted("bias_direction_")
        previous = torch.get_num_threads()
        if self.n_threads is not None:
            torch.set_num_threads(int(self.n_threads))
        try:
            return self._transform(model, words)
        finally:
            torch.set_num_threads(previous)

    def _transform(self, model: Any, words: Iterable[str] | None) -> EmbeddingMatrix:
        import torch

        m = as_matrix(model)
        self._check_dim(m)
        if len(m) < 2:
            raise ParameterError(f"{type(self).__name__}: model {m.ref!r} needs at least two words")
        mask = scope_mask(m, words, self.protected_)
        Vn = _unit_rows32(m.vectors)
        targets = np.flatnonzero(mask & Vn.any(axis=1))  # an all-zero vector is left as it is
        out = Vn.copy()
        k = int(min(self.n_neighbours, len(m) - 1))
        g32 = self.bias_direction_.astype(np.float32)
        g = torch.from_numpy(g32)
        all_t = torch.from_numpy(Vn)
        # 1. repulsion sets: the neighbours with indirect bias > theta, packed first in each row
        rep = np.zeros((targets.size, k), dtype=np.int32)
        count = np.zeros(targets.size, dtype=np.int64)
        for start in range(0, targets.size, self.batch_size):
            rows = targets[start : start + self.batch_size]
            nb = self._neighbours(all_t, rows, k).numpy()
            beta = indirect_bias(Vn[nb], Vn[rows][:, None, :], g32)
            keep = beta > self.theta
            order = np.argsort(~keep, axis=1, kind="stable")
            rep[start : start + rows.size] = np.take_along_axis(nb, order, axis=1)
            count[start : start + rows.size] = keep.sum(axis=1)
        # 2. optimise words with similar set sizes together (less padding; words are independent)
        by_size = np.argsort(count, kind="stable")
        for sel in _size_batches(count[by_size], self.batch_size, self.batch_size * 8):
            sel = by_size[sel]
            width = max(1, int(count[sel].max()))
            N = all_t[torch.from_numpy(rep[sel, :width].astype(np.int64))]  # (B, width, dim)
            rep_mask = torch.from_numpy((np.arange(width)[None, :] < count[sel][:, None]).astype(np.float32))
            W = all_t[torch.from_numpy(targets[sel])]
            out[targets[sel]] = self._optimise(W, N, rep_mask, g).numpy()
        return self._result(
            m, out,
            {"n_debiased": int(targets.size),
             "mean_repulsion_set_size": float(count.mean()) if count.size else 0.0},
        )

    @staticmethod
    def _neighbours(all_t, rows: np.ndarray, k: int):
        """Indices (B, k) of the k most similar words of each row (itself excluded), by cosine,
        in chunks that keep the (chunk, n_words) similarity block under ~256 MB."""
        import torch

        n = all_t.shape[0]
        chunk = max(1, (1 << 26) // n)
        res = []
        for s in range(0, rows.size, chunk):
            r = torch.from_numpy(rows[s : s + chunk])
            sims = all_t[r] @ all_t.T
            sims[torch.arange(r.numel()), r] = -float("inf")
            res.append(torch.topk(sims, k, dim=1).indices)
        return torch.cat(res, dim=0)

    def _optimise(self, W, N, rep_mask, g):
        import torch

        l1, l2, l3 = (float(x) for x in self.weights)
        count = rep_mask.sum(dim=1)
        has_rep = (count > 0).to(torch.float32)
        count = count.clamp(min=1.0)
        Nn = N / N.norm(dim=2, keepdim=True).clamp_min(1e-12)
        wb = torch.nn.Parameter(W.clone())
        opt = torch.optim.Adam([wb], lr=float(self.learning_rate))
        for _ in range(int(self.epochs)):
            opt.zero_grad()
            norm = wb.norm(dim=1)
            cos_n = torch.bmm(Nn, wb.unsqueeze(2)).squeeze(2) / norm[:, None]
            rep = (cos_n.abs() * rep_mask).sum(dim=1) / count * has_rep
            att = (torch.sum(wb * W, dim=1) / (norm * W.norm(dim=1)) - 1.0).abs() / 2.0
            proj = wb @ g
            neu = (proj / norm).abs() if self.neutralization == "cosine" else proj.abs()
            loss = (l1 * rep + l2 * att + l3 * neu).sum()
            loss.backward()
            opt.step()
        with torch.no_grad():
            return wb / wb.norm(dim=1, keepdim=True)

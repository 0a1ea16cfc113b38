"""Counterfactual data augmentation (CDA), two-sided.

References: Zmigrod, Mielke, Wallach & Cotterell (2019), ACL; Webster, Wang, Tenney, Beutel, Pitler,
Pavlick, Chen, Chi & Petrov (2020), arXiv:2010.06032 (two-sided CDA: the original *and* its
counterfactual are both kept); implementation as bias-bench (McGill-NLP/bias-bench at 291426a,
``experiments/run_mlm.py`` ``gender_counterfactual_augmentation``).

Conventions (bias-bench's, kept token for token):

* a text is split on whitespace (``str.split()``); its counterfactual is re-joined with single
  spaces, the original is kept as given;
* every word equal to one word of a pair is replaced by the other word of the pair; the word list
  is the pairs followed by the pairs with each punctuation mark of
  :data:`audit.lm_mitigation.pairs.PUNCTUATION` glued on (``he,`` <-> ``she,``); matching is exact
  and case-sensitive (bias-bench decodes an uncased tokenizer's ids, so its text is lower case:
  pass ``lower=True`` for uncased models); when a word belongs to several pairs the *last* pair
  in that list wins (bias-bench's loop overwrites);
* tuples of ``k > 2`` words (bias-bench's race and religion triples, ``ternary_counterfactual_augmentation``):
  for each text, one target position is drawn for each position ``j`` among the other ``k - 1``
  (``rng.choice``, in the order ``j = 0..k-1``: bias-bench's ``random.choice([1, 2])``,
  ``([0, 2])``, ``([0, 1])``), and every word at position ``j`` of a tuple becomes that tuple's word
  at the drawn position; the draws come from ``random.Random(seed)`` (bias-bench: the global
  ``random`` after ``set_seed``), so one counterfactual per text, reproducible;
* a text with at least one swap yields ``[counterfactual, original]`` (in that order); a text
  without any attribute word yields nothing (``keep_unmatched=False``, bias-bench: the mapped
  dataset holds only the augmented examples) or itself (``keep_unmatched=True``).

Limit (of word-for-word CDA, not of this implementation): in languages with grammatical gender the
words around a swapped noun do not follow (``Der Vater`` -> ``Der Mutter``); the corpus then holds
ungrammatical counterfactuals, as Zmigrod et al. (2019) discuss for Spanish and Hebrew.

Documented difference: bias-bench augments the decoded 128-token chunks of the tokenised,
grouped corpus; biasaudit augments the user's corpus line by line (one sentence per line), before
tokenisation, so a swap never changes where a chunk ends.
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence

from audit.errors import ParameterError
from audit.lm_mitigation.pairs import AttributePairs, with_punctuation

__all__ = ["swap_map", "counterfactual", "augment_corpus"]


def swap_map(pairs: AttributePairs | Sequence[Sequence[str]], *, punctuation: bool = True) -> dict[str, str]:
    """Word -> its counterfactual, for two-word pairs; the last pair containing a word wins."""
    rows = with_punctuation(pairs) if punctuation else list(pairs.pairs if isinstance(pairs, AttributePairs)
                                                              else pairs)
    out: dict[str, str] = {}
    for row in rows:
        if len(row) != 2:
            raise ParameterError(f"CDA swaps word pairs; got a {len(row)}-word entry {tuple(row)!r}")
        m, f = row
        out[m] = f
        out[f] = m
    return out


def counterfactual(text: str, mapping: dict[str, str]) -> str | None:
    """``text`` with every attribute word swapped (whitespace split, single-space join), or
    ``None`` when it has no attribute word."""
    words = text.split()
    swapped = [mapping.get(w, w) for w in words]
    if not any(w in mapping for w in words):
        return None
    return " ".join(swapped)


def _tuple_map(pairs: AttributePairs | Sequence[Sequence[str]], *, punctuation: bool) -> dict[str, tuple]:
    """Word -> (its tuple, its position), for tuples of ``k > 2`` words; the last tuple wins."""
    rows = with_punctuation(pairs) if punctuation else list(pairs.pairs if isinstance(pairs, AttributePairs)
                                                              else pairs)
    k = {len(r) for r in rows}
    if len(k) != 1 or min(k) < 3:
        raise ParameterError(f"CDA over tuples needs tuples of one length of three words or more, got lengths "
                             f"{sorted(k)}")
    return {w: (tuple(r), j) for r in rows for j, w in enumerate(r)}


def _tuple_counterfactual(text: str, mapping: dict[str, tuple], k: int, rng: random.Random) -> str | None:
    targets = [rng.choice([i for i in range(k) if i != j]) for j in range(k)]
    words = text.split()
    if not any(w in mapping for w in words):
        return None
    return " ".join(mapping[w][0][targets[mapping[w][1]]] if w in mapping else w for w in words)


def augment_corpus(texts: Iterable[str], pairs: AttributePairs | Sequence[Sequence[str]], *,
                   punctuation: bool = True, keep_unmatched: bool = False, lower: bool = False,
                   seed: int = 0) -> list[str]:
    """Two-sided CDA of ``texts``: ``[counterfactual, original]`` for each text with an attribute
    word (see the module docstring for the conventions; ``seed``: the draws of tuples of 3+ words)."""
    rows = list(pairs.pairs if isinstance(pairs, AttributePairs) else pairs)
    n_sided = bool(rows) and len(rows[0]) > 2
    if n_sided:
        tmap, rng, k = _tuple_map(rows, punctuation=punctuation), random.Random(seed), len(rows[0])
    else:
        mapping = swap_map(rows, punctuation=punctuation)
    out: list[str] = []
    for t in texts:
        if lower:
            t = t.lower()
        c = _tuple_counterfactual(t, tmap, k, rng) if n_sided else counterfactual(t, mapping)
        if c is not None:
            out += [c, t]
        elif keep_unmatched:
            out.append(t)
    return out

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


def augment_corpus(texts: Iterable[str], pairs: AttributePairs | Sequence[Sequence[str]], *,
                   punctuation: bool = True, keep_unmatched: bool = False, lower: bool = False) -> list[str]:
    """Two-sided CDA of ``texts``: ``[counterfactual, original]`` for each text with an attribute
    word (see the module docstring for the conventions)."""
    mapping = swap_map(pairs, punctuation=punctuation)
    out: list[str] = []
    for t in texts:
        if lower:
            t = t.lower()
        c = counterfactual(t, mapping)
        if c is not None:
            out += [c, t]
        elif keep_unmatched:
            out.append(t)
    return out

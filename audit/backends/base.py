"""The interfaces backends implement: word vectors (static models) and the model interface
(:class:`LanguageModel`) that the measure families call."""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@dataclasses.dataclass
class Lookup:
    """Vectors for the words a backend knows.

    vectors: word -> 1-D float array (the backend's dtype; metrics cast to float64).
             Words the backend does not know are absent.
    subword: the words whose vectors were synthesised from subwords (fastText ``.bin`` OOV),
             reported in results as such.
    """

    vectors: dict[str, np.ndarray]
    subword: set[str] = dataclasses.field(default_factory=set)


@runtime_checkable
class WordVectors(Protocol):
    """A loaded model that maps single words (no spaces) to vectors.

    ref:      the reference the user gave (path or short name).
    backend:  the backend name (``fasttext``, ``word2vec-text``, ``word2vec-bin``, ``npy``,
              ``spacy``, ``glove-6b-50d``, ``hf-encoder`` ...).
    revision: a resolved revision: a commit hash for hub models, a content digest
              (``sha256:...`` of the file(s), or of size+mtime+head for very large files) for
              local files, a package version for packaged models.
    dim:      vector dimension.
    """

    ref: str
    backend: str
    revision: str
    dim: int

    def lookup(self, words: Sequence[str]) -> Lookup: ...


@runtime_checkable
class LanguageModel(Protocol):
    """The model interface the measure families use (and nothing else does), like
    lm-evaluation-harness's ``LM``: a family never imports torch nor touches a model's weights or
    tokenizer; an engine (Hugging Face: :class:`audit.backends.hf.HFModel`; sentence-transformers;
    later vLLM) implements the operations its model kinds support and raises
    :class:`~audit.errors.ModelError` (one line naming the model and the operation) for the others.

    Every operation is batched (``batch_size=None``: the engine's automatic size, halved on CUDA
    out-of-memory where the engine can) and returns arrays in the order of its inputs. The
    conventions are the engine's and documented there, in one place each (Hugging Face:
    :mod:`audit.backends.hf_scoring` for the start token -- BOS, else EOS, exactly once --, padding
    with explicit position ids, float32 log-softmax summed in float64, the LM head on scored
    positions only, shared prefixes computed once; :mod:`audit.backends.hf_embed` for pooling and
    layers; :mod:`audit.backends.hf_generate` for top-k and decoding). An input longer than the
    model accepts (:attr:`max_length`) is refused with :class:`~audit.errors.DataError` naming it,
    never truncated silently.

    Attributes: ``ref``, ``backend``, ``revision`` (as :class:`WordVectors`), ``kind``
    (``encoder`` | ``mlm`` | ``causal`` | ``sentence``), ``dim`` (embedding width),
    ``num_hidden_layers``, ``max_length``.

    Operations (the families that use them):

    * ``loglikelihood(requests)`` -- ``(context, continuation)`` pairs -> ``(scores, n_tokens)``:
      causal LMs ``log P(continuation | context)``; masked LMs the pseudo-log-likelihood of the
      continuation's tokens (BBQ options, causal LPBS).
    * ``loglikelihood_rolling(sentences)`` -> ``(ll, n_tokens)`` of whole sentences (CrowS-Pairs, causal).
    * ``start`` (``loglikelihood``, ``loglikelihood_rolling``, ``first_words``, ``samples``; causal
      LMs): the start-token rule, ``"always"`` (default: the start token first, always) or
      ``"harness"`` (lm-evaluation-harness: only where the tokenizer adds one, or before an empty
      context); the families' ``start_token`` parameter.
    * ``pair_pll(pairs)`` -> ``(n, 3)`` CrowS-Pairs masked-LM scores (shared tokens masked in turn).
    * ``masked_scores(requests)`` -- ``(text, scored span, other masked spans)`` -> per-token
      log-probabilities of the scored span's tokens (LPBS, masked).
    * ``topk_fills(templates, k, slot)`` -> ``(words, logprobs)`` (HONEST, masked).
    * ``first_words(prompts, k, decoding, seed, max_new_tokens)`` -> ``(words, logprobs)``:
      generation until the first word ends (HONEST, causal).
    * ``generate_until(prompts, until, max_new_tokens)`` -> the greedy continuation of each prompt,
      cut before the first stop string (generative BBQ).
    * ``render_chat(texts, system_instruction)`` -> each text as a user turn rendered by the
      tokenizer's chat template, the assistant turn opened; ``chat_template_digest``. A family
      given ``chat_template: true`` measures on :class:`audit.backends.chat.ChatModel`, which
      routes ``loglikelihood``, ``loglikelihood_rolling``, ``first_words`` and ``generate_until``
      through it (``start="harness"``: the start token only where the tokenizer adds it).
    * ``samples(prompts, k, seed, max_new_tokens, temperature, top_k, top_p)`` -> per prompt ``k``
      sampled continuations as text (HONEST ``official`` protocol, causal).
    * ``embed(sentences, method, spans, layer)`` -> float32 ``(n, dim)`` pooled embeddings of
      sentences or of character spans in them (SEAT, word metrics on contextual models).
    * ``count_tokens(texts)``, ``token_positions(text, spans)``, ``is_unknown_word(word)``: the
      engine's token bookkeeping that families need for truncation, counts and missing words.
    """

    ref: str
    backend: str
    revision: str
    kind: str

    def loglikelihood(self, requests: Sequence[tuple[str, str]], *, batch_size: int | None = None,
                      start: str = "always"): ...

    def loglikelihood_rolling(self, sentences: Sequence[str], *, batch_size: int | None = None,
                              start: str = "always"): ...

    def pair_pll(self, pairs: Sequence[tuple[str, str]], *, batch_size: int | None = None): ...

    def masked_scores(self, requests: Sequence, *, batch_size: int | None = None): ...

    def topk_fills(self, templates: Sequence[str], k: int, *, slot: str = "[M]", batch_size: int | None = None): ...

    def first_words(self, prompts: Sequence[str], k: int, *, decoding: str = "greedy", seed: int = 0,
                    max_new_tokens: int = 8, batch_size: int | None = None, start: str = "always"): ...

    def samples(self, prompts: Sequence[str], k: int, *, seed: int = 0, max_new_tokens: int = 10,
                temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0, batch_size: int | None = None,
                start: str = "always"): ...

    def generate_until(self, prompts: Sequence[str], *, until: Sequence[str] = (), max_new_tokens: int = 256,
                       batch_size: int | None = None) -> list[str]: ...

    def render_chat(self, texts: Sequence[str], *, system_instruction: str | None = None) -> list[str]: ...

    def embed(self, sentences: Sequence[str], *, method: str | None = None, spans: Sequence | None = None,
              layer: int = -1, batch_size: int | None = 32, padding_side: str = "right"): ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...

    def token_positions(self, text: str, spans: Sequence[tuple[int, int]]) -> list[list[int]]: ...

    def is_unknown_word(self, word: str) -> bool: ...

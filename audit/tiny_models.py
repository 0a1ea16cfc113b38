"""Tiny local Hugging Face models for tests (no network, no model hub).

Three builders write a complete ``save_pretrained`` directory (``config.json``,
``model.safetensors``, tokenizer files) and return its path:

* :func:`build_tiny_bert`    -- ``BertForMaskedLM`` + WordPiece ``BertTokenizerFast`` (uncased,
  ``[CLS] ... [SEP]``, ``[MASK]``);
* :func:`build_tiny_roberta` -- ``RobertaForMaskedLM`` + byte-level BPE ``RobertaTokenizerFast``
  (``<s> ... </s>``, ``<mask>``);
* :func:`build_tiny_gpt2`    -- ``GPT2LMHeadModel`` + byte-level BPE ``GPT2TokenizerFast`` whose
  BOS/EOS token is ``<|endoftext|>`` (GPT-2 does not add it by itself; callers prepend it);
* :func:`build_tiny_distilbert` -- ``DistilBertForMaskedLM`` + the same uncased WordPiece
  vocabulary as the BERT model (``DistilBertTokenizerFast``; no token type ids).

Sizes: hidden 32, 2 layers, 2 heads, intermediate 64, 128 positions. The tokenizers are trained
on a small generated corpus (:func:`tiny_corpus`) that contains the words of English WEAT/LPBS
word lists and of the first CrowS-Pairs sentences (read from ``../shared/data`` when present,
with an embedded fallback), with a small vocabulary so that many words split into several
subtokens, as with real models. Each model is then trained for a few seeded steps on the corpus
so that its predictions are not uniform (< 5 s each on a laptop CPU).

Content is deterministic: same corpus, same seeds, single-threaded training inside a forked RNG
(the caller's global torch/random state is untouched).

:func:`tiny_model_dir` is the pytest-independent cache: it builds each kind once per cache root
(default ``$TMPDIR/biasaudit-tiny-models-<digest>``, digest over this file's source and the
corpus, so an edited builder never serves stale models), atomically (build in a temporary
sibling, then rename), so concurrent test processes share it safely. A pytest fixture can wrap
it, e.g. ``tiny_model_dir("bert", tmp_path_factory.getbasetemp())``.

Keep this module's public API stable: other test files import it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Callable

from audit import schema
from audit.datasets.corpus import corpus_from_tests
from audit.datasets.external import data_root
from audit.outputs import private_folder

__all__ = [
    "KINDS",
    "build_tiny_bert",
    "build_tiny_roberta",
    "build_tiny_gpt2",
    "build_tiny_distilbert",
    "build_tiny_causal",
    "build_tiny_llama",
    "build_tiny_qwen2",
    "build_tiny_mistral",
    "build_tiny_instruct",
    "build_tiny_st",
    "build_random",
    "INSTRUCT_CHAT_TEMPLATE",
    "CAUSAL_FAMILIES",
    "CAUSAL_KINDS",
    "tiny_corpus",
    "tiny_model_dir",
    "load_tiny",
]

KINDS = ("bert", "roberta", "gpt2", "distilbert", "llama", "qwen2", "mistral", "instruct")

HIDDEN = 32
LAYERS = 2
HEADS = 2
INTERMEDIATE = 64
MAX_POSITIONS = 128
SEED = 1234
TRAIN_STEPS = 40
TRAIN_BATCH = 32
TRAIN_MAX_LEN = 48

_SHARED = data_root()  # $BIASAUDIT_DATA, else ../shared/data beside the checkout

# Used when ../shared/data is absent (and always, in addition to the shared lists).
_FALLBACK_WORDS = (
    "flower flowers insect insects rose tulip daisy spider moth wasp caress freedom health love "
    "peace cheer friend heaven loyal pleasure diamond gentle honest lucky rainbow abuse crash "
    "filth murder sickness accident death grief poison stink assault disaster hatred pollute "
    "tragedy he she boys men girls women math algebra geometry calculus equations computation "
    "numbers addition poetry art dance literature novel symphony drama sculpture man woman "
    "doctor nurse engineer teacher rich poor black white old young christian muslim jewish "
    "immigrant american african asian european gay straight disabled fat thin"
).split()

_FALLBACK_SENTENCES = (
    "The poor are really ignorant about how to handle the money they do have.",
    "The rich are really ignorant about how to handle the money they do have.",
    "He was a doctor and she was a nurse at the hospital.",
    "She was a doctor and he was a nurse at the hospital.",
    "Women are bad at math and men are good at engineering.",
    "Old people cannot learn how to use a computer.",
    "Young people cannot learn how to use a computer.",
)

_TEMPLATES = (
    "TARGET is ATTRIBUTE.",
    "TARGET are ATTRIBUTE.",
    "TARGET likes ATTRIBUTE.",
    "TARGET like ATTRIBUTE.",
    "TARGET is interested in ATTRIBUTE.",
    "this is a TARGET and it is ATTRIBUTE.",
    "the TARGET was very ATTRIBUTE today.",
)


def _shared_words_and_sentences() -> tuple[list[str], list[str]]:
    """Words of the English WEAT/LPBS lists and the first 200 CrowS-Pairs pairs, if present."""
    words: list[str] = []
    sentences: list[str] = []
    weat = _SHARED / "bias-framework" / "en" / "WEAT"
    if weat.is_dir():
        for f in sorted(weat.glob("*.txt")):
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    words += [w.strip() for w in line.split(",") if w.strip()]
    lpbs = _SHARED / "bias-framework" / "en" / "LPBS"
    if lpbs.is_dir():
        for f in sorted(lpbs.glob("*.jsonl")):
            obj = json.loads(f.read_text(encoding="utf-8"))
            for key in ("targ1", "targ2"):
                for form in ("singular", "plural"):
                    words += list(obj.get(key, {}).get(form, []))
            for key in ("attr1", "attr2"):
                words += list(obj.get(key, []))
    crows = _SHARED / "crows-pairs" / "crows_pairs_anonymized.csv"
    if crows.is_file():
        import csv

        with crows.open(encoding="utf-8", newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                if i >= 200:
                    break
                sentences += [row["sent_more"], row["sent_less"]]
    return words, sentences


def tiny_corpus() -> list[str]:
    """The deterministic training corpus (a list of sentences).

    CrowS-Pairs sentences (first 200 pairs, both sides, when the shared data are present) and the
    fallback sentences, plus 2000 template sentences that put the WEAT/LPBS words in
    ``TARGET is ATTRIBUTE.``-like frames (seeded ``random.Random(SEED)``).
    """
    words, sentences = _shared_words_and_sentences()
    vocab = sorted(set(words) | set(_FALLBACK_WORDS))
    rng = random.Random(SEED)
    generated = []
    for _ in range(2000):
        t = rng.choice(_TEMPLATES)
        generated.append(t.replace("TARGET", rng.choice(vocab)).replace("ATTRIBUTE", rng.choice(vocab)))
    return list(sentences) + list(_FALLBACK_SENTENCES) + generated


# --------------------------------------------------------------------------- tokenizers


def _learn_bpe(word_counts: dict[str, int], n_merges: int, join) -> list[tuple[str, str]]:
    """Deterministic BPE merges (the ``tokenizers`` trainers break count ties by hash order, so
    their vocabularies change from run to run). Most frequent pair first, ties broken by the
    lexicographically smallest pair. ``word_counts`` maps a tuple of initial symbols to a count;
    ``join(a, b)`` is the merged symbol."""
    import heapq
    from collections import Counter, defaultdict

    words = [list(w) for w in sorted(word_counts)]
    counts = [word_counts[w] for w in sorted(word_counts)]
    pairs: Counter = Counter()
    where: dict = defaultdict(set)
    for i, syms in enumerate(words):
        for p in zip(syms, syms[1:]):
            pairs[p] += counts[i]
            where[p].add(i)
    # (-count, pair) of every pair at its current count, plus stale entries skipped when popped:
    # the smallest valid entry is min(pairs.items(), key=lambda kv: (-kv[1], kv[0])), found
    # without scanning every pair at every merge
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        while heap and pairs.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)
        if not heap:
            break
        best = heap[0][1]
        merged = join(*best)
        merges.append(best)
        touched = set()
        for i in sorted(where.pop(best, ())):
            syms = words[i]
            for p in zip(syms, syms[1:]):
                pairs[p] -= counts[i]
                touched.add(p)
                if pairs[p] <= 0:
                    del pairs[p]
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and (syms[j], syms[j + 1]) == best:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pairs[p] += counts[i]
                where[p].add(i)
                touched.add(p)
        for p in touched:
            if p in pairs:
                heapq.heappush(heap, (-pairs[p], p))
    return merges


def _train_wordpiece(corpus: list[str], vocab_size: int) -> dict[str, int]:
    """Uncased WordPiece vocabulary (``##`` continuation) learnt by deterministic BPE merges."""
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    word_counts: Counter = Counter()
    for s in corpus:
        for w, _ in pre.pre_tokenize_str(norm.normalize_str(s)):
            word_counts[(w[0],) + tuple("##" + c for c in w[1:])] += 1
    alphabet = sorted({c for w in word_counts for c in w})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    n_merges = vocab_size - len(specials) - len(alphabet)
    merges = _learn_bpe(word_counts, n_merges,
                        lambda a, b: a + (b[2:] if b.startswith("##") else b))
    tokens = specials + alphabet
    for a, b in merges:
        t = a + (b[2:] if b.startswith("##") else b)
        if t not in tokens:
            tokens.append(t)
    return {t: i for i, t in enumerate(tokens)}


def _train_bytelevel_bpe(corpus: list[str], vocab_size: int, special: list[str]):
    """Byte-level BPE (GPT-2/RoBERTa style, no prefix space): ``(vocab, merges)``, deterministic."""
    from collections import Counter

    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    word_counts: Counter = Counter()
    for s in corpus:
        for w, _ in pre.pre_tokenize_str(s):
            word_counts[tuple(w)] += 1
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_merges = vocab_size - len(special) - len(alphabet)
    merges = _learn_bpe(word_counts, n_merges, lambda a, b: a + b)
    tokens = list(special) + alphabet
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    return {t: i for i, t in enumerate(tokens)}, merges


# --------------------------------------------------------------------------- training


def _train_steps(model, tokenizer, corpus: list[str], *, mlm: bool) -> None:
    """A few seeded AdamW steps (MLM: 15 % masking, never special tokens; causal: next token)."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    order = torch.randperm(len(corpus), generator=g).tolist()
    for step in range(TRAIN_STEPS):
        idx = [order[(step * TRAIN_BATCH + j) % len(order)] for j in range(TRAIN_BATCH)]
        batch_text = [corpus[i] for i in idx]
        if not mlm and tokenizer.bos_token is not None:
            batch_text = [tokenizer.bos_token + s for s in batch_text]
        enc = tokenizer(batch_text, padding=True, truncation=True, max_length=TRAIN_MAX_LEN,
                        return_tensors="pt", return_special_tokens_mask=mlm)
        input_ids = enc["input_ids"]
        attn = enc["attention_mask"]
        labels = input_ids.clone()
        if mlm:
            special = enc["special_tokens_mask"].bool() | (attn == 0)
            pick = (torch.rand(input_ids.shape, generator=g) < 0.15) & ~special
            labels[~pick] = -100
            input_ids = input_ids.clone()
            input_ids[pick] = tokenizer.mask_token_id
        else:
            labels[attn == 0] = -100
        out = model(input_ids=input_ids, attention_mask=attn, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    model.eval()


class _Deterministic:
    """Forked torch/python RNG, one thread: same bytes every build, caller state untouched."""

    def __enter__(self):
        import torch

        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self._fork = torch.random.fork_rng(devices=[])
        self._fork.__enter__()
        torch.manual_seed(SEED)
        self._py_state = random.getstate()
        return self

    def __exit__(self, *exc):
        import torch

        random.setstate(self._py_state)
        self._fork.__exit__(*exc)
        torch.set_num_threads(self._threads)
        return False


# --------------------------------------------------------------------------- builders


def _init_train_save(out: Path, tokenizer, model_cls, config, train: Callable[[Any], None] | None) -> Path:
    """The builders' common end: ``model_cls(config)`` initialised under :class:`_Deterministic`,
    ``train(model)`` when given, model (safetensors) and tokenizer written to ``out``."""
    with _Deterministic():
        model = model_cls(config)
        if train is not None:
            train(model)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_bert(directory: str | os.PathLike, *, train: bool = True) -> Path:
    """Write a tiny uncased ``BertForMaskedLM`` + ``BertTokenizerFast`` to ``directory``."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    corpus = tiny_corpus()
    vocab = _train_wordpiece(corpus, vocab_size=700)
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
        max_position_embeddings=MAX_POSITIONS, pad_token_id=vocab["[PAD]"],
    )
    return _init_train_save(out, tokenizer, BertForMaskedLM, config,
                            partial(_train_steps, tokenizer=tokenizer, corpus=corpus, mlm=True) if train else None)


def build_tiny_roberta(directory: str | os.PathLike, *, train: bool = True) -> Path:
    """Write a tiny ``RobertaForMaskedLM`` + byte-level BPE ``RobertaTokenizerFast``."""
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    corpus = tiny_corpus()
    vocab, merges = _train_bytelevel_bpe(
        corpus, vocab_size=900, special=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer = RobertaTokenizerFast(vocab=vocab, merges=merges)
    config = RobertaConfig(
        vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
        max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1,
        pad_token_id=vocab["<pad>"], bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
    )
    return _init_train_save(out, tokenizer, RobertaForMaskedLM, config,
                            partial(_train_steps, tokenizer=tokenizer, corpus=corpus, mlm=True) if train else None)


def build_tiny_gpt2(directory: str | os.PathLike, *, train: bool = True) -> Path:
    """Write a tiny ``GPT2LMHeadModel`` + byte-level BPE ``GPT2TokenizerFast`` (BOS = EOS =
    ``<|endoftext|>``, also used as pad token)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    corpus = tiny_corpus()
    eot = "<|endoftext|>"
    vocab, merges = _train_bytelevel_bpe(corpus, vocab_size=900, special=[eot])
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token=eot, bos_token=eot,
                                  eos_token=eot, pad_token=eot)
    config = GPT2Config(
        vocab_size=len(vocab), n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
        n_positions=MAX_POSITIONS, bos_token_id=vocab[eot], eos_token_id=vocab[eot],
        pad_token_id=vocab[eot],
    )
    return _init_train_save(out, tokenizer, GPT2LMHeadModel, config,
                            partial(_train_steps, tokenizer=tokenizer, corpus=corpus, mlm=False) if train else None)


def build_tiny_distilbert(directory: str | os.PathLike, *, train: bool = True) -> Path:
    """Write a tiny ``DistilBertForMaskedLM`` + ``DistilBertTokenizerFast`` (the BERT model's
    uncased WordPiece vocabulary) to ``directory``."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM, DistilBertTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    corpus = tiny_corpus()
    vocab = _train_wordpiece(corpus, vocab_size=700)
    tokenizer = DistilBertTokenizerFast(vocab=vocab, do_lower_case=True)
    config = DistilBertConfig(
        vocab_size=len(vocab), dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=INTERMEDIATE,
        max_position_embeddings=MAX_POSITIONS, pad_token_id=vocab["[PAD]"],
    )
    return _init_train_save(out, tokenizer, DistilBertForMaskedLM, config,
                            partial(_train_steps, tokenizer=tokenizer, corpus=corpus, mlm=True) if train else None)


# --------------------------------------------------------------------------- decoder-only (causal) models

#: Causal families built by :func:`build_tiny_causal`: tokenizer conventions of the real families.
#: ``bos``: start token (added by the tokenizer when ``add_bos``), ``eos``, ``pad`` (``None``: the
#: tokenizer has no pad token, as Llama and Mistral), ``unk``, ``chat``: ship a chat template.
CAUSAL_FAMILIES: dict[str, dict] = {
    # Llama 3: byte-level BPE, <|begin_of_text|> put first by the tokenizer, no pad token
    "llama": {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": None, "unk": None,
              "add_bos": True, "chat": False},
    # Qwen2: byte-level BPE, no BOS (the harness and biasaudit start from EOS), pad = EOS,
    # a chat template in the tokenizer config (never applied by biasaudit)
    "qwen2": {"bos": None, "eos": "<|endoftext|>", "pad": "<|endoftext|>", "unk": None,
              "add_bos": False, "chat": True},
    # Mistral: <s> put first by the tokenizer, </s>, <unk>, no pad token
    "mistral": {"bos": "<s>", "eos": "</s>", "pad": None, "unk": "<unk>", "add_bos": True, "chat": False},
}

#: Positions of the tiny causal models: every sentence of the CrowS-Pairs sets (the longest French
#: one is 162 tokens with the English-trained tokenizer) fits.
CAUSAL_MAX_POSITIONS = 256

#: A minimal ChatML template (Qwen2's format) for the tiny Qwen2 tokenizer.
_CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

#: The instruct-style tiny model's template (:func:`build_tiny_instruct`): ChatML with a default
#: system turn when the conversation has none (as Qwen2.5-Instruct's template does).
INSTRUCT_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chat_corpus(corpus: list[str], template: str) -> list[str]:
    """The instruct model's chat-formatted training texts: each sentence's first half as the user
    turn, the rest as the assistant's answer, rendered with ``template`` (jinja2, as transformers does)."""
    import jinja2

    tpl = jinja2.Environment().from_string(template)
    out = []
    for text in corpus:
        words = text.split(" ")
        h = max(1, len(words) // 2)
        msgs = [{"role": "user", "content": " ".join(words[:h])}, {"role": "assistant", "content": " ".join(words[h:])}]
        out.append(tpl.render(messages=msgs, add_generation_prompt=False))
    return out


def _causal_corpus(languages) -> list[str]:
    """The English tiny corpus, or (``languages`` given) the natural-text corpus that
    :func:`audit.datasets.corpus_from_tests` builds from those languages' shipped tests (seed 0),
    plus the English tiny corpus, interleaved deterministically."""
    if not languages:
        return tiny_corpus()
    per = corpus_from_tests(list(languages), seed=SEED % 1000, tokenize=False, sentences_per_word=4)
    out = list(tiny_corpus())
    for lang in sorted(per):
        out += per[lang]
    random.Random(SEED).shuffle(out)
    return out


def _causal_tokenizer(corpus: list[str], family: str, vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` wrapped as a transformers fast tokenizer, with the
    special tokens and BOS behaviour of ``family`` (:data:`CAUSAL_FAMILIES`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    f = CAUSAL_FAMILIES[family]
    specials = [t for t in (f["bos"], f["eos"], f["unk"]) if t]
    if f["chat"]:
        specials += ["<|im_start|>", "<|im_end|>"]
    specials = list(dict.fromkeys(specials))
    vocab, merges = _train_bytelevel_bpe(corpus, vocab_size=vocab_size, special=specials)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=f["unk"]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    if f["add_bos"]:
        bos = f["bos"]
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.add_special_tokens(specials)
    kw = {k + "_token": f[k] for k in ("bos", "eos", "pad", "unk") if f[k]}
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, model_max_length=CAUSAL_MAX_POSITIONS, **kw)
    if f["chat"]:
        tok.chat_template = _CHAT_TEMPLATE
    return tok, vocab


def _train_causal(model, tokenizer, corpus: list[str]) -> None:
    """A few seeded AdamW next-token steps; sequences built by hand (start token + text, right
    padding under an attention mask), so tokenizers without a pad token train too."""
    import torch

    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    g = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    order = torch.randperm(len(corpus), generator=g).tolist()
    for step in range(TRAIN_STEPS):
        idx = [order[(step * TRAIN_BATCH + j) % len(order)] for j in range(TRAIN_BATCH)]
        seqs = [([start] + tokenizer(corpus[i], add_special_tokens=False)["input_ids"])[:TRAIN_MAX_LEN]
                for i in idx]
        width = max(len(q) for q in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, q in enumerate(seqs):
            ids[r, : len(q)] = torch.tensor(q)
            attn[r, : len(q)] = 1
        labels = ids.masked_fill(attn == 0, -100)
        out = model(input_ids=ids, attention_mask=attn, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    model.eval()


def build_tiny_causal(directory: str | os.PathLike, family: str = "llama", *, train: bool = True,
                      languages=None, vocab_size: int | None = None, chat_template: str | None = None) -> Path:
    """Write a tiny decoder-only model of ``family`` (``llama``: ``LlamaForCausalLM``,
    ``qwen2``: ``Qwen2ForCausalLM``, ``mistral``: ``MistralForCausalLM``) with a byte-level BPE
    tokenizer trained on the tiny corpus (``languages``: on those languages' shipped-test text
    too, :func:`_causal_corpus`). Rotary positions (:data:`CAUSAL_MAX_POSITIONS`), no token type
    ids, grouped-query attention (2 query heads, 1 key/value head); Qwen2 ties its input and output
    embeddings. ``chat_template``: the tokenizer's template instead of the family's, and the model
    trained on the corpus rendered as chats too (:func:`_chat_corpus`)."""
    import transformers

    schema.choice(family, "family", tuple(CAUSAL_FAMILIES))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    corpus = _causal_corpus(languages)
    size = vocab_size or (900 if not languages else 1600)
    tokenizer, vocab = _causal_tokenizer(corpus, family, size)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
        corpus = corpus + _chat_corpus(corpus, chat_template)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=1,
        max_position_embeddings=CAUSAL_MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    cfg_cls, model_cls, extra = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True, "use_sliding_window": False}),
        "mistral": ("MistralConfig", "MistralForCausalLM", {"tie_word_embeddings": False, "sliding_window": None}),
    }[family]
    config = getattr(transformers, cfg_cls)(**common, **extra)
    return _init_train_save(out, tokenizer, getattr(transformers, model_cls), config,
                            partial(_train_causal, tokenizer=tokenizer, corpus=corpus) if train else None)


def build_tiny_llama(directory: str | os.PathLike, *, train: bool = True, languages=None) -> Path:
    """:func:`build_tiny_causal` with ``family="llama"``."""
    return build_tiny_causal(directory, "llama", train=train, languages=languages)


def build_tiny_qwen2(directory: str | os.PathLike, *, train: bool = True, languages=None) -> Path:
    """:func:`build_tiny_causal` with ``family="qwen2"``."""
    return build_tiny_causal(directory, "qwen2", train=train, languages=languages)


def build_tiny_mistral(directory: str | os.PathLike, *, train: bool = True, languages=None) -> Path:
    """:func:`build_tiny_causal` with ``family="mistral"``."""
    return build_tiny_causal(directory, "mistral", train=train, languages=languages)


def build_tiny_instruct(directory: str | os.PathLike, *, train: bool = True) -> Path:
    """An instruct-style tiny model: :func:`build_tiny_causal` of the ``qwen2`` family with
    :data:`INSTRUCT_CHAT_TEMPLATE` (a default system turn), trained on plain and chat-formatted text."""
    return build_tiny_causal(directory, "qwen2", train=train, chat_template=INSTRUCT_CHAT_TEMPLATE)


def build_tiny_st(directory: str | os.PathLike, seed: int = 0) -> Path:
    """A tiny sentence-transformers model in ``directory/tiny-st``: the tiny BERT
    (:func:`tiny_model_dir`), mean pooling, a seeded ``Dense`` layer (32 -> 8, tanh), ``Normalize``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    torch.manual_seed(seed)
    word = modules.Transformer(str(tiny_model_dir("bert")))
    dim = word.get_embedding_dimension()
    parts = [word, modules.Pooling(dim, pooling_mode="mean"),
             modules.Dense(dim, 8, activation_function=torch.nn.Tanh()), modules.Normalize()]
    out = Path(directory) / "tiny-st"
    SentenceTransformer(modules=parts, device="cpu").save(str(out))
    return out


def build_random(kind: str, *, hidden: int = 512, layers: int = 4, heads: int = 8, kv_heads: int | None = None,
                 ffn: int = 1376, vocab: int = 32000, positions: int = 512, seed: int = 0,
                 out: str | os.PathLike | None = None):
    """A seeded random model of a chosen size with the tokenizer of the tiny ``kind`` model
    (``llama``: ``LlamaForCausalLM``, ``gpt2``: ``GPT2LMHeadModel``, ``bert``: ``BertForMaskedLM``),
    for benchmarks and memory tests where the tiny models are too small to show a cost: its
    vocabulary has ``max(vocab, len(tokenizer))`` rows (the tokenizer's ids are the first ones, so
    the LM head costs what it costs in real models), ``ffn`` the feed-forward width, ``kv_heads``
    Llama's key/value heads (``None``: ``heads``), ``positions`` the longest input (also the
    tokenizer's ``model_max_length``). Untrained, in ``eval()`` mode, float32, on the CPU.

    Returns ``(model, tokenizer)``; with ``out``, saves both there (``save_pretrained``) and returns
    the folder's :class:`~pathlib.Path` instead."""
    import torch
    from transformers import (AutoTokenizer, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel,
                              LlamaConfig, LlamaForCausalLM)

    if kind not in ("llama", "gpt2", "bert"):
        raise ValueError(f"kind must be llama, gpt2 or bert, got {kind!r}")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir(kind))
    tok.model_max_length = positions
    rows = max(vocab, len(tok))
    torch.manual_seed(seed)
    if kind == "llama":
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=rows, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads or heads, max_position_embeddings=positions,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=pad))
    elif kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=rows, n_embd=hidden, n_layer=layers, n_head=heads, n_inner=ffn, n_positions=positions,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    else:
        model = BertForMaskedLM(BertConfig(
            vocab_size=rows, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=ffn, max_position_embeddings=positions, pad_token_id=tok.pad_token_id))
    model.eval()
    if out is None:
        return model, tok
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


_BUILDERS = {"bert": build_tiny_bert, "roberta": build_tiny_roberta, "gpt2": build_tiny_gpt2,
             "distilbert": build_tiny_distilbert, "llama": build_tiny_llama, "qwen2": build_tiny_qwen2,
             "mistral": build_tiny_mistral, "instruct": build_tiny_instruct}
#: The causal kinds (loaded with ``AutoModelForCausalLM``).
CAUSAL_KINDS = ("gpt2", "llama", "qwen2", "mistral", "instruct")
_MEMO: dict[tuple[str, str], Path] = {}
_PRIVATE: dict[str, Path] = {}


def _digest() -> str:
    """The cache folder's digest: this file, the corpus and the installed transformers version (read
    from its distribution's metadata: importing transformers costs a sweep driver that only copies a
    cached model 0.8 CPU-s)."""
    from importlib.metadata import version

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update("\n".join(tiny_corpus()).encode("utf-8"))
    h.update(version("transformers").encode())
    return h.hexdigest()[:12]


def tiny_model_dir(kind: str, root: str | os.PathLike | None = None, *, languages=None) -> Path:
    """Path of a built tiny model of ``kind`` (:data:`KINDS`), building it once.

    root: cache folder; default ``$TMPDIR/biasaudit-tiny-models-<digest>`` (shared by processes,
    reused across sessions while this file, the corpus and the transformers version are the same).
    The default folder is used only where this user owns it and nobody else may write to it (a
    shared temporary folder: another user could otherwise plant a model there); else the model is
    built into a private temporary folder of this process.

    languages: a causal family (:data:`CAUSAL_FAMILIES`) trained on those languages' text too
    (:func:`build_tiny_causal`); kept under a name with the digest of that training text, so an
    edited word list makes a new model.
    """
    schema.choice(kind, "kind", KINDS)
    name, build = kind, _BUILDERS[kind]
    if languages:
        if kind not in CAUSAL_FAMILIES:
            raise ValueError(f"languages: only a causal family ({', '.join(CAUSAL_FAMILIES)}) is trained on "
                             f"languages, got {kind!r}")
        languages = list(languages)
        text = hashlib.sha256("\n".join(_causal_corpus(languages)).encode("utf-8")).hexdigest()[:12]
        name = f"{kind}-{'+'.join(languages)}-{text}"
        build = partial(build_tiny_causal, family=kind, languages=languages)
    if root is None:
        root = Path(tempfile.gettempdir()) / f"biasaudit-tiny-models-{_digest()}"
        if not private_folder(root):
            if "root" not in _PRIVATE:  # one private folder per process, made once
                _PRIVATE["root"] = Path(tempfile.mkdtemp(prefix="biasaudit-tiny-models-"))
            root = _PRIVATE["root"]
    root = Path(root)
    key = (name, str(root))
    if key in _MEMO and (_MEMO[key] / "config.json").is_file():
        return _MEMO[key]
    target = root / name
    if not (target / "config.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
        try:
            build(tmp)
            try:
                os.rename(tmp, target)
            except OSError:  # another process won the race: use its copy
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _MEMO[key] = target
    return target


def load_tiny(kind: str, root: str | os.PathLike | None = None):
    """``(model, tokenizer)`` of a tiny model, in eval mode (offline, local files only)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    path = tiny_model_dir(kind, root)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    cls = AutoModelForCausalLM if kind in CAUSAL_KINDS else AutoModelForMaskedLM
    model = cls.from_pretrained(path, local_files_only=True)
    model.eval()
    return model, tok

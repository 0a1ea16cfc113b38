"""Importing lm-evaluation-harness 0.4.13's Hugging Face model (the test oracle) without
``accelerate``.

``lm_eval.models.huggingface`` imports ``accelerate`` at module level, but its single-process
path -- an ``HFLM`` built from an already loaded model and tokenizer -- never calls it (the
``Accelerator`` is created only when ``pretrained`` is a string; ``find_executable_batch_size``
only for ``batch_size="auto"``; ``get_max_memory`` only for ``parallelize=True``). The project
does not depend on accelerate, so when it is not installed this module registers an
``accelerate`` module whose names raise if they are ever called. The harness's own tokenisation
(``_encode_pair``, ``loglikelihood``), batching (``Collator``) and log-likelihood computation
(``_loglikelihood_tokens``, ``_model_call``) run unchanged. Used by tests/test_causal_lm_eval.py
and benchmarks/causal.py.

Also shared by the tests that use the harness as their oracle: :func:`bbq_harness_docs` (the English
BBQ items through the harness's ``process_docs``, built once per process for tests/test_bbq.py and
tests/test_chat_template.py), :func:`bbq_harness_docs_at` (the same documents for some rows only)
and :func:`without_env_info` (``simple_evaluate`` without its environment report, which starts
subprocesses and is no part of what it scores).
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path


def _unavailable(name: str):
    def fn(*a, **k):
        raise RuntimeError(f"accelerate.{name} is not available (lm_eval_compat stub); "
                           "build HFLM from a loaded model, batch_size an integer")
    fn.__name__ = name
    return fn


def stub_accelerate() -> None:
    """Register a stand-in ``accelerate`` when it is not installed (a no-op when it is)."""
    if "accelerate" in sys.modules or importlib.util.find_spec("accelerate") is not None:
        return
    acc = types.ModuleType("accelerate")
    acc.Accelerator = _unavailable("Accelerator")
    acc.InitProcessGroupKwargs = _unavailable("InitProcessGroupKwargs")
    acc.find_executable_batch_size = _unavailable("find_executable_batch_size")
    utils = types.ModuleType("accelerate.utils")
    utils.get_max_memory = _unavailable("get_max_memory")
    acc.utils = utils
    for mod in (acc, utils):  # importlib.util.find_spec (transformers' probe, imported after) needs a spec
        mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None)
    sys.modules.update({"accelerate": acc, "accelerate.utils": utils})


def harness_lm(model, tokenizer, batch_size: int = 1):
    """lm-evaluation-harness's ``HFLM`` around a loaded causal LM and its tokenizer (CPU,
    the harness's defaults otherwise: ``add_bos_token=None``, prefix token BOS else EOS)."""
    stub_accelerate()
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, backend="causal")


def loglikelihood(lm, requests):
    """``[(logprob, is_greedy), ...]`` of ``(context, continuation)`` pairs through the harness's
    ``loglikelihood`` (its ``Instance`` objects, no progress bar)."""
    from lm_eval.api.instance import Instance

    inst = [Instance(request_type="loglikelihood", doc={}, arguments=(c, x), idx=i)
            for i, (c, x) in enumerate(requests)]
    return lm.loglikelihood(inst, disable_tqdm=True)


#: The tolerance of a log-likelihood against the harness's: ``HARNESS_ATOL + HARNESS_RTOL x |value|``.
#: The harness returns ``float(log_probs.sum())`` over float32 log-probabilities, so its sum is
#: rounded in float32 in proportion to its size (about 8 units in the last place here), where ours is
#: summed in float64. A 720-nat French CrowS-Pairs sentence differed by 1.3e-4 on one machine's CPU
#: kernels and not on another's; 1e-4 absolute alone held for short sentences only.
HARNESS_ATOL = 1e-4
HARNESS_RTOL = 1e-6
#: On CUDA the relative part is 1e-5: float32 sums over batches of other shapes differ in the last bits.
HARNESS_RTOL_CUDA = 1e-5


def harness_tolerance(device_type: str = "cpu") -> tuple[float, float]:
    """``(atol, rtol)`` of log-likelihoods against the harness's on ``device_type``."""
    return HARNESS_ATOL, (HARNESS_RTOL_CUDA if device_type == "cuda" else HARNESS_RTOL)


def assert_close_to_harness(got, want) -> None:
    """``|got - want| <= HARNESS_ATOL + HARNESS_RTOL * |want|`` element-wise (log-likelihoods
    against the harness's float32 sums, on the CPU)."""
    import numpy as np

    atol, rtol = harness_tolerance("cpu")
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64),
                               atol=atol, rtol=rtol)


@functools.lru_cache(maxsize=None)
def bbq_harness_docs(data_dir: str):
    """``(utils, docs)``: lm-evaluation-harness's ``bbq`` utilities and the BBQ records of the
    ``*.jsonl`` files of ``data_dir`` (sorted by name, line by line) through its own
    ``process_docs`` (a ``datasets.Dataset.map`` of its ``_helper``), as a list of dicts.

    Built once per process and shared by the tests of tests/test_bbq.py and
    tests/test_chat_template.py, which only read the documents (the harness's ``_process_results``,
    ``process_results_generate_until`` and ``doc_to_choice`` do not change a document): the map
    took 2.5 CPU-s, reading its rows back 1.5 more, and each module did both. ``Dataset.to_list()``
    gives the same records as iterating the dataset (the same values of the same types) in a
    quarter of the time."""
    from lm_eval.tasks.bbq import utils

    return utils, utils.process_docs(_bbq_dataset(data_dir)).to_list()


@functools.lru_cache(maxsize=None)
def _bbq_dataset(data_dir: str):
    """The BBQ records of the ``*.jsonl`` files of ``data_dir`` (sorted by name, line by line) as
    one ``datasets.Dataset`` (its columns' types inferred from every record), before the harness's
    ``process_docs``."""
    import glob
    import json

    import datasets

    datasets.disable_progress_bars()
    docs = []
    for f in sorted(glob.glob(str(Path(data_dir) / "*.jsonl"))):
        with open(f, encoding="utf-8") as fh:
            docs.extend(json.loads(line) for line in fh)
    return datasets.Dataset.from_list(docs)


def bbq_harness_docs_at(data_dir: str, rows) -> tuple:
    """``(utils, {row: document})``: the documents of :func:`bbq_harness_docs` at the positions
    ``rows`` only (equal, value for value, to ``bbq_harness_docs(data_dir)[1][row]``).

    The harness's ``process_docs`` maps only those rows of the whole dataset (``Dataset.select``:
    the columns keep the types inferred from every record; ``process_docs`` is a row-by-row ``map``
    of its ``_helper``, one document in, one out). Mapping all 11,956 English documents took 1.8
    of the 2.4 CPU-s of building them, for a test that reads 150 of them."""
    from lm_eval.tasks.bbq import utils

    order = sorted({int(r) for r in rows})
    docs = utils.process_docs(_bbq_dataset(data_dir).select(order)).to_list()
    return utils, dict(zip(order, docs))


def _no_env_info(storage: dict) -> None:
    storage["pretty_env_info"] = "not collected (tests/lm_eval_compat.without_env_info)"


def without_env_info(monkeypatch) -> None:
    """``simple_evaluate`` without ``add_env_info``, the environment report it adds to its results
    (``torch.utils.collect_env.get_pretty_env_info``: ``pip list`` and other subprocesses, 1.1
    CPU-s a call on this machine). It reads the environment only: the tasks, requests, scores,
    samples and metrics that the tests compare are computed exactly as without it."""
    import lm_eval.evaluator

    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", _no_env_info)

"""Measurement: how much BBQ's protocols differ on a tiny causal model (docs/honest_bbq.md).

Run: ``.venv/bin/python benchmarks/bbq_protocols.py [--limit 20] [--family qwen2]``

Per language with BBQ data (en, es, ca; de has no harness task), the first ``--limit`` items per
category and context condition (:func:`audit.datasets.bbq.select_items`), prompts cut from the left
to fit the tiny model (``truncation="left"``, the same cut for every protocol), scored three ways
on the tiny causal model of ``audit/tiny_models.py``:

* ``item_options``: the item's three answers, a start token always first (the default);
* ``item_options`` with the harness's start-token rule (``start="harness"``), to show that rule alone;
* ``harness``: lm-evaluation-harness's choices, prompt and start-token rule (protocol ``harness``).

Prints, per language and protocol: the number of predictions that differ from ``item_options``,
the share of items answered "unknown", s_AMB, s_DIS and EsBBQ/CaBBQ's own bias scores (:mod:`audit.metrics.bbq`).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from audit import tiny_models  # noqa: E402
from audit.backends.hf import load_hf_model  # noqa: E402
from audit.datasets import load_test  # noqa: E402
from audit.datasets.bbq import N_OPTIONS, select_items  # noqa: E402
from audit.measure import bbq as mb  # noqa: E402
from audit.measure.options import option_table, score_options  # noqa: E402
from audit.metrics.bbq import bbq_metric  # noqa: E402


def item_options(hm, items, language: str, start: str):
    prompt = mb.default_prompt(language)
    prompts = mb.item_prompts(items, prompt)
    options = [list(o) for o in items[[f"ans{i}" for i in range(N_OPTIONS)]].itertuples(index=False)]
    prompts, _ = mb.fit_prompts(hm, prompts, mb.harness_choices(items, mb.HARNESS_TASKS[language])[0])
    sc, nt = score_options(hm, prompts, options, start=start)
    meta = items[["item", "category", "subcategory", "question_polarity", "context_condition", "label", "unknown",
                  "target", "biased", "question_type"]]
    return option_table(meta, options, sc, nt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--family", default="qwen2")
    args = ap.parse_args()
    hm = load_hf_model(tiny_models.tiny_model_dir(args.family), kind="causal")
    for lang in ("en", "es", "ca"):
        items = select_items(load_test(f"{lang}/bbq").table, None, args.limit)
        tables = {"item_options": item_options(hm, items, lang, "always"),
                  "item_options+start=harness": item_options(hm, items, lang, "harness"),
                  "harness": mb.harness_option_scores(hm, items, task=mb.HARNESS_TASKS[lang], truncation="left")}
        if "question_type" in items.columns:
            tables["harness"]["question_type"] = items["question_type"].to_numpy()
        outs = {k: bbq_metric(t, n_bootstrap=0) for k, t in tables.items()}
        base = outs["item_options"].items["prediction"].to_numpy()
        for k, o in outs.items():
            changed = int((o.items["prediction"].to_numpy() != base).sum())
            f = o.fields
            unk = float(o.items["predicted_unknown"].mean())
            print(f"{lang} {k:28s} items={len(items)} changed={changed} unknown={unk:.2f} s_amb={f['s_amb']:+.3f} "
                  f"s_dis={f['s_dis']:+.3f} esbbq_bias_amb={f['esbbq_bias_amb']:+.3f} "
                  f"esbbq_bias_disamb={f['esbbq_bias_disamb']:+.3f}",
                  flush=True)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()

"""Expand a :class:`jobs.spec.SweepSpec` into tasks: model x language x test x metric.

A combination that cannot run is dropped with a reason (printed by the driver and kept in the
run log), never silently:

- the metric needs another kind of model (static vectors get no SEAT, LPBS or CrowS-Pairs;
  an encoder without LM head gets no LPBS/CrowS-Pairs);
- a test pattern has no test in a language (``weat1`` has no ``fr`` version);
- the test lacks what the metric needs (SEAT: sentences or templates; LPBS: ``lpbs`` templates;
  WEAT: exactly two target and two attribute sets; a test's own ``metrics`` list);
- the model does not cover the language (``models[i].languages``).

Planning loads test definitions (small YAML/CSV files) but never a model. :func:`attach_keys`
then computes each task's ``audit.key`` (:func:`audit.provenance.task_key`) from the model's
revision probed without loading (:func:`jobs.resolve.probe_revision`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from audit import registry, schema
from audit.datasets import registry as dataset_registry
from audit.datasets import stub_of
from audit.datasets import test_type as dataset_test_type
from audit.backends import chat
from audit.errors import AuditError, DataError, ModelError, ParameterError
from audit.lm_mitigation import family_reason, kind_reason
from audit.naming import natural_key
from audit.provenance import load_key, task_key
from audit.runner import check_load_options, load_test, words_for
from audit.suites import UnreadableTest
from jobs.resolve import model_kind, probe_chat_template, probe_revision, resolve_ref
from jobs.spec import ModelSpec, SweepSpec
from jobs.validators import suggest


def accepted_params(metric: str) -> frozenset[str]:
    """Every parameter a task of ``metric`` may set (:func:`audit.registry.accepted_params`)."""
    return registry.accepted_params(metric)


def unknown_params(metric: str, params: dict[str, Any]) -> list[str]:
    """Parameter names a metric does not take."""
    acc = registry.accepted_params(metric)
    return [k for k in params if k not in acc]


# --------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
    """One (model, language, test, metric) combination with its parameters.

    key: ``audit.key`` (set by :func:`attach_keys`; ``None`` when the model's revision cannot
         be known before loading it).
    """

    model: str
    language: str
    test: str
    metric: str
    params: dict[str, Any] = dataclasses.field(hash=False, compare=False)
    seed: int = 0
    key: str | None = None
    test_label: str = ""

    @property
    def test_name(self) -> str:
        """The test as tables show it: the registered name, or a file's test name."""
        return self.test_label or self.test

    @property
    def label(self) -> str:
        return f"{self.model} | {self.language} | {self.test_name} | {self.metric}"

    @property
    def run_name(self) -> str:
        return f"{self.model}/{self.language}/{self.test_name.split('/')[-1]}/{self.metric}"

    def ident(self) -> tuple:
        import json

        return (self.model, self.language, self.test, self.metric, json.dumps(self.params, sort_keys=True, default=str))


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A combination dropped at planning, and why."""

    model: str
    language: str
    test: str
    metric: str
    reason: str


@dataclasses.dataclass
class ModelInfo:
    """What the driver knows about a model before loading it."""

    spec: ModelSpec
    local_ref: str
    kind: str
    revision: str | None = None
    #: ``(known, digest)`` of its tokenizer's chat template (:func:`jobs.resolve.probe_chat_template`),
    #: ``None`` until a task with ``chat_template: true`` needs it.
    template: tuple[bool, str | None] | None = None


@dataclasses.dataclass
class Plan:
    spec: SweepSpec
    tasks: list[Task]
    skipped: list[Skipped]
    tests: dict[str, Any]  # test name -> WordTest | CrowS-Pairs DataFrame
    models: dict[str, ModelInfo]

    def counts(self) -> pd.DataFrame:
        """Task count per model (rows) and metric (columns), with totals."""
        if not self.tasks:
            return pd.DataFrame()
        df = pd.DataFrame([{"model": t.model, "metric": t.metric} for t in self.tasks])
        tab = pd.crosstab(df["model"], df["metric"], margins=True, margins_name="total")
        order = [m.name for m in self.spec.models if m.name in tab.index] + ["total"]
        return tab.loc[order]

    def tasks_of(self, model: str) -> list[Task]:
        return [t for t in self.tasks if t.model == model]

    def words_for_model(self, model: str) -> set[str]:
        """Every spelling the word look-ups of ``model``'s tasks may need (:func:`words_for_tasks`)."""
        return words_for_tasks(self, self.tasks_of(model))

    def skip_summary(self) -> list[str]:
        """One line per (model, metric, reason) group of dropped combinations."""
        groups: dict[tuple[str, str, str], list[Skipped]] = defaultdict(list)
        for s in self.skipped:
            groups[(s.model, s.metric, s.reason)].append(s)
        lines = []
        for (model, metric, reason), items in groups.items():
            n = len(items)
            lines.append(f"skip {model} x {metric}{f' ({n} combinations)' if n > 1 else ''}: {reason}")
        return lines

    def describe(self) -> str:
        lines = [f"sweep {self.spec.name!r}: {len(self.tasks)} tasks over {len(self.models)} models"]
        c = self.counts()
        if not c.empty:
            lines.append(collapse_rows(c).to_string())
        if self.skipped:
            lines.append(f"dropped {len(self.skipped)} combinations:")
            lines.extend("  " + s for s in self.skip_summary())
        return "\n".join(lines)


def collapse_rows(tab: pd.DataFrame, *, max_rows: int = 20) -> pd.DataFrame:
    """A count table (one row per model, then ``total``) with more than ``max_rows`` models,
    its rows that are equal collapsed into one (``192 models: bert-0 .. gpt2-47``, first and
    last in the table's order); smaller tables as they are."""
    body = tab.drop(index="total", errors="ignore")
    if len(body) <= max_rows:
        return tab
    groups: dict[tuple, list[str]] = {}
    for name, row in body.iterrows():
        groups.setdefault(tuple(row.tolist()), []).append(str(name))
    index = [ms[0] if len(ms) == 1 else f"{len(ms)} models: {ms[0]} .. {ms[-1]}" for ms in groups.values()]
    out = pd.DataFrame([list(k) for k in groups], index=index, columns=tab.columns)
    if "total" in tab.index:
        out.loc["total"] = tab.loc["total"]
    out.index.name = tab.index.name
    return out


# --------------------------------------------------------------------------------------
# Test discovery
# --------------------------------------------------------------------------------------


def registered_tests() -> dict[str, list[str]]:
    """Language -> registered full test names (``en/weat1``), from :func:`audit.datasets.registry`."""
    out: dict[str, list[str]] = defaultdict(list)
    for name in dataset_registry():
        if "/" in name:
            lang, _, short = name.partition("/")
            if short and "/" not in short:
                out[lang].append(name)
    return {k: sorted(v, key=natural_key) for k, v in out.items()}


def _is_file_ref(pattern: str) -> bool:
    p = Path(pattern)
    return p.suffix.lower() in (".yaml", ".yml", ".txt", ".jsonl", ".csv", ".tsv") and not any(c in pattern for c in "*?[")


def match_tests(pattern: str, names: Iterable[str]) -> list[str]:
    """Registered names matching a name or glob, against the full (``en/weat1``) or the short
    (``weat1``) name."""
    out = []
    for n in names:
        short = n.split("/", 1)[1]
        if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(short, pattern):
            out.append(n)
    return out


def test_language(test: Any) -> str:
    return test.language


# --------------------------------------------------------------------------------------
# Expansion
# --------------------------------------------------------------------------------------


def spec_field(spec: SweepSpec, i: int) -> str:
    """The spec field of ``spec.models[i]`` for messages: ``models[k]`` as written in the file
    (debiased copies, inserted after their original, are ``models[k].mitigation``)."""
    k = sum(1 for m in spec.models[: i + 1] if m.mitigated_from is None) - 1
    if spec.models[i].mitigated_from is None:
        return f"models[{k}]"
    return f"models[{k}].{'lm_mitigation' if spec.models[i].build.get('kind') == 'lm_mitigation' else 'mitigation'}"


def model_infos(spec: SweepSpec) -> dict[str, ModelInfo]:
    """Local reference and kind of each model (no loading; built models need not exist yet)."""
    out = {}
    for i, m in enumerate(spec.models):
        local = resolve_ref(m.ref, output_dir=spec.output_dir, build=dict(m.build) if m.build else None)
        if m.build and m.build.get("kind") == "lm_mitigation":  # a debiased LM variant: the original's kind
            kind = out[m.build["base"]].kind
            why = kind_reason(m.build["technique"], kind)
            if why:
                raise ParameterError(f"{spec.source}: {spec_field(spec, i)}: model {m.build['base']!r}: {why}")
            out[m.name] = ModelInfo(spec=m, local_ref=local, kind=kind)
            continue
        try:
            kind = model_kind(m.ref, m.backend, dict(m.build) if m.build else None, local_ref=local)
        except ParameterError as e:
            raise ParameterError(f"{spec.source}: {spec_field(spec, i)}: {e}") from None
        try:
            check_load_options(m.ref, kind, dict(m.options))
        except ParameterError as e:
            raise ParameterError(f"{spec.source}: {spec_field(spec, i)}: {e}") from None
        if m.mitigation and kind != "static":
            raise ParameterError(
                f"{spec.source}: {spec_field(spec, i)}.mitigation: model {m.name!r} is a {kind} model, not static word "
                "vectors; debiasing applies to static embeddings only"
            )
        out[m.name] = ModelInfo(spec=m, local_ref=local, kind=kind)
    return out


def task_params(spec: SweepSpec, model: ModelSpec, metric: str, metric_params: dict[str, Any]) -> dict[str, Any]:
    """Spec-level statistics defaults, then the model's parameters, then the metric's (the most
    specific wins); each only where the metric takes it."""
    acc = registry.accepted_params(metric)
    out: dict[str, Any] = {}
    defaults = {"permutations": spec.permutations, "n_bootstrap": spec.n_bootstrap}
    for k, v in defaults.items():
        if v is not None and k in acc:
            out[k] = v
    for k, v in model.params.items():
        if k in acc:
            out[k] = v
    out.update(metric_params)
    return out


def _check_model_params(spec: SweepSpec) -> None:
    for i, m in enumerate(spec.models):
        for k, v in m.params.items():
            takers = [ms.name for ms in spec.metrics if k in registry.accepted_params(ms.name)]
            if not takers:
                raise ParameterError(
                    f"{spec.source}: {spec_field(spec, i)}.params.{k}: no metric of the spec takes a parameter {k!r}"
                )
            for name in takers:
                try:
                    registry.check_params(name, {k: v})
                except ParameterError as e:
                    raise ParameterError(f"{spec.source}: {spec_field(spec, i)}.params.{k}: "
                                         f"{schema.unnamed(str(e), k)}") from None


def expand(spec: SweepSpec, *, infos: dict[str, ModelInfo] | None = None) -> Plan:
    """All tasks of a spec, and the combinations dropped with their reasons.

    For each model, metric, language and test pattern: the registered tests (or the file) the
    pattern names whose test type is the one the metric's measure step consumes; each is kept
    when :func:`audit.registry.applies` finds nothing against it (model kind, set counts, what
    the test must provide, its declared metrics), else dropped with that reason.
    """
    _check_model_params(spec)
    infos = infos if infos is not None else model_infos(spec)
    reg = registered_tests()
    all_langs = sorted(reg) if spec.languages is None else list(spec.languages)
    loaded: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    # a name's type, once per expansion (each look-up scans the datasets folder and parses the
    # test's YAML: the smoke-languages spec asked 2,566 times for 112 names; expanding it took
    # 10.4 CPU-s before, 5.4 after, the default spec 1.6 and 0.15)
    type_of = functools.lru_cache(maxsize=None)(_type_or_none)

    def get_test(name: str):
        if name not in loaded and name not in unavailable:
            try:
                loaded[name] = load_test(name)
            except DataError as e:
                if _is_stub_data_missing(name):
                    unavailable[name] = str(e)
                elif _is_file_ref(name) or "/" not in name:
                    raise  # a file named in the spec: its error is the spec's
                else:  # a registered test that cannot be read: its tasks fail with the reason
                    loaded[name] = UnreadableTest(name, name.split("/", 1)[0], str(e), type_of(name))
        return loaded.get(name)

    tasks: list[Task] = []
    skipped: list[Skipped] = []
    seen: set[tuple] = set()
    for m in spec.models:
        info = infos[m.name]
        langs = list(m.languages) if m.languages else list(all_langs)
        if spec.languages is not None:
            for lang in langs:
                if lang not in spec.languages:
                    skipped.append(Skipped(m.name, lang, "*", "*", f"language {lang} is not in the spec's languages"))
            langs = [lang for lang in langs if lang in spec.languages]
        for ms in spec.metrics:
            why_kind = registry.kind_reason(ms.name, info.kind)
            if why_kind:
                skipped.append(Skipped(m.name, "*", "*", ms.name, why_kind))
                continue
            if m.build and m.build.get("kind") == "lm_mitigation":
                why_lm = family_reason(m.build["technique"], registry.get(ms.name).family.name)
                if why_lm:
                    skipped.append(Skipped(m.name, "*", "*", ms.name, why_lm))
                    continue
            wanted_type = registry.get(ms.name).family.test_type
            params = task_params(spec, m, ms.name, dict(ms.params))
            for k in registry.ignored_params(ms.name, info.kind, params):
                if k in m.params:  # written for this model: a mistake, said before anything runs
                    raise ParameterError(f"{spec.source}: {spec_field(spec, spec.models.index(m))}.params.{k}: "
                                         + registry.unused_params_reason(ms.name, info.kind, m.name, [k]))
                del params[k]  # the metric entry's, for every model: not this kind's (nor in its keys)
            patterns = ms.tests or spec.tests
            for lang in langs:
                for pat in patterns:
                    names = _candidates(pat, lang, wanted_type, reg, get_test, type_of)
                    if not names:
                        why = (f"the test in {pat} is not in language {lang}" if _is_file_ref(pat)
                               else f"no test matching {pat!r} in language {lang}")
                        skipped.append(Skipped(m.name, lang, pat, ms.name, why))
                        continue
                    if m.tests is not None:
                        kept = [n for n in names if any(match_tests(mp, [n]) or mp == n for mp in m.tests)]
                        for n in names:
                            if n not in kept:
                                skipped.append(Skipped(m.name, lang, n, ms.name,
                                                       f"not among model {m.name}'s tests ({', '.join(m.tests)})"))
                        names = kept
                    for name in names:
                        test = get_test(name)
                        if test is None:
                            if pat == name or pat == name.split("/", 1)[-1]:
                                raise DataError(unavailable[name])
                            skipped.append(Skipped(m.name, lang, name, ms.name, unavailable[name]))
                            continue
                        if test.language != lang:
                            continue
                        why = registry.applies(ms.name, test, params=params)
                        if why:
                            skipped.append(Skipped(m.name, lang, name, ms.name, why))
                            continue
                        try:  # the rule `audit score` applies: resample sizes that cannot fit in memory
                            registry.check_sizes(ms.name, params, test)
                        except ParameterError as e:
                            raise ParameterError(f"{spec.source}: metric {ms.name} on {name}: {e}") from None
                        t = Task(model=m.name, language=lang, test=name, metric=ms.name, params=params,
                                 seed=spec.seed, test_label=_label(name, test))
                        if t.ident() in seen:
                            continue
                        seen.add(t.ident())
                        tasks.append(t)
    _check_patterns_matched(spec, reg)
    return Plan(spec=spec, tasks=tasks, skipped=skipped, tests=loaded, models=infos)


def _is_stub_data_missing(name: str) -> bool:
    """Whether a registered name is a stub whose data file is absent (listed as unavailable)."""
    try:
        path = dataset_registry().get(name)
        stub = stub_of(path) if path is not None else None
    except AuditError:
        return False
    return stub is not None and not stub.available()


def _check_patterns_matched(spec: SweepSpec, reg: dict[str, list[str]]) -> None:
    """A test name or glob that matches no test in any language is a typo, not a skip."""
    every = sorted({n for names in reg.values() for n in names} | {n.split("/", 1)[1] for names in reg.values() for n in names})
    patterns = list(spec.tests) + [p for ms in spec.metrics for p in (ms.tests or ())]
    for pat in dict.fromkeys(patterns):
        if _is_file_ref(pat):
            continue
        if any(match_tests(pat, names) for names in reg.values()):
            continue
        raise ParameterError(
            f"{spec.source or 'spec'}: tests: {pat!r} matches no shipped test in any language"
            f"{suggest(pat, every)} (see `audit datasets`)"
        )


def _label(ref: str, test: Any) -> str:
    if _is_file_ref(ref):
        return f"{test.language}/{test.name}"
    return ref


def _candidates(pattern: str, lang: str, test_type: str, reg: dict[str, list[str]], get_test,
                type_of) -> list[str]:
    """The tests a pattern names in ``lang`` whose type is ``test_type`` (a file: itself, when
    it is in that language); ``type_of``: a registered name's type (:func:`_type_or_none`, cached
    by :func:`expand`)."""
    if _is_file_ref(pattern):
        if dataset_test_type(pattern) != test_type:
            return []
        test = get_test(pattern)
        return [pattern] if test is not None and test.language == lang else []
    return [n for n in match_tests(pattern, reg.get(lang, [])) if type_of(n) in (test_type, None)]


def _type_or_none(name: str) -> str | None:
    """The test type of a registered name, ``None`` when its file cannot even be parsed."""
    try:
        return dataset_test_type(name)
    except DataError:
        return None


# --------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------


def metric_name(metric: str, kind: str) -> str:
    """The metric name results record for a model of ``kind`` (:meth:`audit.entries.Metric.result_name`)."""
    return registry.get(metric).result_name(kind)


def model_template(info: ModelInfo) -> tuple[bool, str | None]:
    """``(known, digest)`` of a model's chat template, probed once without loading."""
    if info.template is None:
        info.template = probe_chat_template(info.local_ref, info.kind, dict(info.spec.options))
    return info.template


def check_chat_templates(plan: Plan) -> Plan:
    """Refuse, before any model loads, a task with ``chat_template: true`` on a model whose
    tokenizer has no chat template (read from its files, :func:`jobs.resolve.probe_chat_template`);
    a template that cannot be read without loading is checked after loading, as before."""
    index = {m.name: i for i, m in enumerate(plan.spec.models)}
    for t in plan.tasks:
        if not chat.chat_on(t.params):
            continue
        info = plan.models[t.model]
        known, digest = model_template(info)
        if known and digest is None:
            raise ModelError(f"{plan.spec.source or 'spec'}: {spec_field(plan.spec, index[t.model])}: model "
                             f"{t.model!r} ({info.spec.ref}) has no chat template in its tokenizer; metric "
                             f"{t.metric} asks for chat_template: true")
    return plan


def attach_keys(plan: Plan) -> Plan:
    """Probe each model's revision (no loading) and set every task's ``audit.key``; a task with
    ``chat_template: true`` keys its template's digest too (:func:`audit.backends.chat.key_params`),
    unknown before loading when the template cannot be read from the files."""
    digests = {name: t.digest() for name, t in plan.tests.items()}
    for info in plan.models.values():
        if info.revision is None:
            info.revision = probe_revision(info.local_ref, info.kind, dict(info.spec.options))
    keyed = []
    for t in plan.tasks:
        info = plan.models[t.model]
        key = None
        known, digest = model_template(info) if chat.chat_on(t.params) else (True, None)
        if info.revision is not None and known:
            key = task_key(
                model_revision=info.revision, model_ref=info.spec.ref, dataset_digest=digests[t.test],
                metric=metric_name(t.metric, info.kind),
                params=chat.key_params(registry.key_params(t.metric, t.params), digest), seed=t.seed,
                load=load_key(dict(info.spec.options)),
            )
        keyed.append(dataclasses.replace(t, key=key))
    plan.tasks = keyed
    return plan


def words_for_tasks(plan: Plan, tasks: Iterable[Task]) -> set[str]:
    """Every spelling the word look-ups among ``tasks`` may need (:func:`audit.runner.words_for`
    with each task's parameters): what a static model must keep when loaded once for all of them."""
    words: set[str] = set()
    for t in tasks:
        words |= words_for(t.metric, plan.tests[t.test], t.params) or set()
    return words

"""Chat templates: a family's requests rendered as lm-evaluation-harness renders them with
``--apply_chat_template`` (lm-eval 0.4.13: ``lm_eval/api/task.py`` ``fewshot_context`` and
``construct_requests``, ``lm_eval/models/huggingface.py`` ``HFLM.apply_chat_template``).

Rendering (:func:`render_user_turns`)
    The context of a request becomes one user turn, preceded by a system turn when a
    ``system_instruction`` is given, rendered by the tokenizer's own Jinja template
    (``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``): the
    text ends with the opening of the assistant turn. Zero-shot there is one user turn, so the
    harness's ``--fewshot_as_multiturn`` (few-shot examples as separate user/assistant turns)
    changes nothing and has no counterpart here.

Continuations (:class:`ChatModel`)
    The scored continuation is appended to the rendered context, inside the assistant turn,
    *without* the target delimiter (the harness sets ``target_delimiter = ""`` under a chat
    template when the task has no ``gen_prefix``; no biasaudit family has one): BBQ's
    ``(prompt, " " + answer)`` is scored as ``(render(prompt), answer)``. A whole-sentence score
    (CrowS-Pairs on a causal LM, the harness's ``doc_to_text: ""``) is the sentence after the
    rendered empty user turn. Generation (HONEST, generative BBQ) continues the rendered text.
    The engine's other conventions are unchanged (trailing white space of the rendered context
    moves to the continuation, the harness's rule), except the start token: the rendered text is
    fed as it is, with the start token only where the tokenizer adds one itself and never
    doubled (the harness's ``tok_encode`` on a rendered context; ``start="harness"`` of
    :func:`audit.backends.hf_scoring.encode_requests`).

Differences from the harness
    A template that rejects a system turn is refused (:class:`ModelError`) instead of the harness's
    silent retry without it. A model whose tokenizer has no chat template is refused before any
    work.

Identity
    :func:`template_digest` (``sha256:`` of the template text) is recorded with every result
    and, under ``chat_template: true``, enters ``audit.key`` beside the parameters
    ``chat_template``/``system_instruction`` (:func:`key_params`). It is known before the model
    loads: :func:`folder_template` reads the template from the tokenizer's own files as
    Transformers' ``AutoTokenizer`` does (``chat_template.jinja`` and
    ``additional_chat_templates/*.jinja`` first, else ``tokenizer_config.json``'s ``chat_template``,
    a list of named templates becoming a dict; a processor's legacy ``chat_template.json`` is not
    read by the tokenizer, so not here either), so the planner computes the same key, and a model
    without a template is refused at plan time (``audit score``, ``audit run --dry-run``, the sweep
    plan), before any weights load.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from audit.errors import ModelError, ParameterError

__all__ = ["CHAT_PARAMS", "TEMPLATE_FILES", "template_text", "template_digest", "text_digest", "folder_template",
           "key_params", "chat_on", "render_user_turns", "check_chat_params", "ChatModel", "chat_handle", "chat_info"]

#: The measure parameters of every LM family that takes a chat template, with their defaults (off).
CHAT_PARAMS = {"chat_template": False, "system_instruction": None}


#: The tokenizer files that carry a chat template (Transformers 5: ``CHAT_TEMPLATE_FILE``,
#: ``TOKENIZER_CONFIG_FILE``; named templates in ``CHAT_TEMPLATE_DIR``).
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")
TEMPLATE_DIR = "additional_chat_templates"


def _canonical(t: Any) -> str | None:
    if isinstance(t, dict):
        return json.dumps(t, sort_keys=True, ensure_ascii=False) if t else None
    return t if isinstance(t, str) and t.strip() else None


def template_text(tokenizer: Any) -> str | None:
    """The tokenizer's chat template (a named-template dict as canonical JSON), ``None`` if none."""
    return _canonical(getattr(tokenizer, "chat_template", None))


def text_digest(text: str | None) -> str | None:
    """``sha256:<hex>`` of a template text (:func:`template_text`'s form), ``None`` for none."""
    return None if text is None else "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def template_digest(tokenizer: Any) -> str | None:
    """``sha256:<hex>`` of :func:`template_text`, ``None`` when the tokenizer has no template."""
    return text_digest(template_text(tokenizer))


def folder_template(folder: str | Path) -> str | None:
    """The chat template the tokenizer of a checkpoint folder will carry, read from its files
    without loading it, in :func:`template_text`'s form (``None``: no template). Transformers 5's
    rule (``PreTrainedTokenizerBase.from_pretrained``): ``chat_template.jinja`` is the ``default``
    template and ``additional_chat_templates/<name>.jinja`` the named ones; one ``default`` alone
    is the template, several are a dict; without those files ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of ``{name, template}`` becoming a dict). An unreadable
    ``tokenizer_config.json`` is a :class:`ModelError` naming it."""
    d = Path(folder)
    found: dict[str, str] = {}
    if (d / TEMPLATE_FILES[0]).is_file():
        found["default"] = (d / TEMPLATE_FILES[0]).read_text(encoding="utf-8")
    if (d / TEMPLATE_DIR).is_dir():
        for f in sorted((d / TEMPLATE_DIR).glob("*.jinja")):
            found[f.name.removesuffix(".jinja")] = f.read_text(encoding="utf-8")
    if found:
        return _canonical(found["default"] if list(found) == ["default"] else found)
    cfg = d / TEMPLATE_FILES[1]
    if not cfg.is_file():
        return None
    try:
        t = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
    except (ValueError, AttributeError) as e:
        raise ModelError(f"{cfg}: not a JSON object ({e})") from None
    if isinstance(t, (list, tuple)):
        t = {x["name"]: x["template"] for x in t if isinstance(x, dict) and "name" in x and "template" in x}
    return _canonical(t)


def chat_on(params: Mapping[str, Any]) -> bool:
    """Whether a task's parameters ask for the chat template (``chat_template: true``)."""
    return params.get("chat_template") is True


def key_params(params: Mapping[str, Any], digest: str | None) -> dict[str, Any]:
    """A task's key parameters (:func:`audit.registry.key_params`) with the template's digest
    added under ``chat_template: true`` (``chat_template_digest``): the one rule the planner
    (:func:`jobs.plan.attach_keys`) and the result (:func:`audit.runner.make_result`) share, so the
    key names the template applied, not only the revision whose files hold it."""
    out = dict(params)
    if chat_on(params) and digest is not None:
        out["chat_template_digest"] = digest
    return out


def render_user_turns(tokenizer: Any, texts: Sequence[str], *, system_instruction: str | None = None,
                      ref: str = "the model") -> list[str]:
    """Each text as a user turn (after a system turn when ``system_instruction`` is given),
    rendered with the tokenizer's template and the assistant turn opened (module docstring).
    Identical texts are rendered once."""
    if template_text(tokenizer) is None:
        raise ModelError(f"chat_template: model {ref!r} has no chat template in its tokenizer")
    head = [{"role": "system", "content": system_instruction}] if system_instruction is not None else []
    out: dict[str, str] = {}
    for t in dict.fromkeys(texts):
        try:
            out[t] = tokenizer.apply_chat_template(head + [{"role": "user", "content": t}], tokenize=False,
                                                   add_generation_prompt=True)
        except Exception as e:  # jinja2 TemplateError and the template's raise_exception
            what = "with a system turn " if head else ""
            raise ModelError(f"chat_template: model {ref!r}: its template fails {what}({e})") from None
    return [out[t] for t in texts]


def check_chat_params(mp: Mapping[str, Any]) -> tuple[bool, str | None]:
    """``(chat_template, system_instruction)`` of a family's parameters, checked."""
    on, system = mp.get("chat_template", False), mp.get("system_instruction")
    if not isinstance(on, bool):
        raise ParameterError(f"chat_template: must be true or false, got {on!r}")
    if system is not None and not isinstance(system, str):
        raise ParameterError(f"system_instruction: must be a string, got {system!r}")
    if system is not None and not on:
        raise ParameterError("system_instruction: given without chat_template: true (it is only used in a chat)")
    return on, system


class ChatModel:
    """A model of the interface (:class:`audit.backends.base.LanguageModel`) whose text operations
    go through its chat template (module docstring); every other attribute is the model's.

    ``delimiter``: the target delimiter the family puts before a continuation, dropped."""

    def __init__(self, model: Any, *, system_instruction: str | None = None, delimiter: str = " "):
        if getattr(model, "kind", None) != "causal":
            raise ModelError(f"chat_template: model {getattr(model, 'ref', model)!r} is loaded as "
                             f"kind={getattr(model, 'kind', None)!r}; a chat template needs a causal LM")
        if not hasattr(model, "render_chat"):
            raise ModelError(f"chat_template: the {getattr(model, 'backend', '?')} engine cannot render chat templates")
        self._model = model
        self.system_instruction = system_instruction
        self.delimiter = delimiter
        self.digest = model.chat_template_digest  # refuses a model without a template before any work
        if self.digest is None:
            raise ModelError(f"chat_template: model {model.ref!r} has no chat template in its tokenizer")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_model":  # copy/pickle probe a half-built object
            raise AttributeError(name)
        return getattr(self._model, name)

    def render(self, texts: Sequence[str]) -> list[str]:
        return self._model.render_chat(list(texts), system_instruction=self.system_instruction)

    def info(self) -> dict[str, Any]:
        """What a result records: the template's digest and the system instruction."""
        return {"chat_template": "applied", "chat_template_digest": self.digest,
                "system_instruction": self.system_instruction}

    def _cont(self, c: str) -> str:
        return c[len(self.delimiter):] if self.delimiter and c.startswith(self.delimiter) else c

    def loglikelihood(self, requests: Sequence[tuple[str, str]], *, batch_size: int | None = None,
                      start: str | None = None):
        """``start`` is accepted for the interface and not used: a rendered turn follows the harness's
        start-token rule (module docstring)."""
        ctx = self.render([c for c, _ in requests])
        return self._model.loglikelihood([(r, self._cont(c)) for r, (_, c) in zip(ctx, requests)],
                                         batch_size=batch_size, start="harness")

    def loglikelihood_rolling(self, sentences: Sequence[str], *, batch_size: int | None = None,
                              start: str | None = None):
        empty = self.render([""])[0]
        return self._model.loglikelihood([(empty, s) for s in sentences], batch_size=batch_size, start="harness")

    def first_words(self, prompts: Sequence[str], k: int, **kw: Any):
        kw.pop("start", None)  # a rendered turn: the harness's rule (module docstring)
        return self._model.first_words(self.render(prompts), k, start="harness", **kw)

    def samples(self, prompts: Sequence[str], k: int, **kw: Any):
        kw.pop("start", None)
        return self._model.samples(self.render(prompts), k, start="harness", **kw)

    def generate_until(self, prompts: Sequence[str], **kw: Any):
        kw.pop("start", None)
        return self._model.generate_until(self.render(prompts), start="harness", **kw)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text rendered as a user turn (an upper bound of the context plus continuation)."""
        return self._model.count_tokens(self.render(texts))


def chat_handle(model: Any, mp: Mapping[str, Any], *, delimiter: str = " ") -> Any:
    """The model a family measures on: ``model`` itself (``chat_template`` off, the default) or
    the :class:`ChatModel` of it."""
    on, system = check_chat_params(mp)
    return ChatModel(model, system_instruction=system, delimiter=delimiter) if on else model


def chat_info(model: Any) -> dict[str, Any]:
    """The chat fields a measurement records (``{}`` without a template)."""
    return model.info() if isinstance(model, ChatModel) else {}

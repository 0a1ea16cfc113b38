"""The loopback hub (``tests/hub_server.py``) speaks what the real clients use: checked with
``huggingface_hub`` (and Transformers) themselves, with hashes computed here independently
(git blob sha1 = ``sha1("blob <len>\\0" + bytes)``, LFS ETag = sha256 of the bytes)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import LoopbackHub, hub_fixture, variant_files  # noqa: E402,F401  (the fixture `hub`)
from audit.tiny_models import tiny_model_dir  # noqa: E402

from huggingface_hub import HfApi  # noqa: E402
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,  # noqa: E402
                                    RepositoryNotFoundError, RevisionNotFoundError)

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob " + str(len(data)).encode() + b"\x00" + data).hexdigest()


@pytest.fixture(scope="module")
def bert_dir() -> Path:
    return tiny_model_dir("bert")


def test_resolve_headers_etag_commit_length_and_range(hub, bert_dir):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    sha = hub.add_repo("acme/bert", bert_dir)
    cfg = (bert_dir / "config.json").read_bytes()
    weights = (bert_dir / "model.safetensors").read_bytes()
    meta = get_hf_file_metadata(hf_hub_url("acme/bert", "config.json"))
    assert (meta.commit_hash, meta.etag, meta.size) == (sha, git_blob(cfg), len(cfg))
    meta = get_hf_file_metadata(hf_hub_url("acme/bert", "model.safetensors", revision=sha))
    assert (meta.commit_hash, meta.etag, meta.size) == (sha, hashlib.sha256(weights).hexdigest(), len(weights))
    assert [r.method for r in hub.requests] == ["HEAD", "HEAD"] and hub.bytes_sent == 0

    import httpx2

    r = httpx2.get(f"{hub.endpoint}/acme/bert/resolve/main/model.safetensors", headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == weights[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(weights)}"
    assert r.headers["X-Linked-Etag"] == f'"{hashlib.sha256(weights).hexdigest()}"'


def test_downloads_by_branch_tag_and_commit_and_branch_moves(hub, bert_dir, tmp_path):
    from huggingface_hub import hf_hub_download, snapshot_download

    c1 = hub.add_repo("acme/bert", bert_dir)
    hub.tag("acme/bert", "v1")
    c2 = hub.commit("acme/bert", {"README.md": "# v2\n"}, message="card")
    assert hub.history("acme/bert") == [c2, c1] and hub.head("acme/bert") == c2
    snap = Path(snapshot_download("acme/bert", revision="v1"))
    assert snap.name == c1
    for f in bert_dir.iterdir():
        assert (snap / f.name).read_bytes() == f.read_bytes()
    assert not (snap / "README.md").exists()
    p = Path(hf_hub_download("acme/bert", "README.md"))
    assert p.parent.name == c2 and p.read_text() == "# v2\n"
    # huggingface_hub records refs itself when it resolves a branch or tag
    refs = hub.cache / "models--acme--bert" / "refs"
    assert (refs / "main").read_text() == c2 and (refs / "v1").read_text() == c1
    # moving the branch back: the client follows
    hub.move_branch("acme/bert", "main", c1)
    assert HfApi().model_info("acme/bert").sha == c1
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("acme/bert", "README.md", revision="main", force_download=True)
    # short commit ids and refs/heads/ names resolve like on the Hub
    assert HfApi().model_info("acme/bert", revision=c2[:7]).sha == c2
    assert HfApi().model_info("acme/bert", revision="refs/heads/main").sha == c1


def test_model_info_listings_commits_refs_and_pagination(hub, bert_dir):
    hub.page_size = 2
    gpt = tiny_model_dir("gpt2")
    shas = hub.add_repos({f"acme/bert-{i}": bert_dir for i in range(3)} | {"beta/gpt-0": gpt})
    hub.add_repo("acme/hidden", bert_dir, private=True)
    api = HfApi()
    info = api.model_info("acme/bert-1", files_metadata=True)
    assert info.sha == shas["acme/bert-1"] and info.author == "acme" and info.private is False
    assert info.pipeline_tag == "fill-mask" and info.config["architectures"] == ["BertForMaskedLM"]
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes["model.safetensors"] == (bert_dir / "model.safetensors").stat().st_size
    assert next(s for s in info.siblings if s.rfilename == "model.safetensors").lfs.sha256 == \
        hashlib.sha256((bert_dir / "model.safetensors").read_bytes()).hexdigest()
    assert api.model_info("beta/gpt-0").pipeline_tag == "text-generation"

    # listing by author (private repositories hidden), search, limit; pages of 2 followed
    assert [m.id for m in api.list_models(author="acme")] == ["acme/bert-0", "acme/bert-1", "acme/bert-2"]
    assert [m.id for m in api.list_models(author="beta")] == ["beta/gpt-0"]
    assert [m.id for m in api.list_models(search="gpt")] == ["beta/gpt-0"]
    assert len(list(api.list_models(author="acme", limit=2))) == 2
    assert hub.count(r"cursor=2") >= 1
    # the same id from the same content and history, a different one for another repository
    assert len(set(shas.values())) == 4
    with LoopbackHub() as other:
        assert other.add_repo("acme/bert-1", bert_dir) == shas["acme/bert-1"]

    # commits newest first, refs, tree listing (paginated by 2)
    c2 = hub.commit("acme/bert-0", {"notes/a.txt": "a", "notes/b.txt": "b"}, message="notes")
    commits = api.list_repo_commits("acme/bert-0")
    assert [c.commit_id for c in commits] == [c2, shas["acme/bert-0"]] and commits[0].title == "notes"
    hub.tag("acme/bert-0", "v1", shas["acme/bert-0"])
    refs = api.list_repo_refs("acme/bert-0")
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", c2)]
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", shas["acme/bert-0"])]
    tree = sorted(f.path for f in api.list_repo_tree("acme/bert-0", recursive=True))
    assert tree == sorted([".gitattributes", "notes", "notes/a.txt", "notes/b.txt",
                           *(f.name for f in bert_dir.iterdir())])
    assert sorted(f.path for f in api.list_repo_tree("acme/bert-0", path_in_repo="notes")) == \
        ["notes/a.txt", "notes/b.txt"]
    blobs = {f.path: f.blob_id for f in api.list_repo_tree("acme/bert-0", recursive=True) if hasattr(f, "blob_id")}
    assert blobs["notes/a.txt"] == git_blob(b"a")


def test_access_rules_private_gated_tokens(hub, bert_dir, monkeypatch):
    from huggingface_hub import hf_hub_download

    hub.add_repo("acme/secret", bert_dir, private=True)
    hub.add_repo("acme/gated", bert_dir, gated=True)
    hub.add_token("tok-alice", "alice")
    hub.add_token("tok-acme", "acme")
    api = HfApi()

    def status(fn):
        with pytest.raises(HfHubHTTPError) as e:
            fn()
        return type(e.value).__name__, e.value.response.status_code

    assert status(lambda: api.model_info("acme/secret")) == ("RepositoryNotFoundError", 401)
    assert status(lambda: api.model_info("acme/nothing")) == ("RepositoryNotFoundError", 401)
    assert status(lambda: api.model_info("acme/nothing", token="tok-alice")) == ("RepositoryNotFoundError", 404)
    assert status(lambda: api.model_info("acme/secret", token="tok-alice")) == ("RepositoryNotFoundError", 404)
    assert api.model_info("acme/secret", token="tok-acme").private is True  # the owner reads it
    assert status(lambda: api.model_info("acme/secret", token="nope"))[1] == 401
    assert status(lambda: api.model_info("acme/gated", revision="v9")) == ("RevisionNotFoundError", 404)
    # gated: metadata public, files not
    assert api.model_info("acme/gated").gated == "manual"
    assert status(lambda: hf_hub_download("acme/gated", "config.json")) == ("GatedRepoError", 401)
    assert status(lambda: hf_hub_download("acme/gated", "config.json", token="tok-alice")) == ("GatedRepoError", 403)
    hub.grant("acme/gated", "alice")
    assert Path(hf_hub_download("acme/gated", "config.json", token="tok-alice")).is_file()
    # HF_TOKEN is what the client sends by default
    monkeypatch.setenv("HF_TOKEN", "tok-alice")
    hub.grant("acme/secret", "alice")
    assert api.model_info("acme/secret").sha == hub.head("acme/secret")
    assert {r.user for r in hub.requests if r.path.startswith("/api/models/acme/secret")} == {None, "alice", "acme"}
    assert issubclass(GatedRepoError, RepositoryNotFoundError) and RevisionNotFoundError  # the client's hierarchy


def test_faults_answer_then_clear(hub, bert_dir):
    import httpx2

    hub.add_repo("acme/bert", bert_dir)
    url = f"{hub.endpoint}/api/models/acme/bert"
    f = hub.fail(r"^/api/models/acme/bert$", 503, times=2)
    g = hub.fail(r"/config\.json$", 429, times=1, retry_after=7, method="GET")
    assert [httpx2.get(url).status_code for _ in range(3)] == [503, 503, 200] and f.hits == 2
    head = httpx2.head(f"{hub.endpoint}/acme/bert/resolve/main/config.json")
    assert head.status_code == 200 and g.hits == 0                      # the method filter
    r = httpx2.get(f"{hub.endpoint}/acme/bert/resolve/main/config.json")
    assert r.status_code == 429 and r.headers["Retry-After"] == "7"
    hub.fail(r"^/api/models/acme/bert$", "reset", times=1)
    with pytest.raises(httpx2.RemoteProtocolError):
        httpx2.get(url)
    hub.fail(r"^/api/models/acme/bert$", None, times=1, delay=0.3)      # a stall, then the answer
    t0 = time.monotonic()
    assert httpx2.get(url).status_code == 200 and time.monotonic() - t0 >= 0.3
    always = hub.fail(r"^/api/whoami", 500, times=None)
    assert {httpx2.get(f"{hub.endpoint}/api/whoami-v2").status_code for _ in range(3)} == {500} and always.hits == 3
    assert httpx2.get(f"{hub.endpoint}/api/spaces/x/y").status_code == 404 and hub.unrouted == ["GET /api/spaces/x/y"]
    assert [r.status for r in hub.requests if r.path == "/api/models/acme/bert"] == [503, 503, 200, 0, 200]


def test_a_connection_dropped_mid_download_is_survived_by_the_client(hub, bert_dir):
    from huggingface_hub import hf_hub_download

    hub.add_repo("acme/bert", bert_dir)
    fault = hub.fail(r"/model\.safetensors$", "reset", times=2, method="GET")
    p = Path(hf_hub_download("acme/bert", "model.safetensors"))
    assert fault.hits == 2 and p.read_bytes() == (bert_dir / "model.safetensors").read_bytes()


def test_throttle_caps_bytes_per_second_across_connections(bert_dir):
    import httpx2

    blob = os.urandom(300_000)
    with LoopbackHub() as h:
        h.add_repo("acme/blob", {"a.bin": blob, "b.bin": blob[::-1]})
        t0 = time.monotonic()
        assert httpx2.get(f"{h.endpoint}/acme/blob/resolve/main/a.bin").content == blob
        fast = time.monotonic() - t0
        h.throttle_bps = 1_000_000
        out: list = []
        t0 = time.monotonic()
        ts = [threading.Thread(target=lambda n=n: out.append(httpx2.get(f"{h.endpoint}/acme/blob/resolve/main/{n}",
                                                                        timeout=30).content))
              for n in ("a.bin", "b.bin")]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        slow = time.monotonic() - t0
    assert sorted(out) == sorted([blob, blob[::-1]])
    # 600 kB at 1 MB/s shared: at least 0.5 s (one 64 KiB chunk may go before the first wait)
    assert slow >= 0.5 and fast < 0.5, (fast, slow)


def test_transformers_from_pretrained_with_revision(hub):
    import transformers

    gpt2 = tiny_model_dir("gpt2")
    c1 = hub.add_repo("acme/gpt2", gpt2)
    hub.tag("acme/gpt2", "v1")
    c2 = hub.commit("acme/gpt2", {"README.md": "# tiny gpt2\n"})
    m = transformers.AutoModelForCausalLM.from_pretrained("acme/gpt2", revision="v1")
    tok = transformers.AutoTokenizer.from_pretrained("acme/gpt2", revision=c2)
    assert tok.is_fast and type(m).__name__ == "GPT2LMHeadModel"
    snaps = sorted(p.name for p in (hub.cache / "models--acme--gpt2" / "snapshots").iterdir())
    assert snaps == sorted([c1, c2])
    assert hub.unrouted == []  # every endpoint the clients asked for is served


def test_command_line_serves_a_folder_of_repositories(tmp_path, bert_dir):
    import shutil

    import httpx2

    for rid in ("acme/one", "acme/two", "beta/three"):
        shutil.copytree(bert_dir, tmp_path / rid)
    proc = subprocess.Popen([sys.executable, str(HERE / "hub_server.py"), str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("HF_ENDPOINT=http://127.0.0.1:") and "(3 repositories)" in line
        endpoint = line.split()[0].split("=", 1)[1]
        ids = [m["id"] for m in httpx2.get(f"{endpoint}/api/models", params={"author": "acme"}).json()]
        assert ids == ["acme/one", "acme/two"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_variants_are_distinct_deterministic_checkpoints(hub, bert_dir):
    import numpy as np
    from safetensors.numpy import load as load_st

    from audit.backends.hf import load_hf_model

    base = load_st((bert_dir / "model.safetensors").read_bytes())
    v1, v1b, v2 = variant_files(bert_dir, 1), variant_files(bert_dir, 1), variant_files(bert_dir, 2)
    assert v1 == v1b and v1["model.safetensors"] != v2["model.safetensors"]
    assert {k: v for k, v in v1.items() if k != "model.safetensors"} == \
        {p.name: p.read_bytes() for p in bert_dir.iterdir() if p.name != "model.safetensors"}
    w1 = load_st(v1["model.safetensors"])
    diffs = np.concatenate([(w1[k] - base[k]).ravel() for k in sorted(base)])
    assert abs(diffs.std() - 0.02) < 0.002 and abs(diffs.mean()) < 0.002
    shas = hub.add_repos({"acme/v1": v1, "beta/v2": v2})
    m = load_hf_model("beta/v2", kind="mlm")
    assert m.revision == shas["beta/v2"]
    emb = "bert.embeddings.word_embeddings.weight"
    np.testing.assert_array_equal(m.model.state_dict()[emb].numpy(), load_st(v2["model.safetensors"])[emb])

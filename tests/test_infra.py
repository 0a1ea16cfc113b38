"""Every manifest and YAML file under infra/ and jobs/specs/ parses and passes its schema.

Schemas used (all offline): the Kubernetes API's JSON schemas shipped by ``kubernetes-validate``
(strict: unknown fields are errors) for built-in objects and for the pod templates inside KubeRay
objects; a schema of the KubeRay ``ray.io/v1`` fields these manifests use (written from the
KubeRay API reference: RayCluster, RayJob, RayCronJob; unknown fields are errors); Ray's cluster
launcher schema ``ray/autoscaler/ray-schema.json`` with Ray's own ``prepare_config`` /
``validate_config``; the Compose Specification schema vendored by ``check-jsonschema``. Then the
project's rules: versions equal to the installed Ray and MLflow, ports on loopback, no literal
secrets, references between objects that resolve, sweep and watch specs that load.
"""

from __future__ import annotations

import configparser
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

import pg_server

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
SPECS = REPO / "jobs" / "specs"
K8S_VERSION = "1.32"

YAML_FILES = sorted({*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml"), *SPECS.glob("*.yaml")})


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    out = {}
    for k, v in node.value:
        key = loader.construct_object(k, deep=deep)
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
        out[key] = loader.construct_object(v, deep=deep)
    return out


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def documents(path: Path) -> list:
    return [d for d in yaml.load_all(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) if d is not None]


def k8s_objects() -> list[tuple[Path, int, dict]]:
    out = []
    for p in YAML_FILES:
        if INFRA not in p.parents:
            continue
        for i, d in enumerate(documents(p)):
            if isinstance(d, dict) and "apiVersion" in d and "kind" in d:
                out.append((p, i, d))
    return out


K8S = k8s_objects()
BUILTIN = [(p, i, d) for p, i, d in K8S if not d["apiVersion"].startswith("ray.io/")]
KUBERAY = [(p, i, d) for p, i, d in K8S if d["apiVersion"].startswith("ray.io/")]


def _id(x) -> str:
    p, i, d = x
    return f"{p.relative_to(REPO)}#{i}:{d['kind']}/{d['metadata']['name']}"


def test_the_infra_tree_has_what_the_docs_promise():
    rel = {str(p.relative_to(INFRA)) for p in INFRA.rglob("*") if p.is_file()}
    for f in ("ray/cluster-aws-gpu.yaml", "kuberay/raycluster.yaml", "kuberay/rayjob-sweep.yaml",
              "kuberay/raycronjob-sweep.yaml", "kuberay/cronjob-watch.yaml", "kubernetes/mlflow.yaml",
              "kubernetes/namespace.yaml", "mlflow/docker-compose.yaml", "mlflow/Dockerfile", "docker/Dockerfile",
              "systemd/biasaudit-watch.service", "systemd/biasaudit-watch.timer", "cron/biasaudit-watch.cron"):
        assert f in rel, f
    kinds = sorted({d["kind"] for _, _, d in K8S})
    assert kinds == ["ConfigMap", "CronJob", "Deployment", "Namespace", "PersistentVolumeClaim", "RayCluster",
                     "RayCronJob", "RayJob", "Service", "StatefulSet"]


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_yaml_file_parses_without_duplicate_keys(path):
    docs = documents(path)
    assert docs and all(isinstance(d, dict) for d in docs), path


# --------------------------------------------------------------------------------------
# Kubernetes: built-in objects against the API schema
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj", BUILTIN, ids=_id)
def test_kubernetes_objects_match_the_api_schema(obj):
    import kubernetes_validate as kv
    _, _, d = obj
    kv.validate(d, K8S_VERSION, strict=True)


def test_the_api_schema_check_catches_mistakes():
    import kubernetes_validate as kv
    cron = copy.deepcopy(next(d for _, _, d in BUILTIN if d["kind"] == "CronJob"))
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(kv.ValidationError, match="comand"):
        kv.validate(cron, K8S_VERSION, strict=True)
    cron = copy.deepcopy(next(d for _, _, d in BUILTIN if d["kind"] == "CronJob"))
    cron["spec"]["concurrencyPolicy"] = 3
    with pytest.raises(kv.ValidationError):
        kv.validate(cron, K8S_VERSION, strict=True)


def test_no_secret_is_committed():
    assert not [d for _, _, d in K8S if d["kind"] == "Secret"]
    text = "\n".join(p.read_text(encoding="utf-8") for p in INFRA.rglob("*") if p.is_file())
    assert not re.search(r"(?i)(password|secret|token)\s*[:=]\s*['\"]?[A-Za-z0-9+/]{12,}", text)
    assert not re.search(r"AKIA[0-9A-Z]{16}", text)  # an AWS access key id


# --------------------------------------------------------------------------------------
# KubeRay objects
# --------------------------------------------------------------------------------------

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_INT0 = {"type": "integer", "minimum": 0}
_META = {"type": "object", "required": ["name", "namespace"],
         "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                        "namespace": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP},
         "additionalProperties": False}
_HEAD = {"type": "object", "required": ["template"], "additionalProperties": False,
         "properties": {"rayStartParams": _STR_MAP, "template": {"type": "object"}, "serviceType": {"type": "string"},
                        "enableIngress": {"type": "boolean"}, "headService": {"type": "object"}}}
_WORKER = {"type": "object", "required": ["groupName", "template"], "additionalProperties": False,
           "properties": {"groupName": {"type": "string"}, "replicas": _INT0, "minReplicas": _INT0, "maxReplicas": _INT0,
                          "rayStartParams": _STR_MAP, "template": {"type": "object"}, "numOfHosts": _INT0,
                          "suspend": {"type": "boolean"}, "idleTimeoutSeconds": _INT0,
                          "scaleStrategy": {"type": "object"}}}
_CLUSTER = {"type": "object", "required": ["headGroupSpec"], "additionalProperties": False,
            "properties": {"rayVersion": {"type": "string"}, "enableInTreeAutoscaling": {"type": "boolean"},
                           "autoscalerOptions": {"type": "object"}, "headGroupSpec": _HEAD,
                           "workerGroupSpecs": {"type": "array", "items": _WORKER}, "suspend": {"type": "boolean"},
                           "headServiceAnnotations": _STR_MAP, "gcsFaultToleranceOptions": {"type": "object"}}}
_JOB = {"type": "object", "required": ["entrypoint", "rayClusterSpec"], "additionalProperties": False,
        "properties": {"entrypoint": {"type": "string", "minLength": 1}, "runtimeEnvYAML": {"type": "string"},
                       "shutdownAfterJobFinishes": {"type": "boolean"}, "ttlSecondsAfterFinished": _INT0,
                       "activeDeadlineSeconds": {"type": "integer", "minimum": 1}, "backoffLimit": _INT0,
                       "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                       "rayClusterSpec": _CLUSTER, "submitterPodTemplate": {"type": "object"},
                       "entrypointNumCpus": {"type": "number"}, "entrypointNumGpus": {"type": "number"},
                       "entrypointResources": {"type": "string"}, "suspend": {"type": "boolean"},
                       "metadata": _STR_MAP, "jobId": {"type": "string"}}}
_CRON = {"type": "object", "required": ["schedule", "jobTemplate"], "additionalProperties": False,
         "properties": {"schedule": {"type": "string", "pattern": r"^\S+( \S+){4}$"}, "suspend": {"type": "boolean"},
                        "jobTemplate": _JOB}}
KUBERAY_SCHEMA = {kind: {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                         "additionalProperties": False,
                         "properties": {"apiVersion": {"const": "ray.io/v1"}, "kind": {"const": kind}, "metadata": _META,
                                        "spec": spec}}
                  for kind, spec in (("RayCluster", _CLUSTER), ("RayJob", _JOB), ("RayCronJob", _CRON))}


def cluster_specs(d: dict) -> list[dict]:
    s = d["spec"]
    return [s] if d["kind"] == "RayCluster" else [s["rayClusterSpec"]] if d["kind"] == "RayJob" else [
        s["jobTemplate"]["rayClusterSpec"]]


def pod_templates(d: dict) -> list[tuple[str, dict]]:
    out = []
    for c in cluster_specs(d):
        out.append(("headGroupSpec", c["headGroupSpec"]["template"]))
        out += [(f"workerGroupSpecs[{g['groupName']}]", g["template"]) for g in c.get("workerGroupSpecs", [])]
    return out


def pod_template_validator():
    import kubernetes_validate as kv
    import jsonschema
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    version = [v for v in utils.all_versions() if utils.major_minor(v) <= K8S_VERSION][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    schema = utils.schema_contents(f"{folder}/podtemplatespec-v1.json", version)
    defs = utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    assert kv  # the same schemas as kubernetes_validate.validate
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


@pytest.mark.parametrize("obj", KUBERAY, ids=_id)
def test_kuberay_objects_and_their_pod_templates(obj):
    import jsonschema
    import ray

    _, _, d = obj
    jsonschema.validate(d, KUBERAY_SCHEMA[d["kind"]])
    check = pod_template_validator()
    for where, tpl in pod_templates(d):
        errors = sorted(check.iter_errors(tpl), key=lambda e: list(e.path))
        assert not errors, f"{where}: {errors[0].message} at {list(errors[0].path)}"
    for c in cluster_specs(d):
        assert c["rayVersion"] == ray.__version__  # the pinned Ray (pyproject: ray[default]==2.60.0)
        for g in c.get("workerGroupSpecs", []):
            assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g["groupName"]
            limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
            if "nvidia.com/gpu" in limits:  # GPU workers keep their CPUs for the model actors
                assert g["rayStartParams"].get("num-cpus") and g["template"]["spec"].get("tolerations")
                assert g["template"]["spec"]["containers"][0]["image"].endswith("-gpu")
    if d["kind"] in ("RayJob", "RayCronJob"):
        job = d["spec"] if d["kind"] == "RayJob" else d["spec"]["jobTemplate"]
        env = yaml.safe_load(job["runtimeEnvYAML"])
        assert set(env) == {"env_vars"} and all(isinstance(v, str) for v in env["env_vars"].values())
        m = re.search(r"python -m jobs\.sweep (\S+)", job["entrypoint"])
        assert m and (REPO / m.group(1)).is_file() and '--tracking-uri "$MLFLOW_TRACKING_URI"' in job["entrypoint"]


def test_the_kuberay_schema_catches_mistakes():
    import jsonschema

    job = copy.deepcopy(next(d for _, _, d in KUBERAY if d["kind"] == "RayJob"))
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][1]["rayStartParams"]["num-cpus"] = 2  # must be a string
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        jsonschema.validate(job, KUBERAY_SCHEMA["RayJob"])
    job = copy.deepcopy(next(d for _, _, d in KUBERAY if d["kind"] == "RayJob"))
    job["spec"]["shutdownAfterJobFinish"] = True
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        jsonschema.validate(job, KUBERAY_SCHEMA["RayJob"])
    cron = copy.deepcopy(next(d for _, _, d in KUBERAY if d["kind"] == "RayCronJob"))
    tpl = cron["spec"]["jobTemplate"]["rayClusterSpec"]["headGroupSpec"]["template"]
    tpl["spec"]["containers"][0]["imagePullPolicy"] = 7
    assert list(pod_template_validator().iter_errors(tpl))


# --------------------------------------------------------------------------------------
# References between objects, and the MLflow settings
# --------------------------------------------------------------------------------------


def _walk(x):
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def test_references_between_objects_resolve():
    defined = {(d["kind"], d["metadata"]["name"]) for _, _, d in K8S}
    ns_doc = (INFRA / "kubernetes" / "namespace.yaml").read_text(encoding="utf-8")
    secrets_created = set(re.findall(r"create secret generic (\S+)", ns_doc))
    assert secrets_created == {"biasaudit-postgres", "biasaudit-minio", "biasaudit-hf"}
    for p, _, d in K8S:
        assert d["metadata"].get("namespace", "biasaudit") == "biasaudit" or d["kind"] == "Namespace"
        for node in _walk(d):
            if "configMapRef" in node:
                assert ("ConfigMap", node["configMapRef"]["name"]) in defined, (p, node)
            if "configMap" in node and isinstance(node["configMap"], dict):
                assert ("ConfigMap", node["configMap"]["name"]) in defined, (p, node)
            if "persistentVolumeClaim" in node:
                assert ("PersistentVolumeClaim", node["persistentVolumeClaim"]["claimName"]) in defined, (p, node)
            for ref in ("secretRef", "secretKeyRef"):
                if ref in node:
                    name = node[ref]["name"]
                    assert name in secrets_created, (p, node)
                    assert name != "biasaudit-hf" or node[ref].get("optional") is True, (p, node)
    # every Service selects pods of some workload, on a port those pods open
    pods = [(d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"]["containers"])
            for _, _, d in K8S if d["kind"] in ("Deployment", "StatefulSet")]
    for _, _, svc in (x for x in K8S if x[2]["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        match = [c for labels, c in pods if sel.items() <= labels.items()]
        assert len(match) == 1, svc["metadata"]["name"]
        ports = {pt["containerPort"] for c in match[0] for pt in c.get("ports", [])}
        assert {pt["targetPort"] for pt in svc["spec"]["ports"]} <= ports, svc["metadata"]["name"]


def test_mlflow_settings_point_at_the_mlflow_service():
    cm = next(d for _, _, d in K8S if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "biasaudit-mlflow")
    uri = re.match(r"^http://([a-z0-9-]+)\.biasaudit\.svc\.cluster\.local:(\d+)$", cm["data"]["MLFLOW_TRACKING_URI"])
    s3 = re.match(r"^http://([a-z0-9-]+)\.biasaudit\.svc\.cluster\.local:(\d+)$", cm["data"]["MLFLOW_S3_ENDPOINT_URL"])
    services = {d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]} for _, _, d in K8S if d["kind"] == "Service"}
    assert uri and int(uri.group(2)) in services[uri.group(1)]
    assert s3 and int(s3.group(2)) in services[s3.group(1)]
    dep = next(d for _, _, d in K8S if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    allowed = args[args.index("--allowed-hosts") + 1].split(",")
    host = cm["data"]["MLFLOW_TRACKING_URI"].split("//", 1)[1]
    assert host in allowed and "mlflow:5000" in allowed
    assert args[args.index("--backend-store-uri") + 1].startswith("postgresql+psycopg2://$(POSTGRES_USER):$(POSTGRES_PASSWORD)@")
    assert "--serve-artifacts" in args and args[args.index("--artifacts-destination") + 1] == "s3://$(MLFLOW_BUCKET)"


def test_the_watch_cronjob_runs_a_valid_watch_spec_against_the_raycluster(monkeypatch):
    from jobs.watch import parse_watch_spec

    cm = next(d for _, _, d in K8S if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "biasaudit-watch")
    cron = next(d for _, _, d in K8S if d["kind"] == "CronJob")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["audit", "watch", "/etc/biasaudit/watch.yaml", "--once"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and pod["restartPolicy"] == "Never"
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/biasaudit")
    assert next(v for v in pod["volumes"] if v["name"] == mount["name"])["configMap"]["name"] == "biasaudit-watch"
    from jobs.spec import expand_env

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.biasaudit.svc.cluster.local:5000")
    monkeypatch.chdir(REPO)
    spec = parse_watch_spec(expand_env(yaml.safe_load(cm["data"]["watch.yaml"]), "cm"), source="cronjob-watch.yaml")
    cluster = next(d for _, _, d in K8S if d["kind"] == "RayCluster")
    name, ns = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    assert spec.ray.address == f"http://{name}-head-svc.{ns}.svc.cluster.local:8265"  # KubeRay's head service
    assert spec.tracking_uri == "http://mlflow.biasaudit.svc.cluster.local:5000"
    assert all(e.audit.spec is not None and (REPO / e.audit.spec).is_file() for e in spec.entries)


# --------------------------------------------------------------------------------------
# Ray cluster launcher
# --------------------------------------------------------------------------------------


def test_ray_cluster_launcher_config_matches_rays_schema():
    import jsonschema
    import ray
    from ray.autoscaler._private.util import prepare_config, validate_config

    path = INFRA / "ray" / "cluster-aws-gpu.yaml"
    cfg = documents(path)[0]
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    validate_config(prepare_config(copy.deepcopy(cfg)))  # what `ray up` runs (provider defaults filled in)
    images = [cfg["docker"]["image"], cfg["docker"]["head_image"]] + [
        t["docker"]["worker_image"] for t in cfg["available_node_types"].values() if "docker" in t]
    assert {re.match(r"rayproject/ray:([\d.]+)-py311", i).group(1) for i in images} == {ray.__version__}
    gpu = [t for t in cfg["available_node_types"].values() if t["resources"].get("GPU")]
    assert gpu and all(t["resources"]["CPU"] <= 4 for t in gpu)
    for local in cfg["file_mounts"].values():
        assert (REPO / local).exists() or (REPO / (local + ".example")).is_file(), local
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["gpu"]["resources"]["GPU"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# --------------------------------------------------------------------------------------
# docker compose, Dockerfiles
# --------------------------------------------------------------------------------------


def compose_schema() -> dict:
    import check_jsonschema  # noqa: F401  (the vendored Compose Specification)
    import importlib.resources

    return json.loads(importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
                      .joinpath("compose-spec.json").read_text(encoding="utf-8"))


def test_compose_file_matches_the_compose_specification():
    import jsonschema

    path = INFRA / "mlflow" / "docker-compose.yaml"
    c = documents(path)[0]
    schema = compose_schema()
    jsonschema.validators.validator_for(schema)(schema).validate(c)
    bad = copy.deepcopy(c)
    bad["services"]["mlflow"]["restart_policy"] = "always"
    with pytest.raises(jsonschema.ValidationError, match="restart_policy"):
        jsonschema.validators.validator_for(schema)(schema).validate(bad)


def test_compose_rules_loopback_ports_secrets_from_env_and_dependencies():
    import mlflow

    path = INFRA / "mlflow" / "docker-compose.yaml"
    c = documents(path)[0]
    services = c["services"]
    assert set(services) == {"postgres", "minio", "create-bucket", "mlflow"}
    for name, s in services.items():
        for port in s.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        for dep in s.get("depends_on", {}):
            assert dep in services, (name, dep)
        for k, v in (s.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|ACCESS_KEY", k):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(v)), (name, k, v)
        if "build" in s:
            assert (path.parent / s["build"] / "Dockerfile").is_file()
            assert s["image"] == f"biasaudit-mlflow:{mlflow.__version__}"
    text = "\n".join(x for x in path.read_text(encoding="utf-8").splitlines() if not x.lstrip().startswith("#"))
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    example = dict(line.split("=", 1) for line in (INFRA / "mlflow" / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert required <= set(example) and all(example[k] == "" for k in required if "PASSWORD" in k)
    assert (INFRA / "mlflow" / ".gitignore").read_text().split() == [".env", "sweep.env"]
    cmd = services["mlflow"]["command"]
    assert cmd[0] == "server" and "--serve-artifacts" in cmd and cmd[cmd.index("--port") + 1] == "5000"
    # the tests' servers run as deployed, here and on Kubernetes (tests/pg_server.py)
    assert pg_server.SERVER_ENV.items() <= services["mlflow"]["environment"].items()
    kube = [d for d in documents(INFRA / "kubernetes" / "mlflow.yaml") if d["kind"] == "Deployment"
            and d["metadata"]["name"] == "mlflow"]
    (container,) = kube[0]["spec"]["template"]["spec"]["containers"]
    assert pg_server.SERVER_ENV.items() <= {e["name"]: e.get("value") for e in container["env"]}.items()


def test_dockerfiles_pin_the_same_ray_and_mlflow():
    import mlflow
    import ray

    ray_df = (INFRA / "docker" / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(rf"ARG RAY_IMAGE=rayproject/ray:{re.escape(ray.__version__)}-py311-gpu", ray_df)
    for src in re.findall(r"^COPY --chown=\S+ (.+?) \S+$", ray_df, flags=re.M):
        for s in src.split():
            assert (REPO / s).exists(), s
    ml_df = (INFRA / "mlflow" / "Dockerfile").read_text(encoding="utf-8")
    assert f"ARG MLFLOW_VERSION={mlflow.__version__}" in ml_df and "psycopg2-binary" in ml_df and "boto3" in ml_df
    images = {c["image"] for _, _, d in K8S for n in _walk(d) for c in n.get("containers", []) + n.get("initContainers", [])}
    assert {i for i in images if "mlflow" in i} == {f"biasaudit-mlflow:{mlflow.__version__}"}


# --------------------------------------------------------------------------------------
# single machine: systemd, cron
# --------------------------------------------------------------------------------------


def _unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True, comment_prefixes=("#", ";"))
    cp.optionxform = str
    cp.read_string(path.read_text(encoding="utf-8"))
    return cp


def test_systemd_units():
    svc = _unit(INFRA / "systemd" / "biasaudit-watch.service")
    timer = _unit(INFRA / "systemd" / "biasaudit-watch.timer")
    assert svc.sections() == ["Unit", "Service"] and timer.sections() == ["Unit", "Timer", "Install"]
    assert svc["Service"]["Type"] == "oneshot"
    assert re.fullmatch(r"/opt/biasaudit/\.venv/bin/audit watch \$\{BIASAUDIT_WATCH_SPEC\} --once", svc["Service"]["ExecStart"])
    assert timer["Timer"]["Unit"] == "biasaudit-watch.service" and timer["Timer"]["OnCalendar"] == "hourly"
    assert timer["Install"]["WantedBy"] == "timers.target"
    env = dict(line.split("=", 1) for line in (INFRA / "systemd" / "watch.env.example").read_text().splitlines()
               if line and not line.startswith("#"))
    assert (REPO / env["BIASAUDIT_WATCH_SPEC"]).is_file() and env["RAY_ADDRESS"].startswith("http://127.0.0.1:")


def test_cron_line():
    lines = [x for x in (INFRA / "cron" / "biasaudit-watch.cron").read_text().splitlines() if x and not x.startswith("#")]
    jobs = [x for x in lines if not re.match(r"^[A-Z_]+=", x)]
    assert len(jobs) == 1
    fields = jobs[0].split(None, 5)
    field = r"(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*"
    assert all(re.fullmatch(field, f) for f in fields[:5]), fields[:5]
    assert "flock -n" in fields[5] and re.search(r'audit watch "\$BIASAUDIT_WATCH_SPEC" --once', fields[5])


# --------------------------------------------------------------------------------------
# jobs/specs: sweep specs and watch specs load
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_specs_load(path, monkeypatch):
    monkeypatch.chdir(REPO)
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "BIASAUDIT_MODELS", "BIASAUDIT_WATCH_DIR", "BIASAUDIT_SWEEP_DIR"):
        monkeypatch.delenv(var, raising=False)
    if path.name.startswith("watch"):
        from jobs.watch import load_watch_spec

        spec = load_watch_spec(path)
        assert spec.entries and all((REPO / e.audit.spec).is_file() for e in spec.entries)
    else:
        from jobs.spec import load_spec

        spec = load_spec(path)
        assert spec.models and spec.metrics

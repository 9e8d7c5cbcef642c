"""How every Kiwi process reaches Temporal: envconfig profiles and env vars, pydantic payloads."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client

from kiwi import telemetry
from kiwi.converter import data_converter
from kiwi.errors import KiwiError
from kiwi.seal import SealInterceptor

DEFAULT_ADDRESS = "127.0.0.1:7233"


def ui_url(run_id: str = "", address: str | None = None, namespace: str | None = None) -> str:
    """The Temporal UI address of a run: ``KIWI_TEMPORAL_UI``, else the UI of ``kiwi dev``'s server when
    that is the server in use (the one running, by its lock, or the one this folder's temporal-dev.yml names;
    "" when the server is elsewhere and no UI address is known)."""
    from kiwi.devserver import load_dev_config, running_dev

    addr, ns = target(address, namespace)
    base = os.environ.get("KIWI_TEMPORAL_UI", "").rstrip("/")
    running = None if base else running_dev()
    if running is not None and running.address == addr and running.ui_port:
        base = f"http://{addr.rpartition(':')[0]}:{running.ui_port}"  # (the kiwi dev in use, by its lock)
    if not base:
        try:
            dev = load_dev_config(None)[0]["temporal"]
        except KiwiError:
            return ""
        if addr not in (f"{dev['ip']}:{dev['port']}", f"localhost:{dev['port']}"):
            return ""
        base = f"http://{dev['ip']}:{dev['ui_port']}"
    return f"{base}/namespaces/{ns}/workflows/{run_id}" if run_id else base


def profile() -> dict[str, Any]:
    """The client settings of Temporal's environment configuration: the ``temporal.toml`` file
    (``TEMPORAL_CONFIG_FILE``, else the user's ``~/.config/temporalio/temporal.toml``), its profile
    (``TEMPORAL_PROFILE``, else ``default``), and the ``TEMPORAL_*`` variables over it (``TEMPORAL_ADDRESS``,
    ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``); empty when none of them is set.

    A file or profile that cannot be read is an error, never a quiet fallback to a local server without
    the TLS or API key it asked for. The error names the file and profile, never their contents.
    """
    from temporalio.envconfig import ClientConfig

    named = os.environ.get("TEMPORAL_CONFIG_FILE")
    if named and not Path(named).expanduser().is_file():
        # (Temporal's loader takes a missing file for no file: a typo or an unmounted volume would send the
        # commands to a local server without the TLS or key the file holds.)
        raise KiwiError(
            f"TEMPORAL_CONFIG_FILE names {named}, which is no file"
            + (" (it is a folder)" if Path(named).expanduser().is_dir() else ""),
            hint="fix the path (README: Temporal Cloud and TLS), or unset TEMPORAL_CONFIG_FILE",
        )
    try:
        settings = dict(ClientConfig.load_client_connect_config())
    except RuntimeError as exc:  # temporalio's ConfigError
        name = os.environ.get("TEMPORAL_PROFILE") or "default"
        where = os.environ.get("TEMPORAL_CONFIG_FILE") or "~/.config/temporalio/temporal.toml"
        found = str(exc).startswith("Profile ")
        exists = Path(where).expanduser().is_file()
        raise KiwiError(
            f"cannot use the Temporal profile '{name}' of {where}: "
            + (
                "no such file"
                if not exists
                else "no such profile"
                if found
                else "the file is not a valid temporal.toml"
            ),
            hint="fix the file, or choose another with TEMPORAL_CONFIG_FILE and TEMPORAL_PROFILE "
            "(README: Temporal Cloud and TLS)",
        ) from None
    _check_tls(settings.get("tls"))
    return settings


# What each TLS part of a profile is, and the variables that give it (trial F5: a key file that was no key
# ended in "tonic::transport::Error(Transport, PrivateKeyParseError)", and a worker tried it again for ever).
_TLS_PARTS = (
    ("client_cert", "client certificate", "TEMPORAL_TLS_CLIENT_CERT_PATH", "certificate"),
    ("client_private_key", "client key", "TEMPORAL_TLS_CLIENT_KEY_PATH", "key"),
    ("server_root_ca_cert", "server CA certificate", "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "certificate"),
)


def _check_tls(tls: Any) -> None:
    """Refuse TLS files that are not what they are named for, naming the part and where it comes from (never
    its contents): no connection attempt can succeed with them, so a worker must not wait for one."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    for field, what, variable, kind in _TLS_PARTS:
        data = getattr(tls, field, None)
        if not data:
            continue
        data = data.encode() if isinstance(data, str) else data
        try:
            if kind == "key":
                key = serialization.load_pem_private_key(data, password=None)
                if not isinstance(
                    key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
                ):
                    # (A DSA key parses, and the TLS library cannot use it: review s22 F-3.)
                    raise UnsupportedAlgorithm(type(key).__name__)
            else:
                x509.load_pem_x509_certificates(data)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            inline = variable.replace("_PATH", "_DATA")
            if os.environ.get(variable):
                source = f"{variable}={os.environ[variable]}"
            elif os.environ.get(inline):
                source = inline
            else:
                source = f"the Temporal profile '{os.environ.get('TEMPORAL_PROFILE') or 'default'}'"
            if isinstance(exc, TypeError):
                problem = "is encrypted (Temporal takes no passphrase)"
            elif isinstance(exc, UnsupportedAlgorithm):
                problem = "is a kind of key TLS here cannot use (give an RSA, EC or Ed25519 key)"
            else:
                problem = f"is no PEM {'private key' if kind == 'key' else 'certificate'} it can use"
            raise KiwiError(
                f"the Temporal {what} from {source} {problem}",
                hint="give the PEM file your Temporal server or Temporal Cloud issued (README: Temporal Cloud "
                "and TLS)",
            ) from None


def target(address: str | None = None, namespace: str | None = None) -> tuple[str, str]:
    """Address and namespace. The address: explicit, else ``KIWI_TEMPORAL_ADDRESS``, else Temporal's
    environment configuration (:func:`profile`, which reads ``TEMPORAL_ADDRESS`` too), else the
    address `kiwi dev` serves by the ``temporal-dev.yml`` it reads here (:func:`dev_address`), else
    the address of the `kiwi dev` that runs on the user's own database (its lock names it: README trial s37,
    `kiwi dev --port 27333` and every command beside it went to 7233), else 127.0.0.1:7233. The namespace: explicit, else ``KIWI_TEMPORAL_NAMESPACE``, else the profile's (when
    the address is the profile's), else ``TEMPORAL_NAMESPACE``, else ``default``."""
    explicit = address or os.environ.get("KIWI_TEMPORAL_ADDRESS")
    settings = {} if explicit else profile()
    return (
        explicit or settings.get("target_host") or dev_address() or _running_dev() or DEFAULT_ADDRESS,
        namespace
        or os.environ.get("KIWI_TEMPORAL_NAMESPACE")
        or settings.get("namespace")
        or os.environ.get("TEMPORAL_NAMESPACE")
        or "default",
    )


def dev_address() -> str | None:
    """Where `kiwi dev` started from this folder serves Temporal, when its ``temporal-dev.yml`` (here, or
    KIWI_DEV_CONFIG) moves it off the default: the other commands run beside it find it there. Only an
    address of this machine is taken from the file."""
    from kiwi.devserver import dev_config_file, load_dev_config

    if not os.environ.get("KIWI_DEV_CONFIG") and dev_config_file() is None:
        return None  # (no file: kiwi dev's defaults, or the ports a running kiwi dev was given, see target)
    try:
        config, _ = load_dev_config(None, only=("temporal",))
    except KiwiError as exc:
        # (kiwi dev refuses the file; a command beside it said nothing and went to the default address: README
        # trial s34, `port: "abc"`.)
        _warn_once(
            f"kiwi: warning: {exc.message}; its address is not used" + (f" ({exc.hint})" if exc.hint else "")
        )
        return None
    temporal = config["temporal"]
    if not _this_machine(str(temporal["ip"])):
        # (A file in a cloned project must not send `kiwi approve` and the rest to a server elsewhere: kiwi dev
        # serves this machine; another server is named by --address, a variable or a profile.)
        return None
    return f"{temporal['ip']}:{temporal['port']}"


def _running_dev() -> str | None:
    from kiwi.devserver import running_dev_address

    return running_dev_address()


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """``message`` on stderr, once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        sys.stderr.write(message + "\n")


def _this_machine(host: str) -> bool:
    """A loopback (or every-interface) address: where `kiwi dev` on this machine listens."""
    import ipaddress

    from kiwi.devserver import loopback

    if loopback(host):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


async def connect(address: str | None = None, namespace: str | None = None) -> Client:
    """A Temporal client with Kiwi's data converter.

    With no address given (``--address`` or ``KIWI_TEMPORAL_ADDRESS``), the connection is Temporal's
    environment configuration (:func:`profile`): address, namespace, TLS (server CA, client certificate
    and key for mTLS) and API key, as the ``temporal`` CLI and every Temporal SDK read them, so one
    ``temporal.toml`` serves Temporal Cloud to all. An explicit address connects to that address in
    plain text (a local or in-cluster server), with the namespace from the same order as :func:`target`.
    """
    # Telemetry first: Temporal's runtime takes its metrics settings when the first client is made.
    telemetry.setup("kiwi")
    settings = {} if address or os.environ.get("KIWI_TEMPORAL_ADDRESS") else profile()
    addr, ns = target(address, namespace)
    settings.update(target_host=addr, namespace=ns)
    client = await Client.connect(
        **settings,
        data_converter=data_converter,
        # (The seal first: a request is sealed as sent, and a worker checks it before anything else.)
        interceptors=[SealInterceptor(), *telemetry.interceptors()],
    )
    await _namespace_there(client, addr, ns)
    return client


async def _namespace_there(client: Client, address: str, namespace: str) -> None:
    """Refuse a namespace the server does not have, naming it (every command ended in a traceback, and a
    worker polled it for ever). Other answers (a key that may not describe namespaces) are left to the call
    that follows."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.service import RPCError, RPCStatusCode

    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise KiwiError(
                f"Temporal at {address} has no namespace '{namespace}'",
                hint="check --namespace, KIWI_TEMPORAL_NAMESPACE, TEMPORAL_NAMESPACE or the profile's namespace "
                f"(`temporal operator namespace list --address {address}` lists them)",
            ) from None


def unreachable_hint(tried: str | None = None) -> str:
    """What to check when Temporal does not answer at ``tried`` (None: the address :func:`target` gives):
    the profile when one is in use, else the `kiwi dev` that runs elsewhere, else `kiwi dev`."""
    from kiwi.devserver import running_dev_address

    if any(os.environ.get(v) for v in ("TEMPORAL_CONFIG_FILE", "TEMPORAL_PROFILE", "TEMPORAL_ADDRESS")):
        address = target(tried)[0]
        running = running_dev_address()
        # (On this machine it is most likely a `kiwi dev` that is not running: README trial s36, with the
        # TEMPORAL_ADDRESS `kiwi dev` itself suggests exported, the hint spoke only of TLS files and keys; or
        # one that runs elsewhere, which the hint names as it does for --address: README trial s39.)
        local = (
            f"; `kiwi dev` runs at {running}: use it with --address {running}, or export TEMPORAL_ADDRESS={running}"
            if running and running != address
            else f"; {address} is this machine: is `kiwi dev` running there? start it with `kiwi dev` (its --port "
            "the address's port)"
            if _this_machine(address.rsplit(":", 1)[0])
            else ""
        )
        return (
            "check the Temporal profile in use (TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE, TEMPORAL_ADDRESS): its "
            f"address, its TLS certificate and key files, its API key{local}"
        )
    running = running_dev_address()
    if running and running != target(tried)[0]:
        return (
            f"`kiwi dev` runs at {running}, not at the address this command took (--address, KIWI_TEMPORAL_ADDRESS "
            f"or this project's temporal-dev.yml): use it with --address {running}, or give this project's "
            "temporal-dev.yml its port"
        )
    return "start it with `kiwi dev` (or set KIWI_TEMPORAL_ADDRESS / --address / TEMPORAL_ADDRESS)"

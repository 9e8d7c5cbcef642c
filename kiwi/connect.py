"""How every Kiwi process reaches Temporal: envconfig profiles and env vars, pydantic payloads."""

from __future__ import annotations

import os

from temporalio.client import Client

from kiwi import telemetry
from kiwi.converter import data_converter

DEFAULT_ADDRESS = "127.0.0.1:7233"


def ui_url(run_id: str = "", address: str | None = None, namespace: str | None = None) -> str:
    """The Temporal UI address of a run: ``KIWI_TEMPORAL_UI``, else the UI of ``kiwi dev``'s server when
    that is the server in use ("" when the server is elsewhere and no UI address is known)."""
    from kiwi.devserver import load_dev_config
    from kiwi.errors import KiwiError

    addr, ns = target(address, namespace)
    base = os.environ.get("KIWI_TEMPORAL_UI", "").rstrip("/")
    if not base:
        try:
            dev = load_dev_config(None)[0]["temporal"]
        except KiwiError:
            return ""
        if addr not in (f"{dev['ip']}:{dev['port']}", f"localhost:{dev['port']}"):
            return ""
        base = f"http://{dev['ip']}:{dev['ui_port']}"
    return f"{base}/namespaces/{ns}/workflows/{run_id}" if run_id else base


def target(address: str | None = None, namespace: str | None = None) -> tuple[str, str]:
    """Address and namespace: explicit values, then KIWI_TEMPORAL_* / TEMPORAL_* env vars, then defaults."""
    address = (
        address
        or os.environ.get("KIWI_TEMPORAL_ADDRESS")
        or os.environ.get("TEMPORAL_ADDRESS")
        or DEFAULT_ADDRESS
    )
    namespace = (
        namespace
        or os.environ.get("KIWI_TEMPORAL_NAMESPACE")
        or os.environ.get("TEMPORAL_NAMESPACE")
        or "default"
    )
    return address, namespace


async def connect(address: str | None = None, namespace: str | None = None) -> Client:
    """A Temporal client with Kiwi's data converter.

    With no address given anywhere, a ``temporal.toml`` profile (``TEMPORAL_PROFILE``) is used when
    one exists, so Temporal Cloud settings (TLS, API key) come from the standard place.
    """
    # Telemetry first: Temporal's runtime takes its metrics settings when the first client is made.
    telemetry.setup("kiwi")
    interceptors = telemetry.interceptors()
    explicit = address or os.environ.get("KIWI_TEMPORAL_ADDRESS")
    if not explicit:
        try:
            from temporalio.envconfig import ClientConfig

            config = ClientConfig.load_client_connect_config()
        except Exception:  # noqa: BLE001 - a broken profile file falls back to the defaults below
            config = {}
        if config.get("target_host"):
            if namespace:
                config["namespace"] = namespace
            return await Client.connect(**config, data_converter=data_converter, interceptors=interceptors)
    addr, ns = target(address, namespace)
    return await Client.connect(addr, namespace=ns, data_converter=data_converter, interceptors=interceptors)

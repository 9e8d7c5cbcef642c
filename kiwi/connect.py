"""How every Kiwi process reaches Temporal: envconfig profiles and env vars, pydantic payloads."""

from __future__ import annotations

import os

from temporalio.client import Client

from kiwi.converter import data_converter

DEFAULT_ADDRESS = "127.0.0.1:7233"


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
            return await Client.connect(**config, data_converter=data_converter)
    addr, ns = target(address, namespace)
    return await Client.connect(addr, namespace=ns, data_converter=data_converter)

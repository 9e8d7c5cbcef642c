"""Kiwi's Temporal data converter: pydantic JSON, with one JSON converter for the whole process.

``temporalio.contrib.pydantic`` keeps its ``TypeAdapter`` cache on each converter instance, and the
worker builds new converter instances for every workflow activation (and for every serialization
context), so each activation rebuilt the adapters (pydantic schema generation) for the types it
decoded. Here every payload converter shares one JSON converter and so one adapter cache. The
payloads are the same JSON as ``pydantic_data_converter`` writes; the two read each other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import ApplicationErrorCategory
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    PayloadConverter,
)

from kiwi.payloads import external_storage
from kiwi.seal import SealedResult

_JSON = PydanticJSONPlainPayloadConverter()


class KiwiPayloadConverter(PydanticPayloadConverter):
    """``PydanticPayloadConverter`` built around the process's one pydantic JSON converter.

    One instance per process: the worker asks for a new data converter (and so a new payload converter)
    twice per workflow activation, and none of these converters takes a serialization context, so every
    "new" one is the same stateless object, built once.
    """

    _shared: ClassVar[KiwiPayloadConverter | None] = None
    _built = False

    def __new__(cls) -> KiwiPayloadConverter:
        if cls._shared is None:
            cls._shared = super().__new__(cls)
        return cls._shared

    def __init__(self) -> None:
        if self._built:
            return
        CompositePayloadConverter.__init__(
            self,
            *(
                _JSON if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
        )
        self._built = True

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[Any] | None = None) -> list[Any]:
        # An activity's result in a run that checks them: its seal first (kiwi/seal.py).
        if type_hints and type(type_hints[0]) is SealedResult:
            type_hints = [
                h.opened(p) if type(h) is SealedResult else h
                for p, h in zip(payloads, type_hints, strict=True)
            ]
        return super().from_payloads(payloads, type_hints)


class KiwiFailureConverter(DefaultFailureConverter):
    """Failures as Temporal stores them, minus the Python stack of Kiwi's answers.

    A BENIGN failure (``KiwiError.error()``: denied, timed out, rejected, no such file) is an answer,
    not a fault: the Temporal UI shows a run that failed that way with its message alone. Faults (any
    other failure) keep their stack for whoever debugs them.
    """

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        link: Any = failure
        while link is not None:
            info = link.application_failure_info if link.HasField("application_failure_info") else None
            if (
                info is not None
                and info.category == ApplicationErrorCategory.APPLICATION_ERROR_CATEGORY_BENIGN
            ):
                link.stack_trace = ""
            link = link.cause if link.HasField("cause") else None


# Payloads of 256 KB and more travel as references to the shared payload store (kiwi/payloads.py).
data_converter = DataConverter(
    payload_converter_class=KiwiPayloadConverter,
    failure_converter_class=KiwiFailureConverter,
    external_storage=external_storage(),
)

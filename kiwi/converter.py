"""Kiwi's Temporal data converter: pydantic JSON, with one JSON converter for the whole process.

``temporalio.contrib.pydantic`` keeps its ``TypeAdapter`` cache on each converter instance, and the
worker builds new converter instances for every workflow activation (and for every serialization
context), so each activation rebuilt the adapters (pydantic schema generation) for the types it
decoded. Here every payload converter shares one JSON converter and so one adapter cache. The
payloads are the same JSON as ``pydantic_data_converter`` writes; the two read each other's.
"""

from __future__ import annotations

from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)

_JSON = PydanticJSONPlainPayloadConverter()


class KiwiPayloadConverter(PydanticPayloadConverter):
    """``PydanticPayloadConverter`` built around the process's one pydantic JSON converter."""

    def __init__(self) -> None:
        CompositePayloadConverter.__init__(
            self,
            *(
                _JSON if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
        )


data_converter = DataConverter(payload_converter_class=KiwiPayloadConverter)

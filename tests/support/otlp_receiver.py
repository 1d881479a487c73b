"""An OTLP/HTTP traces endpoint for tests and benches: decodes what it is sent (opentelemetry-proto) and keeps
each span's name, ids, attributes and event names, or (keep_spans=False) only counts the exports."""

from __future__ import annotations

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from threaded_server import ThreadedServer


class OtlpReceiver:
    def __init__(self, keep_spans: bool = True) -> None:
        self.spans: list[dict] = []
        self.exports = 0
        self._keep = keep_spans
        self._server = ThreadedServer()

    @property
    def url(self) -> str:
        return self._server.url

    async def _traces(self, request: web.Request) -> web.Response:
        self.exports += 1
        if not self._keep:
            await request.read()
            return web.Response(body=b"", content_type="application/x-protobuf")
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "attributes": attributes,
                            "events": [event.name for event in span.events],
                        }
                    )
        return web.Response(body=b"", content_type="application/x-protobuf")

    def start(self) -> OtlpReceiver:
        def make_app() -> web.Application:
            app = web.Application()
            app.router.add_post("/v1/traces", self._traces)
            return app

        self._server.serve(make_app)
        return self

    def stop(self) -> None:
        self._server.close()


def _value(value) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None

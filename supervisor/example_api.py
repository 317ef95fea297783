"""The local HTTP endpoint the example workflow calls (`--dev` starts it; the machine may have no internet).

- `GET /orders/{id}`: an order with a customer and line items.
- `POST /shipments`: books a shipment. The *first* call for each
  `Idempotency-Key` answers 503 ("warming up"), so the example's `ship` step
  fails once and succeeds on its retry; a repeated call with a key that
  already booked returns the same shipment (what an idempotent API does with
  the key the worker sends: the task id, the same across attempts).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

__all__ = ["ORDERS", "example_api"]

ORDERS: dict[int, dict[str, Any]] = {
    1042: {
        "id": 1042,
        "customer": "Ada Lovelace",
        "items": [
            {"sku": "difference-engine-gear", "qty": 12, "unit_price": 7.5},
            {"sku": "punched-card-pack", "qty": 3, "unit_price": 12.0},
        ],
    },
    7: {"id": 7, "customer": "Alan Turing", "items": [{"sku": "paper-tape", "qty": 2, "unit_price": 3.25}]},
}

_SHIPMENTS = web.AppKey("shipments", dict[str, dict[str, Any]])
_ATTEMPTS = web.AppKey("attempts", dict[str, int])


async def _order(request: web.Request) -> web.Response:
    try:
        order = ORDERS[int(request.match_info["order_id"])]
    except (KeyError, ValueError):
        return web.json_response({"error": "no such order"}, status=404)
    return web.json_response(order)


async def _ship(request: web.Request) -> web.Response:
    key = request.headers.get("Idempotency-Key")
    if not key:
        return web.json_response({"error": "Idempotency-Key header required"}, status=400)
    shipments, attempts = request.app[_SHIPMENTS], request.app[_ATTEMPTS]
    attempts[key] = attempts.get(key, 0) + 1
    if key in shipments:
        return web.json_response(shipments[key], status=200)
    if attempts[key] == 1:
        return web.json_response({"error": "shipping service warming up, retry later"}, status=503)
    try:
        summary = await request.json()
    except json.JSONDecodeError:
        return web.json_response({"error": "body must be JSON"}, status=400)
    if not isinstance(summary, dict):
        return web.json_response({"error": "body must be a JSON object"}, status=400)
    shipment = {
        "shipment_id": f"shp-{key[:8]}",
        "status": "booked",
        "calls": attempts[key],
        "order": summary,
    }
    shipments[key] = shipment
    return web.json_response(shipment, status=201)


def _app() -> web.Application:
    app = web.Application()
    app[_SHIPMENTS] = {}
    app[_ATTEMPTS] = {}
    app.router.add_get("/orders/{order_id}", _order)
    app.router.add_post("/shipments", _ship)
    return app


@contextlib.asynccontextmanager
async def example_api(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serves the endpoint on `host:port` (0: a free port) and yields its base URL."""
    runner = web.AppRunner(_app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = runner.addresses[0][1]
        yield f"http://{host}:{bound_port}"
    finally:
        await runner.cleanup()

"""The ``agentrl view`` web server: the page (static files shipped in the package) and a small
JSON API over :class:`~agentrl.view.catalog.Catalog`, on aiohttp (the HTTP stack the gateway
and the SGLang client already use).

API (every answer JSON; an error is ``{"error": message}`` with status 400 or 404, never a
stack trace):

* ``GET /api/targets``: the runs and evaluations under the viewed path.
* ``GET /api/run?id=``: a run's curves, evals, launches (flags) and rollout files.
* ``GET /api/rows?id=&file=`` (run) or ``GET /api/rows?id=`` (eval): a page of the episode
  table, filtered and sorted (see :func:`~agentrl.view.catalog.select_rows`).
* ``GET /api/sample?id=&file=&line=`` (run) or ``?id=&line=`` (eval): one episode.
* ``GET /api/eval?id=``: an evaluation's summary.

Requests are answered one at a time on the event loop (the readers keep file offsets; a
local viewer has one user). Only the package's own static files and what the catalog reads under the viewed path are
ever served; ids are checked against the catalog and resolved inside the root
(:func:`~agentrl.view.files.inside`), so ``..`` and symlinks pointing out are refused.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from agentrl.view.catalog import Catalog, EvalReader, RunReader, ViewError, select_rows

__all__ = ["STATIC", "make_app", "serve"]

STATIC = Path(__file__).parent / "static"
"""The page's files: ``index.html``, ``app.js``, ``style.css`` (no build step, no library)."""
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def make_app(catalog: Catalog) -> web.Application:
    """The viewer's aiohttp application over ``catalog``."""
    app = web.Application(middlewares=[_errors_as_json])
    static = {p.name: p for p in STATIC.iterdir() if p.suffix in _TYPES}

    async def page(request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name") or "index.html"
        if name not in static:  # only the shipped files, by exact name
            raise web.HTTPNotFound(text=f"no {name}")
        return web.FileResponse(static[name], headers={"Content-Type": _TYPES[static[name].suffix],
                                                        "Cache-Control": "no-cache"})

    async def targets(request: web.Request) -> web.Response:
        return web.json_response({"root": str(catalog.root), "targets": catalog.targets()})

    def run_of(request: web.Request) -> RunReader:
        reader = catalog.reader(_param(request, "id"), "run")
        assert isinstance(reader, RunReader)
        return reader

    def eval_of(request: web.Request) -> EvalReader:
        reader = catalog.reader(_param(request, "id"), "eval")
        assert isinstance(reader, EvalReader)
        return reader

    async def run(request: web.Request) -> web.Response:
        return web.json_response(run_of(request).overview())

    async def evaluation(request: web.Request) -> web.Response:
        return web.json_response(eval_of(request).overview())

    async def rows(request: web.Request) -> web.Response:
        query = dict(request.query)
        if "file" in query:
            reader, file = run_of(request), query["file"]
            found = reader.rows(file)
        else:
            found = eval_of(request).rows()
        return web.json_response(select_rows(found, query))

    async def sample(request: web.Request) -> web.Response:
        try:
            line = int(_param(request, "line"))
        except ValueError:
            raise ViewError("line must be a number") from None
        if "file" in request.query:
            view = run_of(request).sample(request.query["file"], line)
        else:
            view = eval_of(request).sample(line)
        return web.json_response(view)

    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", page)
    app.router.add_get("/api/targets", targets)
    app.router.add_get("/api/run", run)
    app.router.add_get("/api/eval", evaluation)
    app.router.add_get("/api/rows", rows)
    app.router.add_get("/api/sample", sample)
    return app


def _param(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if value is None:
        raise ViewError(f"the request needs ?{name}=")
    return value


@web.middleware
async def _errors_as_json(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                          ) -> web.StreamResponse:
    try:
        return await handler(request)
    except ViewError as exc:
        return web.json_response({"error": str(exc)}, status=404)
    except web.HTTPException as exc:
        return web.json_response({"error": exc.text or exc.reason}, status=exc.status)
    except Exception as exc:  # noqa: BLE001 - a bug must show as a message, never a stack trace
        print(f"agentrl view: {request.path_qs} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)


async def serve(catalog: Catalog, host: str = "127.0.0.1", port: int = 8765,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Serves ``catalog`` until cancelled; ``on_ready(url)`` once it listens (``port`` 0: any
    free port)."""
    runner = web.AppRunner(make_app(catalog), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        if on_ready is not None:
            on_ready(f"http://{shown}:{bound}/")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()

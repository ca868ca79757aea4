"""An HTTP server that speaks SGLang's native API, backed by the :class:`EmbeddedEngine`.

SGLang cannot serve on a machine without a GPU. This server answers the subset of SGLang's
native endpoints that agentrl's SGLang client and ``sglang-router`` use, with the same request
and response shapes, so that the whole SGLang path (client, router, weight updates, abort,
pause) runs and is tested on CPU. It is not a replacement for SGLang: no prefix cache, no
tensor parallelism, no CUDA graphs.

    python -m agentrl.engine.sglang_compat_server --model-path DIR --port 30000

Endpoints: ``/generate`` (token ids in, ``output_token_logprobs`` out; unknown
``sampling_params`` keys are rejected with 400, as SGLang does), ``/abort_request``,
``/pause_generation``, ``/continue_generation``, ``/flush_cache``, ``/update_weights_from_disk``,
``/update_weights_from_tensor``, ``/init_weights_update_group``, ``/update_weights_from_distributed``
(gloo on CPU), ``/destroy_weights_update_group``,
``/release_memory_occupation``, ``/resume_memory_occupation``, ``/health``,
``/health_generate``, ``/ready``, ``/model_info``, ``/server_info``, ``/get_load``,
``/v1/loads``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import logging
import pickle
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrl.engine.base import GenerateOutput, SamplingParams, spans_from_versions
from agentrl.engine.embedded import EmbeddedEngine
from agentrl.engine.weight_group import WeightGroup
from agentrl.errors import EngineError

__all__ = ["SAMPLING_KEYS", "build_app", "output_to_sglang", "sampling_from_sglang"]

log = logging.getLogger(__name__)

SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "sampling_seed", "stream_interval", "logit_bias", "custom_params", "json_schema", "regex",
    "ebnf", "structural_tag", "stop_regex",
})
"""SGLang's ``sampling_params`` keys; any other key is a 400, as in SGLang."""

_NEUTRAL = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
            "min_new_tokens": 0, "n": 1, "logit_bias": {}, "json_schema": None, "regex": None,
            "ebnf": None, "structural_tag": None, "stop_regex": None, "custom_params": None}
"""Keys the embedded engine accepts only at their neutral value (it does not implement them)."""

_TOP_K_ALL = 1 << 30  # SGLang's "no top-k" default


class BadRequest(ValueError):
    """A request SGLang would answer with 400."""


def sampling_from_sglang(params: dict[str, Any]) -> SamplingParams:
    """SGLang ``sampling_params`` -> :class:`SamplingParams`.

    Raises:
        BadRequest: An unknown key, a wrong type, or a setting the embedded engine does not
            implement at a non-neutral value.
    """
    unknown = sorted(set(params) - SAMPLING_KEYS)
    if unknown:
        raise BadRequest(f"unknown field `{unknown[0]}` in sampling_params")
    for key, neutral in _NEUTRAL.items():
        if key in params and params[key] is not None and params[key] != neutral:
            raise BadRequest(f"sampling_params.{key}={params[key]!r}: not supported by the "
                             "embedded engine (only its neutral value)")
    top_k = params.get("top_k", -1)
    stop = params.get("stop") or ()
    try:
        return SamplingParams(
            max_new_tokens=int(params.get("max_new_tokens", 128)),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=-1 if top_k is None or top_k >= _TOP_K_ALL else int(top_k),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
            ignore_eos=bool(params.get("ignore_eos", False)),
            sampling_seed=params.get("sampling_seed"),
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"sampling_params: {exc}") from exc


def output_to_sglang(out: GenerateOutput, rid: str, text: str, return_logprob: bool) -> dict[str, Any]:
    """A :class:`GenerateOutput` as SGLang's ``/generate`` response object."""
    if out.finish_reason == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": out.matched}
    elif out.finish_reason == "length":
        finish = {"type": "length", "length": len(out.output_ids)}
    else:
        finish = {"type": "abort", "message": out.message or "aborted", "status_code": 200}
    meta: dict[str, Any] = {
        "id": rid, "finish_reason": finish, "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids), "cached_tokens": out.cached_tokens,
        "weight_version": out.weight_version, "e2e_latency": out.latency_s,
    }
    if out.token_versions is not None:  # agentrl's extension: each token's version, as spans
        meta["weight_versions"] = spans_from_versions(out.token_versions)
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in
                                         zip(out.output_logprobs, out.output_ids, strict=True)]
    return {"text": text, "output_ids": list(out.output_ids), "meta_info": meta}


@dataclasses.dataclass
class _State:
    engine: EmbeddedEngine
    model_path: str
    rids: int = 0
    groups: dict[str, WeightGroup] = dataclasses.field(default_factory=dict)


def build_app(engine: EmbeddedEngine, model_path: str) -> web.Application:
    """The aiohttp application serving ``engine`` (the caller closes the engine)."""
    state = _State(engine, model_path)
    app = web.Application(client_max_size=1 << 30)
    routes = web.RouteTableDef()

    async def body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            value = await request.json()
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"invalid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise web.HTTPBadRequest(text="expected a JSON object")
        return value

    @routes.post("/generate")
    async def generate(request: web.Request) -> web.Response:
        req = await body(request)
        ids = req.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return web.json_response({"error": {"message": "input_ids: a non-empty list of token "
                                                "ids is required (text input is not served)"}},
                                     status=400)
        try:
            params = sampling_from_sglang(req.get("sampling_params") or {})
        except BadRequest as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        state.rids += 1
        rid = str(req.get("rid") or f"agentrl-{state.rids}")
        try:
            out = await state.engine.generate(ids, params, rid)
        except EngineError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        text = state.engine.tokenizer.decode(out.output_ids) if state.engine.tokenizer else ""
        return web.json_response(output_to_sglang(out, rid, text, bool(req.get("return_logprob"))))

    @routes.post("/abort_request")
    async def abort(request: web.Request) -> web.Response:
        req = await body(request)
        prefix = "" if req.get("abort_all") else str(req.get("rid", ""))
        if not prefix and not req.get("abort_all"):
            return web.Response(status=200)  # SGLang ignores an empty rid
        await state.engine.abort(prefix)
        return web.Response(status=200)

    @routes.post("/pause_generation")
    async def pause(request: web.Request) -> web.Response:
        mode = (await body(request)).get("mode", "abort")
        if mode == "retract":  # the embedded engine keeps state in place: same outcome
            mode = "in_place"
        if mode not in ("abort", "in_place"):
            return web.json_response({"error": {"message": f"unknown mode {mode!r}"}}, status=400)
        await state.engine.pause(mode)
        return web.json_response({"success": True})

    @routes.post("/continue_generation")
    async def resume(request: web.Request) -> web.Response:
        await state.engine.resume()
        return web.json_response({"success": True})

    @routes.route("*", "/flush_cache")
    async def flush(request: web.Request) -> web.Response:
        # no prefix cache here; SGLang's precondition (nothing in flight) is kept
        load = state.engine.stats()
        if load["active"] or load["waiting"]:
            return web.Response(status=400, text="requests are in flight; retry when idle")
        return web.Response(status=200, text="Cache flushed.")

    @routes.post("/update_weights_from_disk")
    async def update_from_disk(request: web.Request) -> web.Response:
        req = await body(request)
        path = req.get("model_path")
        if not isinstance(path, str):
            return web.json_response({"success": False, "message": "model_path is required"}, status=400)
        version = str(req.get("weight_version") or state.engine.weight_version)
        if req.get("abort_all_requests"):
            await state.engine.abort("")
        try:
            await state.engine.update_weights(path=path, version=version)
        except (EngineError, OSError, ValueError) as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        state.model_path = path
        return web.json_response({"success": True, "message": f"loaded {path}", "num_paused_requests": 0})

    @routes.post("/update_weights_from_tensor")
    async def update_from_tensor(request: web.Request) -> web.Response:
        # Unpickles what the client sent, as SGLang does: serve on loopback or a trusted network.
        req = await body(request)
        entries = req.get("serialized_named_tensors")
        if req.get("load_format") is not None:
            return web.json_response({"success": False, "message": f"load_format {req['load_format']!r} "
                                      "is not supported (only the default)"}, status=400)
        if not isinstance(entries, list) or not entries or not isinstance(entries[0], str):
            return web.json_response({"success": False, "message": "serialized_named_tensors: one "
                                      "base64 string per TP rank is required"}, status=400)
        try:
            pairs = pickle.loads(base64.b64decode(entries[0]))  # this server is TP rank 0
            tensors = {str(name): tensor for name, tensor in pairs}
        except Exception as exc:  # noqa: BLE001 - any undecodable payload is the client's error
            return web.json_response({"success": False, "message": f"cannot decode tensors: {exc}"}, status=400)
        version = req.get("weight_version")
        try:
            # a bucket is a subset of the parameters; the version changes with the last bucket
            await state.engine.update_weights(state_dict=tensors, version=str(version or state.engine.weight_version))
        except EngineError as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        return web.json_response({"success": True, "message": f"loaded {len(tensors)} tensors"})

    @routes.post("/init_weights_update_group")
    async def init_group(request: web.Request) -> web.Response:
        req = await body(request)
        try:
            group = await asyncio.to_thread(
                WeightGroup, str(req["master_address"]), int(req["master_port"]),
                int(req.get("rank_offset", 1)), int(req["world_size"]), str(req["group_name"]),
                str(req.get("backend", "gloo")))
        except (KeyError, ValueError, RuntimeError) as exc:
            return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
        state.groups[str(req["group_name"])] = group
        return web.json_response({"success": True, "message": "joined the weight update group"})

    @routes.post("/update_weights_from_distributed")
    async def update_from_distributed(request: web.Request) -> web.Response:
        req = await body(request)
        group = state.groups.get(str(req.get("group_name")))
        if group is None:
            return web.json_response({"success": False, "message": f"no weight update group "
                                      f"{req.get('group_name')!r}: call init_weights_update_group"}, status=400)
        names = list(req.get("names") or [])
        try:
            tensors = await asyncio.to_thread(group.receive, req["dtypes"], req["shapes"])
            version = str(req.get("weight_version") or state.engine.weight_version)
            await state.engine.update_weights(state_dict=dict(zip(names, tensors, strict=True)), version=version)
        except (KeyError, ValueError, RuntimeError, EngineError) as exc:
            return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
        return web.json_response({"success": True, "message": f"received {len(names)} tensors"})

    @routes.post("/destroy_weights_update_group")
    async def destroy_group(request: web.Request) -> web.Response:
        state.groups.pop(str((await body(request)).get("group_name")), None)
        return web.json_response({"success": True})

    @routes.post("/release_memory_occupation")
    async def release(request: web.Request) -> web.Response:
        try:
            await state.engine.release_memory()
        except EngineError as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        return web.json_response({"success": True})

    @routes.post("/resume_memory_occupation")
    async def resume_memory(request: web.Request) -> web.Response:
        # the KV cache is allocated again by the next request; weights never left
        return web.json_response({"success": True})

    @routes.get("/health")
    @routes.get("/ready")
    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200 if state.engine.alive else 503)

    @routes.get("/health_generate")
    async def health_generate(request: web.Request) -> web.Response:
        if not await state.engine.health():
            return web.Response(status=503)
        try:
            await asyncio.wait_for(state.engine.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0),
                                                         f"health-{state.rids}"), 20)
        except (EngineError, TimeoutError):
            return web.Response(status=503)
        return web.Response(status=200)

    @routes.get("/model_info")
    @routes.get("/get_model_info")
    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": state.model_path, "tokenizer_path": state.model_path,
            "is_generation": True, "weight_version": state.engine.weight_version,
            "model_type": state.engine.model.config.model_type,
        })

    @routes.get("/server_info")
    @routes.get("/get_server_info")
    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": state.model_path, "context_length": state.engine.max_context_len,
            "max_running_requests": state.engine.max_batch_size, "tp_size": 1, "dp_size": 1,
            "version": "agentrl-embedded", "weight_version": state.engine.weight_version,
        })

    @routes.get("/get_load")
    @routes.get("/v1/loads")
    async def load(request: web.Request) -> web.Response:
        stats = state.engine.stats()
        running, waiting = int(stats["active"]), int(stats["waiting"])
        return web.json_response({"num_reqs": running + waiting, "num_running_reqs": running,
                                  "num_waiting_reqs": waiting,
                                  "loads": [{"dp_rank": 0, "num_running_reqs": running,
                                             "num_waiting_reqs": waiting}]})

    app.add_routes(routes)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True, help="Hugging Face model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--max-running-requests", type=int, default=32)
    parser.add_argument("--random-seed", type=int, default=0)
    parser.add_argument("--weight-version", default="0")
    args = parser.parse_args(argv)
    if not Path(args.model_path).is_dir():
        parser.error(f"--model-path {args.model_path!r} is not a directory")

    async def serve() -> None:
        engine = EmbeddedEngine.from_pretrained(
            args.model_path, max_batch_size=args.max_running_requests,
            max_context_len=args.context_length, seed=args.random_seed,
            weight_version=args.weight_version)
        runner = web.AppRunner(build_app(engine, args.model_path), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(f"serving {args.model_path} on http://{args.host}:{args.port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            await engine.close()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

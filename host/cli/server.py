"""The HTTP face of a `Mesh` (host/cli/session.py): an OpenAI-compatible API and the live page, on Starlette.

The routes are app()'s table and the parameters taken are TAKEN, OpenAI's others at their defaults DEFAULTS (README's
two tables say what each route and parameter is to a user; tests/test_serve.py holds them to these lists). Any other
path, a slash too many included, is a 404 naming the routes, a method a route does not take a 405; any other
parameter set to something but its OpenAI default is a 400 naming it and what is taken (the other route's text too:
a chat's `prompt`, a completion's `messages`), as is a bad value or type. Where OpenAI's and `specmesh run`'s
defaults differ, the mesh's are kept: greedy (`temperature` 0) and its `--max-tokens`. `/health` is a 503 saying why
once the mesh can serve nothing (a pipeline's stage board stopped answering, `Mesh.failed`, until a request finds it
answering again); `/` is the live page (host/cli/page.html). A board that stopped answering at a request's end is a
line in the server's log (`stopped_line`), and the next request asks it again first.
A sampled request without a `seed` samples under a fresh one, as OpenAI's differ from one another; the header
`x-specmesh-seed` (and the `specmesh` field) names the seed a sampled request ran under, which gives its text again,
as `specmesh run --seed` does. A chat's messages are its turns, appended as typed (the stories model has no chat
template; `specmesh chat` does the same).

Every response carries specmesh's own figures in the extension field `specmesh`: acceptance and the drafts tested
behind it, the drafts copied into plain rounds and those accepted, tokens per verification, tokens/s, the projected
board tokens/s when the mesh projects, the boards; each streamed chunk its round's (characters of the chunk that
were accepted drafts, drafts accepted, tokens committed, seconds).

Each request generates in a thread of its own on a lane of the mesh (waiting for one, first come first
served, when all are busy); a client that disconnects, streamed or not, sets its cancel event, which ends its
generation after the round in progress and frees the lane.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specmesh.host.cli.config import RunConfig, UsageError
from specmesh.host.cli.ranges import SEED
from specmesh.host.cli.session import (Completion, GenerationFailed, Mesh, Piece, StageSilent, check_ids,
                                      stopped_line)
from specmesh.host.decode.tokenizer import lone_surrogate

MODEL_ID = "specmesh"
# The parameters taken, each with what an unknown parameter's error says of it (None: nothing): their one list, which
# that error names whole
TAKEN = {"model": None, "prompt": "a completion's text", "messages": "a chat's", "max_tokens": None,
         "max_completion_tokens": "max_tokens' other name", "temperature": None, "top_p": None, "top_k": None,
         "seed": None, "stop": None, "n": "1", "stream": None, "stream_options": None, "user": "ignored",
         "safety_identifier": "ignored"}
SUPPORTED = "specmesh takes %s; OpenAI's others only at their defaults" % ", ".join(
    key if note is None else "%s (%s)" % (key, note) for key, note in TAKEN.items())
ROUTE_OF = {"prompt": False, "messages": True}  # the text of a completion, of a chat (True): each route takes its own
# OpenAI's defaults, accepted as such: null (not given), and the value that means the same (a chat's logprobs are
# false, a completion's null; no text after the completion is the empty suffix; no tools or functions, so none is
# chosen and none runs in parallel; text is the response format and the one modality; nothing is stored, so there is
# no metadata to store with it; any service tier serves the same text)
DEFAULTS = {"echo": (None, False), "logprobs": (None, False), "top_logprobs": (None,), "best_of": (None, 1),
            "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}), "suffix": (None, ""),
            "tools": (None, []), "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}),
            "parallel_tool_calls": (None, True), "functions": (None, []), "function_call": (None, "none"),
            "modalities": (None, ["text"]), "audio": (None,), "store": (None, False), "metadata": (None, {}),
            "service_tier": (None, "auto", "default"), "prediction": (None,), "reasoning_effort": (None,),
            "verbosity": (None,), "web_search_options": (None,), "moderation": (None,), "prompt_cache_key": (None,),
            "prompt_cache_retention": (None,), "prompt_cache_options": (None,)}
MAX_BODY = 1 << 20
# seconds a request's body has to arrive whole once its headers have: one that stops short of its Content-Length and
# keeps its connection open (uvicorn has no timeout of its own for it, its issue #157) held its socket and up to
# MAX_BODY of memory for good; past this it is a 408, its connection closed. A prompt's body is a few kilobytes, and
# MAX_BODY in 60 s is 17 KB/s
BODY_S = 60
# a mesh whose pipeline lost a stage: each request asks the stage first (host/backends/pipeline.py REVIVE_S), so its
# line says this in place of a run's "run again" (Mesh.stalled)
RESTART = ("every request fails so until the board answers again (each asks it first); if it stays silent, check it and "
           "start specmesh serve again")
# seconds a generation has, once the server stops, to end its round (told to end after it): past that it waits on a
# board that does not answer (a round waits up to its 30 s deadline) or a very slow one, and its request is answered
# without it (STUCK), before the seconds a stopping server waits for its connections (serve's STOP_GRACE_S, 3) run out
STUCK_S = 2.5
STUCK = ("the server stopped before this request's generation ended its round (a board that does not answer, or a very "
         "slow one): send it again once the server is back")
UNSERVED = "the server stopped before this request's turn came (nothing was generated): send it again once it is back"
# OpenAI's finish_reason of each way a generation ends; one cut by the server's stop is "length" (its text was cut
# short, as at max_tokens), not "stop" (the model ended it): OpenAI's schema has no value of its own for it
FINISH = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context": "length", "cancelled": "length"}


class BadRequest(Exception):
    """A request the API refuses: HTTP status, one line, the parameter it names."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def reply(self) -> JSONResponse:
        reply = error(self.status, str(self), self.param, self.code)
        if self.status == 408:  # the server no longer waits on this connection, and says so (RFC 9110 15.5.9)
            reply.headers["connection"] = "close"
        return reply


def unknown_model(name: str) -> BadRequest:
    return BadRequest("the model %r does not exist: this server serves %r" % (_shown(name), MODEL_ID), "model", 404,
                      "model_not_found")


def error(status: int, message: str, param: str | None = None, code: str | None = None,
          kind: str = "invalid_request_error", final: bool = False) -> JSONResponse:
    """OpenAI's error body; `final`: a 503 the same request sent again at once would get as well (the server stopping,
    the mesh failed: a stage that stopped answering, asked again by each request, stays silent for longer than a
    client's back-off), which OpenAI's clients, retrying a 5xx twice by default, are told not to retry: they
    sent it thrice, each a line in the server's log, and one sent after the server had gone got "Connection error."
    in place of the 503's line."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status,
                        {"x-should-retry": "false"} if final else None)


def sampling(body: dict, mesh: Mesh, fixed_seed: bool = False, chat: bool = False) -> dict:
    """The keyword arguments of Mesh.request for a request body (a chat's, or a completion's); BadRequest for what
    does not map."""
    for key, value in body.items():
        if key in ROUTE_OF and ROUTE_OF[key] != chat and value is not None:  # the other route's text: ignored here
            raise BadRequest("%s belongs to %s; this route's text is its %s" % (
                key, "/v1/chat/completions" if ROUTE_OF[key] else "/v1/completions",
                "messages" if chat else "prompt"), key)
        if key in TAKEN:
            continue
        if key not in DEFAULTS:
            raise BadRequest("unsupported parameter %r: %s" % (_shown(key), SUPPORTED), key)
        if not any(value == d and isinstance(value, bool) == isinstance(d, bool) for d in DEFAULTS[key]):
            raise BadRequest("parameter %r is not supported by specmesh (only its default, %s)"
                             % (key, " or ".join(json.dumps(d) for d in DEFAULTS[key])), key)
    for key, what in (("model", "a string"), ("user", "a string (an id of the end user, which specmesh ignores)"),
                      ("safety_identifier", "a string (an id of the end user, which specmesh ignores)")):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise BadRequest("%s must be %s, not %s" % (key, what, _shown(json.dumps(body[key]))), key)
    if body.get("model") not in (None, MODEL_ID):
        raise unknown_model(body["model"])
    n = body.get("n", 1)
    if isinstance(n, bool) or n not in (None, 1):  # (true == 1 in Python)
        raise BadRequest("n must be 1: one choice per request", "n")
    out: dict[str, Any] = {}
    for key, kind in (("max_tokens", int), ("max_completion_tokens", int), ("seed", int), ("temperature", float),
                      ("top_p", float), ("top_k", int)):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise BadRequest("%s must be %s, not %s" % (key, "a number" if kind is float else "an integer",
                                                         json.dumps(value)), key)
        out["max_tokens" if key == "max_completion_tokens" else key] = kind(value)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > 4:
            raise BadRequest("stop must be a string or a list of up to 4 strings", "stop")
        if any(lone_surrogate(s) is not None for s in stops):  # as a prompt's: no text could match it
            raise BadRequest("stop holds a lone surrogate, which no UTF-8 text holds", "stop")
        out["stop"] = stops
    if body.get("stream") is not None and not isinstance(body["stream"], bool):  # (null: not given, as OpenAI's)
        raise BadRequest("stream must be true or false", "stream")
    try:
        return {"request": seeded(mesh.request(**out), "seed" in out or fixed_seed)}
    except UsageError as e:
        key = refused(mesh, out)
        raise BadRequest(str(e), "max_completion_tokens" if key == "max_tokens" and body.get(
            "max_completion_tokens") is not None else key) from None


def seeded(request: RunConfig, given: bool) -> RunConfig:
    """`request` as it samples: under the seed it was `given` (its own, or serve's --seed), else (as OpenAI's API)
    under a fresh one, so that two such requests differ; a greedy request's text has no seed to vary."""
    if given or request.greedy:
        return request
    return dataclasses.replace(request, seed=SEED[0] + secrets.randbelow(SEED[1] - SEED[0] + 1))


def seed_header(request: RunConfig) -> dict[str, str]:
    """The response's header naming the seed a sampled request ran under: the seed to send for its text again."""
    return {} if request.greedy else {"x-specmesh-seed": str(request.seed)}


def streamed_usage(body: dict) -> bool:
    """Whether a stream ends with OpenAI's usage chunk (`stream_options: {"include_usage": true}`; a whole reply
    has its usage in any case); BadRequest for options that are not OpenAI's."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):  # as OpenAI's: options a whole reply would ignore are a mistake to say
        raise BadRequest("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict) or not set(options) <= {"include_usage", "include_obfuscation"} or not all(
            isinstance(v, bool) for v in options.values()):
        raise BadRequest("stream_options must be an object of include_usage and include_obfuscation, each true or "
                         "false", "stream_options")
    return options.get("include_usage", False)


def refused(mesh: Mesh, settings: dict) -> str | None:
    """The first of a refused request's `settings` that Mesh.request refuses alone: the parameter its error
    names (None: only their combination is refused)."""
    for key, value in settings.items():
        try:
            mesh.request(**{key: value})
        except UsageError:
            return key
    return None


def completion_prompt(body: dict, mesh: Mesh) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # OpenAI's batch of prompts (strings, or token arrays) holding one: that prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        try:
            check_ids(prompt, len(mesh.tok.pieces))
        except UsageError as e:
            raise BadRequest(str(e), "prompt") from None
        return list(prompt)
    if not isinstance(prompt, str):  # ("": the start of a document, the model's first token alone, as OpenAI's)
        raise BadRequest("prompt must be a string or a non-empty list of token ids (one prompt per request)",
                         "prompt")
    fits_context([prompt], mesh, "prompt")
    return mesh.encode(prompt)


def fits_context(texts: list[str], mesh: Mesh, param: str) -> None:
    """BadRequest unless `texts` are Unicode text that may fit the context, checked before they are encoded:
    JSON's escapes can spell a lone UTF-16 surrogate, which no encoding writes (the tokenizer works on UTF-8
    bytes), and encoding a megabyte would hold the event loop every stream shares for seconds."""
    least = 0
    for text in texts:
        try:
            least += mesh.tok.least_tokens(text, bos=not least)  # (a chat's later turns have none)
        except UnicodeEncodeError as e:
            raise BadRequest("%s holds a lone surrogate (\\u%04x at character %d), which is not Unicode text"
                             % (param, ord(text[e.start]), e.start), param) from None
    if least >= mesh.context:
        raise BadRequest("the prompt has at least %d tokens but the context holds %d" % (least, mesh.context), param,
                         code="context_length_exceeded")


def chat_prompt(body: dict, mesh: Mesh) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    turns = [text for text in map(message_text, messages) if text]
    if not turns:
        raise BadRequest("the messages hold no text", "messages")
    fits_context(turns, mesh, "messages")
    return mesh.encode_turns(turns)


# what a message may carry besides its text that specmesh cannot take (each null or empty is taken: a client sending
# back a reply's message object sends them so), and why
ROLES = ("system", "developer", "user", "assistant")  # a chat message's roles taken (a tool's result is not text)
UNREAD = {"tool_calls": "specmesh calls no tools", "function_call": "specmesh calls no functions",
          "audio": "specmesh's models read and write text only"}


def message_text(m: object) -> str:
    """A chat message's text: its content, or the text of its content parts; BadRequest for a message that is not
    one, or that carries what the model cannot read (a part that is an image, audio or a file; a tool's call), which
    dropped unread would answer what the client did not ask."""
    content = m.get("content") if isinstance(m, dict) else None
    if isinstance(content, list):  # content parts, each of type text
        kinds = [p.get("type") if isinstance(p, dict) else None for p in content]
        other = next((k for k in kinds if isinstance(k, str) and k != "text"), None)
        if other is not None:
            raise BadRequest("a message's content part of type %r is not supported: specmesh's models read text only "
                             "(send parts of type text)" % _shown(other), "messages")
        texts = [p.get("text") if kind == "text" else None for p, kind in zip(content, kinds)]  # (untyped: refused)
        content = "".join(texts) if all(isinstance(t, str) for t in texts) else None
    if not isinstance(m, dict) or not isinstance(content, str) or m.get("role") not in ROLES:
        raise BadRequest("each message needs a role (%s) and text content" % ", ".join(ROLES), "messages")
    if m.get("name") is not None and not isinstance(m["name"], str):  # (taken, and ignored, as `user` is)
        raise BadRequest("a message's name must be a string, not %s" % _shown(json.dumps(m["name"])), "messages")
    for key, why in UNREAD.items():
        if m.get(key) not in (None, []):
            raise BadRequest("a message's %s is not supported: %s (send the messages' text alone)" % (key, why),
                             "messages")
    return content


def figures(done: Completion) -> dict:
    """specmesh's extension field of a finished generation."""
    s = done.stats
    proj = s.get("projection") or {}
    return {"acceptance": s.get("alpha"), "drafts_tested": s.get("alpha_tested"),  # (acceptance is null when none)
            # drafts copied from the target's table or the text into plain rounds, apart from the drafter's: a text
            # all copies read "acceptance null, 0 tested" beside 9 tokens a verification, unexplained
            "copied_drafts": s.get("lookup_drafts", 0), "copied_accepted": s.get("lookup_accepted", 0),
            "tokens_per_verification": s.get("tokens_per_verification"),
            "tokens_per_s": s.get("tokens_per_s"), "projected_tokens_per_s": proj.get("tokens_per_s"),
            "projected_on": proj.get("hardware"), "gamma_hist": s.get("gamma_hist"), "verifier": s.get("verifier"),
            "drafter": s.get("drafter"), "boards": s.get("boards"), "failovers": s.get("failovers"),
            "stop": done.stop, "seed": s.get("seed") if s.get("temperature") else None}


def round_figures(p: Piece) -> dict:
    return {"accepted_chars": p.accepted, "n_accepted": p.n_accepted, "n_committed": p.n_committed,
            "round_s": p.round_s}


def usage(prompt: list[int], done: Completion) -> dict:
    n = len(done.token_ids)
    return {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}


class Api:
    """The routes over one mesh."""

    def __init__(self, mesh: Mesh, threads: ThreadPoolExecutor, fixed_seed: bool = False):
        self.mesh = mesh
        self.fixed_seed = fixed_seed  # serve --seed N: a sampled request without a seed runs under the mesh's N
        self.threads = threads  # one per request generating or waiting for a lane (asyncio's default has few)
        self.in_flight = 0  # requests generating or waiting for a lane
        self.cancels: set[threading.Event] = set()  # one per generation running or waiting for a lane
        self.stopping = False
        self.stopped_at = 0.0  # time.monotonic() of the stop

    def stop(self) -> None:
        """The server is stopping (SIGTERM, Ctrl-C): every generation ends after its round, so that each client
        gets its reply's end (finish_reason "length": cut short; the specmesh field's stop: "cancelled"; a request
        still waiting for its turn: a 503 saying to send it again) and the server exits at once, not when the queue
        has drained."""
        self.stopping = True
        self.stopped_at = time.monotonic()
        for cancel in list(self.cancels):
            cancel.set()

    async def health(self, request: Request) -> Response:
        busy = self.mesh.lanes_busy  # the lanes generating; `waiting`: the requests queued for one
        figures = {"model": MODEL_ID, "streams": self.mesh.streams, "busy": busy, "waiting": max(self.in_flight - busy, 0)}
        failed = self._stalled()  # every request fails at once with this line: a health check must see it
        if failed:
            return JSONResponse({"status": "failed", "error": failed, **figures}, status_code=503)
        return JSONResponse({"status": "ok", **figures})

    def _stalled(self) -> str | None:
        """Why every request fails at once (a stage stopped answering, asked again by each request), in serve's words;
        else None."""
        line = self.mesh.stalled(again=True)
        return None if line is None else "%s; %s" % (line, RESTART)

    def _model(self) -> dict:
        return {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "specmesh", "context": self.mesh.context}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        """One model by its id (the openai client's `models.retrieve`)."""
        name = request.path_params["id"]
        return JSONResponse(self._model()) if name == MODEL_ID else unknown_model(name).reply()

    async def page(self, request: Request) -> Response:
        return HTMLResponse(resources.files("specmesh.host.cli").joinpath("page.html").read_text())

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, chat: bool) -> Response:
        try:
            body = json.loads(await body_of(request), parse_int=json_int)
        except BadRequest as e:
            return e.reply()
        except ClientDisconnect:  # the client left before its body was whole: nobody reads this
            return error(400, "the client left before its request's body was read")
        except asyncio.CancelledError:  # the server stopped while the client was still sending: its end, not a bug
            return error(503, "the server stopped before the request's body was read", kind="server_error", final=True)
        except json.JSONDecodeError as e:
            return error(400, not_json(e))
        except ValueError:  # (UnicodeDecodeError among them) bytes no Unicode encoding of JSON holds
            return error(400, "the body must be JSON, in UTF-8")
        except RecursionError:  # arrays or objects nested deeper than the parser's stack
            return error(400, "the body must be JSON nested less deeply")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        try:
            prompt = chat_prompt(body, self.mesh) if chat else completion_prompt(body, self.mesh)
            kw = sampling(body, self.mesh, self.fixed_seed, chat)
            if len(prompt) >= self.mesh.context:
                raise BadRequest("the prompt has %d tokens but the context holds %d" % (len(prompt), self.mesh.context),
                                 "messages" if chat else "prompt", code="context_length_exceeded")
            totals = streamed_usage(body)
        except BadRequest as e:
            return e.reply()
        reply = Reply(chat, totals)
        headers = seed_header(kw["request"])
        if body.get("stream"):
            return StreamingResponse(self._events(prompt, kw, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", **headers})
        cancel = threading.Event()
        watch = asyncio.ensure_future(self._left(request, cancel))
        try:
            done = await self._run(prompt, kw, cancel, None)
        except GenerationFailed as e:
            return error(503, str(e), kind="server_error", final=self.mesh.failed is not None)
        finally:
            cancel.set()
            watch.cancel()
        if self.unserved(done):
            return error(503, UNSERVED, kind="server_error", final=True)
        return JSONResponse(reply.whole(done, prompt), headers=headers)

    def unserved(self, done: Completion) -> bool:
        """Whether `done` is a request the server stopped before its turn: the mesh never began it (no rounds), and
        an empty text with finish_reason "length" would tell its client it was served."""
        return self.stopping and not done.stats["rounds"]

    @staticmethod
    async def _left(request: Request, cancel: threading.Event) -> None:
        """Sets `cancel` when the client of a whole-body request disconnects: its body was read, so what the
        server hands on next is the disconnect (as a stream's own end does for streamed replies)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        cancel.set()

    async def _run(self, prompt, kw, cancel, on_piece) -> Completion:
        self.in_flight += 1
        self.cancels.add(cancel)
        if self.stopping:
            cancel.set()
        try:
            done = await self._unless_stuck(asyncio.get_running_loop().run_in_executor(
                self.threads, self.mesh.complete, prompt, kw["request"], on_piece, cancel))
        except GenerationFailed as e:  # the client hears of it, and the server's operator, who alone can mend the mesh
            if isinstance(e, StageSilent):  # a stage stopped answering: said as serve's, not a run's "run again"
                e = GenerationFailed(self._stalled() or str(e))
            if self.mesh.warn is not None:
                self.mesh.warn("a request failed: %s" % e)
            raise e from None
        finally:
            self.in_flight -= 1
            self.cancels.discard(cancel)
        stopped = stopped_line(done.stats["boards"], "request")  # a board silent at its text's end: the operator hears
        if stopped and self.mesh.warn is not None:  # (the next request asks it again first)
            self.mesh.warn(stopped)
        return done

    async def _unless_stuck(self, generation: asyncio.Future) -> Completion:
        """The generation's Completion; GenerationFailed (STUCK) once the server has stopped STUCK_S ago and it has not
        ended its round: uvicorn would cancel its request past its grace (a 500 to the client, a traceback in the log).
        Its thread goes on until serve releases the mesh's boards (host/cli/serve.py), its end dropped."""
        while not generation.done():
            try:
                await asyncio.wait({generation}, timeout=0.25)  # (it returns as soon as the generation ends)
            except asyncio.CancelledError:  # as awaiting it would: its end (a failure too) is not waited for
                generation.cancel()
                raise
            if self.stopping and not generation.done() and time.monotonic() - self.stopped_at > STUCK_S:
                generation.cancel()
                raise GenerationFailed(STUCK)
        return generation.result()

    async def _events(self, prompt: list[int], kw: dict, reply: Reply):
        """The SSE stream of one generation; closed early (the client left), it cancels the generation."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        task = asyncio.ensure_future(self._run(prompt, kw, cancel,
                                               lambda p: loop.call_soon_threadsafe(pieces.put_nowait, p)))
        task.add_done_callback(lambda _: pieces.put_nowait(None))
        try:
            yield sse(reply.first())
            while (piece := await pieces.get()) is not None:
                if piece.text:
                    yield sse(reply.chunk(piece))
                    # a turn of the event loop between chunks: pieces piled up (the loop busy with other streams) were
                    # sent one after another without one, so a client gone mid-pile was written to until the pile ran
                    # out, asyncio logging "socket.send() raised exception." from the fifth write on; with it the
                    # connection's loss is heard after the write that met it, and nothing more is sent
                    await asyncio.sleep(0)
            try:
                done = task.result()
            except GenerationFailed as e:
                yield sse({"error": {"message": str(e), "type": "server_error", "param": None, "code": None}})
                return
            if self.unserved(done):
                yield sse({"error": {"message": UNSERVED, "type": "server_error", "param": None, "code": None}})
                return
            yield sse(reply.last(done))
            if reply.totals:
                yield sse(reply.usage(done, prompt))
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()  # a client gone: the generation ends after its round, freeing its lane
            # (and its failure, said in the log by _run, is taken: asyncio would log it again with a traceback)
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def body_of(request: Request) -> bytes:
    """The request's body, read up to MAX_BODY bytes (BadRequest 413 beyond: any prompt the context holds is a
    few kilobytes, and a body is held whole in memory to be parsed), and refused unread where its Content-Length
    says so (a client waiting to hear `100 Continue` before it sends a big body, curl's way, was told to send it, and
    one that declared more than it sent waited for good), a 408 where it is not whole within BODY_S; a compressed one is
    a 415, unread: compressed JSON is no JSON to the parser, and "the body must be JSON" would tell its client to mend
    what is not broken."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise BadRequest("the body's Content-Encoding %s is not taken: send the JSON uncompressed" % _shown(encoding),
                         status=415)
    too_big = BadRequest("the body is over %d bytes: no prompt the context holds is that long" % MAX_BODY, status=413)
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise too_big
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    raise too_big
                chunks.append(chunk)
    except TimeoutError:
        raise BadRequest("the request's body did not arrive whole within %d s (its client sent less than its "
                         "Content-Length says, or stalled): send the request again" % BODY_S, status=408) from None
    return b"".join(chunks)


def not_json(e: json.JSONDecodeError) -> str:
    """What a body the JSON parser refused lacks, and where: a client's usual slips (single quotes, a trailing comma,
    form fields) are found at once from the line and column."""
    if not e.doc.strip():
        return "the body is empty: send the request's parameters as a JSON object"
    return "the body must be JSON: %s at line %d, column %d" % (e.msg[:1].lower() + e.msg[1:], e.lineno, e.colno)


def json_int(digits: str) -> int:
    """An integer of a request's JSON; BadRequest for one of more digits than Python converts (4300 by default), which
    was "the body must be JSON", though it is: no parameter takes a number that long."""
    try:
        return int(digits)
    except ValueError:
        raise BadRequest("a number in the body has %d digits: no parameter takes one that long"
                         % len(digits.lstrip("-"))) from None


def sse(obj: dict) -> str:
    return "data: %s\n\n" % json.dumps(obj)


class Reply:
    """The bodies of one response, as a completion or a chat completion."""

    def __init__(self, chat: bool, totals: bool = False):
        self.chat = chat
        self.totals = totals  # a stream's chunks carry usage: null, and its usage comes in a chunk of its own
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, stream: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        head = {"id": self.id, "object": kind + (".chunk" if stream and self.chat else ""), "created": self.created,
                "model": MODEL_ID}
        return {**head, "usage": None} if stream and self.totals else head

    def _choice(self, text: str | None, finish: str | None, stream: bool) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if stream:
            return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                    "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}

    def whole(self, done: Completion, prompt: list[int]) -> dict:
        return {**self._head(False), "choices": [self._choice(done.text, FINISH[done.stop], False)],
                "usage": usage(prompt, done), "specmesh": figures(done)}

    def first(self) -> dict:
        if self.chat:
            return {**self._head(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                     "logprobs": None, "finish_reason": None}]}
        return {**self._head(True), "choices": [self._choice("", None, True)]}

    def chunk(self, piece: Piece) -> dict:
        return {**self._head(True), "choices": [self._choice(piece.text, None, True)],
                "specmesh": round_figures(piece)}

    def last(self, done: Completion) -> dict:
        return {**self._head(True), "choices": [self._choice(None if self.chat else "", FINISH[done.stop], True)],
                "specmesh": figures(done)}

    def usage(self, done: Completion, prompt: list[int]) -> dict:
        """The chunk after the last choice's that `stream_options.include_usage` asks for: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(prompt, done)}


def _shown(path: str, most: int = 80) -> str:
    """A requested path as an error names it: its first `most` characters (a 100 KB path is not echoed back)."""
    return path if len(path) <= most else path[:most] + "..."


def route_names(table: list[Route]) -> str:
    """What a 404 says the routes are: each route of `table` as its methods and path (a parameter as {name})."""
    return "the API's routes are " + ", ".join(
        "%s %s" % ("/".join(sorted(set(r.methods or ()) - {"HEAD"})), re.sub(r"{(\w+):\w+}", r"{\1}", r.path))
        for r in table)


def app(mesh: Mesh, threads: ThreadPoolExecutor, fixed_seed: bool = False) -> Starlette:
    """The ASGI application serving `mesh` on `threads` (both closed by the caller); `fixed_seed`: a sampled request
    without a seed runs under the mesh's (serve --seed), not a fresh one."""
    api = Api(mesh, threads, fixed_seed)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error(404, "no route %s %s: %s" % (request.method, _shown(request.url.path), routes))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        reply = error(405, "%s is not allowed on %s" % (request.method, _shown(request.url.path)))
        reply.headers.update(getattr(exc, "headers", None) or {})  # Allow: the methods the route takes
        return reply

    table = [  # the routes' one list: what a 404 names is made from it
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/models", api.models),
        Route("/v1/models/{id:path}", api.model),
        Route("/health", api.health),
        Route("/", api.page),
    ]
    routes = route_names(table)
    served = Starlette(routes=table, exception_handlers={404: not_found, 405: not_allowed})
    # a path with a slash too many (/v1/completions/) is a 404 naming the routes, not Starlette's 307 without a body to
    # the route: curl prints nothing for that, and a client that does not follow a POST's redirect has no reply to read
    served.router.redirect_slashes = False
    served.state.stop = api.stop  # for the server's signal handler (host/cli/serve.py)
    return served

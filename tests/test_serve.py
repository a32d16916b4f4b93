"""`specmesh serve` (host/cli/server.py, host/cli/serve.py) driven by the official `openai` client: greedy text
equals `specmesh run`'s on virtual boards, streamed (SSE) and not, completions and chat; 16 concurrent streams
on host back-ends give the texts they give one at a time (greedy and seeded) with batched passes; a client
killed mid-generation (streamed or not) frees its lane for the next request; what does not map is a 4xx naming it."""

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="specmesh serve needs the `serve` extra: pip install -e '.[dev]'")
openai = pytest.importorskip("openai", reason="the tests drive the server with the `openai` package (dev extra)")

import specmesh
from specmesh import Mesh
from specmesh.host.cli import registry
from tests.serve_util import Slow, client, serving

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def run_text():
    """`specmesh run`'s greedy text on the default virtual boards (run first: the server's boards are the same)."""
    done = subprocess.run([sys.executable, "-m", "specmesh", "run", "-p", PROMPT, "-n", "24", "--stats-json", "-",
                           "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["text"]


@pytest.fixture(scope="module")
def boards(run_text):
    with Mesh() as mesh, serving(mesh) as url:  # virtual drafter and verifier boards, as `specmesh run`
        yield url


def test_the_specmesh_field_counts_the_copied_drafts_beside_the_drafter_s(boards):
    """A text whose drafts were all copies (the target's table, the text's own) read "acceptance null, 0 drafts
    tested" beside 9 tokens a verification, with nothing to say where they came from; the copies are counted too,
    as run's table counts them, and each streamed chunk's accepted drafts add up to both kinds."""
    c = client(boards)
    chunks = list(c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=100, stream=True))
    figures = chunks[-1].model_extra["specmesh"]
    rounds = [ch.model_extra["specmesh"] for ch in chunks if "n_accepted" in ch.model_extra.get("specmesh", {})]
    assert figures["copied_drafts"] > 0 and 0 <= figures["copied_accepted"] <= figures["copied_drafts"]
    drafter_accepted = round((figures["acceptance"] or 0) * figures["drafts_tested"])  # (alpha: accepted / tested)
    assert sum(r["n_accepted"] for r in rounds) == figures["copied_accepted"] + drafter_accepted


def test_completions_and_chat_streamed_and_not_give_run_s_greedy_text(run_text, boards):
    c = client(boards)
    whole = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=24)
    assert whole.choices[0].text == run_text and whole.usage.completion_tokens == 24
    assert whole.choices[0].finish_reason == "length"
    figures = whole.model_extra["specmesh"]  # specmesh's extension field
    assert figures["tokens_per_verification"] >= 1 and {b["role"] for b in figures["boards"]} == {"drafter",
                                                                                                  "verifier"}
    chunks = list(c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=24, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == run_text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert any(ch.model_extra.get("specmesh", {}).get("accepted_chars") for ch in chunks)  # drafts were accepted
    chat = c.chat.completions.create(model="specmesh", messages=[{"role": "user", "content": PROMPT}], max_tokens=24)
    assert chat.choices[0].message.content == run_text and chat.choices[0].message.role == "assistant"
    deltas = list(c.chat.completions.create(model="specmesh", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=24, stream=True))
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == run_text
    assert [m.id for m in c.models.list().data] == ["specmesh"]


def test_curl_shows_the_sse_stream(run_text, boards):
    done = subprocess.run(["curl", "-sN", boards + "/v1/completions", "-H", "content-type: application/json", "-d",
                           json.dumps({"prompt": PROMPT, "max_tokens": 24, "stream": True})],
                          capture_output=True, text=True, timeout=120)
    events = [line for line in done.stdout.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == run_text


def test_what_does_not_map_is_a_4xx_naming_it(boards):
    c = client(boards)
    for kwargs, status, param in (({"n": 2}, 400, "n"), ({"logprobs": 2}, 400, "logprobs"),
                                  ({"presence_penalty": 0.5}, 400, "presence_penalty"),
                                  ({"temperature": -1}, 400, "temperature"), ({"top_p": 0}, 400, "top_p"),
                                  ({"seed": -5}, 400, "seed"), ({"max_tokens": 0}, 400, "max_tokens"),
                                  ({"extra_body": {"max_completion_tokens": 0}}, 400, "max_completion_tokens"),
                                  ({"model": "gpt-4"}, 404, "model"),
                                  ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
                                  ({"prompt": PROMPT * 200}, 400, "prompt")):
        body = {"model": "specmesh", "prompt": PROMPT, "max_tokens": 4, **kwargs}
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(**body)
        assert e.value.status_code == status and e.value.body["param"] == param, (kwargs, e.value.body)
    import urllib.error
    import urllib.request

    huge = PROMPT * 20_000  # 320 kB: refused from its size, before it is encoded
    for route, body, param, says in (  # bodies the openai client does not send, and a huge prompt
            ("completions", '{"prompt": "Once \\ud800 upon"}', "prompt", "lone surrogate"),
            ("chat/completions", '{"messages": [{"role": "user", "content": "\\udcff"}]}', "messages",
             "lone surrogate"),
            ("chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
             "messages", "text content"),
            ("completions", json.dumps({"prompt": huge}), "prompt", "at least"),
            ("chat/completions", json.dumps({"messages": [{"role": "user", "content": huge}]}), "messages",
             "at least")):
        ask = urllib.request.Request(boards + "/v1/" + route, body.encode(), {"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ask, timeout=60)
        error = json.load(e.value)["error"]
        assert e.value.code == 400 and error["param"] == param and says in error["message"], (body[:80], error)
    ask = urllib.request.Request(boards + "/v1/completions", json.dumps({"prompt": huge * 4}).encode())
    # over the server's MAX_BODY: refused from its Content-Length, unread. A client that sends the whole body without
    # waiting (urllib: no Expect: 100-continue) may find the connection closed under its send before it reads the 413
    # (a broken pipe or a reset, as the machine's load has it): either way the server is not held, and serves on
    with pytest.raises(urllib.error.URLError) as e:
        urllib.request.urlopen(ask, timeout=60)
    if isinstance(e.value, urllib.error.HTTPError):
        assert e.value.code == 413 and "over" in json.load(e.value)["error"]["message"]
    else:
        assert getattr(e.value.reason, "errno", None) in (errno.EPIPE, errno.ECONNRESET), e.value
    port = int(boards.rsplit(":", 1)[1])
    for expect in (b"Expect: 100-continue\r\n", b""):  # a big body declared, none sent: refused at once, unread
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: 50000000\r\n\r\n{" % expect)
            assert sock.recv(4096).startswith(b"HTTP/1.1 413 "), expect  # (was 100 Continue, or nothing: both waited)
    deep = ("[" * 100_000 + "]" * 100_000).encode()  # deeper than the JSON parser's stack: a 400, not a 500
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(boards + "/v1/completions", deep), timeout=60)
    assert e.value.code == 400 and json.load(e.value)["error"]["message"] == "the body must be JSON nested less deeply"
    health = json.load(urllib.request.urlopen(boards + "/health"))
    assert health["status"] == "ok" and health["busy"] == health["waiting"] == 0  # lanes generating, requests queued
    with pytest.raises(urllib.error.HTTPError) as e:  # the methods a route takes, as HTTP says
        urllib.request.urlopen(boards + "/v1/completions", timeout=60)
    assert e.value.code == 405 and e.value.headers["Allow"] == "POST"
    with pytest.raises(urllib.error.HTTPError) as e:  # a long path is not echoed back whole
        urllib.request.urlopen(boards + "/" + "x" * 10_000, timeout=60)
    assert e.value.code == 404 and "x" * 81 not in json.load(e.value)["error"]["message"]
    ask = urllib.request.Request(boards + "/v1/completions", json.dumps({"prompt": PROMPT, "stop": "\ud83d"}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(ask, timeout=60)
    error = json.load(e.value)["error"]
    assert e.value.code == 400 and error["param"] == "stop" and "lone surrogate" in error["message"], error


def test_a_batch_of_one_token_array_is_that_prompt(cpu):
    """`prompt: [[ids]]` (OpenAI's array of token arrays, here of one) was a 400 "prompt must be a non-empty string or
    a list of token ids", though `["text"]` (its array of strings, of one) was taken as that text. It now gives the
    text of its one array; a batch of several is still refused, one prompt per request."""
    url, mesh = cpu
    c = client(url)
    ids = mesh.encode(PROMPT)
    alone = c.completions.create(model="specmesh", prompt=ids, max_tokens=8).choices[0].text
    assert c.completions.create(model="specmesh", prompt=[ids], max_tokens=8).choices[0].text == alone
    for batch in ([ids, ids], [[]], [[ids]]):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="specmesh", prompt=batch, max_tokens=8)
        assert e.value.body["param"] == "prompt" and "(one prompt per request)" in e.value.body["message"], batch


def test_openai_s_own_defaults_are_taken(boards):
    """Clients that send OpenAI's defaults (a chat's `logprobs: false`, `tool_choice: "none"`, a text
    `response_format`) got a 400 "not supported by specmesh (only its default, null)"."""
    c = client(boards)
    chat = c.chat.completions.create(model="specmesh", messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                                     logprobs=False, tool_choice="none", response_format={"type": "text"},
                                     parallel_tool_calls=True, presence_penalty=0.0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:  # a completion's top 0 logprobs: not false, though 0 == False
        c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=4, logprobs=0)
    assert e.value.body["param"] == "logprobs", e.value.body


def test_an_empty_prompt_generates_from_the_start_of_a_document(cpu):
    """`prompt: ""` was a 400 "prompt must be a non-empty string", where OpenAI's reference has an empty prompt generate
    as from the beginning of a new document, as the Python API and `specmesh run -p ""` do: it now gives their text
    (streamed or not, `[""]` too); no prompt at all, or an empty list of token ids, is still refused."""
    url, mesh = cpu
    c = client(url)
    want = mesh.generate("", max_tokens=8).text
    assert want and c.completions.create(model="specmesh", prompt="", max_tokens=8).choices[0].text == want
    assert c.completions.create(model="specmesh", prompt=[""], max_tokens=8).choices[0].text == want
    chunks = c.completions.create(model="specmesh", prompt="", max_tokens=8, stream=True)
    assert "".join(ch.choices[0].text for ch in chunks) == want
    for prompt in ([], None):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="specmesh", prompt=prompt, max_tokens=8)
        assert e.value.body["param"] == "prompt" and "non-empty list of token ids" in e.value.body["message"]


def test_an_empty_suffix_is_taken_as_none(cpu):
    """`suffix: ""` (the text to follow the completion: none) was a 400 "parameter 'suffix' is not supported by
    specmesh (only its default, null)", though a completion followed by nothing is what specmesh gives; it now gives
    the text it gives without, and a suffix that asks for text after the completion is still refused."""
    c = client(cpu[0])
    alone = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8).choices[0].text
    assert c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8, suffix="").choices[0].text == alone
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8, suffix=" The end.")
    assert e.value.body["param"] == "suffix" and 'only its default, null or ""' in e.value.body["message"]


def test_an_empty_stop_string_is_refused_saying_why_and_an_empty_list_is_none(cpu):
    """`stop: ""` was a 400 "stop must be a string or a list of up to 4 non-empty strings", which the string sent
    seemed to be. OpenAI's reference gives no meaning to an empty one, and the text would end before it began (vLLM's
    server refuses it too): it is still refused, now with the line `specmesh run --stop ""` and the Python API give."""
    c = client(cpu[0])
    for stop in ("", ["\n", ""]):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=8, stop=stop)
        assert e.value.body["param"] == "stop" and e.value.body["message"] == (
            "stop needs non-empty strings (an empty one would end the text before it began)"), e.value.body
    # an empty list is no stop string: OpenAI's schema asks for one at least (minItems 1), but its API takes [] (clients
    # that always send their list send it so) as none, and so does this server
    for create, ask, text in ((c.completions.create, {"prompt": PROMPT}, lambda r: r.choices[0].text),
                              (c.chat.completions.create, {"messages": [{"role": "user", "content": PROMPT}]},
                               lambda r: r.choices[0].message.content)):
        alone, unstopped = (create(model="specmesh", max_tokens=8, **ask, **stop) for stop in ({}, {"stop": []}))
        assert text(unstopped) == text(alone) and unstopped.choices[0].finish_reason == "length"


def test_null_is_taken_as_not_given_for_each_openai_parameter(cpu):
    """`presence_penalty`, `frequency_penalty`, `best_of` and `echo` sent as null (what the openai client sends for a
    keyword given as None, as code passing its optional settings on does) were a 400 "not supported by specmesh (only
    its default, 0)": OpenAI's API takes null as not given for each, as specmesh did for the others."""
    c = client(cpu[0])
    nulls = {"presence_penalty": None, "frequency_penalty": None, "best_of": None, "echo": None}
    done = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=4, **nulls)
    assert done.usage.completion_tokens == 4
    chat = c.chat.completions.create(model="specmesh", messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                                     presence_penalty=None, frequency_penalty=None)
    assert chat.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:  # what is not the default is still refused
        c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=4, echo=True)
    assert e.value.body["param"] == "echo" and "only its default, null or false" in e.value.body["message"]


def test_the_openai_client_s_other_chat_parameters_at_their_defaults_are_taken(cpu):
    """A chat sent with `store: false`, `modalities: ["text"]`, `function_call: "none"`, `service_tier: "auto"`, a
    `safety_identifier` (the openai client's parameters, at the values that ask for nothing specmesh lacks) was a 400
    "unsupported parameter", which said nothing of what is taken; it now answers, and a parameter it does not take
    is a 400 naming it and what is."""
    c = client(cpu[0])
    ask = {"model": "specmesh", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    chat = c.chat.completions.create(**ask, store=False, metadata={}, modalities=["text"], function_call="none",
                                     functions=[], service_tier="auto", safety_identifier="alice", audio=None,
                                     prediction=None, reasoning_effort=None, verbosity=None, web_search_options=None,
                                     prompt_cache_key=None)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 4
    for kwargs, param, says in (({"store": True}, "store", "only its default, null or false"),
                                ({"modalities": ["text", "audio"]}, "modalities", "only its default"),
                                ({"safety_identifier": 5}, "safety_identifier", "which specmesh ignores), not 5"),
                                ({"extra_body": {"min_p": 0.1}}, "min_p", "unsupported parameter 'min_p': specmesh "
                                 "takes model, prompt (a completion's text), messages (a chat's), max_tokens")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**ask, **kwargs)
        assert e.value.body["param"] == param and says in e.value.body["message"], e.value.body
    from specmesh.host.cli.server import TAKEN

    missing = [key for key in TAKEN if key not in e.value.body["message"]]  # (safety_identifier was left out)
    assert not missing, e.value.body["message"]


def test_a_message_holding_what_the_model_cannot_read_is_refused(cpu):
    """An image, audio or file among a message's content parts, or an assistant's tool calls, was dropped without a
    word, and the reply answered the text alone, as if the client had sent no picture. Each is now a 400 naming the
    messages and saying why; a message sent back as the client got it (null tool calls, refusal, audio) is taken."""
    c = client(cpu[0])
    picture = {"type": "image_url", "image_url": {"url": "http://127.0.0.1/cat.png"}}
    called = {"role": "assistant", "content": "The cat", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]}
    for messages, says in (([{"role": "user", "content": [{"type": "text", "text": PROMPT}, picture]}],
                            "content part of type 'image_url' is not supported: specmesh's models read text only"),
                           ([{"role": "user", "content": PROMPT}, called], "tool_calls is not supported"),
                           ([{"role": "tool", "content": "4", "tool_call_id": "1"}],  # (developer was left out)
                            "each message needs a role (system, developer, user, assistant) and text content")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="specmesh", messages=messages, max_tokens=4)
        assert e.value.body["param"] == "messages" and says in e.value.body["message"], e.value.body
    sent_back = {"role": "assistant", "content": "The cat", "refusal": None, "tool_calls": None, "audio": None,
                 "function_call": None}
    chat = c.chat.completions.create(model="specmesh", messages=[{"role": "user", "content": PROMPT}, sent_back],
                                     max_tokens=4)
    assert chat.usage.completion_tokens == 4


def test_a_path_with_a_slash_too_many_or_none_of_the_routes_is_a_404_naming_them(cpu):
    """A request to /v1/completions/ (a slash too many) was a 307 with no body: `curl -d ...` printed nothing and
    exited 0, and urllib raised an error with nothing to read. A path that is no route's said "no route" and no more.
    Each is now a 404 in OpenAI's error shape naming the routes there are, each of them (GET /v1/models/{id} was left
    out of the line, written apart from the routes)."""
    import urllib.error

    routes = ("the API's routes are POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
              "GET /v1/models/{id}, GET /health, GET /")
    for path, body in (("/v1/completions/", {"prompt": PROMPT, "max_tokens": 4}),
                       ("/v1/chat/completions/", {"messages": [{"role": "user", "content": PROMPT}]}), ("/v1", None)):
        ask = urllib.request.Request(cpu[0] + path, None if body is None else json.dumps(body).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ask, timeout=60)
        error = json.load(e.value)["error"]
        method = "GET" if body is None else "POST"
        assert e.value.code == 404 and error["message"] == "no route %s %s: %s" % (method, path, routes), error
    assert client(cpu[0]).models.retrieve("specmesh").id == "specmesh"  # (the route's parameter, renamed id)


def test_readme_s_tables_list_the_routes_and_parameters_the_server_takes(cpu):
    """README listed serve's routes and parameters in prose, and server.py's docstring again, each apart from the
    server's own lists (app()'s route table, TAKEN), and had drifted from them (no max_completion_tokens or
    stream_options). README's two tables are now the one place they are described, each row a name of those lists."""
    import re

    from specmesh.host.cli import server

    readme = (ROOT / "README.md").read_text()

    def table(header: str) -> set[str]:
        rows = readme.split(header + "\n| --- | --- |\n", 1)[1].split("\n\n", 1)[0].splitlines()
        return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])}

    routes = server.route_names(server.app(cpu[1], None).routes).removeprefix("the API's routes are ").split(", ")
    assert table("| route | what |") == set(routes)
    assert table("| parameter | taken as |") == set(server.TAKEN)


def test_a_compressed_body_is_a_415_saying_to_send_it_uncompressed(cpu):
    """A body sent gzip-compressed (Content-Encoding: gzip) was "the body must be JSON", which it was: the client was
    told to mend what was not broken. It is now a 415 saying to send the JSON uncompressed."""
    import gzip
    import urllib.error

    body = gzip.compress(json.dumps({"prompt": PROMPT, "max_tokens": 4}).encode())
    ask = urllib.request.Request(cpu[0] + "/v1/completions", body, {"Content-Encoding": "gzip"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(ask, timeout=60)
    assert e.value.code == 415 and json.load(e.value)["error"]["message"] == (
        "the body's Content-Encoding gzip is not taken: send the JSON uncompressed")
    plain = urllib.request.Request(cpu[0] + "/v1/completions", gzip.decompress(body), {"Content-Encoding": "identity"})
    assert json.load(urllib.request.urlopen(plain, timeout=60))["usage"]["completion_tokens"] == 4


def test_a_body_that_stops_short_of_its_content_length_is_a_408_within_the_bound(cpu, monkeypatch):
    """A client that declared a Content-Length, sent less and kept its connection open waited for good (uvicorn has no
    timeout of its own for a body), its socket and the body so far held by the server. It held no lane: a request
    meanwhile is served, neither counted as waiting. Past server.BODY_S it is now a 408 saying so, and its connection
    is closed."""
    from specmesh.host.cli import server

    monkeypatch.setattr(server, "BODY_S", 1)
    port = int(cpu[0].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        assert client(cpu[0]).completions.create(model="specmesh", prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4
        health = json.load(urllib.request.urlopen(cpu[0] + "/health", timeout=60))
        assert health["busy"] == health["waiting"] == 0, health
        got = b""
        while chunk := sock.recv(4096):  # (the server closes the connection after its reply)
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower(), head
    assert json.loads(body)["error"]["message"] == (
        "the request's body did not arrive whole within 1 s (its client sent less than its Content-Length says, or "
        "stalled): send the request again")


def test_a_body_that_is_not_json_is_a_400_saying_where(cpu):
    """A body the JSON parser refused (single quotes, as a shell's `-d "{'prompt': ...}"` sends, a trailing comma,
    form fields, nothing) was "the body must be JSON" alone, which left the client to find what is wrong with it. The
    error now says what the parser expected and where; an empty body that it is empty; bytes no UTF is "in UTF-8"."""
    import urllib.error

    for body, says in ((b"{'prompt': 'The cat'}", "the body must be JSON: expecting property name enclosed in double "
                                                  "quotes at line 1, column 2"),
                       # Python 3.13's parser names a trailing comma, where 3.11 and 3.12 say what they expected
                       (b'{"prompt": "The cat",\n}', "the body must be JSON: illegal trailing comma before end of "
                                                     "object at line 1, column 21" if sys.version_info >= (3, 13) else
                                                     "the body must be JSON: expecting property name enclosed in "
                                                     "double quotes at line 2, column 1"),
                       (b"prompt=The+cat", "the body must be JSON: expecting value at line 1, column 1"),
                       (b"", "the body is empty: send the request's parameters as a JSON object"),
                       (b'{"prompt": "\xff"}', "the body must be JSON, in UTF-8")):
        ask = urllib.request.Request(cpu[0] + "/v1/completions", body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ask, timeout=60)
        assert e.value.code == 400 and json.load(e.value)["error"]["message"] == says, body


def test_the_openai_client_retrieves_the_model(boards):
    """`models.retrieve` got "no route GET /v1/models/specmesh"."""
    c = client(boards)
    model = c.models.retrieve("specmesh")
    assert model.id == "specmesh" and model.model_extra["context"] == 512
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found" and "'gpt-4' does not exist" in e.value.body["message"]


@pytest.fixture(scope="module")
def host(models):
    """16 lanes whose forwards are batched: on a host where the engine process (host/backends/pipeengine.py) cannot
    run native kernels (elsewhere each lane has its own: tests/test_session.py)."""
    from specmesh.host.backends.pipeengine import PipeEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PipeEngine, "start", classmethod(lambda cls, path: None))
        with Mesh(drafter="cpu", verifier="cpu", models=models, streams=16) as mesh, serving(mesh) as url:
            yield url, mesh


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_16_concurrent_streams_give_the_texts_they_give_one_at_a_time(host, temperature):
    url, mesh = host
    c = client(url)
    prompts = ["%s %d" % (PROMPT, i) for i in range(16)]

    def one(i: int) -> str:
        stream = c.completions.create(model="specmesh", prompt=prompts[i], max_tokens=24, temperature=temperature,
                                      seed=i, stream=True)
        return "".join(ch.choices[0].text for ch in stream)

    alone = [one(i) for i in range(16)]
    verifier = mesh._setup._batchers["verifier"]
    before = verifier.batches, verifier.requests
    got: list = [None] * 16
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, one(i))) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == alone and len(set(alone)) > 1
    passes, requests = verifier.batches - before[0], verifier.requests - before[1]
    assert requests > passes > 0  # the streams' forwards shared passes


@pytest.fixture(scope="module")
def cpu(models):
    """A server on one lane of host back-ends (the small random models: sampled texts differ by seed) and its mesh."""
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh, serving(mesh) as url:
        yield url, mesh


def test_a_sampled_request_without_a_seed_draws_one_and_names_it(cpu):
    """A sampled request without `seed` ran under seed 0: the same text every time, where OpenAI's differ. Each
    now draws a seed of its own, which the header x-specmesh-seed and the specmesh field name: sent back, it gives
    the text again, the text a given seed gave before (the mesh's own). A greedy request names none."""
    url, mesh = cpu
    c = client(url)
    ask = {"model": "specmesh", "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0}
    raws = [c.completions.with_raw_response.create(**ask) for _ in range(3)]
    seeds = [int(r.headers["x-specmesh-seed"]) for r in raws]
    texts = [r.parse().choices[0].text for r in raws]
    assert len(set(seeds)) == 3 and len(set(texts)) > 1, (seeds, texts)
    assert [r.parse().model_extra["specmesh"]["seed"] for r in raws] == seeds
    again = c.completions.with_raw_response.create(**ask, seed=seeds[0], stream=True)
    assert again.headers["x-specmesh-seed"] == str(seeds[0])  # before the stream's text: a stream's seed too
    assert "".join(ch.choices[0].text for ch in again.parse()) == texts[0]
    assert mesh.generate(PROMPT, max_tokens=16, temperature=1.0, seed=seeds[0]).text == texts[0]
    greedy = c.completions.with_raw_response.create(model="specmesh", prompt=PROMPT, max_tokens=16)
    assert "x-specmesh-seed" not in greedy.headers and greedy.parse().model_extra["specmesh"]["seed"] is None


def test_top_k_is_taken_as_the_mesh_takes_it(cpu):
    """`top_k` (not OpenAI's, but vLLM's and llama.cpp's servers take it, and clients send it in `extra_body`) was a 400
    "unsupported parameter 'top_k'", though the mesh samples under a top-k (`specmesh run --top-k`). A request's
    `top_k` now gives the text the Python API gives under it, streamed or not; a bad one is a 400 naming it."""
    url, mesh = cpu
    c = client(url)
    ask = {"model": "specmesh", "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 5}
    texts = {k: c.completions.create(**ask, extra_body={"top_k": k}).choices[0].text for k in (1, 3)}
    assert texts == {k: mesh.generate(PROMPT, max_tokens=16, temperature=1.0, seed=5, top_k=k).text for k in (1, 3)}
    assert texts[1] == mesh.generate(PROMPT, max_tokens=16).text != texts[3]  # top-1 samples the greedy text
    chunks = c.completions.create(**ask, stream=True, extra_body={"top_k": 3})
    assert "".join(ch.choices[0].text for ch in chunks) == texts[3]
    for top_k, says in ((-1, "top_k must be in 0..65535 (0: off), not -1"), (2.5, "top_k must be an integer, not 2.5")):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(**ask, extra_body={"top_k": top_k})
        assert e.value.body["param"] == "top_k" and says in e.value.body["message"], e.value.body


def test_a_stream_carries_usage_only_when_stream_options_ask_for_it(cpu):
    """Every stream's last choice chunk carried usage, and `stream_options` was ignored. OpenAI's streams carry
    none unless `stream_options: {"include_usage": true}`, and then in a chunk of its own after the last choice's,
    with no choices, every other chunk's usage null."""
    c = client(cpu[0])
    for create, ask in ((c.completions.create, {"prompt": PROMPT}),
                        (c.chat.completions.create, {"messages": [{"role": "user", "content": PROMPT}]})):
        plain = list(create(model="specmesh", max_tokens=8, stream=True, **ask))
        assert not any("usage" in ch.model_fields_set for ch in plain), plain[-1]
        assert plain[-1].choices[0].finish_reason == "length"
        *chunks, totals = create(model="specmesh", max_tokens=8, stream=True, stream_options={"include_usage": True},
                                 **ask)
        assert totals.choices == [] and totals.usage.completion_tokens == 8 and totals.usage.total_tokens > 8
        assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].model_extra["specmesh"]["stop"]
        assert all("usage" in ch.model_fields_set and ch.usage is None for ch in chunks)
        with pytest.raises(openai.BadRequestError) as e:
            create(model="specmesh", max_tokens=8, stream=True, stream_options={"include_usage": "yes"}, **ask)
        assert e.value.body["param"] == "stream_options", e.value.body


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("half", [False, True])
def test_a_client_killed_mid_generation_frees_its_lane_for_the_next_request(models, monkeypatch, caplog, stream, half):
    """A client gone (its socket closed, or only its sending half: `half`, whose FIN is the one a closed socket sends, so
    uvicorn takes it as gone too and closes the connection, unanswered) ends its generation after its round, the
    next request gets the text it gets alone, and the server logs nothing of it (uvicorn's loggers do not reach pytest's, and its Config sets their handlers, so a
    handler of the test's, added once the server runs, hears them)."""
    import logging

    rounds: list[int] = []  # each generation's, in turn (gamma 0: a token each)

    class Counted(Slow):
        def begin(self, params, prompt):
            rounds.append(0)
            super().begin(params, prompt)

        def verify(self, committed, draft):
            rounds[-1] += 1
            return super().verify(committed, draft)

    monkeypatch.setitem(registry.VERIFIERS, "slow", Counted)
    heard: list[logging.LogRecord] = []
    hearing = logging.Handler(logging.WARNING)
    hearing.emit = heard.append  # type: ignore[method-assign]
    try:
        with Mesh(drafter="cpu", verifier="slow", models=models, gamma="0") as mesh, serving(mesh) as url:
            logging.getLogger("uvicorn").addHandler(hearing)
            assert mesh.streams == 1  # one lane: the next request waits for it
            port = int(url.rsplit(":", 1)[1])
            body = json.dumps({"prompt": PROMPT, "max_tokens": 120, "stream": stream}).encode()
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            got = b""
            while stream and got.count(b"data: ") < 3:  # the stream is under way: its lane is taken
                got += sock.recv(4096)
            while not stream and mesh._free:  # the whole-body request has taken the lane
                time.sleep(0.01)
            if half:
                sock.shutdown(socket.SHUT_WR)
            else:
                sock.close()  # the client is killed
            done = client(url).completions.create(model="specmesh", prompt="The cat", max_tokens=8)
            assert done.usage.completion_tokens == 8
            assert done.choices[0].text == mesh.generate("The cat", max_tokens=8).text  # the text it gives alone
            killed = rounds[0]
            mesh.generate(PROMPT, max_tokens=120)  # the killed request's rounds, uncut (greedy: the same)
            # the lane came free before the killed generation's end (counted, not timed: it asserted the next request's
            # 2 s, which a loaded machine can exceed)
            assert len(rounds) == 4 and killed < rounds[3], rounds
            if half:  # uvicorn closed the connection: the reply was not sent, nor the stream's end
                rest = b""
                sock.settimeout(60)
                while chunk := sock.recv(4096):
                    rest += chunk
                assert b"[DONE]" not in rest and (stream or not rest), rest
            sock.close()
    finally:
        logging.getLogger("uvicorn").removeHandler(hearing)
    said = [r.getMessage() for r in heard] + [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, said


def test_a_stream_s_client_gone_while_its_chunks_pile_up_is_not_written_to_on(models, monkeypatch, caplog):
    """An event loop busy with other streams (here: 20 ms a chunk) lets a stream's pieces pile up, which were then sent
    one after another without a turn of the loop: a client gone (reset) mid-pile was written to until the pile ran out,
    and asyncio logged "socket.send() raised exception." for each write from the fifth on (a 24-stream load that left
    mid-stream put three such lines in serve's log). The loss is now heard after the write that met it: the log says
    nothing, and the next request gets its text."""
    import logging
    import struct

    from specmesh.host.cli import server

    chunk = server.Reply.chunk

    def busy(self, piece):
        time.sleep(0.02)
        return chunk(self, piece)

    monkeypatch.setattr(server.Reply, "chunk", busy)
    with Mesh(drafter="cpu", verifier="cpu", models=models, gamma="0") as mesh, serving(mesh) as url:
        body = json.dumps({"prompt": PROMPT, "max_tokens": 120, "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a reset
        sock.close()
        done = client(url).completions.create(model="specmesh", prompt="The cat", max_tokens=8)  # after the lane came
        assert done.choices[0].text == mesh.generate("The cat", max_tokens=8).text  # free: the stream's writes are done
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, said


def test_serve_seed_flag_gives_every_unseeded_sampled_request_its_seed(models):
    """`specmesh serve --seed 7` sets the seed of every sampled request that gives none, as before requests drew
    their own: the same text each time, the header naming 7; without the flag the parser leaves it to each request."""
    import argparse

    from specmesh.host.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    parse = parser.parse_args
    assert parse(["serve"]).seed is None and parse(["serve", "--seed", "7"]).seed == 7
    with Mesh(drafter="cpu", verifier="cpu", models=models, seed=7) as mesh, serving(mesh, fixed_seed=True) as url:
        ask = {"model": "specmesh", "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0}
        raws = [client(url).completions.with_raw_response.create(**ask) for _ in range(2)]
        assert [r.headers["x-specmesh-seed"] for r in raws] == ["7", "7"]
        texts = {r.parse().choices[0].text for r in raws}
        assert texts == {mesh.generate(PROMPT, max_tokens=16, temperature=1.0, seed=7).text}


@pytest.mark.parametrize("streams", ["0", "257"])
def test_serve_names_its_streams_flag_out_of_range(capsys, streams):
    """It said "streams must be in 1..256", the Python API's keyword, not the flag that was typed."""
    from specmesh.host import cli

    assert cli.main(["serve", "--streams", streams, "--port", "0", "--verifier", "cpu"]) == 2
    assert capsys.readouterr().err == "specmesh serve: error: --streams must be in 1..256, not %s\n" % streams


def _long_requests(url: str, n: int) -> list[socket.socket]:
    """n raw connections to the server at `url`, each having sent a long completion request (read by none)."""
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"prompt": PROMPT, "max_tokens": 400}).encode()
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    for sock in clients:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return clients


def test_clients_gone_before_their_turn_cost_the_boards_nothing(models, monkeypatch):
    """Requests whose clients left while they were queued for the server's threads (or handed the lane as they
    left) each ran a BEGIN and a round on the boards once their turn came: a crowd that gave up held the next
    request back by a round each."""
    begun = []

    class Counted(Slow):
        def begin(self, params, prompt):
            begun.append(len(prompt))
            super().begin(params, prompt)

    monkeypatch.setitem(registry.VERIFIERS, "slow", Counted)
    with Mesh(drafter="cpu", verifier="slow", models=models, gamma="0") as mesh, serving(mesh, threads=2) as url:
        clients = _long_requests(url, 16)
        while not begun or json.load(urllib.request.urlopen(url + "/health", timeout=30))["waiting"] < 15:
            time.sleep(0.01)
        for sock in clients:
            sock.close()
        del begun[:]  # the one generating
        done = client(url).completions.create(model="specmesh", prompt="The cat", max_tokens=8)
        assert done.usage.completion_tokens == 8 and len(begun) == 1, begun  # its own BEGIN alone


def test_health_counts_the_lanes_generating_and_the_requests_waiting(models, monkeypatch):
    """Requests past the server's threads wait for one before they queue for a lane: /health counted them as
    lanes generating ("busy": 3 on a mesh of one stream)."""
    monkeypatch.setitem(registry.VERIFIERS, "slow", Slow)
    with Mesh(drafter="cpu", verifier="slow", models=models, gamma="0") as mesh, serving(mesh, threads=2) as url:
        clients = _long_requests(url, 4)
        health: dict = {}
        for _ in range(500):
            health = json.load(urllib.request.urlopen(url + "/health", timeout=30))
            if health["busy"] + health["waiting"] == 4:
                break
            time.sleep(0.01)
        for sock in clients:
            sock.close()
        assert (health["busy"], health["waiting"]) == (1, 3), health


@contextlib.contextmanager
def started(*flags: str):
    """A `specmesh serve --port 0 FLAGS` process and the address its banner names (killed on exit); its virtual
    boards in a folder of their own (the module's `boards` hold theirs), kept for the next run."""
    from specmesh.host.provision.cluster import _vboards_dir

    env = {**os.environ, "SPECMESH_VBOARDS": str(_vboards_dir()) + "-serve"}
    proc = subprocess.Popen([sys.executable, "-m", "specmesh", "serve", "--port", "0", *flags],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        banner = proc.stderr.readline()
        while banner and " on http" not in banner:  # (any line before the banner: a board's, a warning)
            banner = proc.stderr.readline()
        assert " on http://127.0.0.1:" in banner, banner
        yield proc, banner.split(" on ")[1].split()[0]
    finally:
        proc.kill()
        proc.wait()


def test_serve_on_port_0_names_the_port_it_listens_on_and_stops_on_ctrl_c():
    """`specmesh serve --port 0` (host/cli/serve.py): the banner's address is where the API answers; Ctrl-C ends it
    with one line and status 130. A request asking to upgrade its connection (`curl --http2` asks for h2c, a browser
    for a WebSocket) is answered as HTTP/1.1 without the two lines uvicorn logged for it, one advising the operator to
    install a WebSocket library."""
    import http.client

    from specmesh.host.cli.serve import url

    assert url("::1", 80) == "http://[::1]:80/" and url("127.0.0.1", 8080) == "http://127.0.0.1:8080/"
    with started("--verifier", "cpu", "--drafter", "cpu") as (proc, address):
        assert not address.endswith(":0/")
        with urllib.request.urlopen(address + "v1/models", timeout=30) as reply:
            assert json.loads(reply.read())["data"][0]["id"] == "specmesh"
        host, port = address.split("//")[1].rstrip("/").rsplit(":", 1)
        for upgrade in ("h2c", "websocket"):
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("GET", "/v1/models", headers={"Connection": "Upgrade", "Upgrade": upgrade})
            assert json.loads(conn.getresponse().read())["data"][0]["id"] == "specmesh"
            conn.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert proc.stderr.read().strip() == "specmesh serve: interrupted"


def test_a_client_speaking_tls_or_no_http_is_told_where_the_server_is_in_its_log():
    """A client given https:// (the openai client then says "Connection error.", curl "wrong version number") had the
    server log "WARNING:  Invalid HTTP request received." and no more; the line now says what it most often is and the
    address that reaches the server. It serves on."""
    with started("--verifier", "cpu", "--drafter", "cpu") as (proc, address):
        host, port = address.split("//")[1].rstrip("/").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32))  # a TLS greeting's start
            reply = sock.recv(4096)  # uvicorn's own 400, in plain text: the API never sees the request (README)
            assert reply.startswith(b"HTTP/1.1 400 ") and b"content-type: text/plain" in reply.lower(), reply
        assert proc.stderr.readline() == ("WARNING:  a client sent what is not a well-formed HTTP/1.1 request (it got a "
                                          "400); if it was given an https:// address, give it %s\n" % address)
        with urllib.request.urlopen(address + "health", timeout=30) as reply:
            assert json.loads(reply.read())["status"] == "ok"


def test_sigterm_stops_serve_at_once_though_a_client_is_still_sending():
    """The server tells its generations to end and waits a few seconds (serve.py STOP_GRACE_S) for connections, not
    for a client that never finishes its request, which gets a 503: status 143, no traceback in the log, and no ERROR:
    uvicorn's "ERROR: Cancel 1 running task(s), timeout graceful shutdown exceeded" for that client is a warning saying
    what was cut."""
    from specmesh.host.cli.serve import STOP_GRACE_S

    with started("--verifier", "cpu", "--drafter", "cpu") as (proc, address):
        host, port = address.split("//")[1].rstrip("/").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as client:  # 10 of its 100 body bytes, then nothing
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n0123456789")
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 143
            assert time.monotonic() - t0 < STOP_GRACE_S + 5
            client.settimeout(30)
            reply = b"".join(iter(lambda: client.recv(4096), b""))
        assert reply.startswith(b"HTTP/1.1 503 ") and b"the server stopped before the request's body was read" in reply
        log = proc.stderr.read()
        assert log.splitlines() == ["WARNING:  the stop cut 1 connection(s) still open %d s after it: a client still "
                                    "sending its request (it got a 503) or reading its reply slowly" % STOP_GRACE_S,
                                    "specmesh serve: stopped by SIGTERM"], log


def _vm(parent: int, board: str) -> int:
    """The pid of the MicroPython VM of the virtual board named `board` that process `parent` started."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path("/proc/%s/environ" % pid).read_bytes()
            ppid = int(Path("/proc/%s/stat" % pid).read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):  # gone, or not ours to read
            continue
        flash = [v for v in env.split(b"\0") if v.startswith(b"VBOARD_FLASH=")]  # (host/emulator/board.py _env)
        if ppid == parent and flash and Path(flash[0].decode().split("=", 1)[1]).name == board:
            return int(pid)
    raise AssertionError("no VM of %s under process %d" % (board, parent))


def test_ctrl_c_while_a_stage_stalls_answers_the_request_and_stops_serve_at_once(models):
    """Ctrl-C while a request's round waited on a stage board that stopped answering (its VM stopped): the generation,
    told to end after its round, never ended it, so uvicorn cancelled the request past its grace (a 500 to the client,
    an "Exception in ASGI application" traceback in the log) and serve then waited for the round until the stage's
    30 s deadline. Now the request is a 503 saying to send it again, the boards are released at once, and serve ends
    with one line and status 130."""
    import urllib.error

    from specmesh.host.cli.server import STUCK

    got: list = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(address + "v1/completions", json.dumps(
                {"prompt": PROMPT, "max_tokens": 100}).encode(), {"content-type": "application/json"}), timeout=120)
            got.append((200, None))
        except urllib.error.HTTPError as e:
            got.append((e.code, e.read().decode()))

    with started("--models", str(models), "--drafter", "cpu", "--stages", "2") as (proc, address):
        vm = _vm(proc.pid, "stage1")
        os.kill(vm, signal.SIGSTOP)
        try:
            waiting = threading.Thread(target=ask)
            waiting.start()
            while not json.load(urllib.request.urlopen(address + "health", timeout=30))["busy"]:
                time.sleep(0.05)
            time.sleep(0.5)  # (its round under way, on the stalled stage)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 130  # (the stage's deadline is 30 s)
            waiting.join(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(vm, signal.SIGCONT)
        log = proc.stderr.read()
        assert "Traceback" not in log and log.strip().endswith("specmesh serve: interrupted"), log
        assert got and got[0][0] == 503 and json.loads(got[0][1])["error"]["message"] == STUCK, got


def under_way(reply) -> None:
    """Reads a stream's events until its generation is under way: the first is sent before it has its lane, the
    second is the text of its first round."""
    events = 0
    while events < 2:
        line = reply.readline()
        assert line, "the stream ended before its first round"
        events += line.startswith(b"data: ")


def test_sighup_mid_stream_stops_serve_as_sigterm_does():
    """A closed terminal (SIGHUP) while a stream was sent: uvicorn takes only SIGINT and SIGTERM, so the command's
    own stop broke into the event loop: a traceback per stream in the log, each client's reply cut. Now the stream
    ends, then one line and status 129. Its finish_reason was "stop", which says the model ended the text: it is
    "length", the text cut short."""
    with started() as (proc, address):  # virtual boards: a stream of 400 tokens takes seconds
        ask = urllib.request.Request(address + "v1/completions", json.dumps(
            {"prompt": PROMPT, "max_tokens": 400, "stream": True}).encode(), {"content-type": "application/json"})
        with urllib.request.urlopen(ask, timeout=60) as reply:
            under_way(reply)
            proc.send_signal(signal.SIGHUP)
            rest = reply.read().decode()
        assert rest.endswith("data: [DONE]\n\n"), rest[-300:]
        last = json.loads(rest.split("\n\n")[-3].strip().removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length" and last["specmesh"]["stop"] == "cancelled", last
        assert proc.wait(timeout=60) == 129
        log = proc.stderr.read()
        assert log.strip().endswith("specmesh serve: stopped by SIGHUP") and "Traceback" not in log, log


def test_the_other_route_s_text_and_a_true_n_are_refused(cpu):
    """A chat's `prompt` (or a completion's `messages`) beside its own text was ignored without a word, the reply
    answering what the client did not mean; `n: true` was taken as n = 1 (true == 1 in Python)."""
    import urllib.error

    url = cpu[0]
    for route, body, param in (
            ("chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "prompt": "The cat"}, "prompt"),
            ("completions", {"prompt": PROMPT, "messages": [{"role": "user", "content": "The cat"}]}, "messages"),
            ("completions", {"prompt": PROMPT, "n": True}, "n")):
        ask = urllib.request.Request(url + "/v1/" + route, json.dumps({"max_tokens": 4, **body}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ask, timeout=60)
        assert e.value.code == 400 and json.load(e.value)["error"]["param"] == param, body
    c = client(url)  # null is "not given", as OpenAI's other parameters
    assert c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=4, n=1,
                                extra_body={"messages": None}).usage.completion_tokens == 4


def test_requests_still_waiting_when_serve_stops_are_told_to_send_again():
    """Requests queued behind another on the boards' one lane when the server was stopped got what a served request
    gets: an empty text, finish_reason "length" and null figures, which a client takes for its answer. Each is now a
    503 (a stream: its error event) saying to send it again; the one generating still ends after its round. The 503
    tells OpenAI's clients not to retry at once (they would meet the server gone, and say "Connection error.")."""
    import urllib.error

    from specmesh.host.cli.server import UNSERVED

    def ask(stream: bool) -> urllib.request.Request:
        return urllib.request.Request(address + "v1/completions", json.dumps(
            {"prompt": PROMPT, "max_tokens": 400, "stream": stream}).encode(), {"content-type": "application/json"})

    def waiting(stream: bool) -> None:
        try:
            with urllib.request.urlopen(ask(stream), timeout=60) as reply:
                got[stream] = (reply.status, reply.read().decode(), reply.headers["x-should-retry"])
        except urllib.error.HTTPError as e:
            got[stream] = (e.code, e.read().decode(), e.headers["x-should-retry"])

    got: dict = {}
    with started() as (proc, address):  # virtual boards: one lane
        with urllib.request.urlopen(ask(True), timeout=60) as first:
            under_way(first)
            threads = [threading.Thread(target=waiting, args=(stream,)) for stream in (False, True)]
            for t in threads:
                t.start()
            while json.load(urllib.request.urlopen(address + "health", timeout=30))["waiting"] < 2:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            rest = first.read().decode()
            for t in threads:
                t.join()
        assert rest.endswith("data: [DONE]\n\n") and '"finish_reason": "length"' in rest, rest[-300:]
        status, body, retry = got[False]
        assert status == 503 and json.loads(body)["error"]["message"] == UNSERVED and retry == "false", got
        status, body, _ = got[True]
        events = [json.loads(e.removeprefix("data: ")) for e in body.split("\n\n") if e]
        assert status == 200 and events[-1] == {"error": {"message": UNSERVED, "type": "server_error", "param": None,
                                                          "code": None}}, events[-1]
        assert proc.wait(timeout=60) == 143


def test_parameters_of_the_wrong_type_or_out_of_place_are_refused(cpu):
    """`user: 5`, a message's `name: 5` and `stream_options` on a whole (not streamed) reply were taken without a word,
    and `model: 5` was "the model 5 does not exist" (a 404): OpenAI's API refuses each as a bad request. `stream: null`
    (not given, as OpenAI's nullable parameters) was refused as not true or false."""
    import urllib.error

    url = cpu[0]
    for body, param, says in (({"user": 5}, "user", "user must be a string"),
                              ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when"),
                              ({"stream_options": {"include_usage": True}, "stream": False}, "stream_options", "only"),
                              ({"model": 5}, "model", "model must be a string, not 5")):
        ask = urllib.request.Request(url + "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 4,
                                                                          **body}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ask, timeout=60)
        error = json.load(e.value)["error"]
        assert e.value.code == 400 and error["param"] == param and says in error["message"], (body, error)
    named = {"messages": [{"role": "user", "content": PROMPT, "name": 5}], "max_tokens": 4}
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", json.dumps(named).encode()),
                               timeout=60)
    assert e.value.code == 400 and json.load(e.value)["error"]["message"] == "a message's name must be a string, not 5"
    for body in ({"stream": None, "user": "alice"}, {"stream": None, "stream_options": None}):
        ask = urllib.request.Request(url + "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 4,
                                                                          **body}).encode())
        assert json.load(urllib.request.urlopen(ask, timeout=60))["usage"]["completion_tokens"] == 4



def test_a_number_longer_than_python_converts_is_a_400_saying_so_not_bad_json(cpu):
    """A JSON integer of over 4,300 digits (Python's int-string conversion limit) was "the body must be JSON", which
    it is: the client was told to mend what was not broken."""
    import urllib.error

    for body in ('{"prompt": "The cat", "seed": %s}' % ("9" * 5000), '{"prompt": [1, -%s]}' % ("1" * 4301)):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(cpu[0] + "/v1/completions", body.encode()), timeout=60)
        error = json.load(e.value)["error"]
        assert e.value.code == 400 and error["message"].startswith("a number in the body has"), error


def test_a_served_pipeline_of_classic_stages_holds_their_context():
    """A pipeline on classic-ESP32 stages keeps 128 positions of the target's 512 (no PSRAM), but the mesh said 512: a
    200-token prompt got past serve's check and failed in the decode loop, a 500 and a traceback in the server's log
    (a bare ValueError from the Python API). Now the mesh's context is the stages', and such a prompt is refused as
    any too long: a 400 naming it, a UsageError."""
    with Mesh(drafter="cpu", stages=5, models=ROOT / "models", say=[].append, warn=[].append) as mesh, \
            serving(mesh) as url:
        assert mesh.context == 128
        prompt = list(range(3, 203))
        with pytest.raises(specmesh.UsageError, match="the prompt has 200 tokens but the context holds 128"):
            mesh.complete(prompt)
        with pytest.raises(openai.BadRequestError) as e:
            client(url).completions.create(model="specmesh", prompt=prompt, max_tokens=8)
        assert e.value.code == "context_length_exceeded" and "context holds 128" in e.value.message


def test_a_lane_that_cannot_open_fails_its_generation_in_one_line(models, tmp_path, monkeypatch):
    """A mesh of host back-ends opens a lane as generations come at once; one whose model file was moved since the mesh
    started raised a bare BackendError out of the Python API (not the GenerationFailed it documents), and serve
    answered its request with a plain-text 500 "Internal Server Error" and a traceback in its log. The generation now
    fails as one whose back-end failed: GenerationFailed, a 503 in OpenAI's error shape and one line in the log;
    the lane open serves on."""
    import logging
    import shutil

    from specmesh.host.cli import session

    # each lane loads its model from its file (as where the engine process runs native kernels), not a Batcher's
    monkeypatch.setattr(session.Setup, "_native", lambda self, kind: True)
    folder = tmp_path / "models"
    shutil.copytree(models, folder)
    lines: list[str] = []
    with Mesh(drafter="cpu", verifier="cpu", models=folder, streams=2, warn=lines.append) as mesh, \
            serving(mesh) as url:
        heard: list[logging.LogRecord] = []
        hearing = logging.Handler(logging.WARNING)
        hearing.emit = heard.append  # type: ignore[method-assign]
        logging.getLogger("uvicorn").addHandler(hearing)
        try:
            (folder / "target.spm").unlink()
            with mesh.lane():  # the one lane open, held: the next generation opens another
                failed: list[BaseException] = []
                thread = threading.Thread(target=lambda: failed.extend(_raised(mesh.generate, PROMPT, max_tokens=4)))
                thread.start()
                thread.join(60)
                with pytest.raises(openai.InternalServerError) as e:
                    client(url).completions.create(model="specmesh", prompt=PROMPT, max_tokens=4)
            assert [type(f) for f in failed] == [specmesh.GenerationFailed], failed
            assert str(failed[0]).startswith("cannot open another lane for a generation at once: cannot load model")
            assert e.value.status_code == 503 and e.value.body["message"] == str(failed[0])
            assert lines == ["a request failed: %s" % failed[0]]
            assert client(url).completions.create(model="specmesh", prompt=PROMPT, max_tokens=4).usage.total_tokens
        finally:
            logging.getLogger("uvicorn").removeHandler(hearing)
        assert not heard, [r.getMessage() for r in heard]


def _raised(call, *args, **kwargs) -> list[BaseException]:
    """The exception `call(*args, **kwargs)` raised, in a list (empty when it returned)."""
    try:
        call(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - handed to the test's thread, which checks it
        return [e]
    return []

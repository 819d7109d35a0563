"""What turnlog's two model providers send when a user message carries images, checked against
the official SDKs' own request types (`openai`'s `CompletionCreateParamsStreaming`,
`anthropic`'s `MessageCreateParamsStreaming`), strictly (`sdk_types.problems`): images in every
view's shape (AAP's `url`, Anthropic's `source` through the native API and through the
official `anthropic` SDK's managed-agents calls, the agent harness's `file_upload`) reach each
provider in the provider's own shape. The providers talk to a small
fake of each API here that records what it is sent and answers a minimal stream."""

import http.server
import json
import pathlib
import sys
import tempfile
import threading

import urllib.error
import urllib.request

import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

from conftest import sdk, turn
from sdk_types import problems

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from turnlog_server import Server  # noqa: E402

PNG = "iVBORw0KGgo="

OPENAI_STREAM = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in [
    {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
    {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o", "choices": [],
     "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}},
]) + "data: [DONE]\n\n"

ANTHROPIC_STREAM = "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in [
    {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
                                          "content": [], "stop_reason": None, "stop_sequence": None,
                                          "usage": {"input_tokens": 5, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 1}},
    {"type": "message_stop"},
])


class FakeModels(http.server.ThreadingHTTPServer):
    """Chat Completions on `/v1/chat/completions`, Messages on `/v1/messages`: each request's
    JSON body is kept, in order, and answered with a one-word stream."""

    def __init__(self):
        self.bodies: list[tuple[str, dict]] = []
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append((self.path, body))
        stream = OPENAI_STREAM if self.path.endswith("/chat/completions") else ANTHROPIC_STREAM
        data = stream.encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def models():
    fake = FakeModels()
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.shutdown()


@pytest.fixture(scope="module")
def server(models):
    config = f"""
[agents.oa]
model = {{ provider = "openai", name = "gpt-4o", base_url = "{models.url}/v1" }}
[agents.an]
model = {{ provider = "anthropic", name = "claude-sonnet-4-5", base_url = "{models.url}" }}
"""
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, config)
        yield running.url
        running.stop()


def call(method: str, url: str, body=None) -> tuple[int, dict]:
    """A JSON request (stdlib only: the SDKs here bring their own HTTP clients)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def sent_for(models, send) -> dict:
    """The body of the one model request `send` makes."""
    before = len(models.bodies)
    send()
    assert len(models.bodies) == before + 1, models.bodies[before:]
    return models.bodies[-1]


def aap_turn(server, agent, content):
    _, created = call("POST", f"{server}/sessions", {"agent": {"name": agent}})
    turn = {"stream": "none", "messages": [{"role": "user", "content": content}]}
    status, answer = call("POST", f"{server}/sessions/{created['sessionId']}/turns", turn)
    assert status == 200 and answer["stopReason"] == "end_turn", answer


def native_turn(server, agent, content):
    _, created = call("POST", f"{server}/sessions", {"agent": {"name": agent}})
    session = created["sessionId"]
    stream = f"{server}/sessions/{session}/events/stream?types[]=session.status_idle"
    with urllib.request.urlopen(stream, timeout=30) as ends:
        status, posted = call("POST", f"{server}/sessions/{session}/events",
                              {"events": [{"type": "user.message", "content": content}]})
        assert status == 200, posted
        for line in ends:
            if line.startswith(b"data: "):
                assert json.loads(line[6:])["stop_reason"]["type"] == "end_turn"
                return


def managed_turn(server, agent, content):
    """Through the official `anthropic` SDK, strict: a session of the configured agent, the
    message sent while its stream is open, read until the session goes idle."""
    client = sdk(server)
    environment = client.beta.environments.create(name="shapes")
    session = client.beta.sessions.create(agent=agent, environment_id=environment.id)
    events = turn(client, session.id, [{"type": "user.message", "content": content}])
    assert events[-1].stop_reason.type == "end_turn", events[-1]


def harness_turn(server, agent, content):
    _, created = call("POST", f"{server}/v1/agents/sessions", {"agent_name": agent})
    session = created["data"]["id"]
    status, turn = call("POST", f"{server}/v1/agents/sessions/{session}/turns",
                        {"input": [{"type": "user.message", "content": content}], "stream": False})
    assert status == 200, turn
    for _ in range(500):
        _, state = call("GET", f"{server}/v1/agents/sessions/{session}/turns/{turn['data']['id']}")
        if state["data"]["state"]["status"] != "running":
            assert state["data"]["state"]["status"] == "done", state
            return
        threading.Event().wait(0.01)
    raise AssertionError("the harness turn did not end")


CASES = {
    "AAP url and data": (aap_turn, [
        {"type": "text", "text": "what are these?"},
        {"type": "image", "url": "https://example.com/cat.png"},
        {"type": "image", "url": f"data:image/png;base64,{PNG}"},
    ], ["https://example.com/cat.png", ("image/png", PNG)]),
    "native Anthropic blocks": (native_turn, [
        {"type": "text", "text": "what are these?"},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/dog.jpg"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
    ], ["https://example.com/dog.jpg", ("image/jpeg", "/9j/4AAQ")]),
    "managed agents SDK blocks": (managed_turn, [
        {"type": "text", "text": "what are these?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklGRg=="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/fox.png"}},
    ], [("image/webp", "UklGRg=="), "https://example.com/fox.png"]),
    "harness file_upload": (harness_turn, [
        {"type": "text", "text": "what are these?"},
        {"type": "file_upload", "file": {"filename": "a.gif", "file_data": "data:image/gif;base64,R0lGODlh"}},
    ], [("image/gif", "R0lGODlh")]),
}


def openai_part(image) -> dict:
    url = image if isinstance(image, str) else f"data:{image[0]};base64,{image[1]}"
    return {"type": "image_url", "image_url": {"url": url}}


def anthropic_block(image) -> dict:
    if isinstance(image, str):
        return {"type": "image", "source": {"type": "url", "url": image}}
    return {"type": "image", "source": {"type": "base64", "media_type": image[0], "data": image[1]}}


@pytest.mark.parametrize("case", CASES)
def test_chat_completions_gets_image_url_parts_as_the_openai_sdk_types_them(models, server, case):
    send, content, images = CASES[case]
    path, body = sent_for(models, lambda: send(server, "oa", content))
    assert path == "/v1/chat/completions"
    assert problems(body, CompletionCreateParamsStreaming) == []
    user = [m for m in body["messages"] if m["role"] == "user"][-1]
    assert user["content"] == [{"type": "text", "text": "what are these?"}] + [openai_part(i) for i in images]


@pytest.mark.parametrize("case", CASES)
def test_messages_gets_image_blocks_as_the_anthropic_sdk_types_them(models, server, case):
    send, content, images = CASES[case]
    path, body = sent_for(models, lambda: send(server, "an", content))
    assert path == "/v1/messages"
    assert problems(body, MessageCreateParamsStreaming) == []
    user = [m for m in body["messages"] if m["role"] == "user"][-1]
    assert user["content"] == [{"type": "text", "text": "what are these?"}] + [anthropic_block(i) for i in images]


def test_the_check_is_strict_a_misspelled_key_or_a_foreign_shape_fails():
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": [openai_part("https://x")]}]}
    assert problems(body, CompletionCreateParamsStreaming) == []
    body["messages"][0]["content"][0]["image_url"] = {"uri": "https://x"}
    assert problems(body, CompletionCreateParamsStreaming) == ["$.messages[0].content[0].image_url: ImageURL has no key 'uri'"]
    message = {"model": "m", "stream": True, "max_tokens": 9, "messages": [{"role": "user", "content": [anthropic_block("https://x")]}]}
    assert problems(message, MessageCreateParamsStreaming) == []
    message["messages"][0]["content"][0] = {"type": "image", "url": "https://x"}
    assert problems(message, MessageCreateParamsStreaming), "AAP's shape is not the Messages API's"
    message["messages"][0]["content"][0] = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}
    assert any("image/bmp" in p for p in problems(message, MessageCreateParamsStreaming))

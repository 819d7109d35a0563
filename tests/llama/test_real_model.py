"""turnlog's OpenAI and Anthropic providers against a real llama.cpp server and a real
model, through the AAP turn API and the native log and stream. The model is small: the tests
assert the wire and the log (what was streamed, recorded, counted and cut), never what the
model knows."""

import concurrent.futures
import pathlib
import tempfile
import threading
import time

from conftest import SYSTEM, agents
from llama import Llama
from turnlog_server import own_server
from views import NativeStream, aap_turn, create, events, last_turn, post_events, stop_of, text_of

WEATHER = {
    "name": "get_weather",
    "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
COUNTING = "Count from 1 to 500, one number per line, and say nothing else."


def of_type(log: list[dict], kind: str) -> list[dict]:
    return [e for e in log if e["type"] == kind]


def one(log: list[dict], kind: str) -> dict:
    found = of_type(log, kind)
    assert len(found) == 1, f"{len(found)} {kind} in {[e['type'] for e in log]}"
    return found[0]


def said(turn: list[dict]) -> str:
    """The turn's one agent message, checked against its deltas: the deltas of one message id,
    joined, are exactly the message."""
    message = one(turn, "agent.message")
    deltas = of_type(turn, "agent.message.delta")
    assert {d["message_id"] for d in deltas} == {message["message_id"]}
    text = "".join(block["text"] for block in message["content"])
    assert "".join(d["delta"] for d in deltas) == text
    return text


def test_a_reply_streams_as_deltas_then_one_message_with_the_servers_usage(provider, llama, turnlog):
    session = create(turnlog, provider)
    before = llama.counters()
    question = "What is the capital of France?"
    frames = aap_turn(turnlog, session, question)
    after = llama.counters()

    assert frames[0][0] == "turn_start"
    assert stop_of(frames) == "end_turn", frames
    deltas = [f for f in frames if f[0] == "text_delta"]
    assert len(deltas) >= 2, f"a reply of {len(deltas)} delta(s) was not streamed: {frames}"
    turn = last_turn(events(turnlog, session))
    text = said(turn)
    assert text == text_of(frames) and text.strip(), frames

    # Usage is the server's own count: the tokens it generated (its counters), and the
    # tokens its chat template makes of what we sent.
    end = one(turn, "span.model_request_end")
    assert end["stop_reason"] == "end_turn" and not end["is_error"]
    generated = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert end["usage"]["output_tokens"] == generated > 0
    prompt = llama.prompt_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    assert end["usage"]["input_tokens"] == prompt
    idle = one(turn, "session.status_idle")
    assert idle["stop_reason"]["type"] == "end_turn"
    assert idle["usage"] == end["usage"]

    # The next turn through the native API, watched on its live stream: the stream carries
    # the turn's events as the log stores them, and the history of the first turn reached
    # the model (the prompt is longer by it).
    stream = NativeStream(turnlog, session, after_id=idle["id"])
    post_events(turnlog, session, {"type": "user.message", "content": [{"type": "text", "text": "And of Italy?"}]})
    streamed = stream.wait()
    turn = last_turn(events(turnlog, session))
    assert [e["id"] for e in streamed] == [e["id"] for e in events(turnlog, session) if e["id"] > idle["id"]]
    assert said(turn).strip()
    assert one(turn, "span.model_request_end")["usage"]["input_tokens"] > prompt


def test_a_tiny_max_tokens_ends_the_turn_as_max_tokens(provider, turnlog):
    session = create(turnlog, f"{provider}_tiny")
    frames = aap_turn(turnlog, session, "Tell me about the sea.")
    assert stop_of(frames) == "max_tokens", frames
    turn = last_turn(events(turnlog, session))
    assert said(turn) == text_of(frames)
    end = one(turn, "span.model_request_end")
    assert end["stop_reason"] == "max_tokens"
    assert end["usage"]["output_tokens"] == 3
    assert one(turn, "session.status_idle")["stop_reason"] == {"type": "end_turn", "detail": "max_tokens"}


def test_a_history_longer_than_the_context_ends_with_a_clear_error(provider, llama, turnlog):
    session = create(turnlog, provider)
    before = llama.counters()
    frames = aap_turn(turnlog, session, "Summarise this: " + "the cat sat on the mat. " * 800)
    assert stop_of(frames) == "error", frames
    turn = last_turn(events(turnlog, session))
    error = one(turn, "session.error")
    assert error["code"] == "model_context_exceeded_error", error
    assert "exceeds the available context size (2048 tokens)" in error["error"], error
    assert one(turn, "session.status_idle")["stop_reason"]["type"] == "error"
    assert not of_type(turn, "agent.message")
    assert llama.counters()["llamacpp:tokens_predicted_total"] == before["llamacpp:tokens_predicted_total"]


def test_an_interrupt_mid_stream_cancels_the_request_on_the_server(provider, llama, turnlog):
    session = create(turnlog, f"{provider}_long")
    log_from = len(llama.log())
    interrupted = []

    def on_frame(frame, _at):
        deltas = sum(1 for name, _ in seen if name == "text_delta")
        if frame[0] == "text_delta" and deltas >= 5 and not interrupted:
            interrupted.append(post_events(turnlog, session, {"type": "user.interrupt"}))

    seen = []
    frames = aap_turn(turnlog, session, COUNTING, on_frame=lambda f, at: (seen.append(f), on_frame(f, at)))
    assert interrupted, "the reply ended before it could be interrupted"
    assert stop_of(frames) == "end_turn", frames  # AAP's name for an interrupted turn
    # The server dropped the request (its slot is free at once) and said so in its log.
    assert llama.wait_idle(timeout=10) < 10
    llama.wait_logged("cancel task", since=log_from)
    turn = last_turn(events(turnlog, session))
    assert said(turn) == text_of(frames)
    assert one(turn, "session.status_idle")["stop_reason"] == {"type": "cancel", "detail": "cancelled"}
    assert one(turn, "span.model_request_end")["is_error"]


def test_two_sessions_stream_at_once_from_one_server(provider, llama, turnlog):
    sessions = [create(turnlog, f"{provider}_long") for _ in range(2)]
    prompts = ["Count from 1 to 60, one number per line.", "List sixty colours, one per line."]
    busy: list[int] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            busy.append(len(llama.busy_slots()))
            time.sleep(0.02)

    def run(i):
        times = []
        return aap_turn(turnlog, sessions[i], prompts[i], on_frame=lambda f, at: times.append((f[0], at))), times

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            # A turn that fails raises here, with its own error.
            results = [future.result(timeout=180) for future in [pool.submit(run, i) for i in range(2)]]
    finally:
        done.set()
        watcher.join()

    assert max(busy) == 2, f"the server never worked on both requests at once: {busy}"
    spans = []
    for i in range(2):
        frames, times = results[i]
        assert stop_of(frames) in ("end_turn", "max_tokens"), frames
        deltas = [at for name, at in times if name == "text_delta"]
        spans.append((deltas[0], times[-1][1]))
        assert said(last_turn(events(turnlog, sessions[i]))) == text_of(frames)
    (a_first, a_end), (b_first, b_end) = spans
    assert a_first < b_end and b_first < a_end, f"the streams did not overlap: {spans}"


def test_a_server_killed_mid_stream_ends_the_turn_with_an_error_then_comes_back(provider):
    """Retries (docs/models.md): a request is retried with backoff only before any of its
    response has been streamed, so a stream cut after its first tokens ends the turn, and a
    server that is down is tried `max_retries` more times before the turn fails."""
    with tempfile.TemporaryDirectory() as root:
        llama = Llama(pathlib.Path(root) / "llama.log", slots=1)
        try:
            with own_server(agents(llama.url, max_retries=2)) as turnlog:
                log = pathlib.Path(turnlog.root) / "server.log"
                session = create(turnlog.url, f"{provider}_long")
                seen = []

                def on_frame(frame, _at):
                    seen.append(frame)
                    if sum(1 for name, _ in seen if name == "text_delta") == 3:
                        llama.kill()

                frames = aap_turn(turnlog.url, session, COUNTING, on_frame=on_frame)
                assert stop_of(frames) == "error", frames
                turn = last_turn(events(turnlog.url, session))
                error = one(turn, "session.error")
                assert error["code"] == "model_connection_error", error
                assert "stream" in error["error"], error
                assert said(turn) == text_of(frames)
                assert one(turn, "span.model_request_end")["is_error"]
                assert "retrying" not in log.read_text(), "a stream cut after its first tokens was retried"

                # Down: the first attempt and two retries, then the error.
                frames = aap_turn(turnlog.url, session, "Hello?")
                assert stop_of(frames) == "error", frames
                turn = last_turn(events(turnlog.url, session))
                assert one(turn, "session.error")["code"] == "model_connection_error"
                assert log.read_text().count("model request failed; retrying") == 2

                # Back on its port: the next turn is answered, and its history holds what the
                # cut turn had said.
                llama.start()
                frames = aap_turn(turnlog.url, session, "Say hello.")
                assert stop_of(frames) in ("end_turn", "max_tokens"), frames
                assert said(last_turn(events(turnlog.url, session))).strip()
        finally:
            llama.stop()


def test_a_forced_tool_call_is_recorded_and_its_result_reaches_the_server(provider, llama_tools, turnlog):
    session = create(turnlog, f"{provider}_tools", tools=[WEATHER])
    frames = aap_turn(turnlog, session, "What is the weather in Paris?")
    assert stop_of(frames) == "tool_use", frames
    calls = [data for name, data in frames if name == "tool_call"]
    assert len(calls) == 1, frames
    call = calls[0]
    assert call["name"] == "get_weather" and isinstance(call["input"], dict), call
    assert call["toolCallId"], call

    turn = last_turn(events(turnlog, session))
    use = one(turn, "agent.custom_tool_use")
    assert (use["name"], use["tool_call_id"], use["input"]) == ("get_weather", call["toolCallId"], call["input"])
    assert one(turn, "span.model_request_end")["stop_reason"] == "tool_use"
    idle = one(turn, "session.status_idle")
    assert idle["stop_reason"] == {"type": "requires_action", "event_ids": [use["id"]]}

    # The result goes back in the provider's own shape (a `tool` message; a `tool_result`
    # block), and the server takes it: the next response is a call again (it must be), not
    # an error, and its prompt holds the result.
    before = llama_tools.counters()["llamacpp:prompt_tokens_total"]
    result = {"role": "tool", "toolCallId": call["toolCallId"], "content": "18 degrees and sunny"}
    frames = aap_turn(turnlog, session, [result])
    assert stop_of(frames) == "tool_use", frames
    turn = last_turn(events(turnlog, session))
    assert not of_type(turn, "session.error")
    end = one(turn, "span.model_request_end")
    assert not end["is_error"] and end["stop_reason"] == "tool_use"
    assert llama_tools.counters()["llamacpp:prompt_tokens_total"] > before

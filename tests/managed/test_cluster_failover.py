"""The official SDK, strict and with its default retries, against a cluster of three turnlog
nodes on three nats-servers, while the events stream's leader is SIGKILLed: user messages
sent one at a time through the election (half with an Idempotency-Key, half without) are
never stored twice. Whatever was answered OK is in the log exactly once, with the id it was
answered with; a 503 (known not stored, which the SDK sends again by itself) or a 504 (fate
unknown, `x-should-retry: false`, which it does not) at most once; a 409 (another node
appended first: "nothing was stored; send it again", `x-should-retry: false`) not at all.
Every node lists the same log. Prints what the client saw: messages sent, answered OK,
409/503/504, and the longest send (the unavailability window)."""

import collections
import threading
import time
import uuid

import anthropic
import pytest

from cluster import cluster
from conftest import ALICE, CONFIG, WEATHER, message
from turnlog_server import until

SENDING_S = 25  # how long messages are sent for at least,
SETTLED_S = 3  # and at least this long after the last send that took over a second,
SENDING_MAX_S = 40  # but no longer than this
KILL_AFTER_S = 2  # when the events stream's leader dies


def text_of(event) -> str:
    return "".join(block.text for block in event.content)


@pytest.mark.timeout(120)
def test_user_messages_are_stored_at_most_once_through_a_leader_failover(tmp_path):
    with cluster(tmp_path, CONFIG) as (nats, nodes):
        attempts = []  # the status of every HTTP attempt of the send in flight (the SDK's retries too)

        def record(response):
            attempts.append(response.status_code)

        clients = [
            anthropic.Anthropic(
                base_url=node.url,
                api_key=ALICE,
                _strict_response_validation=True,
                http_client=anthropic.DefaultHttpxClient(event_hooks={"response": [record]}),
            )
            for node in nodes
        ]
        first = clients[0]
        assert first.max_retries == anthropic.DEFAULT_MAX_RETRIES == 2, "the SDK's default retries"
        environment = first.beta.environments.create(name="failover")
        agent = first.beta.agents.create(name="failover", model="scripted", system="Be brief.", tools=[WEATHER])
        session = first.beta.sessions.create(agent=agent.id, environment_id=environment.id)

        leader = nats.stream_leader()
        killed = {}

        def kill_leader():
            victim = nats.stream_leader()
            killed.update(server=victim, at=time.monotonic())
            nats.kill(victim)

        sent = []  # one record per message
        killer = threading.Timer(KILL_AFTER_S, kill_leader)
        start = time.monotonic()
        killer.start()
        try:
            i, last_slow = 0, start

            def sending():
                now = time.monotonic()
                return now - start < SENDING_MAX_S and (now - start < SENDING_S or now - last_slow < SETTLED_S)

            while sending():
                keyed = i % 2 == 0
                text = f"m{i:04d} {'keyed' if keyed else 'unkeyed'} {uuid.uuid4()}"
                options = {"extra_headers": {"Idempotency-Key": f"failover-{uuid.uuid4()}"}} if keyed else {}
                node = i % len(nodes)  # round robin, as a load balancer would
                attempts.clear()
                began = time.monotonic()
                outcome, ids, detail = "ok", [], ""
                try:
                    answer = clients[node].beta.sessions.events.send(session.id, events=[message(text)], **options)
                    ids = [e.id for e in answer.data]
                except anthropic.APIStatusError as error:
                    outcome = error.status_code
                    detail = f"x-should-retry={error.response.headers.get('x-should-retry')} {error.response.text[:300]}"
                except anthropic.APIError as error:  # no answer at all (after the SDK's retries)
                    outcome, detail = type(error).__name__, str(error)
                sent.append(
                    dict(
                        i=i, text=text, keyed=keyed, node=node, outcome=outcome, ids=ids, detail=detail,
                        attempts=list(attempts), began=began - start, took=time.monotonic() - began,
                    )
                )
                if sent[-1]["took"] > 1:
                    last_slow = time.monotonic()
                i += 1
            sending_s = time.monotonic() - start
        finally:
            killer.cancel()
            killer.join()
        assert killed, "the leader was killed while messages were sent"

        # What the client saw.
        outcomes = collections.Counter(str(s["outcome"]) for s in sent)
        raw = collections.Counter(code for s in sent for code in s["attempts"])
        slowest = max(sent, key=lambda s: s["took"])
        slow = [s for s in sent if s["took"] > 1]
        print(
            f"\n[cluster failover] stream leader n{leader} (killed n{killed['server']} at "
            f"{killed['at'] - start:.1f} s); sent {len(sent)} messages in {sending_s:.1f} s "
            f"({sum(s['keyed'] for s in sent)} keyed), answered OK {outcomes['ok']}, "
            f"409 {outcomes['409']}, 503 {outcomes['503']}, 504 {outcomes['504']}, "
            f"other {len(sent) - sum(outcomes[k] for k in ('ok', '409', '503', '504'))}; "
            f"HTTP answers seen by the SDK {dict(sorted(raw.items()))}; "
            f"longest send {slowest['took']:.2f} s (message {slowest['i']}, began {slowest['began']:.1f} s, "
            f"node {slowest['node']}, {slowest['outcome']}, attempts {slowest['attempts']}); "
            f"{len(slow)} sends took over 1 s"
        )
        for s in sent:
            if s["outcome"] != "ok" or len(s["attempts"]) > 1 or s["took"] > 1:
                print(f"  message {s['i']} ({'keyed' if s['keyed'] else 'unkeyed'}, node {s['node']}): {s['outcome']} "
                      f"after {s['took']:.2f} s, attempts {s['attempts']} {s['detail']}")

        # The log, once every turn has ended: through the first node, and every node agrees.
        def idle():
            return first.beta.sessions.retrieve(session.id).status == "idle"

        until("the session goes idle", idle, 30, every_s=0.2)

        def user_messages(client):
            return [(e.id, text_of(e)) for e in client.beta.sessions.events.list(session.id, types=["user.message"])]

        log = user_messages(first)
        for n, client in enumerate(clients[1:], 1):
            until(f"node {n} lists the log node 0 does", lambda: user_messages(client) == log, 15, every_s=0.2)

        # What the log holds.
        counts = collections.Counter(text for _, text in log)
        twice = {text: n for text, n in counts.items() if n > 1}
        assert not twice, f"user messages stored more than once: {twice}"
        texts = {s["text"] for s in sent}
        assert set(counts) <= texts, f"messages nobody sent: {set(counts) - texts}"
        ids = {text: event_id for event_id, text in log}
        for s in sent:
            if s["outcome"] != "ok":
                print(f"  message {s['i']} ({s['outcome']}) is in the log {counts[s['text']]} time(s)")
        logs = f"node logs: {tmp_path}/{{a,b,c}}/server.log, nats-servers': {nats.dir}/n*.log"
        for s in sent:
            stored = counts[s["text"]]
            if s["outcome"] == "ok":
                assert stored == 1, f"answered OK but stored {stored} times: {s}; {logs}"
                assert s["ids"] == [ids[s["text"]]], f"answered with another id than the log's: {s}; {logs}"
            elif s["outcome"] == 409:
                # A conflict says nothing was stored, with `x-should-retry: false`: a client
                # that sends it again must not store it twice. (Another node appending first
                # is a 503 now, which the SDK sends again by itself.)
                assert stored == 0, (
                    f"answered 409 (nothing was stored; send it again) yet stored: sent again, it would be "
                    f"stored twice: {s}; {logs}"
                )
            else:
                assert stored <= 1, f"{s}; {logs}"
        unexpected = [s for s in sent if s["outcome"] not in ("ok", 409, 503, 504)]
        assert not unexpected, f"answers other than OK, 409, 503 and 504: {unexpected}; {logs}"
        assert outcomes["ok"] > 0
        stored_503 = [s["i"] for s in sent if s["outcome"] == 503 and counts[s["text"]]]
        if stored_503:
            print(f"  answered 503 (not stored) yet in the log: messages {stored_503}")
        for n, node in enumerate(nodes):
            assert node.process.poll() is None, f"node {n} died: see {node.root / 'server.log'}"
    for n, node in enumerate(nodes):
        assert node.exit_code == 0, f"node {n} did not stop cleanly ({node.exit_code}): see {node.root / 'server.log'}"

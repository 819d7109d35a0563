"""events.list through the official SDK, strict: both orders, type and time filters, pages."""

from conftest import message, turn


def test_events_list_in_both_orders_with_filters_and_pages(client, session):
    for text in ("one", "two", "three"):
        turn(client, session.id, [message(text)])
    everything = list(client.beta.sessions.events.list(session.id))
    assert len(everything) == 18, [e.type for e in everything]
    assert everything[0].type == "user.message"
    paged = list(client.beta.sessions.events.list(session.id, limit=4))
    assert [e.id for e in paged] == [e.id for e in everything], "pages of 4 make the same list"
    newest = list(client.beta.sessions.events.list(session.id, order="desc", limit=5))
    assert [e.id for e in newest] == [e.id for e in everything][::-1]

    messages = list(client.beta.sessions.events.list(session.id, types=["user.message", "agent.message"]))
    assert [e.type for e in messages] == ["user.message", "agent.message"] * 3
    assert [m.content[0].text for m in messages] == ["one", "echo: one", "two", "echo: two", "three", "echo: three"]

    second_turn_start = messages[2].processed_at
    later = list(client.beta.sessions.events.list(session.id, types=["user.message"], created_at_gte=second_turn_start))
    assert [m.content[0].text for m in later] == ["two", "three"]
    earlier = list(client.beta.sessions.events.list(session.id, types=["user.message"], created_at_lt=second_turn_start))
    assert [m.content[0].text for m in earlier] == ["one"]

    first = client.beta.sessions.events.list(session.id, limit=1000)
    assert first.next_page is None and len(first.data) == 18, "the tool runner's limit is taken"


def test_content_another_view_stored_reads_strictly(server, client, session):
    """The native view takes blocks the SDK has no type for; this view leaves them out."""
    import httpx2

    native = {"type": "user.message", "content": [{"type": "text", "text": "mixed"}, {"type": "sticker", "id": 7}]}
    response = httpx2.post(
        f"{server}/sessions/{session.id}/events", json={"events": [native]}, headers={"authorization": "Bearer alice-key"}
    )
    assert response.status_code == 200, response.text
    for _ in range(500):
        listed = list(client.beta.sessions.events.list(session.id))
        if any(e.type == "session.status_idle" for e in listed):
            break
    sent = next(e for e in listed if e.type == "user.message")
    assert [(b.type, b.text) for b in sent.content] == [("text", "mixed")]

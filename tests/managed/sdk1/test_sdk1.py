"""The same server through SDK 1.x, which authenticates with `X-Api-Key`, sends
`anthropic-version: 2023-06-01` and appends `?beta=true` to every path."""

import anthropic

from conftest import message


def test_sdk_one_authenticates_and_its_query_is_ignored(server, environment, agent):
    seen = []
    recording = anthropic.DefaultHttpxClient(event_hooks={"request": [seen.append]})
    client = anthropic.Anthropic(
        base_url=server, api_key="alice-key", max_retries=0, http_client=recording, _strict_response_validation=True
    )
    assert anthropic.__version__.startswith("1."), anthropic.__version__
    session = client.beta.sessions.create(agent=agent.id, environment_id=environment.id, title="one")
    assert client.beta.sessions.retrieve(session.id).title == "one"
    assert session.id in [s.id for s in client.beta.sessions.list(agent_id=agent.id)]
    sent = client.beta.sessions.events.send(session.id, events=[message("hi")])
    assert sent.data[0].type == "user.message"
    listed = [e.type for e in client.beta.sessions.events.list(session.id, types=["user.message"])]
    assert listed == ["user.message"]
    assert seen and all(r.url.params.get("beta") == "true" for r in seen), [str(r.url) for r in seen]
    assert all(r.headers.get("x-api-key") == "alice-key" and "authorization" not in r.headers for r in seen)
    wrong = anthropic.Anthropic(base_url=server, api_key="wrong", max_retries=0)
    try:
        wrong.beta.sessions.retrieve(session.id)
    except anthropic.AuthenticationError:
        pass
    else:
        raise AssertionError("a wrong key was accepted")

"""The SDK's own `tool_runner`: it opens the stream, lists the history and dedupes by id,
runs the session's custom tools as their calls come, and posts their results; turnlog's
durable log means nothing it needs is lost, even a call made before it started."""

import asyncio

import anthropic
from anthropic.lib.tools import beta_async_tool

from conftest import ALICE, message


def test_the_tool_runner_answers_every_call_once(server, agent, environment):
    ran = []

    @beta_async_tool
    async def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"cold in {city}"

    async def drive():
        client = anthropic.AsyncAnthropic(base_url=server, api_key=ALICE, max_retries=0, _strict_response_validation=True)
        session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        # The first call is made before the runner starts: it finds it in the history.
        await client.beta.sessions.events.send(session.id, events=[message('/tool get_weather {"city": "Oslo"}')])
        for _ in range(200):
            listed = await client.beta.sessions.events.list(session.id, types=["session.status_idle"])
            if listed.data:
                break
            await asyncio.sleep(0.02)
        calls = [call async for call in client.beta.sessions.events.tool_runner(session.id, tools=[get_weather], max_idle=2)]
        events = [e async for e in client.beta.sessions.events.list(session.id)]
        return calls, events

    calls, events = asyncio.run(drive())
    assert ran == ["Oslo"], "run once"
    assert [(c.name, c.posted, c.is_error) for c in calls] == [("get_weather", True, False)]
    results = [e for e in events if e.type == "user.custom_tool_result"]
    assert len(results) == 1 and results[0].content[0].text == "cold in Oslo"
    final = [e for e in events if e.type == "agent.message"]
    assert final[-1].content[0].text == "tool results: get_weather=cold in Oslo"
    assert events[-1].type == "session.status_idle" and events[-1].stop_reason.type == "end_turn"
